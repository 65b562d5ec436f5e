"""pushdown: push transposes below matmuls and sums (opt-in: ``passes={"pushdown": True}``).

The rewrite is the IR's (glcomp.ir.passes.pushdown): after it no permute reads a single-reader
matmul, add or permute, and the graph computes the same outputs. A weight gradient summed over
time steps becomes a sum of matmul results in the weight's own layout, which the blend pass can
accumulate. Off (the default), the plan is returned as it is.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.passes.pushdown import pushdown as pushdown_graph


def pushdown(plan: KernelPlan) -> KernelPlan:
    """Push transposes below matmuls and sums (opt-in)."""
    if not plan.switches["pushdown"]:
        return plan
    return plan.replace(graph=pushdown_graph(plan.graph))
