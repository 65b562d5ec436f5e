"""Movement primitives: they only rearrange elements. The code generator folds them into the
addressing of the kernel that reads them, so most cost no draw call (their lowerings:
glcomp.codegen.families.movement)."""

from __future__ import annotations

import math

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import dims, st
from glcomp.ir.ops.registry import Op, register


def _t():
    from glcomp.ir import tensor

    return tensor


# -- reshape -------------------------------------------------------------------------------------
def reshape_shape(a, shape):
    if math.prod(a) != math.prod(shape) or any(s < 0 for s in shape):
        raise GlcompError(f"cannot reshape a tensor of shape {a} to {shape}")
    return tuple(shape)


def sample_reshape(draw):
    shape = dims(draw, 1, 3, 6)
    flat = list(shape)
    draw(st().randoms()).shuffle(flat)
    return [shape], {"shape": (math.prod(shape),) if len(flat) < 2 else tuple(flat)}


register(
    Op(
        "reshape",
        "movement",
        reshape_shape,
        lambda a, shape: a.reshape(shape),
        lambda g, out, a, shape: (_t().reshape(g, a.shape),),
        sample=sample_reshape,
        attrs=("shape",),
        cost=0,
        view=lambda attrs: "flat",
    )
)


# -- permute -------------------------------------------------------------------------------------
def permute_shape(a, perm):
    if sorted(perm) != list(range(len(a))):
        raise GlcompError(f"permutation {perm} does not match rank {len(a)}")
    return tuple(a[p] for p in perm)


def sample_permute(draw):
    shape = dims(draw, 2, 4, 5)
    perm = draw(st().permutations(range(len(shape))))
    return [shape], {"perm": tuple(perm)}


register(
    Op(
        "permute",
        "movement",
        permute_shape,
        lambda a, perm: np.transpose(a, perm),
        lambda g, out, a, perm: (_t().permute(g, tuple(np.argsort(perm).tolist())),),
        sample=sample_permute,
        attrs=("perm",),
        cost=0,
        view=lambda attrs: {(1, 0): "transpose", (0, 2, 1): "batch_transpose"}.get(tuple(attrs["perm"])),
    )
)


# -- expand (broadcast) ---------------------------------------------------------------------------
def expand_shape(a, shape):
    if len(a) != len(shape) or any(s != o and s != 1 for s, o in zip(a, shape, strict=True)):
        raise GlcompError(f"cannot expand shape {a} to {shape}")
    return tuple(shape)


def sample_expand(draw):
    shape = dims(draw, 1, 4, 5)
    src = tuple(1 if draw(st().booleans()) else s for s in shape)
    return [src], {"shape": shape}


def _expand_grad(g, out, a, shape):
    # Un-broadcasting happens here and only here.
    axes = tuple(i for i, (s, o) in enumerate(zip(a.shape, shape, strict=True)) if s == 1 and o != 1)
    return (_t().prim("sum", g, axes=axes) if axes else g,)


register(
    Op(
        "expand",
        "movement",
        expand_shape,
        lambda a, shape: np.broadcast_to(a, shape).copy(),
        _expand_grad,
        sample=sample_expand,
        attrs=("shape",),
        cost=0,
        broadcast=True,
    )
)


# -- slice / pad (each other's gradient) ------------------------------------------------------------
def slice_shape(a, starts, stops):
    if not len(a) == len(starts) == len(stops):
        raise GlcompError(f"slice bounds {starts}:{stops} do not match rank {len(a)}")
    for s, lo, hi in zip(a, starts, stops, strict=True):
        if not 0 <= lo <= hi <= s:
            raise GlcompError(f"slice {starts}:{stops} out of range for shape {a}")
    return tuple(hi - lo for lo, hi in zip(starts, stops, strict=True))


def sample_slice(draw):
    shape = dims(draw, 1, 4, 6)
    starts, stops = [], []
    for s in shape:
        lo = draw(st().integers(0, s - 1))
        starts.append(lo)
        stops.append(draw(st().integers(lo + 1, s)))
    return [shape], {"starts": tuple(starts), "stops": tuple(stops)}


def pad_shape(a, before, after):
    if not len(a) == len(before) == len(after) or min(before + after, default=0) < 0:
        raise GlcompError(f"padding {before}/{after} does not fit shape {a}")
    return tuple(s + lo + hi for s, lo, hi in zip(a, before, after, strict=True))


def sample_pad(draw):
    shape = dims(draw, 1, 4, 5)
    before = tuple(draw(st().integers(0, 2)) for _ in shape)
    after = tuple(draw(st().integers(0, 2)) for _ in shape)
    return [shape], {"before": before, "after": after}


def _slice_ref(a, starts, stops):
    return a[tuple(slice(lo, hi) for lo, hi in zip(starts, stops, strict=True))].copy()


def _slice_grad(g, out, a, starts, stops):
    after = tuple(s - hi for s, hi in zip(a.shape, stops, strict=True))
    return (_t().prim("pad", g, before=starts, after=after),)


def _pad_grad(g, out, a, before, after):
    stops = tuple(lo + s for lo, s in zip(before, a.shape, strict=True))
    return (_t().prim("slice", g, starts=before, stops=stops),)


register(
    Op(
        "slice",
        "movement",
        slice_shape,
        _slice_ref,
        _slice_grad,
        sample=sample_slice,
        attrs=("starts", "stops"),
        cost=0,
    )
)
register(
    Op(
        "pad",
        "movement",
        pad_shape,
        lambda a, before, after: np.pad(a, list(zip(before, after, strict=True))),
        _pad_grad,
        sample=sample_pad,
        attrs=("before", "after"),
        cost=0,
    )
)


# -- concat ----------------------------------------------------------------------------------------
def concat_shape(*shapes, axis):
    first = shapes[0]
    if not 0 <= axis < len(first):
        raise GlcompError(f"concat axis {axis} out of range for rank {len(first)}")
    for s in shapes[1:]:
        if len(s) != len(first) or any(x != y for i, (x, y) in enumerate(zip(s, first)) if i != axis):
            raise GlcompError(f"cannot concatenate shapes {first} and {s} along axis {axis}")
    return first[:axis] + (sum(s[axis] for s in shapes),) + first[axis + 1 :]


def sample_concat(draw):
    base = list(dims(draw, 1, 3, 5))
    axis = draw(st().integers(0, len(base) - 1))
    shapes = []
    for _ in range(draw(st().integers(2, 3))):
        base[axis] = draw(st().integers(1, 4))
        shapes.append(tuple(base))
    return shapes, {"axis": axis}


def _concat_grad(g, out, *inputs, axis):
    grads, at = [], 0
    for x in inputs:
        grads.append(_t().slice_axis(g, axis, at, at + x.shape[axis]))
        at += x.shape[axis]
    return tuple(grads)


register(
    Op(
        "concat",
        "movement",
        concat_shape,
        lambda *arrays, axis: np.concatenate(arrays, axis=axis),
        _concat_grad,
        arity=None,
        sample=sample_concat,
        attrs=("axis",),
        cost=0,
    )
)
