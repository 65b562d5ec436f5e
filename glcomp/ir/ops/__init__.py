"""The op registry, populated by one module per kernel family."""

from glcomp.ir.ops import (  # noqa: F401
    conv,
    elementwise,
    image,
    index,
    matmul,
    movement,
    pool,
    random,
    reduce,
    resample,
    source,
    special,
)
from glcomp.ir.ops.registry import KINDS, REGISTRY, Op, get_op, register

__all__ = ["KINDS", "REGISTRY", "Op", "get_op", "register"]
