"""The op registry, populated by one module per kernel family."""

from glcomp.ir.ops import conv, elementwise, index, matmul, movement, pool, reduce, source  # noqa: F401
from glcomp.ir.ops.registry import KINDS, REGISTRY, Op, get_op, register

__all__ = ["KINDS", "REGISTRY", "Op", "get_op", "register"]
