"""Reductions over a set of axes. The primitive keeps reduced axes as size 1 (keepdim); the
Tensor API reshapes them away when the user asked for keepdim=False."""

from __future__ import annotations

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import dims, st
from glcomp.ir.ops.registry import Op, register


def reduce_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    for a in axes:
        if not 0 <= a < len(shape):
            raise GlcompError(f"reduction axis {a} out of range for shape {shape}")
    if len(set(axes)) != len(axes) or not axes:
        raise GlcompError(f"reduction axes {axes} must be distinct and non-empty")
    return tuple(1 if i in axes else s for i, s in enumerate(shape))


def sample_reduce(draw):
    shape = dims(draw, 1, 4, 6)
    axes = draw(st().sets(st().integers(0, len(shape) - 1), min_size=1))
    return [shape], {"axes": tuple(sorted(axes))}


def _sum_grad(g, out, a, axes):
    from glcomp.ir.tensor import broadcast_to

    return (broadcast_to(g, a.shape),)


def _max_grad(g, out, a, axes):
    from glcomp.ir.tensor import binary, broadcast_to, prim

    mask = binary("eq", a, broadcast_to(out, a.shape))
    count = prim("sum", mask, axes=axes)  # ties share the gradient, as torch.amax does
    return (broadcast_to(g / count, a.shape) * mask,)


def _logsumexp_grad(g, out, a, axes):
    from glcomp.ir.tensor import broadcast_to

    return (broadcast_to(g, a.shape) * (a - broadcast_to(out, a.shape)).exp(),)


def _logsumexp(a: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    """max + log(sum(exp(a - max))), as the shaders compute it: finite for finite inputs, -inf
    where every element is -inf, NaN where the max is +inf or NaN (torch.logsumexp gives +inf
    for a +inf; softmax and log_softmax, exp(a - this) and a - this, are NaN there in both)."""
    m = np.max(a, axis=axes, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        shifted = np.where(m == -np.inf, np.zeros_like(m), m)
        return (shifted + np.log(np.sum(np.exp(a - shifted), axis=axes, keepdims=True))).astype(a.dtype)


register(
    Op(
        "sum",
        "reduce",
        reduce_shape,
        lambda a, axes: np.sum(a, axis=axes, keepdims=True),
        _sum_grad,
        sample=sample_reduce,
        attrs=("axes",),
    )
)
register(
    Op(
        "max",
        "reduce",
        reduce_shape,
        lambda a, axes: np.max(a, axis=axes, keepdims=True),
        _max_grad,
        sample=sample_reduce,
        smooth=False,
        attrs=("axes",),
    )
)
# log(sum(exp(a))) over the axes, computed on a minus its maximum (softmax is exp(a - logsumexp)):
# one reduction where max then sum(exp(a - max)) were two, each reading every element.
register(
    Op(
        "logsumexp",
        "reduce",
        reduce_shape,
        _logsumexp,
        _logsumexp_grad,
        sample=sample_reduce,
        attrs=("axes",),
        cost=3,
    )
)
