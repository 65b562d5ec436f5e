"""split_reductions: reduce long sums and maxima with few outputs in two stages.

The rewrite is the IR's (glcomp.ir.passes.split_reductions), run before kernel planning so that
each stage becomes a kernel of its own with a short loop over many fragments. After it no
``sum`` or ``max`` reduces LONG or more elements into at most FEW values where its reduced axes
can be split; the outputs are the same up to the order of additions (``max`` exactly). On a
target that names the fragments a draw needs (`Target.parallel_fragments`, a GPU's), FEW is a
quarter of them: a stage with fewer outputs than that and a long loop is split again. Off with
``passes={"split_reductions": False}``; a graph with nothing to split is handed on as it is.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.passes.split_reductions import FEW
from glcomp.ir.passes.split_reductions import split_reductions as split_reductions_graph


def split_reductions(plan: KernelPlan) -> KernelPlan:
    """Split long reductions with few outputs in the plan's graph."""
    if not plan.switches["split_reductions"]:
        return plan
    width = plan.target.parallel_fragments
    few = FEW if width is None else max(FEW, width // 4)
    return plan.replace(graph=split_reductions_graph(plan.graph, few))
