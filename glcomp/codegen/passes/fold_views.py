"""fold_views: fold transposes of transposes and reshapes of reshapes, so loop kernels see stored
operands behind double transposes (``g @ (W.T).T`` of autodiff reads ``W`` itself).

The rewrite is the IR's (glcomp.ir.passes.fold_views): after it no permute reads a permute, no
reshape reads a reshape and no view is the identity; the outputs are exactly the same (views
move values, never change them). Off with ``passes={"fold_views": False}``; a graph with nothing
to fold is handed on as it is (not copied).
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.ir.passes.fold_views import fold_views as fold_views_graph


def fold_views(plan: KernelPlan) -> KernelPlan:
    """Fold chains of views in the plan's graph."""
    if not plan.switches["fold_views"]:
        return plan
    return plan.replace(graph=fold_views_graph(plan.graph))
