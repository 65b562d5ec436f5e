"""The convolution family: conv2d (conv2d.frag.j2) and its adjoints in the input
(conv2d_input_grad.frag.j2) and in the weight (conv2d_weight_grad.frag.j2), each a loop over the
window and channels per output element, or a texel at a time from stored operands (`root4`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from glcomp.codegen.families.base import Lowering, RenderContext, Shapes, Texture, register
from glcomp.ir.ops.conv import part_rows


@dataclass(frozen=True)
class ConvTexel:
    """root4 of the three templates: stored operands read texel-wise (`x_tex`/`g_tex`, `w_tex`),
    each input row as `D` texels from `dmin` on; `C`/`O` the channel counts the template loops
    over where the scalar spec lacks them; `n0`: the first image of a batch chunk."""

    params4: str
    args4: str
    last: str
    row_len: int
    dmin: int
    D: int
    x_tex: Texture | None = None
    g_tex: Texture | None = None
    w_tex: Texture | None = None
    C: int = 0
    O: int = 0  # noqa: E741 (the template's name for the output channels)
    n0: int = 0


def window_spec(attrs: dict[str, Any]) -> dict[str, Any]:
    """Stride and padding as template constants (shared by the conv and pool templates)."""
    stride, pad = attrs["stride"], attrs["padding"]
    return {"SH": stride[0], "SW": stride[1], "PH": pad[0], "PW": pad[1]}


def group_spec(attrs: dict[str, Any], channels_in: int, channels_out: int) -> dict[str, Any]:
    """Grouped convolutions: `G` groups, `CG` input and `OG` output channels per group (the
    templates offset the channel they read by the group's first channel when G > 1)."""
    groups = attrs.get("groups", 1)
    return {"G": groups, "CG": channels_in // groups, "OG": channels_out // groups}


# -- conv2d ----------------------------------------------------------------------------------------
def conv2d_root(r: RenderContext, n: int) -> dict[str, Any]:
    g = r.graph
    ins = g.operands(n)
    x, w = (g.shape(i) for i in ins)
    spec = window_spec(g.attrs(n)) | group_spec(g.attrs(n), x[1], w[0])
    spec |= {"C": w[1], "CX": x[1], "H": x[2], "W": x[3], "KH": w[2], "KW": w[3]}
    return spec | {"x": r.fn(ins[0]), "w": r.fn(ins[1])}


def conv2d_root4(r: RenderContext, n: int) -> ConvTexel:
    g = r.graph
    x, w = g.operands(n)
    pw, kw, sw = g.attrs(n)["padding"][1], g.shape(w)[3], g.attrs(n)["stride"][1]
    dmin, dmax = -pw // 4, (3 * sw + kw - 1 - pw) // 4  # x's row texels from SW * x0 / 4 on
    return ConvTexel(**r.root4_head(n), x_tex=r.texture(x), w_tex=r.texture(w), dmin=dmin, D=dmax - dmin + 1)


# -- conv2d_input_grad: adjoint in x ---------------------------------------------------------------
def input_grad_root(r: RenderContext, n: int) -> dict[str, Any]:
    g = r.graph
    ins = g.operands(n)
    gs, w = (g.shape(i) for i in ins)
    spec = window_spec(g.attrs(n)) | group_spec(g.attrs(n), g.shape(n)[1], gs[1])
    spec |= {"O": w[0] // spec["G"], "OX": gs[1], "OH": gs[2], "OW": gs[3], "KH": w[2], "KW": w[3]}
    return spec | {"g": r.fn(ins[0]), "w": r.fn(ins[1])}


def input_grad_root4(r: RenderContext, n: int) -> ConvTexel | None:
    g = r.graph
    gs, w = g.operands(n)
    pw, kw = g.attrs(n)["padding"][1], g.shape(w)[3]
    g_tex = r.texture(gs)
    if tuple(g.attrs(n)["stride"]) != (1, 1) or g_tex is None:
        return None
    dmin, dmax = (pw - kw + 1) // 4, (pw + 3) // 4  # texels of g's row around column x0 // 4
    head = r.root4_head(n)
    cg = g.shape(w)[1]  # the input channels of one group (all of them when not grouped)
    return ConvTexel(**head, g_tex=g_tex, w_tex=r.texture(w), C=cg, dmin=dmin, D=dmax - dmin + 1)


# -- conv2d_weight_grad: adjoint in w --------------------------------------------------------------
def weight_grad_root(r: RenderContext, n: int) -> dict[str, Any]:
    g = r.graph
    ins = g.operands(n)
    x, gs = (g.shape(i) for i in ins)
    spec = window_spec(g.attrs(n)) | group_spec(g.attrs(n), x[1], gs[1])
    parts = g.attrs(n).get("parts", 1)
    spec |= {"N": x[0], "H": x[2], "W": x[3], "OH": gs[2], "OW": gs[3], "O": gs[1]}
    spec |= {"P": parts, "L": part_rows(x[0] * gs[2], parts)}
    return spec | {"x": r.fn(ins[0]), "g": r.fn(ins[1])}


def _batch_view(g: Any, n: int) -> tuple[int, int]:
    """(source, first image) of `n`: a slice of whole images (batch axis only) is read from its
    source's texture from that image on; any other node is its own source from image 0."""
    if g.op(n) != "slice":
        return n, 0
    (src,) = g.operands(n)
    starts, stops = g.attrs(n)["starts"], g.attrs(n)["stops"]
    if any(starts[1:]) or tuple(stops[1:]) != g.shape(src)[1:]:
        return n, 0
    return src, starts[0]


def weight_grad_root4(r: RenderContext, n: int) -> ConvTexel | None:
    g = r.graph
    (x, n0), (gs, g0) = (_batch_view(g, i) for i in g.operands(n))
    if n0 != g0:  # one batch chunk of both operands (a part of a split weight gradient), or neither
        (x, n0), (gs, g0) = (g.operands(n)[0], 0), (g.operands(n)[1], 0)
    pw = g.attrs(n)["padding"][1]
    x_tex, g_tex = r.texture(x), r.texture(gs)
    if x_tex is None or g_tex is None:
        return None
    sw = g.attrs(n)["stride"][1]
    dmin, dmax = -pw // 4, (3 * sw + 3 - pw) // 4  # x's row texels from SW * tw + kj0 / 4 on
    return ConvTexel(
        **r.root4_head(n),
        x_tex=x_tex,
        g_tex=g_tex,
        O=g.shape(gs)[1],
        C=g.shape(x)[1],
        n0=n0,
        dmin=dmin,
        D=dmax - dmin + 1,
    )


def _extent(*axes: tuple[int, int]) -> Any:
    """A loop extent: the product of the given (operand, axis) sizes of the input shapes."""

    def extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
        out = 1
        for i, a in axes:
            out *= shapes[i][a]
        return out

    return extent


def _weight_grad_extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """The weight gradient's loop: the (image, output position) terms of one part."""
    g = shapes[1]
    return part_rows(g[0] * g[2], attrs.get("parts", 1)) * g[3]


def _input_grad_extent(shapes: Shapes, attrs: dict[str, Any]) -> int:
    """The input gradient's loop: the output channels of one group times the taps that can land
    on one input position (ceil(KH / SH) x ceil(KW / SW))."""
    w, (sh, sw) = shapes[1], attrs["stride"]
    return w[0] // attrs.get("groups", 1) * -(-w[2] // sh) * -(-w[3] // sw)


register(
    Lowering(
        "conv2d",
        "conv2d",
        loop_extent=_extent((1, 1), (1, 2), (1, 3)),
        root=conv2d_root,
        root4=conv2d_root4,
    )
)
register(
    Lowering(
        "conv2d_input_grad",
        "conv2d_input_grad",
        loop_extent=_input_grad_extent,
        root=input_grad_root,
        root4=input_grad_root4,
    )
)
register(
    Lowering(
        "conv2d_weight_grad",
        "conv2d_weight_grad",
        loop_extent=_weight_grad_extent,
        root=weight_grad_root,
        root4=weight_grad_root4,
    )
)
