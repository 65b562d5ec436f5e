"""Matrix product of two rank-2 tensors; the Tensor API flattens leading batch axes."""

from __future__ import annotations

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import st
from glcomp.ir.ops.registry import Op, register


def matmul_shape(a, b):
    if len(a) != 2 or len(b) != 2:
        raise GlcompError(f"matmul needs rank-2 operands, got {a} and {b}")
    if a[1] != b[0]:
        raise GlcompError(f"matmul size mismatch: {a} @ {b}")
    return (a[0], b[1])


def sample_matmul(draw):
    m, k, n = (draw(st().integers(1, 9)) for _ in range(3))
    return [(m, k), (k, n)], {}


def _matmul_grad(g, out, a, b):
    return g @ b.T, a.T @ g


register(
    Op(
        "matmul",
        "matmul",
        matmul_shape,
        lambda a, b: a @ b,
        _matmul_grad,
        2,
        sample=sample_matmul,
        rereads=True,
    )
)
