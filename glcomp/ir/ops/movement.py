"""Movement primitives: they only rearrange elements. The code generator folds them into the
addressing of the kernel that reads them, so most cost no draw call: each op's `emit` hook
writes the GLSL that maps an output index to the operand index it reads."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import dims, st
from glcomp.ir.ops.glsl import conjunction, flat, strides
from glcomp.ir.ops.registry import Emitter, Op, register


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


def reshape_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    """The flat index of the output element, unflattened in the operand's shape."""
    g = r.graph
    src = g.operands(n)[0]
    src_shape = g.shape(src)
    lines = [f"int f = {flat(args, g.shape(n))};"]
    src_args = []
    for k, (step, s) in enumerate(zip(strides(src_shape), src_shape)):
        expr = "f" if step == 1 else f"f / {step}"
        src_args.append("0" if s == 1 else (expr if k == 0 else f"imod({expr}, {s})"))
    lines.append(f"return {r.call(src, src_args)};")
    return lines


def reshape_emit4(r: Emitter, n: int, lead: list[str]) -> tuple[list[str], list[int], list[int]] | None:
    """A reshape to the same row length: the same rows, so the same texels (row index unflattened
    in the operand's leading axes)."""
    g = r.graph
    src = g.operands(n)[0]
    shape, src_shape = g.shape(n), g.shape(src)
    if not shape or not src_shape or shape[-1] != src_shape[-1]:
        return None
    lines, src_lead = [], []
    if len(src_shape) > 1:
        lines.append(f"int f = {flat(lead, shape[:-1]) if lead else '0'};")
        for k, (step, s) in enumerate(zip(strides(src_shape[:-1]), src_shape[:-1])):
            expr = "f" if step == 1 else f"f / {step}"
            src_lead.append("0" if s == 1 else (expr if k == 0 else f"imod({expr}, {s})"))
    return [*lines, f"return {r.call4(src, src_lead, 'j0')};"], [src], []


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
        emit=reshape_emit,
        emit4=reshape_emit4,
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


def permute_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    src_args = [""] * len(args)
    for k, p in enumerate(r.graph.attrs(n)["perm"]):
        src_args[p] = args[k]
    return [f"return {r.call(r.graph.operands(n)[0], src_args)};"]


def permute_emit4(r: Emitter, n: int, lead: list[str]) -> tuple[list[str], list[int], list[int]] | None:
    """A permutation of the leading axes only: the operand's texel at the permuted row. A 2-D
    transpose of a stored operand: four of its rows' texels, one component of each."""
    perm = tuple(r.graph.attrs(n)["perm"])
    if perm == (1, 0):
        read = r.texel4t(r.graph.operands(n)[0], lead[0], "j0")
        return None if read is None else ([f"return {read};"], [], [])
    if perm[-1] != len(perm) - 1:
        return None
    src = r.graph.operands(n)[0]
    src_lead = [""] * len(lead)
    for k, p in enumerate(perm[:-1]):
        src_lead[p] = lead[k]
    return [f"return {r.call4(src, src_lead, 'j0')};"], [src], []


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
        emit=permute_emit,
        emit4=permute_emit4,
        view=lambda attrs: "transpose" if tuple(attrs["perm"]) == (1, 0) else None,
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


def expand_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    src = r.graph.operands(n)[0]
    src_args = ["0" if s == 1 else a for a, s in zip(args, r.graph.shape(src))]
    return [f"return {r.call(src, src_args)};"]


def expand_emit4(r: Emitter, n: int, lead: list[str]) -> tuple[list[str], list[int], list[int]] | None:
    """A broadcast: the operand's texel of the row where the last axis is kept (a per-column
    vector such as a bias), else its one value of the row splatted."""
    src = r.graph.operands(n)[0]
    src_shape = r.graph.shape(src)
    args = ["0" if s == 1 else a for a, s in zip(lead, src_shape[:-1])]
    if src_shape[-1] == r.graph.shape(n)[-1]:
        return [f"return {r.call4(src, args, 'j0')};"], [src], []
    return [f"return vec4({r.call(src, [*args, '0'])});"], [], [src]


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
        emit=expand_emit,
        emit4=expand_emit4,
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


def slice_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    src_args = [f"({a} + {lo})" if lo else a for a, lo in zip(args, r.graph.attrs(n)["starts"])]
    return [f"return {r.call(r.graph.operands(n)[0], src_args)};"]


def slice_emit4(r: Emitter, n: int, lead: list[str]) -> tuple[list[str], list[int], list[int]] | None:
    """A slice that starts at a multiple of 4 along the last axis: the operand's texels, shifted."""
    starts = r.graph.attrs(n)["starts"]
    if starts[-1] % 4:
        return None
    src_lead = [f"({a} + {lo})" if lo else a for a, lo in zip(lead, starts[:-1])]
    j0 = f"(j0 + {starts[-1]})" if starts[-1] else "j0"
    return [f"return {r.call4(r.graph.operands(n)[0], src_lead, j0)};"], [r.graph.operands(n)[0]], []


def _pad_indices(
    args: list[str], attrs: dict[str, Any], shape: tuple[int, ...]
) -> tuple[list[str], list[str]]:
    """For output indices `args` of a padding: the conditions that they lie inside the operand,
    and the operand's indices, shifted and clamped into range (read, then selected)."""
    conds, src_args = [], []
    for a, lo, hi, size in zip(args, attrs["before"], attrs["after"], shape):
        if lo:
            conds.append(f"{a} >= {lo}")
        if lo or hi:
            conds.append(f"{a} < {lo + size}")
        shifted = f"{a} - {lo}" if lo else a
        src_args.append(f"iclamp({shifted}, 0, {size - 1})" if lo or hi else a)
    return conds, src_args


def pad_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    g = r.graph
    attrs, src = g.attrs(n), g.operands(n)[0]
    conds, src_args = _pad_indices(args, attrs, g.shape(src))
    # Read at a clamped index, then select: no texture read inside a branch.
    return [f"float x = {r.call(src, src_args)};", f"return {conjunction(conds)} ? x : 0.0;"]


def pad_emit4(r: Emitter, n: int, lead: list[str]) -> tuple[list[str], list[int], list[int]] | None:
    """A padding that starts at a multiple of 4 along the last axis: the operand's texel (read at
    clamped indices, as in pad_emit), each component selected where it lies inside the operand."""
    g = r.graph
    attrs, src = g.attrs(n), g.operands(n)[0]
    src_shape = g.shape(src)
    lo_last, size_last = attrs["before"][-1], src_shape[-1]
    if lo_last % 4:
        return None
    conds, src_lead = _pad_indices(lead, attrs, src_shape)  # zip stops at the lead axes
    j0 = f"iclamp(j0 - {lo_last}, 0, {4 * ((size_last - 1) // 4)})" if lo_last or attrs["after"][-1] else "j0"
    if lo_last:
        conds.append(f"j0 >= {lo_last}")
    # Lane c lies inside the operand where j0 + c < end; with `end` a multiple of 4 that is one
    # test for the whole texel (and none without padding after the operand's last column).
    end = lo_last + size_last
    if attrs["after"][-1] and end % 4 == 0:
        conds.append(f"j0 < {end}")
    lines = [f"vec4 x = {r.call4(src, src_lead, j0)};", f"bool in_rows = {conjunction(conds)};"]
    lanes = [
        f"{conjunction(['in_rows', f'j0 + {c} < {end}'] if end % 4 else ['in_rows'])} ? x.{'xyzw'[c]} : 0.0"
        for c in range(4)
    ]
    return [*lines, f"return vec4({', '.join(lanes)});"], [src], []


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
        emit=slice_emit,
        emit4=slice_emit4,
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
        emit=pad_emit,
        emit4=pad_emit4,
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


def concat_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    """Each operand read at the index shifted to its own range along the axis: a branch per
    operand, or on GLSL ES 1.00 (texture2D must not run under a divergent branch) every operand
    read at a clamped index and the result selected."""
    g = r.graph
    ins = g.operands(n)
    axis, at, lines = g.attrs(n)["axis"], 0, []
    branchless = r.webgl1
    for k, src in enumerate(ins):
        size = g.shape(src)[axis]
        pos = f"{args[axis]} - {at}" if at else args[axis]
        if branchless:
            pos = f"iclamp({pos}, 0, {size - 1})"
        src_args = [pos if i == axis else a for i, a in enumerate(args)]
        value = r.call(src, src_args)
        last = k == len(ins) - 1
        if branchless:
            lines.append(f"float x{k} = {value};")
        else:
            ret = f"return {value};"
            lines.append(ret if last else f"if ({args[axis]} < {at + size}) {ret}")
        at += size
    if branchless:
        expr, at = f"x{len(ins) - 1}", sum(g.shape(i)[axis] for i in ins)
        for k in reversed(range(len(ins) - 1)):
            at -= g.shape(ins[k + 1])[axis]
            expr = f"({args[axis]} < {at} ? x{k} : {expr})"
        lines.append(f"return {expr};")
    return lines


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
        emit=concat_emit,
    )
)
