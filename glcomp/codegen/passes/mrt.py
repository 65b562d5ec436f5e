"""mrt: write several kernels' results from one draw call, one render target each (MRT fusion).

Kernels that can run at the same point of the schedule and read the same textures (the weight, input and
bias gradients of a layer; Adam's new parameter, first and second moments) are merged: the
shader is rendered once with several roots. An elementwise root read by a later member is
recomputed inline instead of sampled (it is being written in the same draw), unless a loop is
fused into it. A group's loops together stay within the per-invocation loop budget
(glcomp.codegen.loops.FRAGMENT_LOOP_BUDGET). All attachments of
a framebuffer must have one size (WebGL 2), so the group's values get a common footprint.

Guarantees: those of `mrt_fusion`; states keep their layouts. Off with ``passes={"mrt": False}``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from glcomp.codegen import cost as cost_model
from glcomp.codegen.families.base import lowering
from glcomp.codegen.families.matmul import Tiling
from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import FUSIBLE, Kernel
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.loops import FRAGMENT_LOOP_BUDGET, fragment_iterations
from glcomp.codegen.passes.tiling import choose_tiling, tiled_product
from glcomp.codegen.target import Target
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op

LOOKBACK = 8  # how many earlier draws a kernel may join


def mrt(plan: KernelPlan) -> KernelPlan:
    """Merge consecutive kernels that share inputs into multi-target draws (`mrt_fusion`)."""
    if not plan.switches["mrt"]:
        return plan
    fixed = set(plan.state_out())
    alone = set()
    if plan.switches["tiling"] and plan.storage != "rgba8":
        layouts = dict(plan.layouts)  # one copy for every kernel's question (they only read it)
        alone = {k.name for k in plan.kernels if _will_tile(plan.graph, k, layouts, plan.target)}
    kernels, resized = mrt_fusion(list(plan.kernels), plan.graph, plan.layouts, plan.target, fixed, alone)
    return plan.replace(kernels=kernels, layouts={**plan.layouts, **resized})


def _will_tile(graph: Graph, k: Kernel, layouts: dict[int, Layout], target: Target) -> bool:
    """Whether the tiling pass will run lone kernel `k` in its family's register-blocked form
    (a convolution's, a batched product's), or, on a target that names the fragments a draw
    needs, split its product over K to fill the device: such a kernel stays out of MRT groups,
    where it could not be blocked or split."""
    if len(k.roots) != 1:
        return False
    low = lowering(graph.op(k.roots[0]))
    if low is not None and low.tiled is not None:
        return low.tiled(graph, k, layouts, target) is not None
    batched = len(graph.shape(k.roots[0])) == 3
    if target.parallel_fragments is None and not batched:
        return False
    if batched and get_op(graph.op(k.roots[0])).rereads:  # a batched product (conv2d returned above)
        # tiled as it is, or once the tiling pass has stored the operand expressions blocking it
        # (a head's slice of a gradient read by P.T @ dO): kept out of groups
        return tiled_product(graph, k, k.roots[0], layouts, target, extra_draws=0) is not None
    t = choose_tiling(graph, k, layouts, target)
    # a product split over K: kept out of groups
    return isinstance(t, Tiling) and (t.batch_rows > 0 or t.S > 1)


def _fusible_root(graph: Graph, n: int) -> bool:
    return get_op(graph.op(n)).kind in (*FUSIBLE, "source")


def mrt_fusion(
    kernels: list[Kernel],
    graph: Graph,
    layouts: Mapping[int, Layout],
    target: Target,
    fixed: set[int],
    alone: set[str] | frozenset[str] = frozenset(),
) -> tuple[list[Kernel], dict[int, Layout]]:
    """Merge runs of consecutive kernels into multi-target kernels (kernels named in `alone`
    stay single).

    Guarantees: execution order stays valid (members are consecutive, and a member reads an
    earlier member's value only by recomputing it inline); a group has at most
    `max_draw_buffers` targets and at most `max_texture_units` samplers; every root of a group
    gets a layout of the same width and height (returned: the new layout of every value whose
    footprint changed; `layouts` itself is not changed), and values in
    `fixed` (state textures with a preset layout) only join groups whose footprint they already
    have; a group runs at most FRAGMENT_LOOP_BUDGET loop iterations per texel over all its roots
    (software rasterizers stop a shader's loops past a shared limit, so stacking long loops in
    one draw would return partial sums), and a root is recomputed inline only when no loop is
    fused into it. A kernel joins a group only when it shares a texture read with it or reads one of its
    results: otherwise merging saves nothing worth the larger shader.
    """
    layouts = dict(layouts)  # the caller's mapping stays as it was
    resized: dict[int, Layout] = {}
    out: list[Kernel] = []
    producer: dict[int, int] = {}  # stored value -> index in `out` of the kernel writing it
    loops = _Loops(graph)
    for k in kernels:
        # The earliest group k may join: after every kernel that produces what k reads.
        ready = max((producer[leaf] for leaf in k.leaves if leaf in producer), default=-1)
        placed = None
        # A group at index `ready` produces some of k's inputs: _try_merge then recomputes them
        # inline (elementwise roots only) or refuses.
        lowest = max(ready, len(out) - LOOKBACK, 0)
        for j in [] if k.name in alone else range(len(out) - 1, lowest - 1, -1):
            if out[j].name in alone:
                continue
            tried = _try_merge(out[j], k, graph, layouts, target, fixed, loops)
            if tried is not None:
                out[j], changed = tried
                layouts.update(changed)
                resized.update(changed)
                placed = j
                break
        if placed is None:
            out.append(k)
            placed = len(out) - 1
        for r in k.roots:
            producer[r] = placed
    return out, resized


class _Loops:
    """`fragment_iterations` of the (final) graph, remembered per root, leaf set and limit: MRT
    asks the same question of each kernel for every group it might join. A kernel's count is
    the sum of its roots' counts (each root's calls are counted independently)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.memo: dict[tuple[int, frozenset[int], int], int] = {}

    def __call__(self, roots: list[int], leaves: Collection[int], limit: int) -> int:
        frozen = frozenset(leaves)
        total = 0
        for r in roots:
            key = (r, frozen, limit)
            if key not in self.memo:
                self.memo[key] = fragment_iterations(self.graph, [r], set(frozen), limit)
            total += self.memo[key]
        return total


def root_cost(graph: Graph, n: int, loops: _Loops | None = None) -> int:
    """Shader work per output element of root `n`: its loop length (1 for elementwise roots),
    from the renderer's loop model, the one the loop budget uses too."""
    if _fusible_root(graph, n):
        return 1
    loops = loops or _Loops(graph)
    return max(1, loops([n], graph.operands(n), 1 << 30) // 4)


def _pays(
    graph: Graph,
    layouts: dict[int, Layout],
    a: list[int],
    b: list[int],
    footprint: int,
    target: Target,
    cost: dict[int, int],
) -> bool:
    """Merging saves a draw; it costs the work of each root over texels it would not cover alone
    (WebGL 1 computes every root on every texel of the shared footprint; WebGL 2 skips texels
    past a root's data, but the larger footprint still runs). `cost` is each root's work per
    element; all in element-iterations (glcomp.codegen.cost)."""
    separate = sum(layouts[r].texels * 4 * cost[r] for r in a + b)
    if target.webgl1:
        merged = footprint * 4 * sum(cost[r] for r in a + b)
    else:
        merged = separate + footprint * 4 * len(a + b)
    return merged <= separate + cost_model.draws(1, target=target)


def _has_fused_loop(graph: Graph, k: Kernel) -> bool:
    return any(not _fusible_root(graph, n) for n in k.body)


def _root_work(graph: Graph, r: int, leaves: set[int], limit: int, loops: _Loops) -> int:
    """Work per output element of root `r` in a kernel reading `leaves`: its own loop, or the
    loops fused into it (an epilogue root is elementwise but runs its loop operand's loop)."""
    return max(root_cost(graph, r, loops), loops([r], leaves, limit) // 4)


def _try_merge(
    g: Kernel,
    k: Kernel,
    graph: Graph,
    layouts: Mapping[int, Layout],
    target: Target,
    fixed: set[int],
    loops: _Loops,
) -> tuple[Kernel, dict[int, Layout]] | None:
    """The kernel writing the roots of `g` and then `k` from one draw, with the new layouts of
    the roots it resizes to a common footprint, or None when the merge is not allowed or does
    not pay."""
    if len(g.roots) + len(k.roots) > target.max_draw_buffers:
        return None
    # Cheapest refusal first: a kernel that neither shares a texture read with the group nor
    # reads one of its results gains nothing from joining it (most pairs MRT looks at).
    reads_group = [leaf for leaf in k.leaves if leaf in g.roots]
    if not reads_group and set(g.leaves).isdisjoint(k.leaves):
        return None
    roots = g.roots + k.roots
    if any(layouts[r].pages > 1 for r in roots):
        return None
    if _has_fused_loop(graph, g) or _has_fused_loop(graph, k):
        # Cost, not correctness: an epilogue's fused loop runs a whole texel per fragment (root4)
        # only as the single target of its draw; in a group it would run per element, 4x the
        # loop work, to save one draw.
        return None
    limit = target.max_loop_iterations
    if reads_group and not all(_fusible_root(graph, r) for r in reads_group):
        return None  # a loop kernel's result cannot be recomputed inline cheaply
    if any(loops([r], g.leaves, limit) for r in reads_group):
        return None  # nor can an epilogue root, which runs a loop per element
    if reads_group and any(get_op(graph.op(r)).rereads for r in k.roots):
        # A matmul or convolution reads each operand element many times: recomputed inline, an
        # operand would cost its arithmetic at every read and lose the texel kernels' fetches.
        return None
    leaves = sorted((set(g.leaves) | set(k.leaves)) - set(g.roots))
    samplers = sum(layouts[n].pages for n in leaves if graph.attrs(n).get("role") != "hyper")
    if samplers > target.max_texture_units:
        return None
    if loops(roots, leaves, limit) > FRAGMENT_LOOP_BUDGET:
        return None  # past the loop limiter of software rasterizers: keep the loops in their own draws
    width = max(layouts[r].width for r in roots)
    height = max(layouts[r].height for r in roots)
    cost = {r: _root_work(graph, r, set(leaves), limit, loops) for r in roots}
    if not _pays(graph, layouts, g.roots, k.roots, width * height, target, cost):
        return None
    if any((layouts[r].width, layouts[r].height) != (width, height) for r in roots if r in fixed):
        return None
    resized = {}
    for r in roots:
        lay = layouts[r]
        if (lay.width, lay.height) != (width, height):
            new = layout_for(lay.shape, target.max_texture_size, width=width)
            if new.height > height or new.pages > 1:
                return None
            resized[r] = Layout(
                new.shape, new.rows, new.row_len, new.row_texels, new.texels, width, height, 1
            )
    body = sorted(set(g.body) | set(k.body) | set(reads_group))
    origins = sorted(set(g.origins) | set(k.origins))
    template = g.template if g.template == k.template else "mixed"
    name = f"{g.name}+{k.name.split('_', 1)[0]}"
    return Kernel(name, roots, body, leaves, template, origins), resized
