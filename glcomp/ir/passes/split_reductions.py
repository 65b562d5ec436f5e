"""Split long reductions with few outputs into two reductions, so both run in parallel.

A fragment shader computes one output texel per fragment, so ``sum`` over N*H*W elements into C
values (a convolution's bias gradient) loops N*H*W times in C/4 fragments: almost no parallelism
on any GPU. Reducing in two stages, first over the trailing reduced axes (many outputs, a short
loop each), then over the rest (few outputs, a short loop), spreads the work over many fragments:

    sum(x[N,C,H,W], axes=(0,2,3))  ->  sum(sum(x, axes=(2,3)), axes=(0,))

A single reduced axis that is not the last one is split in two through a reshape (which keeps the
last axis, so the first stage still reads texels along it). ``max`` splits the same way, and so
does ``logsumexp`` (the logsumexp of the first stage's logsumexps).

A device that needs many fragments in flight (a GPU: glcomp.codegen.target.Target's
``parallel_fragments``) passes a larger `few`: a first stage that still has few outputs and a long
loop (BatchNorm's per-channel sums over (N, H, W) are N x C outputs of H x W each) is split again,
so each stage loops over about the square root of what it would:

    sum(x[N,C,H,W], axes=(2,3))  ->  sum(sum(x, axes=(3,)), axes=(2,))
"""

from __future__ import annotations

import math

from glcomp.ir.graph import Graph, origin

SPLIT = ("sum", "max", "logsumexp")  # the reductions split in two stages
LONG = 256  # reductions at least this long are split...
FEW = 1024  # ...when they produce at most this many values


def _stages(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(first-stage axes, second-stage axes) splitting the reduced axes by position so the longer
    of the two loops is as short as possible; None when there is only one axis."""
    best = None
    for cut in range(1, len(axes)):
        outer, inner = axes[:cut], axes[cut:]
        cost = max(math.prod(shape[a] for a in inner), math.prod(shape[a] for a in outer))
        if best is None or cost < best[0]:
            best = (cost, inner, outer)
    return None if best is None else (best[1], best[2])


def split_factor(length: int) -> int:
    """The power of two about sqrt(`length`) (at most it) that divides `length`: two stages of a
    reduction split by it loop about as long as each other."""
    p = 1 << (max(0, (length - 1).bit_length()) // 2)
    while length % p:
        p //= 2
    return p


def _plan(
    graph: Graph, n: int, few: int = FEW
) -> tuple[tuple[int, ...], tuple[int, ...]] | tuple[int, int] | None:
    """How `_split` splits reduction `n` (without changing the graph): the (first, second)
    stage axes, or (axis, factor) for a single axis split through a reshape; None to keep it
    (shorter than LONG, or more than `few` outputs)."""
    (x,) = graph.operands(n)
    shape, axes = graph.shape(x), tuple(graph.attrs(n)["axes"])
    extent = math.prod(shape[a] for a in axes)
    if extent < LONG or math.prod(graph.shape(n)) > few:
        return None
    stages = _stages(shape, axes)
    if stages is not None:
        return stages
    (a,) = axes
    if a == len(shape) - 1:
        return None  # splitting the packed axis would make the first stage read per element
    p = split_factor(shape[a])
    if p < 2:
        return None
    return a, p


def _split(graph: Graph, n: int, few: int = FEW) -> int | None:
    plan = _plan(graph, n, few)
    if plan is None:
        return None
    op, (x,) = graph.op(n), graph.operands(n)
    shape = graph.shape(x)
    with origin(graph.node(n)["origin"]):
        if isinstance(plan[0], tuple):
            inner, outer = plan
            return graph.add(op, [graph.add(op, [x], axes=inner)], axes=outer)
        a, p = plan
        split = (*shape[:a], p, shape[a] // p, *shape[a + 1 :])
        y = graph.add(op, [graph.add(op, [graph.add("reshape", [x], shape=split)], axes=(a + 1,))], axes=(a,))
        return graph.add("reshape", [y], shape=graph.shape(n))


def _stages_between(graph: Graph, new: int, x: int) -> list[int]:
    """The reductions a split created: those on the way from its result `new` down to `x`, the
    operand of the reduction it replaced (only created nodes lie between them)."""
    out, todo = [], [new]
    while todo:
        v = todo.pop()
        if v != x:
            out += [v] if graph.op(v) in SPLIT else []
            todo += graph.operands(v)
    return out


def split_reductions(graph: Graph, few: int = FEW) -> Graph:
    """After this pass no ``sum``, ``max`` or ``logsumexp`` reduces `LONG` or more elements into
    at most `few` values (`FEW` by default) when its reduced axes can be split (several axes, or
    one axis that is not the last). With a `few` above FEW (a device that needs many fragments)
    the stages a split creates are split again while they are; with FEW they are not (on a CPU
    rasterizer the draw a further stage adds costs more than its fragments save).

    Requires a valid graph; the result computes the same outputs up to the order of additions
    (``max`` exactly; ``logsumexp`` up to rounding) and is pruned of the nodes it replaced. A
    graph with nothing to split or prune is returned as it is (not copied).
    """
    todo = [n for n in graph.g if graph.op(n) in SPLIT and _plan(graph, n, few) is not None]
    if not todo and len(graph.live()) == len(graph.g):
        return graph
    g = graph.copy()
    for n in g.topo():
        work = [n] if g.op(n) in SPLIT else []
        while work:  # each split's stages reduce fewer elements: this ends
            m = work.pop()
            (x,) = g.operands(m)
            new = _split(g, m, few)
            if new is not None:
                g.replace_uses(m, new)
                if few > FEW:
                    work += _stages_between(g, new, x)
    g.prune_in_place()
    return g
