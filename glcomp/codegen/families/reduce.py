"""The reduction family (reduce.frag.j2): one loop over the reduced elements of an output element,
combined by the op's accumulator, or a texel at a time (`root4`, modes "K" and "L"). logsumexp
runs two such loops in one fragment: the maximum m, then the sum of exp(a - m); it returns
m + log(sum), the two reductions softmax took, in the same order."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from glcomp.codegen.families.base import Call4, Lowering, RenderContext, Shapes, Texture, register
from glcomp.codegen.families.glsl import index_args

# The accumulator of each reduction: (combine over acc and the element a, initial value).
ACCUMULATORS = {"sum": ("acc + a", "0.0"), "max": ("glc_max(acc, a)", "-3.0e38")}
# Ops whose first loop is max's and whose second sums exp(a - m) (see the module docstring).
TWO_PASS = {"logsumexp": "max"}
# Ops whose results stay float32 under storage="f16": logsumexp's absolute rounding error would
# become the relative error of every softmax element exp(x - lse) (2^-7 at lse = 8).
WIDE_OPS = frozenset(TWO_PASS)


@dataclass(frozen=True)
class ReduceRoot:
    """reduce.frag.j2's root: one flat loop of `total` indices, decomposed into the reduced axes
    (`decompose`), the operand read at them (`read`), the accumulator (`init`, `combine`)."""

    total: int
    decompose: list[str]
    read: str
    lead: list[str]  # the leading indices read, for a texel-wise read (mode "K" of a fused input)
    init: str
    combine: str
    lse: bool = False  # logsumexp: a second loop sums exp(a - m) after the first found m


@dataclass(frozen=True)
class ReduceTexel:
    """reduce.frag.j2's root4. Mode "K" (the last axis kept, reduced axes one contiguous block):
    `Q` steps of `step` texels from `row_base` through `x_tex`, or a fused input's texels through
    `x4`. Mode "L" (the last axis reduced with a trailing block): `Qo` outer steps of `Lc` texels.
    Mode "F" (a fused input, the last axis reduced): `Q` steps over its `rt` texels a row and the
    other reduced axes, each texel through `x4`."""

    params4: str
    args4: str
    last: str
    row_len: int
    mode: str
    x_tex: Texture | None
    Q: int = 0
    decompose: list[str] | None = None
    x4: Call4 | None = None
    row_base: str = "0"
    step: int = 0
    row_outer: str = ""
    Qo: int = 0
    Lc: int = 0
    rem: int = 0
    rt: int = 0


def reduce_extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """One loop over the reduced elements of an output element."""
    return math.prod(shapes[0][a] for a in attrs["axes"])


def reduce_root(r: RenderContext, n: int) -> ReduceRoot:
    g = r.graph
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
    op = g.op(n)
    combine, init = ACCUMULATORS[TWO_PASS.get(op, op)]
    lead = read[:-1]
    return ReduceRoot(math.prod(extents), decompose, r.call(src, read), lead, init, combine, op in TWO_PASS)


def reduce_root4(r: RenderContext, n: int) -> ReduceTexel | None:
    """root4 of a reduction over a stored single-page input: mode "K" when the last axis is kept
    and the reduced axes are one contiguous block, mode "L" when the last axis is reduced together
    with every axis after the first of a trailing block. A fused input: its texels read through
    its vec4 function, mode "K" with the last axis kept, mode "F" with it reduced (a texel of
    four elements a step, the padding of a row's last texel masked, where the scalar loop read an
    element and its operands' texels a step: BatchNorm's sums of a fused backward expression)."""
    g = r.graph
    (src,) = g.operands(n)
    tex = r.texture(src)
    shape, axes = g.shape(src), sorted(g.attrs(n)["axes"])
    rank = len(shape)
    head = r.root4_head(n)
    if g.op(n) in TWO_PASS and (tex is None or rank - 1 not in axes):
        return None  # texel-wise only along rows of a stored input (mode "L"); else the scalar loops
    if tex is None and rank - 1 in axes:
        rt = math.ceil(shape[-1] / 4)
        others = [a for a in axes if a != rank - 1]
        decompose, read, stride = [f"int col = {'0' if rt == 1 else f'imod(q, {rt})'};"], index_args(rank), rt
        for a in reversed(others):
            expr = f"q / {stride}"
            decompose.append(f"int r{a} = {expr if a == others[0] else f'imod({expr}, {shape[a]})'};")
            read[a] = f"r{a}"
            stride *= shape[a]
        x4 = r.call4(src, read[:-1], "4 * col")
        return ReduceTexel(
            **head, mode="F", x_tex=None, Q=stride, decompose=decompose, x4=x4, rem=shape[-1] % 4, rt=rt
        )
    if tex is None:
        scalar = reduce_root(r, n)
        x4 = r.call4(src, scalar.lead, "j0")
        return ReduceTexel(**head, mode="K", x_tex=None, Q=scalar.total, decompose=scalar.decompose, x4=x4)
    row_strides = [math.prod(shape[k + 1 : rank - 1]) for k in range(rank)]  # rows per index step
    kept = [k for k in range(rank - 1) if k not in axes]
    base = " + ".join(f"i{k} * {row_strides[k]}" for k in kept) or "0"
    if rank - 1 not in axes:
        if axes != list(range(axes[0], axes[-1] + 1)):
            return None
        q = math.prod(shape[a] for a in axes)
        return ReduceTexel(
            **head, mode="K", x_tex=tex, row_base=base, Q=q, step=row_strides[axes[-1]] * tex.rt
        )
    first = rank - 1  # the trailing block of reduced axes starts here
    while first - 1 in axes:
        first -= 1
    outer = [a for a in axes if a < first]
    decompose, terms, stride = [], [], 1
    for a in reversed(outer):
        expr = "qo" if stride == 1 else f"qo / {stride}"
        decompose.insert(0, f"int r{a} = {expr if a == outer[0] else f'imod({expr}, {shape[a]})'};")
        terms.append(f" + r{a} * {row_strides[a]}")
        stride *= shape[a]
    return ReduceTexel(
        **head,
        mode="L",
        x_tex=tex,
        row_base=base,
        row_outer="".join(reversed(terms)),
        decompose=decompose,
        Qo=math.prod(shape[a] for a in outer),
        Lc=math.prod(shape[first : rank - 1]) * tex.rt,
        rem=shape[-1] % 4,
    )


for _op in [*ACCUMULATORS, *TWO_PASS]:
    register(Lowering(_op, "reduce", loop_extent=reduce_extent, root=reduce_root, root4=reduce_root4))
