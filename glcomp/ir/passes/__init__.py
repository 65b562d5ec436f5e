"""Graph-to-graph passes; each module exports one pure function of the same name."""

from glcomp.ir.passes.autodiff import autodiff

__all__ = ["autodiff"]
