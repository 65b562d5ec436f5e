"""join_sums: a sum of products as one product over concatenated operands.

The rewrite is the IR's (glcomp.ir.passes.join_sums), run before kernel planning: an LSTM's
recurrent weight gradient becomes one product with K = T * N (blocked and split by the tiling
pass) instead of T short ones. The outputs are the same up to the order of additions. Off
with ``passes={"join_sums": False}``; a graph with nothing to join is handed on as it is.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.passes.join_sums import join_sums as join_sums_graph


def join_sums(plan: KernelPlan) -> KernelPlan:
    """Join sums of products in the plan's graph."""
    if not plan.switches["join_sums"]:
        return plan
    return plan.replace(graph=join_sums_graph(plan.graph))
