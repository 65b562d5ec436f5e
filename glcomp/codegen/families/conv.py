"""The convolution family: conv2d (conv2d.frag.j2) and its adjoints in the input
(conv2d_input_grad.frag.j2) and in the weight (conv2d_weight_grad.frag.j2), each a loop over the
window and channels per output element, or a texel at a time from stored operands (`root4`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from glcomp.codegen import cost
from glcomp.codegen.families.base import (
    Lowering,
    RenderContext,
    Rendered,
    Shapes,
    Texture,
    environment,
    register,
    safe_comment,
    texel_params,
)
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.target import Target
from glcomp.ir.ops.conv import part_rows

if TYPE_CHECKING:
    from glcomp.codegen.kernels import Kernel


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
    # Stride-2 input gradients (`strided_columns`): per tap column kj, per output column c of the
    # texel, None where the tap does not land there, else (d, component) in g's row for an output
    # texel of even and of odd index, d counted from `dmin`.
    cols: tuple[tuple[tuple[int, int, int, int] | None, ...], ...] = ()


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
    stride = tuple(g.attrs(n)["stride"])
    if stride[1] not in (1, 2) or (stride[1] == 1 and stride[0] != 1) or g_tex is None:
        return None
    head = r.root4_head(n)
    cg = g.shape(w)[1]  # the input channels of one group (all of them when not grouped)
    if stride[1] == 2:
        dmin, dmax, cols = strided_span(pw, kw)
        return ConvTexel(
            **head, g_tex=g_tex, w_tex=r.texture(w), C=cg, dmin=dmin, D=dmax - dmin + 1, cols=cols
        )
    dmin, dmax = (pw - kw + 1) // 4, (pw + 3) // 4  # texels of g's row around column x0 // 4
    return ConvTexel(**head, g_tex=g_tex, w_tex=r.texture(w), C=cg, dmin=dmin, D=dmax - dmin + 1)


def strided_columns(pw: int, kw: int) -> tuple[int, tuple[tuple[tuple[int, int, int, int] | None, ...], ...]]:
    """Where the taps of a stride-2 input gradient read g's row for the four output columns
    x0 + c of texel t = x0 / 4: tap kj lands on column x0 + c when x0 + c + pw - kj is even (a
    parity fixed by c and kj, x0 being a multiple of 4), at g's column 2t + e, e = (c + pw - kj)
    / 2; with t = 2b + p that is texel b + (2p + e) // 4, component (2p + e) % 4 of g's row,
    so the texels and components depend on t's parity p only. Returns (dmin, cols): the first
    texel relative to b, and per kj and c None (the tap misses) or (d, component) for p = 0 and
    p = 1, d relative to dmin."""
    picks: list[list[tuple[int, int, int, int] | None]] = []
    for kj in range(kw):
        row: list[tuple[int, int, int, int] | None] = []
        for c in range(4):
            u = c + pw - kj
            if u % 2:
                row.append(None)
                continue
            e = u // 2
            row.append(((e // 4), e % 4, (2 + e) // 4, (2 + e) % 4))
        picks.append(row)
    dmin = min(d for row in picks for pick in row if pick is not None for d in (pick[0], pick[2]))
    cols = tuple(
        tuple(None if k is None else (k[0] - dmin, k[1], k[2] - dmin, k[3]) for k in row) for row in picks
    )
    return dmin, cols


Picks = tuple[tuple[tuple[int, int, int, int] | None, ...], ...]  # strided_columns' cols


def strided_span(pw: int, kw: int) -> tuple[int, int, Picks]:
    """(dmin, dmax, cols): `strided_columns` and the last texel of g's row its taps read, relative
    to b as dmin is (the D = dmax - dmin + 1 texels a stride-2 input gradient fetches a row)."""
    dmin, cols = strided_columns(pw, kw)
    return dmin, dmin + max(d for col in cols for p in col if p is not None for d in (p[0], p[2])), cols


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


@dataclass(frozen=True)
class ConvTiling:
    """How one conv2d kernel is register-blocked (conv2d_tiled.frag.j2): product `node` =
    conv2d(x, w) of the stored single-page textures `x` and `w`, R output channels of C output
    texels (4 * C columns) per fragment, written to R * C tiles that a gather draw copies into
    the product's layout. `shape` holds N, C, H, W, O, OH, OW, KH, KW (the source's channels and size, the
    output's channels and size, the window); `stride`, `padding` the conv's. With `adjoint` the
    product is conv2d_input_grad(g, w) at stride 1: the source is g (C = the conv's O), the
    output the input gradient (O = the conv's C), the taps mirrored; at stride 2 along W (C = 1)
    only the taps that land on each column, as input_grad_root4's strided form.
    Guarantee: each output element is the sum the texel kernel (conv2d.frag.j2 root4) computes,
    in the same order; components past the row end are exactly zero."""

    NODE_FIELDS: ClassVar[tuple[str, ...]] = ("node", "x", "w")  # the product, then what it samples

    node: int
    x: int
    w: int
    R: int
    shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    C: int = 1  # output texels along a row per fragment
    S: int = 1  # chunks of the reduction (never split)
    adjoint: bool = False  # conv2d_input_grad (stride 1, or 2 along W): x is g, the loop runs over O

    @property
    def groups(self) -> int:
        """Output-channel groups of R: fragments down the channels."""
        return -(-self.shape[4] // self.R)

    @property
    def row_texels(self) -> int:
        return math.ceil(self.shape[6] / 4)

    @property
    def row_blocks(self) -> int:
        """Blocks of C output texels along a row: fragments across a row."""
        return -(-self.row_texels // self.C)

    def tile_layout(self, max_size: int) -> Layout:
        """Each tile's texture: packed like an (N * OG * OH, 4 * RB) tensor (RB = row_blocks)."""
        n, oh = self.shape[0], self.shape[5]
        return layout_for((n * self.groups * oh, 4 * self.row_blocks), max_size)

    @property
    def tiles(self) -> list[int]:
        """Ids the memory plan uses for the tile temporaries (negative: never IR node ids)."""
        return [-(self.node * 64 + i + 1) for i in range(self.R * self.C)]

    def read_params(self, max_size: int) -> dict[str, Any]:
        """How a reader finds texel (row, j) of the product, row = (n * O + o) * OH + h, in the
        tiles, as the gather draw does (_kernel.j2's tiled fetch): tile (o % R) * C + j % C,
        texel ((n * OG + o / R) * OH + h) * RB + j / C of it; components past OW (`row_len`)
        read as zero."""
        o, oh, ow = self.shape[4:7]
        params = {"kind": "conv", "R": self.R, "C": self.C, "O": o, "OG": self.groups, "OH": oh}
        params |= {"row_len": ow, "RB": self.row_blocks}
        return params | texel_params(self.tile_layout(max_size))

    def render(self, kernel: Kernel, layouts: dict[int, Layout], target: Target) -> tuple[Rendered, Rendered]:
        """The block draw's and the gather draw's shaders."""
        _, c, h, _, o, oh, ow, kh, kw = self.shape
        (sh, sw), (ph, pw) = self.stride, self.padding
        strided = self.adjoint and sw == 2
        if strided:
            dmin, dmax, cols = strided_span(pw, kw)
        else:
            (dmin, dmax), cols = conv_texels(self.adjoint, sw, kw, pw, self.C), ()
        params = {"R": self.R, "CB": self.C, "C": c, "H": h, "O": o, "OG": self.groups, "OH": oh, "OW": ow}
        params |= {"KH": kh, "KW": kw, "SH": sh, "SW": sw, "PH": ph, "PW": pw, "KHS": -(-kh // sh)}
        params |= {"RT": self.row_texels, "RB": self.row_blocks, "strided": strided, "cols": cols}
        params |= {"adjoint": self.adjoint, "max_loop": target.max_loop_iterations}
        texels = f" x {self.C} texels" if self.C > 1 else ""
        name = f"{kernel.name} (tiled {self.R} channels{texels}{' of the adjoint' * self.adjoint})"
        return _render_blocked(
            "conv2d_tiled",
            kernel,
            self.node,
            (("x", self.x), ("w", self.w)),
            self.tiles,
            self.tile_layout(target.max_texture_size),
            layouts,
            params,
            {"kernel_name": name, "dmin": dmin, "D": dmax - dmin + 1},
        )


@dataclass(frozen=True)
class WeightGradTiling:
    """How one conv2d_weight_grad kernel is register-blocked (conv2d_weight_grad_tiled.frag.j2):
    gradient `node` = conv2d_weight_grad(x, g) (in `parts` partial sums) of the stored single-page
    textures `x` and `g`, ungrouped; R output channels x C input channels of one weight texel per
    fragment, written to R * C tiles that a gather draw copies into the gradient's layout. `shape`
    holds N, C, H, W, O, OH, OW, KH, KW. Guarantee: each element is the sum the texel kernel
    (root4) computes, in the same order; components past KW are exactly zero."""

    NODE_FIELDS: ClassVar[tuple[str, ...]] = ("node", "x", "g")  # the gradient, then what it samples

    node: int
    x: int
    g: int
    R: int
    shape: tuple[int, ...]
    stride: tuple[int, int]
    padding: tuple[int, int]
    parts: int = 1
    C: int = 1  # input channels per fragment: R * C render targets
    S: int = 1

    @property
    def groups(self) -> int:
        return -(-self.shape[4] // self.R)

    @property
    def channel_groups(self) -> int:
        return -(-self.shape[1] // self.C)

    def tile_layout(self, max_size: int) -> Layout:
        """Each tile's texture: packed like a (P * OG * CG * KH, 4 * ceil(KW / 4)) tensor."""
        kh, kw = self.shape[7], self.shape[8]
        rows = self.parts * self.groups * self.channel_groups * kh
        return layout_for((rows, 4 * math.ceil(kw / 4)), max_size)

    @property
    def tiles(self) -> list[int]:
        return [-(self.node * 64 + i + 1) for i in range(self.R * self.C)]

    def render(self, kernel: Kernel, layouts: dict[int, Layout], target: Target) -> tuple[Rendered, Rendered]:
        """The block draw's and the gather draw's shaders."""
        n, c, h, _, o, oh, _, kh, kw = self.shape
        (sh, sw), (ph, pw) = self.stride, self.padding
        dmin, dmax = weight_grad_texels(sw, pw, kw)
        params = {"R": self.R, "CC": self.C, "CG": self.channel_groups, "P": self.parts}
        params |= {"L": part_rows(n * oh, self.parts), "N": n, "C": c}
        params |= {"H": h, "O": o, "OG": self.groups, "OH": oh, "KH": kh, "KW": kw}
        params |= {"SH": sh, "SW": sw, "PH": ph, "PW": pw, "RT": math.ceil(kw / 4)}
        params |= {"max_loop": target.max_loop_iterations}
        inputs = f" x {self.C} input channels" if self.C > 1 else ""
        return _render_blocked(
            "conv2d_weight_grad_tiled",
            kernel,
            self.node,
            (("x", self.x), ("g", self.g)),
            self.tiles,
            self.tile_layout(target.max_texture_size),
            layouts,
            params,
            {
                "kernel_name": f"{kernel.name} (tiled {self.R} channels{inputs})",
                "dmin": dmin,
                "D": dmax - dmin + 1,
            },
        )


def weight_grad_texels(sw: int, pw: int, kw: int = 4) -> tuple[int, int]:
    """The first and last texel of x's row, relative to jt + tw * SW, that weight texel jt's taps
    read for the 4 columns of g's texel tw (stride `sw`, padding `pw`); a kernel `kw` < 4 wide
    has only its kw taps in the texel (a 1x1 convolution's one)."""
    return -pw // 4, (3 * sw + min(kw, 4) - 1 - pw) // 4


def weight_grad_fetches(r: int, c: int, d: int, sw: int, row_texels: int) -> int:
    """Texel fetches of a blocked weight-gradient fragment (R output x C input channels) per row
    of g of `row_texels` texels: R of g per texel, and of x per input channel the D texels under
    the taps for the first texel and the SW entering the window for each next."""
    new = min(sw, d)
    return r * row_texels + c * (d - new + new * row_texels)


def choose_weight_grad_tiling(
    graph: Any, kernel: Kernel, layouts: dict[int, Layout], target: Target, extra_draws: int = 0
) -> WeightGradTiling | None:
    """The register-blocked form of a lone conv2d_weight_grad kernel over stored single-page x
    and g (ungrouped), or None: R output channels a fragment share each fetch of x's row and C
    input channels each fetch of g's, and along g's row only the texels entering x's window are
    fetched (weight_grad_fetches); chosen where the saved fetches pay for the gather draw and the
    blocked draws. R * C is at most the target's draw buffers."""
    (n,) = kernel.roots
    attrs = graph.attrs(n)
    if kernel.body or attrs.get("groups", 1) != 1 or layouts[n].pages != 1:
        return None
    x, g = graph.operands(n)
    if not all(v in kernel.leaves and layouts[v].pages == 1 for v in (x, g)):
        return None
    batch, c, h, wd = graph.shape(x)
    o, oh, ow = graph.shape(g)[1:]
    kh, kw = attrs["kernel_hw"]
    (sh, sw), (ph, pw) = attrs["stride"], attrs["padding"]
    parts = attrs.get("parts", 1)
    dmin, dmax = weight_grad_texels(sw, pw, kw)
    d = dmax - dmin + 1
    grt, rt = math.ceil(ow / 4), math.ceil(kw / 4)
    rows = part_rows(batch * oh, parts)  # rows of g per fragment
    texels = parts * o * c * kh * rt
    today = cost.fetches(texels * rows * grt * (1 + d))
    shape = (batch, c, h, wd, o, oh, ow, kh, kw)
    best: tuple[float, int, int] | None = None
    for r in CONV_CHANNELS:
        for ci in sorted({min(i, c) for i in WEIGHT_GRAD_INPUTS}):
            if r * ci > target.max_draw_buffers or r > o:
                continue
            tiling = WeightGradTiling(n, x, g, r, shape, (sh, sw), (ph, pw), parts, ci)
            if tiling.tile_layout(target.max_texture_size).pages != 1:
                continue
            blocks = parts * tiling.groups * tiling.channel_groups * kh * rt
            work = cost.fetches(blocks * rows * weight_grad_fetches(r, ci, d, sw, grt))
            work += cost.fetches(texels * cost.GATHER_FETCHES)
            work += cost.draws(1 + extra_draws, blocked=True, target=target)
            if best is None or work < best[0]:
                best = (work, r, ci)
    if best is None or best[0] >= today:
        return None
    return WeightGradTiling(n, x, g, best[1], shape, (sh, sw), (ph, pw), parts, best[2])


def _render_blocked(
    template_name: str,
    kernel: Kernel,
    node: int,
    sources: tuple[tuple[str, int], tuple[str, int]],
    tiles: list[int],
    tile: Layout,
    layouts: dict[int, Layout],
    params: dict[str, Any],
    block: dict[str, Any],
) -> tuple[Rendered, Rendered]:
    """The block and gather shaders of a blocked convolution kernel: `sources` the two sampled
    operands as (template key, node), `tiles` the tile ids, `params` the template's shape constants
    and `block` what only the block draw needs."""
    samplers = [f"s{n}_0" for _, n in sources]
    tile_names = [f"s{node}_{i}" for i in range(len(tiles))]
    common = params | {
        "webgl1": False,
        "rgba8": False,
        "node_ids": ", ".join(f"%{v}" for v in [*kernel.body, *kernel.roots]),
        "origins": [safe_comment(v) for v in kernel.origins],
        "uniforms": [],
        "ints": [],
        "tile_texels": tile.texels,
        "tile_tex": texel_params(tile),
    }
    template = environment().get_template(f"{template_name}.frag.j2")
    keys = {f"s_{key}": name for (key, _), name in zip(sources, samplers, strict=True)}
    keys |= {f"{key}_tex": texel_params(layouts[n]) for key, n in sources}
    source = template.render(
        common | keys | block | {"mode": "block", "outputs": tile_names, "samplers": samplers}
    )
    out = layouts[node]
    gather = template.render(
        common
        | {
            "mode": "gather",
            "kernel_name": f"{kernel.name} (gather)",
            "outputs": [node],
            "samplers": tile_names,
            "tiles": tile_names,
            "width": out.width,
            "texels": out.texels,
        }
    )
    block_samplers = [(name, n, 0) for name, (_, n) in zip(samplers, sources, strict=True)]
    gather_samplers = [(t, tid, 0) for t, tid in zip(tile_names, tiles, strict=True)]
    return Rendered(source, block_samplers, []), Rendered(gather, gather_samplers, [])


# Output channels per fragment tried by the conv tiling (one render target each).
CONV_CHANNELS = (8, 4, 2)
# Output texels along a row per fragment tried by the conv tiling (R * C render targets): the
# fetches of the source row are shared by the C texels as well as by the R channels.
CONV_TEXELS = (1, 2, 4)
# Input channels per fragment tried by the weight-gradient tiling (R * C render targets): the
# fetches of g's row are shared by the C input channels as well.
WEIGHT_GRAD_INPUTS = (1, 2, 4)


def conv_texels(adjoint: bool, sw: int, kw: int, pw: int, texels: int = 1) -> tuple[int, int]:
    """The first and last texel (relative to the first output texel's own, times the stride) of
    the source row that the taps of `texels` output texels (4 * texels columns) read:
    conv2d_root4's and input_grad_root4's (one texel), the conv tiling's."""
    last = 4 * texels - 1
    if adjoint:
        return (pw - kw + 1) // 4, (pw + last) // 4
    return -pw // 4, (last * sw + kw - 1 - pw) // 4


def choose_conv_tiling(
    graph: Any, kernel: Kernel, layouts: dict[int, Layout], target: Target, extra_draws: int = 0
) -> ConvTiling | None:
    """The register-blocked form of a lone conv2d kernel (or a conv2d_input_grad at stride 1, or 2
    along W with one texel a fragment) over
    stored single-page source and weights (ungrouped), or None: R output channels a fragment share
    each fetch of the source row, so a kernel row of a channel costs D / R + ceil(KW / 4) fetches
    per output texel instead of D + ceil(KW / 4); chosen where the saved fetches pay for the
    gather draw and the blocked draws."""
    (n,) = kernel.roots
    adjoint = graph.op(n) == "conv2d_input_grad"
    if kernel.body or graph.attrs(n).get("groups", 1) != 1 or layouts[n].pages != 1:
        return None
    stride = tuple(graph.attrs(n)["stride"])
    strided = adjoint and stride != (1, 1)
    # A 1x1 window at stride 2 keeps the texel kernel: each weight texel holds one tap there, and
    # blocked it ran slower on the H200 (ResNet's shortcut: 1.07 ms texel-wise, 1.22 ms blocked).
    if strided and (stride[1] != 2 or graph.shape(graph.operands(n)[1])[3] == 1):
        return None
    x, w = graph.operands(n)
    if not all(v in kernel.leaves and layouts[v].pages == 1 for v in (x, w)):
        return None
    batch, c, h, wd = graph.shape(x)
    o, oh, ow = graph.shape(n)[1:]
    kh, kw = graph.shape(w)[2:]
    (sh, sw), (ph, pw) = graph.attrs(n)["stride"], graph.attrs(n)["padding"]
    if strided:  # the kernel rows of one parity, the texels of g's row under the landing taps
        dmin, dmax, _ = strided_span(pw, kw)
        rows = -(-kh // sh)
    else:
        (dmin, dmax), rows = conv_texels(adjoint, sw, kw, pw), kh
    d = dmax - dmin + 1
    wrt, rt = math.ceil(kw / 4), math.ceil(ow / 4)
    texels = batch * o * oh * rt
    today = cost.fetches(texels * c * rows * (d + wrt))
    shape = (batch, c, h, wd, o, oh, ow, kh, kw)
    best: tuple[float, int, int] | None = None
    for r in CONV_CHANNELS:
        for cb in (1,) if strided else CONV_TEXELS:
            if r * cb > target.max_draw_buffers or r > o or cb > rt:
                continue
            tiling = ConvTiling(n, x, w, r, shape, (sh, sw), (ph, pw), C=cb, adjoint=adjoint)
            if tiling.tile_layout(target.max_texture_size).pages != 1:
                continue
            lo, hi = (dmin, dmax) if strided else conv_texels(adjoint, sw, kw, pw, cb)
            blocks = batch * tiling.groups * oh * tiling.row_blocks
            work = cost.fetches(blocks * c * rows * (hi - lo + 1 + r * wrt) + texels * cost.GATHER_FETCHES)
            work += cost.draws(1 + extra_draws, blocked=True, target=target)
            if best is None or work < best[0]:
                best = (work, r, cb)
    if best is None or best[0] >= today:
        return None
    return ConvTiling(n, x, w, best[1], shape, (sh, sw), (ph, pw), C=best[2], adjoint=adjoint)


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
        tiled=choose_conv_tiling,
        tiled_template="conv2d_tiled",
    )
)
register(
    Lowering(
        "conv2d_input_grad",
        "conv2d_input_grad",
        loop_extent=_input_grad_extent,
        root=input_grad_root,
        root4=input_grad_root4,
        tiled=choose_conv_tiling,
        tiled_template="conv2d_tiled",
    )
)
register(
    Lowering(
        "conv2d_weight_grad",
        "conv2d_weight_grad",
        loop_extent=_weight_grad_extent,
        root=weight_grad_root,
        root4=weight_grad_root4,
        tiled=choose_weight_grad_tiling,
        tiled_template="conv2d_weight_grad_tiled",
    )
)
