"""The movement and index family: ops fused into the addressing of the kernel that reads them.

Each op's `emit` writes the GLSL that maps an output index to the operand index it reads (most
cost no draw call); `emit4` writes the texel form where a texel of the output is a texel (or a
row value) of the operand. Templates: none of their own (the map kernel's functions).
"""

from __future__ import annotations

import math

from glcomp.codegen.families.base import Lowering, RenderContext, Vec4Body, register
from glcomp.codegen.families.glsl import conjunction, flat, glsl_float, strides
from glcomp.ir.graph import Graph


# -- reshape -------------------------------------------------------------------------------------
def reshape_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
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


def reshape_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
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
    return Vec4Body([*lines, f"return {r.call4(src, src_lead, 'j0')};"], [src], [])


# -- permute -------------------------------------------------------------------------------------
def permute_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    src_args = [""] * len(args)
    for k, p in enumerate(r.graph.attrs(n)["perm"]):
        src_args[p] = args[k]
    return [f"return {r.call(r.graph.operands(n)[0], src_args)};"]


def permute_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
    """A permutation of the leading axes only: the operand's texel at the permuted row. A 2-D
    transpose of a stored operand: four of its rows' texels, one component of each."""
    perm = tuple(r.graph.attrs(n)["perm"])
    src = r.graph.operands(n)[0]
    if perm == (1, 0):
        read = r.texel4t(src, lead[0], "j0")
        return None if read is None else Vec4Body([f"return {read};"], [], [], [read.node])
    if perm[-1] != len(perm) - 1:
        return None
    src_lead = [""] * len(lead)
    for k, p in enumerate(perm[:-1]):
        src_lead[p] = lead[k]
    return Vec4Body([f"return {r.call4(src, src_lead, 'j0')};"], [src], [])


# -- expand (broadcast) ---------------------------------------------------------------------------
def expand_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    src = r.graph.operands(n)[0]
    src_args = ["0" if s == 1 else a for a, s in zip(args, r.graph.shape(src))]
    return [f"return {r.call(src, src_args)};"]


def expand_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
    """A broadcast: the operand's texel of the row where the last axis is kept (a per-column
    vector such as a bias), else its one value of the row splatted."""
    src = r.graph.operands(n)[0]
    src_shape = r.graph.shape(src)
    args = ["0" if s == 1 else a for a, s in zip(lead, src_shape[:-1])]
    if src_shape[-1] == r.graph.shape(n)[-1]:
        return Vec4Body([f"return {r.call4(src, args, 'j0')};"], [src], [])
    return Vec4Body([f"return vec4({r.call(src, [*args, '0'])});"], [], [src])


# -- slice / pad ---------------------------------------------------------------------------------
def slice_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    src_args = [f"({a} + {lo})" if lo else a for a, lo in zip(args, r.graph.attrs(n)["starts"])]
    return [f"return {r.call(r.graph.operands(n)[0], src_args)};"]


def slice_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
    """A slice that starts at a multiple of 4 along the last axis: the operand's texels, shifted."""
    starts = r.graph.attrs(n)["starts"]
    if starts[-1] % 4:
        return None
    src = r.graph.operands(n)[0]
    src_lead = [f"({a} + {lo})" if lo else a for a, lo in zip(lead, starts[:-1])]
    j0 = f"(j0 + {starts[-1]})" if starts[-1] else "j0"
    return Vec4Body([f"return {r.call4(src, src_lead, j0)};"], [src], [])


def _pad_indices(args: list[str], attrs: dict, shape: tuple[int, ...]) -> tuple[list[str], list[str]]:
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


def pad_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    g = r.graph
    attrs, src = g.attrs(n), g.operands(n)[0]
    conds, src_args = _pad_indices(args, attrs, g.shape(src))
    # Read at a clamped index, then select: no texture read inside a branch.
    return [f"float x = {r.call(src, src_args)};", f"return {conjunction(conds)} ? x : 0.0;"]


def pad_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
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
    return Vec4Body([*lines, f"return vec4({', '.join(lanes)});"], [src], [])


# -- concat ----------------------------------------------------------------------------------------
def concat_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
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
        lines.append(f"return {_select_operand(args[axis], [g.shape(i)[axis] for i in ins])};")
    return lines


def _select_operand(index: str, sizes: list[int]) -> str:
    """The branchless selection of a concatenation's operand values x0, x1, ... by `index`
    along the axis (operand k covering `sizes[k]` positions after the previous ones)."""
    expr, at = f"x{len(sizes) - 1}", sum(sizes)
    for k in reversed(range(len(sizes) - 1)):
        at -= sizes[k + 1]
        expr = f"({index} < {at} ? x{k} : {expr})"
    return expr


def concat_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
    """A concatenation along a leading axis, or along the last where every operand's length is a
    multiple of 4: each output texel lies in one operand's texel, read whole at the shifted index
    (a branch per operand, or on GLSL ES 1.00 every operand read at a clamped index and the
    texel selected, as in concat_emit). Other concatenations are gathered per component."""
    g = r.graph
    ins = g.operands(n)
    rank = len(g.shape(n))
    axis = g.attrs(n)["axis"] % rank
    last = axis == rank - 1
    if last and any(g.shape(src)[axis] % 4 for src in ins):
        return None
    index = "j0" if last else lead[axis]
    branchless = r.webgl1
    at, lines = 0, []
    for k, src in enumerate(ins):
        size = g.shape(src)[axis]
        pos = f"{index} - {at}" if at else index
        if branchless:
            pos = f"iclamp({pos}, 0, {size - (4 if last else 1)})"
        src_lead = [pos if i == axis else a for i, a in enumerate(lead)]
        value = r.call4(src, src_lead, f"({pos})" if last else "j0")
        if branchless:
            lines.append(f"vec4 x{k} = {value};")
        elif k == len(ins) - 1:
            lines.append(f"return {value};")
        else:
            lines.append(f"if ({index} < {at + size}) return {value};")
        at += size
    if branchless:
        lines.append(f"return {_select_operand(index, [g.shape(i)[axis] for i in ins])};")
    return Vec4Body(lines, list(dict.fromkeys(ins)), [])


# -- one_hot (index) -------------------------------------------------------------------------------
def one_hot_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    """The label read at the leading indices, rounded, compared with the last index."""
    label = r.call(r.graph.operands(n)[0], args[:-1])
    return [f"return int(floor({label} + 0.5)) == {args[-1]} ? 1.0 : 0.0;"]


def one_hot_emit4(r: RenderContext, n: int, lead: list[str]) -> Vec4Body | None:
    """The texel of a one-hot row: the row's label read once, compared with each column."""
    src = r.graph.operands(n)[0]
    lanes = [f"k == j0{f' + {c}' if c else ''} ? 1.0 : 0.0" for c in range(4)]
    lines = [f"int k = int(floor({r.call(src, lead)} + 0.5));", f"return vec4({', '.join(lanes)});"]
    return Vec4Body(lines, [], [src])


# -- const (a source written into the shader) ------------------------------------------------------
def const_emit(r: RenderContext, n: int, args: list[str]) -> list[str]:
    """The constant's literal; a zero that reaches a product reads the zero uniform instead
    (`zero_reaches_product`): shader compilers fold ``x * 0.0`` to 0 whatever x is, where IEEE
    (and the reference) give nan for an infinite or nan x."""
    value = r.graph.attrs(n)["value"]
    if zero_reaches_product(r.graph, n):
        return [f"return {'-' if math.copysign(1.0, value) < 0 else ''}float({ZERO_UNIFORM});"]
    return [f"return {glsl_float(value)};"]


# The integer uniform every draw of a program that reads it sets to 0 (a draw's {"int": 0}):
# a zero no shader compiler can see, so none folds away what multiplying by it gives.
ZERO_UNIFORM = "u_zero"
# Ops through which a constant reaches its readers unchanged (views of its one value).
_PASSING = frozenset({"reshape", "permute", "expand", "slice", "pad", "concat", "stop_gradient"})
# Ops that multiply or divide by their operands: a literal zero operand lets a compiler replace
# the result by 0 (Mesa's GLSL front end does even for `precise` and `invariant` values, as does
# SwiftShader), though inf * 0, nan * 0 and 0 / 0 are nan.
_PRODUCTS = frozenset({"mul", "div", "matmul", "bmm", "conv2d", "conv2d_input_grad", "conv2d_weight_grad"})


def zero_reaches_product(graph: Graph, n: int) -> bool:
    """Whether const node `n` is a zero (either sign) that a product reads, directly or through
    views (`_PASSING`). Other zeros (added, compared, selected, the maximum's bound) and every
    other constant stay literals: no IEEE result depends on their not being folded."""
    if graph.op(n) != "const" or graph.attrs(n)["value"] != 0.0:
        return False
    seen, todo = {n}, [n]
    while todo:
        for user in graph.users(todo.pop()):
            op = graph.op(user)
            if op in _PRODUCTS:
                return True
            if op in _PASSING and user not in seen:
                seen.add(user)
                todo.append(user)
    return False


register(Lowering("reshape", "map", emit=reshape_emit, emit4=reshape_emit4))
register(Lowering("permute", "map", emit=permute_emit, emit4=permute_emit4))
register(Lowering("expand", "map", emit=expand_emit, emit4=expand_emit4))
register(Lowering("slice", "map", emit=slice_emit, emit4=slice_emit4))
register(Lowering("pad", "map", emit=pad_emit, emit4=pad_emit4))
register(Lowering("concat", "map", emit=concat_emit, emit4=concat_emit4))
register(Lowering("one_hot", "map", emit=one_hot_emit, emit4=one_hot_emit4))
register(Lowering("const", "map", emit=const_emit))
