"""Reductions over a set of axes. The primitive keeps reduced axes as size 1 (keepdim); the
Tensor API reshapes them away when the user asked for keepdim=False."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import dims, st
from glcomp.ir.ops.glsl import index_args
from glcomp.ir.ops.registry import Emitter, Op, Shapes, get_op, register


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


def reduce_extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """One loop over the reduced elements of an output element."""
    return math.prod(shapes[0][a] for a in attrs["axes"])


def reduce_spec(r: Emitter, n: int) -> dict[str, Any]:
    """reduce.frag.j2's root: one flat loop of `total` indices, decomposed into the reduced axes."""
    g = r.graph
    rule = get_op(g.op(n))
    (src,) = g.operands(n)
    src_shape = g.shape(src)
    axes = g.attrs(n)["axes"]
    extents = [src_shape[a] for a in axes]
    decompose, read = [], index_args(len(g.shape(n)))
    stride = 1
    for a, e in reversed(list(zip(axes, extents))):
        expr = "q" if stride == 1 else f"q / {stride}"
        decompose.insert(0, f"int r{a} = {expr if a == axes[0] else f'imod({expr}, {e})'};")
        read[a] = f"r{a}"
        stride *= e
    return {
        "total": math.prod(extents),
        "decompose": decompose,
        "read": r.call(src, read),
        "lead": read[:-1],  # the leading indices read, for a texel-wise read (reduce_spec4)
        "init": rule.glsl_init,
        "combine": rule.glsl,
    }


def reduce_spec4(r: Emitter, n: int, textures: set[int]) -> dict[str, Any] | None:
    """root4 of a reduction over a stored single-page input (see reduce.frag.j2): mode "K"
    when the last axis is kept and the reduced axes are one contiguous block, mode "L" when
    the last axis is reduced together with every axis after the first of a trailing block. A
    fused input with the last axis kept: mode "K", its texels read through its vec4 function."""
    g = r.graph
    (src,) = g.operands(n)
    tex = r.texture(src, textures)
    shape, axes = g.shape(src), sorted(g.attrs(n)["axes"])
    rank = len(shape)
    if tex is None:
        if rank - 1 in axes:
            return None
        # A fused input with the last axis kept: its texel at each reduced index (vec4 function).
        scalar = reduce_spec(r, n)
        return r.root4_head(n) | {
            "mode": "K",
            "x_tex": None,
            "Q": scalar["total"],
            "decompose": scalar["decompose"],
            "x4": r.call4(src, scalar["lead"], "j0"),
        }
    row_strides = [math.prod(shape[k + 1 : rank - 1]) for k in range(rank)]  # rows per index step
    head = r.root4_head(n)
    kept = [k for k in range(rank - 1) if k not in axes]
    if rank - 1 not in axes:
        if axes != list(range(axes[0], axes[-1] + 1)):
            return None
        base = " + ".join(f"i{k} * {row_strides[k]}" for k in kept) or "0"
        return head | {
            "mode": "K",
            "x_tex": tex,
            "row_base": base,
            "Q": math.prod(shape[a] for a in axes),
            "step": row_strides[axes[-1]] * tex["rt"],
        }
    first = rank - 1  # the trailing block of reduced axes starts here
    while first - 1 in axes:
        first -= 1
    outer = [a for a in axes if a < first]
    base = " + ".join(f"i{k} * {row_strides[k]}" for k in kept) or "0"
    decompose, terms, stride = [], [], 1
    for a in reversed(outer):
        expr = "qo" if stride == 1 else f"qo / {stride}"
        decompose.insert(0, f"int r{a} = {expr if a == outer[0] else f'imod({expr}, {shape[a]})'};")
        terms.append(f" + r{a} * {row_strides[a]}")
        stride *= shape[a]
    return head | {
        "mode": "L",
        "x_tex": tex,
        "row_base": base,
        "row_outer": "".join(reversed(terms)),
        "decompose": decompose,
        "Qo": math.prod(shape[a] for a in outer),
        "Lc": math.prod(shape[first : rank - 1]) * tex["rt"],
        "rem": shape[-1] % 4,
    }


KERNEL = {"template": "reduce", "loop_extent": reduce_extent, "spec": reduce_spec, "spec4": reduce_spec4}

register(
    Op(
        "sum",
        "reduce",
        reduce_shape,
        lambda a, axes: np.sum(a, axis=axes, keepdims=True),
        _sum_grad,
        sample=sample_reduce,
        attrs=("axes",),
        glsl="acc + a",
        glsl_init="0.0",
        **KERNEL,
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
        glsl="glc_max(acc, a)",
        glsl_init="-3.0e38",
        **KERNEL,
    )
)
