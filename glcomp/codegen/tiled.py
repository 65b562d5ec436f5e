"""Register-blocked (tiled) matmul: one fragment computes R rows x C column texels of a product.

Today's matmul kernel computes one output texel per fragment and fetches 5 texels per 16
multiply-adds (a texel of A and 4 rows of the right operand). A tiled kernel computes an R x C
block of output texels per fragment and writes it to R * C render targets ("tiles"); the A and B
texels it fetches are shared by the whole block, (R + 4 C) fetches per 16 R C multiply-adds. A
cheap second draw ("gather") copies the tiles into the product's normal packed layout, so readers
see an ordinary texture.

Split K. A product with few output texels and a long K (a Linear into ten classes from 4096
features: 40 texels, 1024 steps of 4) runs serially in a handful of fragments, almost no parallelism
on any GPU. Its block draw is split over `S` chunks of K: the tiles hold S partial products per
output texel (chunk s in the grid's rows s * fh ... (s + 1) * fh - 1) and the gather adds them up, so
both draws loop about sqrt(K / 4) times in many fragments.

Chosen per kernel by `choose_tiling`: a kernel whose only root is a matmul of two stored
single-page textures (A, or a reshape of a stored texture in the same texel order, and B or the
transpose of a stored W), on a GLSL ES 3.00 target with at least 2 draw buffers, when the fetches
saved outweigh the extra draw; the block shape is the one with the fewest fetches per output texel
among those fitting the target's draw buffers. A product with at most `FEW_TEXELS` output texels and
at least `LONG_STEPS` steps of K is split over K instead (1 x 1 blocks, chunks of whole texels).
Guarantee: the tiled draws compute every output element as the same dot products over K as the
reference (summation order aside), and components past the row end are exactly zero.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from glcomp.codegen import cost
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.plan import Kernel
from glcomp.codegen.render import FUSED_ROOT, Rendered, environment, safe_comment
from glcomp.codegen.target import Target
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op

# Block shapes (R rows, C column texels) tried, R * C render targets each.
SHAPES = ((8, 1), (4, 2), (4, 1), (2, 2), (2, 1))
# The gather pass's work per output texel, in texel fetches (one fetch, one write).
GATHER_FETCHES = 2
# Split K: a product with at most FEW_TEXELS output texels and at least LONG_STEPS steps of 4 along K
# loops serially in too few fragments (the thresholds of glcomp.ir.passes.split_reductions, in texels).
FEW_TEXELS = 256
LONG_STEPS = 256


@dataclass(frozen=True)
class Tiling:
    """How one matmul kernel is tiled: product `node` = A @ B with B the stored texture `b`
    (form "b") or the transpose of stored W `b` (form "w"); R x C output texels per fragment;
    K split into `S` chunks (1: not split), their partial products added by the gather."""

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


def fetches_per_texel(r: int, c: int) -> float:
    """Texel fetches per output texel and K step of 4 of an R x C block."""
    return (r + 4 * c) / (r * c)


def _stored(n: int, kernel: Kernel, layouts: dict[int, Layout]) -> bool:
    return n in kernel.leaves and layouts[n].pages == 1


def _texel_view(graph: Graph, n: int) -> int | None:
    """The operand of reshape `n` when both keep a last axis of whole texels (a multiple of 4):
    texel t of `n` is then texel t of its operand (a Flatten before a Linear); else None."""
    if get_op(graph.op(n)).view is None or graph.op(n) != "reshape":
        return None
    (src,) = graph.operands(n)
    return src if graph.shape(n)[-1] % 4 == 0 and graph.shape(src)[-1] % 4 == 0 else None


def split_chunks(m: int, k: int, cols: int) -> int:
    """How many chunks of K an (m, k) @ (k, cols) product is split into: 1 unless it has at most
    FEW_TEXELS output texels and LONG_STEPS steps of K; then a power of two S dividing K / 4,
    about sqrt(K / 4), so the block draw loops K / 4S and the gather S times."""
    steps = k // 4
    if k % 4 or m * math.ceil(cols / 4) > FEW_TEXELS or steps < LONG_STEPS:
        return 1
    s = 1 << (max(0, (steps - 1).bit_length()) // 2)
    while steps % s:
        s //= 2
    return s


def choose_tiling(
    graph: Graph, kernel: Kernel, layouts: dict[int, Layout], target: Target, extra_draws: int = 0
) -> Tiling | None:
    """The tiling of `kernel`, or None when it keeps the one-texel kernel: not a lone matmul of
    stored single-page operands, a target without GLSL ES 3.00 or 2 draw buffers, tiles larger than
    the target's textures, or too little work for the saved fetches to pay for the gather draw
    (and `extra_draws` more draws, e.g. an epilogue split off the product)."""
    if target.webgl1 or target.max_draw_buffers < 2 or len(kernel.roots) != 1:
        return None
    (n,) = kernel.roots
    if get_op(graph.op(n)).kind != "matmul" or layouts[n].pages != 1:
        return None
    a, b = graph.operands(n)
    (m, k), cols = graph.shape(a), graph.shape(n)[1]
    chunks = split_chunks(m, k, cols)
    form, fused = "b", []
    # Only the transpose of a stored W (x @ W.T of a Linear layer) may be fused, and, when K is
    # split, a reshape of a stored A in the same texel order (a Flatten before a Linear).
    view = get_op(graph.op(b)).view
    if b in kernel.body and view is not None and view(graph.attrs(b)) == "transpose":
        fused.append(b)
        b, form = graph.operands(b)[0], "w"
    src = _texel_view(graph, a) if a in kernel.body and chunks > 1 else None
    if src is not None:
        fused.append(a)
        a = src
    if sorted(kernel.body) != sorted(fused):
        return None
    if not (_stored(a, kernel, layouts) and _stored(b, kernel, layouts)):
        return None
    rt, k4 = math.ceil(cols / 4), math.ceil(k / 4)
    if chunks > 1:
        return Tiling(n, a, b, form, 1, 1, m, k, cols, chunks)
    today = cost.fetches(m * rt * k4 * fetches_per_texel(1, 1))
    best: tuple[float, int, int] | None = None
    for r, c in SHAPES:
        fw, fh = -(-rt // c), -(-m // r)
        if r * c > target.max_draw_buffers or fw * fh > target.max_texture_size**2:
            continue
        work = cost.fetches(fw * fh * r * c * k4 * fetches_per_texel(r, c) + m * rt * GATHER_FETCHES)
        work += cost.draws(1 + extra_draws, blocked=True)
        if best is None or work < best[0]:
            best = (work, r, c)
    if best is None or best[0] >= today:
        return None
    return Tiling(n, a, b, form, best[1], best[2], m, k, cols)


def _closure(graph: Graph, start: int, kernel: Kernel, stop: int | None) -> tuple[list[int], list[int]]:
    """The body nodes and leaves of `kernel` that computing `start` reaches (`stop` is read as a
    leaf), in the kernel's orders."""
    body, leaves, todo, seen = set(), set(), [start], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for src in graph.operands(n):
            if src == stop or src in kernel.leaves:
                leaves.add(src)
            elif src in kernel.body:
                body.add(src)
                todo.append(src)
    order = {n: i for i, n in enumerate(kernel.leaves)}
    ordered_leaves = sorted((v for v in leaves if v in order), key=order.__getitem__)
    return [n for n in kernel.body if n in body], ordered_leaves + sorted(leaves - set(order))


def split_epilogues(
    kernels: list[Kernel], graph: Graph, layouts: dict[int, Layout], target: Target, keep: set[str]
) -> tuple[list[Kernel], set[int]]:
    """Kernels whose single map root reads a fused matmul (a Linear's bias, an activation) as
    two kernels, the product on its own (so it can be tiled) and the epilogue reading it as a
    stored texture, where the tiling pays for its two extra draws. `keep`: kernel names left as
    they are. Returns the new kernel list and the products that became stored values.
    Guarantee: the same values are computed in the same order; the split product is written
    before its epilogue reads it."""
    out: list[Kernel] = []
    stored: set[int] = set()
    for k in kernels:
        loops = [n for n in k.body if get_op(graph.op(n)).kind not in FUSED_ROOT]
        lone = len(loops) == 1 and get_op(graph.op(loops[0])).kind == "matmul"
        if k.name in keep or len(k.roots) != 1 or not lone:
            out.append(k)
            continue
        (mm,) = loops
        if get_op(graph.op(k.roots[0])).kind not in FUSED_ROOT:
            out.append(k)
            continue
        mm_body, mm_leaves = _closure(graph, mm, k, None)
        template = get_op(graph.op(mm)).template
        product = Kernel(f"{k.name}_mm", [mm], mm_body, mm_leaves, template, list(k.origins))
        if choose_tiling(graph, product, layouts, target, extra_draws=1) is None:
            out.append(k)
            continue
        ep_body, ep_leaves = _closure(graph, k.roots[0], k, mm)
        out += [product, Kernel(k.name, k.roots, ep_body, ep_leaves, k.template, list(k.origins))]
        stored.add(mm)
    return out, stored


def _tex(lay: Layout) -> dict[str, Any]:
    return {"w": lay.width, "shift": lay.width.bit_length() - 1, "rt": lay.row_texels}


def render_tiled(
    tiling: Tiling, kernel: Kernel, layouts: dict[int, Layout], target: Target
) -> tuple[Rendered, Rendered]:
    """The block draw's and the gather draw's shaders (samplers named by node and page; the
    gather's samplers are the tiles, "page" 0 of each tile id in `tiling.tiles`)."""
    t = tiling
    sa, sb = f"s{t.a}_0", f"s{t.b}_0"
    tiles = [f"s{t.node}_{i}" for i in range(t.R * t.C)]
    common = {
        "webgl1": False,
        "rgba8": False,  # the tiling pass is off with rgba8 storage (these draws write float texels)
        "node_ids": ", ".join(f"%{n}" for n in [*kernel.body, *kernel.roots]),
        "origins": [safe_comment(o) for o in kernel.origins],
        "uniforms": [],
        "R": t.R,
        "C": t.C,
        "M": t.M,
        "K": t.K,
        "N": t.N,
        "S": t.S,
        "form": t.form,
        "max_loop": target.max_loop_iterations,
    }
    template = environment().get_template("matmul_tiled.frag.j2")
    tile = t.tile_layout(target.max_texture_size)
    common |= {"fw": tile.row_texels, "fh": t.grid[1], "tile_texels": tile.texels, "tile_tex": _tex(tile)}
    block = template.render(
        common
        | {
            "mode": "block",
            "kernel_name": f"{kernel.name} (tiled {t.R}x{t.C})",
            "outputs": tiles,
            "samplers": [sa, sb],
            "s_a": sa,
            "s_b": sb,
            "a_tex": _tex(layouts[t.a]) | {"rt": math.ceil(t.K / 4)},  # A may be a view of t.a
            "b_tex": _tex(layouts[t.b]),
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
    block_samplers = [(sa, t.a, 0), (sb, t.b, 0)]
    gather_samplers = [(s, tid, 0) for s, tid in zip(tiles, t.tiles)]
    return Rendered(block, block_samplers, []), Rendered(gather, gather_samplers, [])
