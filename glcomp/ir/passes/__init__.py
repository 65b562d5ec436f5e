"""Graph-to-graph passes; each module exports one pure function of the same name."""

from glcomp.ir.passes.autodiff import autodiff
from glcomp.ir.passes.fold_views import fold_views
from glcomp.ir.passes.split_reductions import split_reductions
from glcomp.ir.passes.split_weight_grads import split_weight_grads
from glcomp.ir.passes.transpose_pushdown import transpose_pushdown

__all__ = ["autodiff", "fold_views", "split_reductions", "split_weight_grads", "transpose_pushdown"]
