"""The IR: graph, op registry, symbolic tensors, tracing, passes and the numpy interpreter."""

from glcomp.ir import ops  # noqa: F401  (populates the registry)
from glcomp.ir.graph import Graph, origin
from glcomp.ir.tensor import Tensor

__all__ = ["Graph", "Tensor", "origin"]
