"""tiling: large matmuls as a register-blocked draw into tiles plus a gather draw.

Chosen per kernel by `choose_tiling`: a kernel whose only root is a matmul of two stored
single-page textures (A, the transpose of a stored X (blocks of 4 or 8 rows), or when K is split a
reshape of a stored texture in the same texel order; and B or the transpose of a stored W), on a
GLSL ES 3.00 target with at least 2 draw buffers, when the fetches saved outweigh the extra draw
(glcomp.codegen.cost). The block shape is the one with
the fewest fetches per output texel among those fitting the target's draw buffers. A product with
at most `FEW_TEXELS` output texels and at least `LONG_STEPS` steps of 4 along K is split over K
instead (1 x 1 blocks, S chunks of whole texels, added by the gather): it would otherwise loop
serially in a handful of fragments. A product fused into an epilogue (a Linear's bias and
activation) is first split off into a kernel of its own where tiling it pays for the two extra
draws (`split_epilogues`).
A batched product (bmm) is tiled as the stack of its batch's rows, each block inside one batch
element (R divides its rows) reading B at that element's rows, A a stored texture or the
batch transpose of one (`_batched_tiling`).
The draws themselves are glcomp.codegen.families.matmul's. A tiled product whose one reader is an
untiled kernel reading it through fused nodes only (the epilogue split off it, typically) is read
by that kernel straight from the tiles, gathering as it reads (`read_from_tiles`): the product
gets no gather draw and no texture of its own.

Guarantees: the same values are computed in the same order (a split product is stored, LOOP,
and written before its epilogue reads it); blended kernels are never tiled. Off with
``passes={"tiling": False}`` and with rgba8 storage (tiled draws write float texels, no byte
encoding); a plan with nothing worth tiling is returned as it is.
"""

from __future__ import annotations

import math

from glcomp.codegen import cost
from glcomp.codegen.families import is_fused, template_of
from glcomp.codegen.families.base import lowering
from glcomp.codegen.families.conv import ConvTiling, WeightGradTiling
from glcomp.codegen.families.matmul import Tiling
from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import LOOP, Kernel
from glcomp.codegen.layout import Layout
from glcomp.codegen.target import Target
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.ir.passes.split_reductions import split_factor

# Block shapes (R rows, C column texels) tried, R * C render targets each.
SHAPES = ((8, 1), (4, 2), (4, 1), (2, 2), (2, 1))
# Block shapes tried only with K split, on targets with a width (1 x 1 unsplit is the one-texel kernel).
SPLIT_SHAPES = ((1, 1),)
# Split K: a product with at most FEW_TEXELS output texels and at least LONG_STEPS steps of 4 along K
# loops serially in too few fragments (the thresholds of glcomp.ir.passes.split_reductions, in texels).
FEW_TEXELS = 256
LONG_STEPS = 256


def tiling(plan: KernelPlan) -> KernelPlan:
    """Large matmuls run as a register-blocked draw into tiles plus a gather draw, where the
    cost model says that pays on the target; a product fused into an epilogue is split off into
    a kernel of its own first where tiling it pays for the draws."""
    if not plan.switches["tiling"] or plan.storage == "rgba8":
        return plan
    keep = set(plan.blended)
    kernels, products = split_epilogues(list(plan.kernels), plan.graph, dict(plan.layouts), plan.target, keep)
    layouts = dict(plan.layouts)  # one copy for all kernels: choose_tiling only reads it
    chosen = {k.name: choose_tiling(plan.graph, k, layouts, plan.target) for k in kernels}
    tilings = {name: t for name, t in chosen.items() if t is not None and name not in keep}
    if not tilings:
        return plan
    stored = {**plan.stored, **dict.fromkeys(sorted(products - set(plan.stored)), LOOP)}
    tiled = plan.replace(kernels=kernels, stored=stored, tilings=tilings)
    return tiled.replace(from_tiles=read_from_tiles(tiled))


def read_from_tiles(plan: KernelPlan) -> dict[int, str]:
    """Tiled products whose one reader reads them from their tiles, gathering as it reads (the
    product then has no gather draw and no texture of its own): product -> its kernel's name.

    A product qualifies when it is a matmul tiled without splitting K or a blocked convolution
    (forward or stride-1 input gradient; its tiles hold R output channels), is no output of the entry,
    and is read by exactly one kernel, which is neither tiled nor blended, reads it only through
    fused (map, movement, index) nodes -- whose element and texel fetches are the ones that gather
    -- and still fits the target's texture units with the tiles in place of the product's
    texture. The values read are the gather's, so the results are the same bit for bit."""
    outputs = set(plan.graph.outputs.values())
    readers: dict[int, list[Kernel]] = {}
    for k in plan.kernels:
        for leaf in set(k.leaves):
            readers.setdefault(leaf, []).append(k)
    hypers = plan.hypers()
    out: dict[int, str] = {}
    for name, t in plan.tilings.items():
        readable = (
            isinstance(t, Tiling | ConvTiling) and t.read_params(plan.target.max_texture_size) is not None
        )
        if not readable or t.node in outputs:
            continue
        users = readers.get(t.node, [])
        if len(users) != 1:
            continue
        (reader,) = users
        if reader.name in plan.tilings or reader.name in plan.blended:
            continue
        inside = [*reader.body, *reader.roots]
        if not all(is_fused(plan.graph, n) for n in inside if t.node in plan.graph.operands(n)):
            continue
        own = [n for n in reader.leaves if n not in hypers and n != t.node and n not in out]
        pages = sum(plan.layouts[n].pages for n in own)
        pages += sum(len(plan.tilings[out[n]].tiles) for n in reader.leaves if n in out)
        if pages + len(t.tiles) > plan.target.max_texture_units:
            continue
        out[t.node] = name
    return out


def fetches_per_texel(r: int, c: int) -> float:
    """Texel fetches per output texel and K step of 4 of an R x C block."""
    return (r + 4 * c) / (r * c)


# Texel fetches per output texel and K step of 4 of a product computed untiled inside another
# kernel's expression (a Linear's product fused into its bias add or residual): each of the
# texel's four elements loops over K on its own, fetching one texel of A and one of B for each
# multiply-add (4 elements x 4 steps x 2), where the one-texel kernel of a root product fetches
# A's texel once and B's four row texels (`fetches_per_texel(1, 1)`).
FUSED_FETCHES = 32.0


def root_fetches(a_fused: bool, b_fused: bool) -> float:
    """Texel fetches per output texel and K step of 4 of a root product's one-texel kernel
    whose A or B is a fused expression (a concatenation of heads): its vec4 is computed an
    element at a time, a fetch each at least (4 for A's texel, 16 for B's four)."""
    return (4.0 if a_fused else 1.0) + (16.0 if b_fused else 4.0)


def _stored(n: int, kernel: Kernel, layouts: dict[int, Layout]) -> bool:
    return n in kernel.leaves and layouts[n].pages == 1


def _texel_view(graph: Graph, n: int) -> int | None:
    """The operand of reshape `n` when both keep a last axis of whole texels (a multiple of 4):
    texel t of `n` is then texel t of its operand (a Flatten before a Linear); else None."""
    view = get_op(graph.op(n)).view
    if view is None or view(graph.attrs(n)) != "flat":
        return None
    (src,) = graph.operands(n)
    return src if graph.shape(n)[-1] % 4 == 0 and graph.shape(src)[-1] % 4 == 0 else None


def _row_view(graph: Graph, n: int) -> int | None:
    """The stored operand whose texels `n` reads as its own: a reshape that keeps the last axis
    (a Linear over (B, T, C) reads (B * T, C): the same rows) or one whose last axes are both whole
    texels (`_texel_view`); else None."""
    view = get_op(graph.op(n)).view
    if view is None or view(graph.attrs(n)) != "flat":
        return None
    (src,) = graph.operands(n)
    return src if graph.shape(src)[-1] == graph.shape(n)[-1] else _texel_view(graph, n)


def _through_row_view(graph: Graph, n: int, kernel: Kernel, fused: list[int]) -> int:
    """`n`, or the stored operand of `n` when `n` is a fused row view of it (`_row_view`, added to
    `fused`): the tiled kernel then reads that operand's texture, whose texels are n's."""
    src = _row_view(graph, n) if n in kernel.body else None
    if src is None:
        return n
    fused.append(n)
    return src


def split_chunks(m: int, k: int, cols: int) -> int:
    """How many chunks of K an (m, k) @ (k, cols) product is split into: 1 unless it has at most
    FEW_TEXELS output texels and LONG_STEPS steps of K; then a power of two S dividing K / 4,
    about sqrt(K / 4), so the block draw loops K / 4S and the gather S times."""
    steps = k // 4
    if k % 4 or m * math.ceil(cols / 4) > FEW_TEXELS or steps < LONG_STEPS:
        return 1
    return split_factor(steps)


def choose_tiling(
    graph: Graph,
    kernel: Kernel,
    layouts: dict[int, Layout],
    target: Target,
    extra_draws: int = 0,
    untiled: float | None = None,
) -> Tiling | ConvTiling | WeightGradTiling | None:
    """The tiling of `kernel` (a family's own where its lowering has one, as conv2d's), or None
    when it keeps the one-texel kernel: not a lone matmul of stored single-page operands, a
    target without GLSL ES 3.00 or 2 draw buffers, tiles larger than the target's textures, or
    too little work for the saved fetches to pay for the gather draw (and `extra_draws` more
    draws, e.g. an epilogue split off the product). `untiled`: the texel fetches per output
    texel and K step of 4 of the kernel the product runs in otherwise (`FUSED_FETCHES` when it
    is fused into an epilogue; by default the one-texel kernel's of a root product)."""
    if target.webgl1 or target.max_draw_buffers < 2 or len(kernel.roots) != 1:
        return None
    (n,) = kernel.roots
    low = lowering(graph.op(n))
    if low is not None and low.tiled is not None:  # a family's own blocked form (conv2d)
        return low.tiled(graph, kernel, layouts, target, extra_draws)
    if get_op(graph.op(n)).kind != "matmul" or layouts[n].pages != 1:
        return None
    if len(graph.shape(n)) == 3:
        return _batched_tiling(graph, n, kernel, layouts, target, extra_draws, untiled)
    if len(graph.shape(n)) != 2:
        return None
    a, b = graph.operands(n)
    (m, k), cols = graph.shape(a), graph.shape(n)[1]
    parallel = target.parallel_fragments is not None
    chunks = 1 if parallel else split_chunks(m, k, cols)
    form, a_form, fused = "b", "a", []
    # Only the transpose of a stored W (x @ W.T of a Linear layer) may be fused, and a reshape of a
    # stored A in the same texel order (a Linear over (B, T, C), a Flatten before a Linear).
    view = get_op(graph.op(b)).view
    if b in kernel.body and view is not None and view(graph.attrs(b)) == "transpose":
        fused.append(b)
        b, form = graph.operands(b)[0], "w"
    b = _through_row_view(graph, b, kernel, fused)
    src = _row_view(graph, a) if a in kernel.body else None
    if src is not None:
        fused.append(a)
        a = src
    # A the transpose of a stored X (a weight gradient's x.T): read by X's rows, 4 rows of A a
    # texel; on CPU rasterizers not split over K (their split blocks are one row).
    view = get_op(graph.op(a)).view
    if src is None and a in kernel.body and view is not None and view(graph.attrs(a)) == "transpose":
        if chunks > 1:
            return None
        fused.append(a)
        a, a_form = graph.operands(a)[0], "t"
        a = _through_row_view(graph, a, kernel, fused)  # X a view of (B, T, C) rows
    if sorted(kernel.body) != sorted(fused):
        return None
    if not (_stored(a, kernel, layouts) and _stored(b, kernel, layouts)):
        return None
    if parallel:
        return _parallel_tiling(n, a, b, form, a_form, m, k, cols, target, extra_draws, untiled=untiled)
    if chunks > 1:
        return Tiling(n, a, b, form, 1, 1, m, k, cols, chunks)
    shapes = tuple(rc for rc in SHAPES if a_form != "t" or rc[0] % 4 == 0)
    best = _best_block(m, k, cols, shapes, target, extra_draws, untiled)
    return None if best is None else Tiling(n, a, b, form, *best, m, k, cols, a_form=a_form)


def _best_block(
    m: int,
    k: int,
    cols: int,
    shapes: tuple[tuple[int, int], ...],
    target: Target,
    extra_draws: int,
    untiled: float | None = None,
) -> tuple[int, int] | None:
    """The block shape (R, C) among `shapes` with the least fetches for an (m, k) @ (k, cols)
    product on a target without a width, gather and draws counted; None when none fits the
    target or the untiled kernel (`untiled` fetches per texel and K step) costs no more."""
    rt, k4 = math.ceil(cols / 4), math.ceil(k / 4)
    today = cost.fetches(m * rt * k4 * (fetches_per_texel(1, 1) if untiled is None else untiled))
    best: tuple[float, int, int] | None = None
    for r, c in shapes:
        fw, fh = -(-rt // c), -(-m // r)
        if r * c > target.max_draw_buffers or fw * fh > target.max_texture_size**2:
            continue
        work = cost.fetches(fw * fh * r * c * k4 * fetches_per_texel(r, c) + m * rt * cost.GATHER_FETCHES)
        work += cost.draws(1 + extra_draws, blocked=True, target=target)
        if best is None or work < best[0]:
            best = (work, r, c)
    return None if best is None or best[0] >= today else (best[1], best[2])


def _batched_tiling(
    graph: Graph,
    n: int,
    kernel: Kernel,
    layouts: dict[int, Layout],
    target: Target,
    extra_draws: int,
    untiled: float | None = None,
) -> Tiling | None:
    """The tiling of a batched product (bmm, (Bt, Mb, K) @ (Bt, K, N)): the batch's rows stacked
    as one (Bt * Mb, K) A, each block of R rows inside one batch element (R divides Mb), B read at
    that element's rows. A is a stored texture or (a_form "t", R a multiple of 4) the permute
    (0, 2, 1) of a stored (Bt, K, Mb) one (attention's P.T @ dO); B a stored (Bt, K, N) texture or
    (form "w") the permute (0, 2, 1) of a stored (Bt, N, K) one (attention's q @ k.T); a stored
    operand may be a reshape of a stored texture in the same texel order (heads split or joined);
    K not split."""
    a, b = graph.operands(n)
    bt, mb, k = graph.shape(a)
    cols = graph.shape(n)[2]
    form, a_form, fused = "b", "a", []
    view = get_op(graph.op(b)).view
    if b in kernel.body and view is not None and view(graph.attrs(b)) == "batch_transpose":
        fused.append(b)
        b, form = graph.operands(b)[0], "w"
    b = _through_row_view(graph, b, kernel, fused)
    # A the permute (0, 2, 1) of a stored (Bt, K, Mb) X (attention's P.T @ dO): X's rows k of each
    # batch element read a texel at a time, whose components are 4 rows of A (R a multiple of 4).
    view = get_op(graph.op(a)).view
    if a in kernel.body and view is not None and view(graph.attrs(a)) == "batch_transpose":
        fused.append(a)
        a, a_form = graph.operands(a)[0], "t"
    else:
        a = _through_row_view(graph, a, kernel, fused)
    if sorted(kernel.body) != sorted(fused):
        return None
    if not (_stored(a, kernel, layouts) and _stored(b, kernel, layouts)):
        return None
    shapes = tuple(rc for rc in SHAPES if mb % rc[0] == 0 and (a_form == "a" or rc[0] % 4 == 0))
    m = bt * mb
    if target.parallel_fragments is not None:
        return _parallel_tiling(n, a, b, form, a_form, m, k, cols, target, extra_draws, shapes, mb, untiled)
    best = _best_block(m, k, cols, shapes, target, extra_draws, untiled)
    if best is None:
        return None
    return Tiling(n, a, b, form, *best, m, k, cols, a_form=a_form, batch_rows=mb)


def _parallel_tiling(
    n: int,
    a: int,
    b: int,
    form: str,
    a_form: str,
    m: int,
    k: int,
    cols: int,
    target: Target,
    extra_draws: int,
    shapes: tuple[tuple[int, int], ...] | None = None,
    batch_rows: int = 0,
    untiled: float | None = None,
) -> Tiling | None:
    """The tiling of an (m, k) @ (k, cols) product on a target that names the fragments a draw
    needs (`Target.parallel_fragments`): every block shape that fits its draw buffers, each with K
    unsplit or split into S chunks (a power of two dividing K / 4; the gather adds the S partial
    products), costed as fetches times `cost.occupancy` of the draw's fragments, plus the blocked
    draws; None when the untiled kernel costs least (`untiled` fetches per output texel and K
    step, the one-texel kernel's by default). `shapes`: the block shapes tried (SHAPES by
    default); `batch_rows`: a batched product's rows per batch element (K is then not split)."""
    rt, k4 = math.ceil(cols / 4), math.ceil(k / 4)
    out = m * rt
    best: tuple[float, int, int, int] | None = None
    per = fetches_per_texel(1, 1) if untiled is None else untiled
    today = cost.fetches(out * k4 * per) * cost.occupancy(out, target)
    shapes = SHAPES if shapes is None else shapes
    for r, c in shapes if batch_rows else (*SPLIT_SHAPES, *shapes):
        fw, fh = -(-rt // c), -(-m // r)
        if r * c > target.max_draw_buffers or (a_form == "t" and r % 4):
            continue
        s = 1
        while True:
            if s > 1 or (r, c) not in SPLIT_SHAPES:
                if s * fw * fh > target.max_texture_size**2:
                    break
                block = cost.fetches(fw * fh * r * c * k4 * fetches_per_texel(r, c))
                block *= cost.occupancy(s * fw * fh, target)
                gather = cost.fetches(out * (cost.GATHER_FETCHES if s == 1 else s + 1))
                gather *= cost.occupancy(out, target)
                work = block + gather + cost.draws(1 + extra_draws, blocked=True, target=target)
                if best is None or work < best[0]:
                    best = (work, r, c, s)
            # Split further while the block draw is short of fragments and K divides (K % 4 == 0:
            # each chunk whole texels), keeping at least LONG_STEPS // 16 steps a chunk.
            if batch_rows or k % 4 or k4 % (2 * s) or s * fw * fh >= (target.parallel_fragments or 0):
                break
            if k4 // (2 * s) < LONG_STEPS // 16:
                break
            s *= 2
    if best is None or best[0] >= today:
        return None
    _, r, c, s = best
    return Tiling(n, a, b, form, r, c, m, k, cols, s, a_form=a_form, batch_rows=batch_rows)


def _closure(
    graph: Graph, start: int, kernel: Kernel, stop: int | None, stops: frozenset[int] = frozenset()
) -> tuple[list[int], list[int]]:
    """The body nodes and leaves of `kernel` that computing `start` reaches (`stop` and `stops`
    are read as leaves), in the kernel's orders."""
    stops = stops | ({stop} if stop is not None else set())
    body, leaves, todo, seen = set(), set(), [start], set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        for src in graph.operands(n):
            if src in stops or src in kernel.leaves:
                leaves.add(src)
            elif src in kernel.body:
                body.add(src)
                todo.append(src)
    order = {n: i for i, n in enumerate(kernel.leaves)}
    ordered_leaves = sorted((v for v in leaves if v in order), key=order.__getitem__)
    return [n for n in kernel.body if n in body], ordered_leaves + sorted(leaves - set(order))


def _operand_bases(graph: Graph, mm: int, kernel: Kernel) -> list[int]:
    """The fused nodes of `kernel` that the product `mm` reads as its operands once the views a
    tiled product reads as stored textures (a transpose, a reshape keeping the rows) are looked
    through (a transpose, a batch transpose, a reshape keeping the texels): a concatenation of
    attention heads, a sum, a masked or scaled operand, a reshape that reorders texels. Stored in a
    texture of their own, they make the product tileable."""
    out: list[int] = []
    for operand in graph.operands(mm):
        n = operand
        while n in kernel.body:
            view = get_op(graph.op(n)).view
            if view is None or view(graph.attrs(n)) not in ("transpose", "batch_transpose", "flat"):
                break
            if view(graph.attrs(n)) == "flat" and _row_view(graph, n) is None:
                break  # a reshape that reorders texels (a 1x1 weight as a matrix): computed on its own
            (n,) = graph.operands(n)
        if n in kernel.body and is_fused(graph, n) and n not in out:
            out.append(n)
    return out


def tiled_product(
    graph: Graph, k: Kernel, mm: int, layouts: dict[int, Layout], target: Target, extra_draws: int
) -> list[Kernel] | None:
    """`k`'s product `mm` as a kernel of its own that can be tiled: first with its operands fused
    as they are, else with the fused operand expressions blocking the tiling (`_operand_bases`)
    computed by kernels of their own before it (one draw each, counted in the cost); None when
    neither pays. The cost it is weighed against is that of `mm` computed in `k` as it is: fused
    into an epilogue (`FUSED_FETCHES`), or `k`'s root reading fused operands (`root_fetches`)."""
    body, leaves = _closure(graph, mm, k, None)
    template = template_of(graph.op(mm))
    bases = [n for n in _operand_bases(graph, mm, k) if layouts[n].pages == 1]
    if mm not in k.roots:
        untiled = FUSED_FETCHES
    else:
        a, b = graph.operands(mm)
        reach = {o: set(_closure(graph, o, k, None)[0]) | {o} for o in (a, b)}
        untiled = root_fetches(*(any(n in reach[o] for n in bases) for o in (a, b)))
    product = Kernel(f"{k.name}_mm", [mm], body, leaves, template, list(k.origins))
    if choose_tiling(graph, product, layouts, target, extra_draws, untiled) is not None:
        return [product]
    if not bases:
        return None
    body, leaves = _closure(graph, mm, k, None, frozenset(bases))
    product = Kernel(f"{k.name}_mm", [mm], body, leaves, template, list(k.origins))
    if choose_tiling(graph, product, layouts, target, extra_draws + len(bases), untiled) is None:
        return None
    inputs = []
    for i, base in enumerate(bases):
        b_body, b_leaves = _closure(graph, base, k, None, frozenset(bases) - {base})
        inputs.append(
            Kernel(f"{k.name}_in{i}", [base], b_body, b_leaves, template_of(graph.op(base)), list(k.origins))
        )
    return [*inputs, product]


def _has_tiled_form(graph: Graph, n: int) -> bool:
    low = lowering(graph.op(n))
    return low is not None and low.tiled is not None


def split_epilogues(
    kernels: list[Kernel], graph: Graph, layouts: dict[int, Layout], target: Target, keep: set[str]
) -> tuple[list[Kernel], set[int]]:
    """Kernels whose single map root reads a fused matmul or conv2d (a Linear's or a conv's bias,
    an activation, a residual add) as two kernels, the product on its own (so it can be tiled)
    and the epilogue reading it as a stored texture, where the tiling pays for the extra draws.
    A product reading a fused expression that is no view of a stored texture (the concatenated
    heads of attention, read by its output projection and by that projection's weight gradient)
    gets that expression computed by a kernel of its own before it, where tiling pays for that
    draw too; so does such a product that is its kernel's root. `keep`: kernel names left as they
    are. Returns the new kernel list and the values that became stored.
    An operand expression already computed for an earlier product (a head's slice of a gradient,
    read by two products) is read from that kernel's texture, not computed again.
    Guarantee: the same values are computed in the same order; every split-off value is written
    once, before the kernels reading it."""
    out: list[Kernel] = []
    stored: set[int] = set()
    for k in kernels:
        loops = [n for n in k.body if not is_fused(graph, n)]
        if k.name in keep or len(k.roots) != 1:
            out.append(k)
            continue
        root = k.roots[0]
        product_root = get_op(graph.op(root)).kind == "matmul" and len(graph.shape(root)) in (2, 3)
        if not loops and (product_root or _has_tiled_form(graph, root)):
            # The product (a matmul, or a convolution with a blocked form) is the root: split off
            # only the operand expressions blocking its tiling (one part: it tiles as it is, and
            # stays as it is).
            parts = tiled_product(graph, k, root, layouts, target, extra_draws=0)
            if parts is None or len(parts) == 1:
                out.append(k)
                continue
            *inputs, product = parts
            inputs = [i for i in inputs if i.roots[0] not in stored]  # computed for an earlier product
            out += [
                *inputs,
                Kernel(k.name, k.roots, product.body, product.leaves, k.template, list(k.origins)),
            ]
            stored.update(n for i in inputs for n in i.roots)
            continue
        lone = len(loops) == 1 and (
            get_op(graph.op(loops[0])).kind == "matmul" or _has_tiled_form(graph, loops[0])
        )
        if not lone or not is_fused(graph, root):
            out.append(k)
            continue
        (mm,) = loops
        parts = tiled_product(graph, k, mm, layouts, target, extra_draws=1)
        if parts is None:
            out.append(k)
            continue
        ep_body, ep_leaves = _closure(graph, root, k, mm)
        parts = [p for p in parts[:-1] if p.roots[0] not in stored] + parts[-1:]
        out += [*parts, Kernel(k.name, k.roots, ep_body, ep_leaves, k.template, list(k.origins))]
        stored.add(mm)
        stored.update(n for part in parts[:-1] for n in part.roots)
    return out, stored
