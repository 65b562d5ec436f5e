"""Matrix products: `matmul` of two rank-2 tensors (the Tensor API flattens the leading axes of a
left operand against a 2-D right one) and `bmm`, a batch of products of two rank-3 tensors with
the same leading (batch) size (the Tensor API broadcasts and flattens batch axes into it)."""

from __future__ import annotations

import numpy as np

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


def bmm_shape(a, b):
    if len(a) != 3 or len(b) != 3:
        raise GlcompError(f"bmm needs rank-3 operands, got {a} and {b}")
    if a[0] != b[0] or a[2] != b[1]:
        raise GlcompError(f"bmm size mismatch: {a} @ {b}")
    return (a[0], a[1], b[2])


def sample_bmm(draw):
    n, m, k, p = (draw(st().integers(1, 6)) for _ in range(4))
    return [(n, m, k), (n, k, p)], {}


def _bmm_grad(g, out, a, b):
    from glcomp.ir.tensor import permute, prim

    return prim("bmm", g, permute(b, (0, 2, 1))), prim("bmm", permute(a, (0, 2, 1)), g)


register(Op("bmm", "matmul", bmm_shape, np.matmul, _bmm_grad, 2, sample=sample_bmm, rereads=True))
