"""The pooling family: max and average pooling (pool.frag.j2, the op's accumulator over the
window) and their input gradients (max_pool2d_grad.frag.j2, avg_pool2d_grad.frag.j2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from glcomp.codegen.families.base import Lowering, RenderContext, Shapes, Texture, register
from glcomp.codegen.families.conv import window_spec

# The accumulator of each pooling op: (combine over acc and the element a, initial value, final).
ACCUMULATORS = {
    "max_pool2d": ("glc_max(acc, a)", "-3.0e38", "acc"),
    "avg_pool2d": ("acc + a", "0.0", "acc / float(KH * KW)"),
}


@dataclass(frozen=True)
class _Texel:
    """A pooling template's root4 reading the stored input `x_tex` (C channels) by texels."""

    params4: str
    args4: str
    last: str
    row_len: int
    x_tex: Texture
    C: int


@dataclass(frozen=True)
class PoolTexel(_Texel):
    """pool.frag.j2's root4: a texel of the output, each row of x read as `D` texels from `dmin` on."""

    dmin: int
    D: int


def window_extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """One loop over the window of an output element."""
    return math.prod(attrs["kernel"])


def pool_root(r: RenderContext, n: int) -> dict[str, Any]:
    """pool.frag.j2's root: the op's accumulator (init, combine, final) over the window."""
    g = r.graph
    (x,) = g.operands(n)
    h, w = g.shape(x)[2:]
    kh, kw = g.attrs(n)["kernel"]
    combine, init, final = ACCUMULATORS[g.op(n)]
    spec = window_spec(g.attrs(n)) | {"H": h, "W": w, "KH": kh, "KW": kw, "x": r.fn(x)}
    return spec | {"init": init, "combine": combine, "final": final}


def pool_root4(r: RenderContext, n: int) -> PoolTexel | None:
    g = r.graph
    (x,) = g.operands(n)
    x_tex = r.texture(x)
    if x_tex is None:
        return None
    pw, kw, sw = g.attrs(n)["padding"][1], g.attrs(n)["kernel"][1], g.attrs(n)["stride"][1]
    dmin, dmax = -pw // 4, (3 * sw + kw - 1 - pw) // 4  # x's row texels from SW * x0 / 4 on
    return PoolTexel(**r.root4_head(n), x_tex=x_tex, C=g.shape(x)[1], dmin=dmin, D=dmax - dmin + 1)


def max_pool_grad_root(r: RenderContext, n: int) -> dict[str, Any]:
    g = r.graph
    ins = g.operands(n)
    x, gs = (g.shape(i) for i in ins)
    kh, kw = g.attrs(n)["kernel"]
    spec = window_spec(g.attrs(n)) | {"H": x[2], "W": x[3], "KH": kh, "KW": kw, "OH": gs[2], "OW": gs[3]}
    return spec | {"x": r.fn(ins[0]), "g": r.fn(ins[1])}


@dataclass(frozen=True)
class MaxPoolGradTexel(_Texel):
    """max_pool2d_grad.frag.j2's root4 for windows that do not overlap (stride = kernel, no
    padding, KW dividing 4, rows of whole texels): the input texel (n, c, h, w0..w0+3) holds
    4 / KW whole windows of one window row."""


def max_pool_grad_root4(r: RenderContext, n: int) -> MaxPoolGradTexel | None:
    """The texel form where each input element lies in at most one window: KH texel reads of x
    and 4 / KW reads of the gradient per texel, where the scalar form re-finds the maximum of
    every window a tap could belong to (KH * KW windows of KH * KW reads per element). The
    windows' maxima are found in the scalar form's order with its comparisons, so the values
    are the scalar form's bit for bit."""
    g = r.graph
    x, _ = g.operands(n)
    attrs = g.attrs(n)
    kh, kw = attrs["kernel"]
    w = g.shape(x)[3]
    if tuple(attrs["stride"]) != (kh, kw) or any(attrs["padding"]) or 4 % kw or w % 4:
        return None
    x_tex = r.texture(x)
    if x_tex is None:
        return None
    return MaxPoolGradTexel(**r.root4_head(n), x_tex=x_tex, C=g.shape(x)[1])


def max_pool_grad_reads(shapes: Shapes, attrs: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    """Per tap of the output window: an inner argmax loop over the input window (reading x at
    each of its taps) and one read of the gradient."""
    window = math.prod(attrs["kernel"])
    return window, (window, 1)


def avg_pool_grad_root(r: RenderContext, n: int) -> dict[str, Any]:
    g = r.graph
    (gs_node,) = g.operands(n)
    gs = g.shape(gs_node)
    kh, kw = g.attrs(n)["kernel"]
    spec = window_spec(g.attrs(n)) | {"KH": kh, "KW": kw, "OH": gs[2], "OW": gs[3]}
    return spec | {"g": r.fn(gs_node)}


for _op in ACCUMULATORS:
    register(Lowering(_op, "pool", loop_extent=window_extent, root=pool_root, root4=pool_root4))
register(
    Lowering(
        "max_pool2d_grad",
        "max_pool2d_grad",
        loop_extent=window_extent,
        loop_reads=max_pool_grad_reads,
        root=max_pool_grad_root,
        root4=max_pool_grad_root4,
    )
)


def landing_extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """One loop over the taps of the window that can land on an input position: ceil(KH / SH) x
    ceil(KW / SW) (avg_pool2d_grad.frag.j2)."""
    (kh, kw), (sh, sw) = attrs["kernel"], attrs["stride"]
    return -(-kh // sh) * -(-kw // sw)


register(Lowering("avg_pool2d_grad", "avg_pool2d_grad", loop_extent=landing_extent, root=avg_pool_grad_root))
