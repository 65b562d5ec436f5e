"""Graph-to-graph passes; each module exports one pure function of the same name (the rewrites
among them are the pipeline passes of the same names, glcomp.codegen.passes)."""

from glcomp.ir.passes.autodiff import autodiff
from glcomp.ir.passes.fold_views import fold_views
from glcomp.ir.passes.join_sums import join_sums
from glcomp.ir.passes.pointwise import pointwise
from glcomp.ir.passes.pushdown import pushdown
from glcomp.ir.passes.split_reductions import split_reductions
from glcomp.ir.passes.split_weight_grads import split_weight_grads

__all__ = [
    "autodiff",
    "fold_views",
    "join_sums",
    "pointwise",
    "pushdown",
    "split_reductions",
    "split_weight_grads",
]
