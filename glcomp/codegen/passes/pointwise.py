"""pointwise: 1x1 convolutions as matrix products, on targets that name the fragments a draw needs.

The rewrite is the IR's (glcomp.ir.passes.pointwise), run before kernel planning: an ungrouped
1x1 stride-1 unpadded convolution, its input gradient and its weight gradient become matmuls
between views of x, g and the weight as (channels, pixels) matrices, which the tiling pass blocks
as it blocks a Linear's (a texel of the weight holds 4 input channels there, one weight in the
convolution's blocked kernel). Only on a target with `Target.parallel_fragments` (a GPU's
costs: webgl2-gpu), where those products were measured faster; elsewhere, and with
``passes={"pointwise": False}``, the plan is handed on as it is. The outputs are the same up to
the order of additions.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.passes.pointwise import pointwise as pointwise_graph


def pointwise(plan: KernelPlan) -> KernelPlan:
    """Pointwise convolutions of the plan's graph as products (GPU targets)."""
    if not plan.switches["pointwise"] or plan.target.parallel_fragments is None:
        return plan
    return plan.replace(graph=pointwise_graph(plan.graph))
