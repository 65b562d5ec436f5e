"""The matmul family: (M, K) @ (K, N) products, one output texel per fragment (matmul.frag.j2:
`root`, `root4`, `root4t`) or register-blocked (matmul_tiled.frag.j2, `Tiling`/`render_tiled`).

Blocking. The texel kernel fetches 5 texels per 16 multiply-adds (a texel of A and 4 rows of the
right operand). A tiled kernel computes an R x C block of output texels per fragment and writes it
to R * C render targets ("tiles"); the A and B texels it fetches are shared by the whole block,
(R + 4 C) fetches per 16 R C multiply-adds. A cheap second draw ("gather") copies the tiles into
the product's normal packed layout, so readers see an ordinary texture.

Split K. A product with few output texels and a long K (a Linear into ten classes from 4096
features: 40 texels, 1024 steps of 4) runs serially in a handful of fragments, almost no parallelism
on any GPU. Its block draw is split over `S` chunks of K: the tiles hold S partial products per
output texel (chunk s in the grid's rows s * fh ... (s + 1) * fh - 1) and the gather adds them up, so
both draws loop about sqrt(K / 4) times in many fragments.

The tiling pass (glcomp.codegen.passes.tiling) chooses which kernels are tiled.
Guarantee: every draw computes each output element as the same dot product over K as the
reference (summation order aside), and components past the row end are exactly zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from glcomp.codegen.families.base import (
    Fn4,
    Lowering,
    RenderContext,
    Rendered,
    Texture,
    environment,
    register,
    safe_comment,
    texel_params,
)
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.target import Target

if TYPE_CHECKING:
    from glcomp.codegen.kernels import Kernel


@dataclass(frozen=True)
class Operand:
    """How a texel root reads one operand of the product, a texel at a time: `form` "rows" (the
    stored texture `tex` along its rows), "transposed" (A: the transpose of a stored (K, M) texture
    `tex`, its texel along K picked from four rows; B: the transpose of a stored (N, K) texture
    `tex`, read along its rows) or "vec4" (a fused operand's vec4 function `fn4`)."""

    form: str
    tex: Texture | None = None
    fn4: Fn4 | None = None


def _operand(r: RenderContext, n: int) -> Operand:
    """`n` read texel-wise: its own texture, the texture its 2-D transpose reads, or its vec4
    function."""
    tex = r.texture(n)
    if tex is not None:
        return Operand("rows", tex)
    g = r.graph
    if g.op(n) == "permute" and tuple(g.attrs(n)["perm"]) == (1, 0):
        src = r.texture(g.operands(n)[0])
        if src is not None:
            return Operand("transposed", src)
    return Operand("vec4", fn4=r.fn4(n))


@dataclass(frozen=True)
class MatmulRoot:
    """matmul.frag.j2's root: a dot product of length K of a row of A (`a`) and a column of B."""

    K: int
    a: str
    b: str


@dataclass(frozen=True)
class MatmulTexel:
    """matmul.frag.j2's root4: the texel (n[i0, j0 + c])_c, K stepped by 4; A and B as `Operand`s."""

    params4: str
    args4: str
    last: str
    row_len: int
    K: int
    N: int
    A: Operand
    B: Operand


@dataclass(frozen=True)
class MatmulColumn:
    """matmul.frag.j2's root4t: the column texel (n[j0 + c, i0])_c of the product read transposed;
    `s_tex`: A is the transpose of that stored (K, M) texture; `b_tex`: B is stored."""

    transposed: bool
    last: str
    args4: str
    K: int
    M: int
    a: str
    b: str
    s_tex: Texture | None
    b_tex: Texture | None


def matmul_extent(shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> int:
    """One loop over K per output element."""
    return shapes[0][1]


def matmul_root(r: RenderContext, n: int) -> MatmulRoot:
    a, b = r.graph.operands(n)
    return MatmulRoot(r.graph.shape(a)[1], r.fn(a), r.fn(b))


def matmul_root4(r: RenderContext, n: int) -> MatmulTexel:
    g = r.graph
    a, b = g.operands(n)
    return MatmulTexel(
        **r.root4_head(n), K=g.shape(a)[1], N=g.shape(b)[1], A=_operand(r, a), B=_operand(r, b)
    )


def matmul_root4t(r: RenderContext, n: int) -> MatmulColumn:
    g = r.graph
    a, b = g.operands(n)
    s_tex = r.texture(g.operands(a)[0]) if g.op(a) == "permute" and a not in r.textures else None
    return MatmulColumn(
        transposed=True,
        last="i0",  # the cache is read by the row index
        args4="i0, j0",
        K=g.shape(a)[1],
        M=g.shape(a)[0],
        a=r.fn(a),
        b=r.fn(b),
        s_tex=s_tex,
        b_tex=r.texture(b),
    )


register(
    Lowering(
        "matmul",
        "matmul",
        loop_extent=matmul_extent,
        root=matmul_root,
        root4=matmul_root4,
        root4t=matmul_root4t,
    )
)


# -- bmm: a batch of products, one draw over the whole batch ----------------------------------------
def bmm_extent(shapes: list[tuple[int, ...]], attrs: dict[str, Any]) -> int:
    """One loop over K per output element."""
    return shapes[0][2]


def bmm_root(r: RenderContext, n: int) -> MatmulRoot:
    a, b = r.graph.operands(n)
    return MatmulRoot(r.graph.shape(a)[2], r.fn(a), r.fn(b))


def bmm_root4(r: RenderContext, n: int) -> MatmulTexel:
    """bmm.frag.j2's root4: the texel (n[i0, i1, j0 + c])_c, K stepped by 4. A is read through its
    vec4 function (A's texel (i0, i1, k0..k0+3)); B by rows (form "vec4": B's texel (i0, k, j0..))
    or, where B is the transpose of the last two axes of S (q @ k.transpose(-2, -1)), along S's
    rows (form "transposed": S's texel (i0, j0 + c, k0..k0+3), one dot product per column)."""
    g = r.graph
    a, b = g.operands(n)
    # B the transpose of S, fused here (not a stored value of its own, which is read by rows).
    if b not in r.textures and g.op(b) == "permute" and tuple(g.attrs(b)["perm"]) == (0, 2, 1):
        right = Operand("transposed", fn4=r.fn4(g.operands(b)[0]))
    else:
        right = Operand("vec4", fn4=r.fn4(b))
    head = r.root4_head(n)
    return MatmulTexel(**head, K=g.shape(a)[2], N=g.shape(b)[2], A=Operand("vec4", fn4=r.fn4(a)), B=right)


register(Lowering("bmm", "bmm", loop_extent=bmm_extent, root=bmm_root, root4=bmm_root4))


@dataclass(frozen=True)
class Tiling:
    """How one matmul kernel is tiled: product `node` = A @ B with A the stored texture `a`
    (a_form "a") or the transpose of stored X `a` (a_form "t": a weight gradient's x.T, or with
    `batch_rows` the batch transpose of a stored (Bt, K, Mb) X; R a multiple of 4), B the stored
    texture `b` (form "b") or the transpose of stored W `b` (form "w"); R x C output texels per
    fragment; K split into `S` chunks (1: not split), their partial products added by the gather."""

    NODE_FIELDS: ClassVar[tuple[str, ...]] = ("node", "a", "b")  # the product, then what it samples

    node: int
    a: int
    b: int
    form: str
    R: int
    C: int
    M: int
    K: int
    N: int
    S: int = 1
    a_form: str = "a"
    batch_rows: int = 0  # a batched product (bmm): A's rows per batch element (M of each), R dividing it

    @property
    def grid(self) -> tuple[int, int]:
        """Fragments across and down the block grid of one chunk of K: (column texel groups,
        row groups)."""
        return -(-math.ceil(self.N / 4) // self.C), -(-self.M // self.R)

    def tile_layout(self, max_size: int) -> Layout:
        """Each tile's texture: the grid's texels in row-major order, packed like a tensor of
        (S * row groups, 4 x column texel groups) (power-of-two sides, as every bundle texture)."""
        fw, fh = self.grid
        return layout_for((self.S * fh, 4 * fw), max_size)

    @property
    def tiles(self) -> list[int]:
        """Ids the memory plan uses for the tile temporaries (negative: never IR node ids)."""
        return [-(self.node * 64 + i + 1) for i in range(self.R * self.C)]

    def render(self, kernel: Kernel, layouts: dict[int, Layout], target: Target) -> tuple[Rendered, Rendered]:
        """The block draw's and the gather draw's shaders (`render_tiled`)."""
        return render_tiled(self, kernel, layouts, target)

    def read_params(self, max_size: int) -> dict[str, Any] | None:
        """How a reader finds texel (row, j) of the product in the tiles, as the gather draw does
        (_kernel.j2's tiled fetch): tile (row % R) * C + j % C, texel (row / R) * fw + j / C of it;
        components past N (`row_len`) read as zero. None when K is split (the gather sums the
        chunks)."""
        if self.S != 1:
            return None
        tile = self.tile_layout(max_size)
        return {
            "kind": "matmul",
            "R": self.R,
            "C": self.C,
            "row_len": self.N,
            "fw": tile.row_texels,
        } | texel_params(tile)


def render_tiled(
    tiling: Tiling, kernel: Kernel, layouts: dict[int, Layout], target: Target
) -> tuple[Rendered, Rendered]:
    """The block draw's and the gather draw's shaders (samplers named by node and page; the
    gather's samplers are the tiles, "page" 0 of each tile id in `tiling.tiles`)."""
    t = tiling
    sa, sb = f"s{t.a}_0", f"s{t.b}_0"  # one sampler when A and B are one texture (x @ x.T)
    tiles = [f"s{t.node}_{i}" for i in range(t.R * t.C)]
    common = {
        "webgl1": False,
        "rgba8": False,  # the tiling pass is off with rgba8 storage (these draws write float texels)
        "node_ids": ", ".join(f"%{n}" for n in [*kernel.body, *kernel.roots]),
        "origins": [safe_comment(o) for o in kernel.origins],
        "uniforms": [],
        "ints": [],
        "R": t.R,
        "C": t.C,
        "M": t.M,
        "K": t.K,
        "N": t.N,
        "S": t.S,
        "form": t.form,
        "a_form": t.a_form,
        "batch_rows": t.batch_rows,
        "max_loop": target.max_loop_iterations,
    }
    template = environment().get_template("matmul_tiled.frag.j2")
    tile = t.tile_layout(target.max_texture_size)
    common |= {
        "fw": tile.row_texels,
        "fh": t.grid[1],
        "tile_texels": tile.texels,
        "tile_tex": texel_params(tile),
    }
    block = template.render(
        common
        | {
            "mode": "block",
            "kernel_name": f"{kernel.name} (tiled {t.R}x{t.C})",
            "outputs": tiles,
            "samplers": [sa] if sa == sb else [sa, sb],
            "s_a": sa,
            "s_b": sb,
            # The operands may be row or texel views of t.a / t.b (a reshape when K is split, a
            # Flatten before a Linear): their rows are the product's, K (A), M (X of A = X.T), N
            # (B) or K (W) long, whatever the stored texture's own rows are.
            "a_tex": texel_params(layouts[t.a])
            | {"rt": math.ceil((t.K if t.a_form == "a" else t.batch_rows or t.M) / 4)},
            "b_tex": texel_params(layouts[t.b]) | {"rt": math.ceil((t.N if t.form == "b" else t.K) / 4)},
        }
    )
    out = layouts[t.node]
    gather = template.render(
        common
        | {
            "mode": "gather",
            "kernel_name": f"{kernel.name} (gather)",
            "outputs": [t.node],
            "samplers": tiles,
            "tiles": tiles,
            "width": out.width,
            "texels": out.texels,
            "rt": out.row_texels,
        }
    )
    block_samplers = [(sa, t.a, 0)] + ([(sb, t.b, 0)] if sb != sa else [])
    gather_samplers = [(s, tid, 0) for s, tid in zip(tiles, t.tiles)]
    return Rendered(block, block_samplers, []), Rendered(gather, gather_samplers, [])
