"""split_weight_grads: long convolution weight gradients with small outputs as partial sums
computed side by side in one draw, then added.

The rewrite is the IR's (glcomp.ir.passes.split_weight_grads), run before kernel planning: the
partials are one primitive (``conv2d_weight_grad`` with ``parts``), so one kernel, and their sum
fuses into its reader. Which gradients are split depends on the layers, not the batch size. The
outputs are the same up to the order of additions. Off with ``passes={"split_weight_grads":
False}``; a graph with nothing to split is handed on as it is.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.passes.split_weight_grads import split_weight_grads as split_weight_grads_graph


def split_weight_grads(plan: KernelPlan) -> KernelPlan:
    """Split long convolution weight gradients in the plan's graph."""
    if not plan.switches["split_weight_grads"]:
        return plan
    return plan.replace(graph=split_weight_grads_graph(plan.graph))
