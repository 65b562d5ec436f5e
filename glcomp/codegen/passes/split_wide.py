"""split_wide: keep every node within the target's texture units, whatever the length of a sequence.

A GL kernel samples one texture unit per texture page it reads, and a target has few of them
(16 on portable WebGL 2, fewer on small targets). The kernel planner stores fused values in
textures of their own until each kernel fits, which works as long as no single node reads more
pages than the target has units through its own operands. Only `concat` has any number of
operands (``glcomp.stack`` of the per-step outputs of an unrolled recurrence, ``glcomp.cat`` of
many tensors), so this pass rewrites, until none matches:

    slice(concat(x1..xk))  ->  the slice of only the operands it overlaps (``out[:, -1]`` of an
                               LSTM's stacked outputs reads the last step, not all of them)
    concat(x1..xk) reading more pages than the target has units
                           ->  concat(concat(x1..xi), concat(xi+1..xj), ...), each inner concat
                               within the limit (pages of split tensors counted); repeated on
                               the outer concat, so long sequences become a tree of gathers

The planner then stores inner concats where their reader would exceed the limit: each becomes
one draw that gathers a group of pages into one texture. Values are only moved, never
recomputed, so the outputs are bit-identical.
"""

from __future__ import annotations

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.layout import layout_for
from glcomp.codegen.target import Target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph, origin
from glcomp.ir.ops import get_op


def split_wide(plan: KernelPlan) -> KernelPlan:
    """Keep every node within the target's texture units (`split_wide_graph`). Not switchable:
    the target's limit is not optional."""
    return plan.replace(graph=split_wide_graph(plan.graph, plan.target))


def _replace(graph: Graph, old: int, new: int) -> None:
    """Point every reader of `old` (and every output naming it) at `new`, then remove `old`
    and whatever only it read."""
    graph.replace_uses(old, new)
    keep = set(graph.inputs.values()) | set(graph.outputs.values())
    dead = [old]
    while dead:
        n = dead.pop()
        if n in graph.g and n not in keep and graph.read_count(n) == 0:
            dead.extend(graph.operands(n))
            graph.g.remove_node(n)


class _Pages:
    """Texture pages a node occupies when stored (none for constants and hyper-parameters,
    which are inlined or passed as uniforms)."""

    def __init__(self, graph: Graph, target: Target) -> None:
        self.graph, self.size, self.memo = graph, target.max_texture_size, {}

    def __call__(self, n: int) -> int:
        if n not in self.memo:
            g = self.graph
            rule = get_op(g.op(n))
            free = rule.kind == "source" and (not rule.feed or g.attrs(n)["role"] == "hyper")
            self.memo[n] = 0 if free else layout_for(g.shape(n), self.size).pages
        return self.memo[n]

    def reads(self, operands: list[int]) -> int:
        return sum(self(o) for o in set(operands))


def _pieces(graph: Graph, n: int) -> list[tuple[int, int, int]] | None:
    """The concat operands slice `n` overlaps, as (operand, start, stop) along the concat axis,
    when `n` slices a concat and needs only some of its operands; else None."""
    (src,) = graph.operands(n)
    if graph.op(src) != "concat":
        return None
    axis = graph.attrs(src)["axis"]
    starts, stops = graph.attrs(n)["starts"], graph.attrs(n)["stops"]
    lo, hi = starts[axis], stops[axis]
    pieces, at = [], 0
    for x in graph.operands(src):
        size = graph.shape(x)[axis]
        a, b = max(lo, at), min(hi, at + size)
        if a < b:
            pieces.append((x, a - at, b - at))
        at += size
    if not pieces or len(pieces) == len(graph.operands(src)):
        return None  # an empty slice, or one that reads every operand
    return pieces


def _narrowed(graph: Graph, n: int) -> int | None:
    """slice(concat(...)) rewritten to read only the concat operands the slice overlaps (a new
    node, not yet read by anything), or None where the slice needs every operand."""
    pieces = _pieces(graph, n)
    if pieces is None:
        return None
    (src,) = graph.operands(n)
    axis = graph.attrs(src)["axis"]
    starts, stops = graph.attrs(n)["starts"], graph.attrs(n)["stops"]
    with origin(graph.node(n)["origin"]):
        parts = []
        for x, a, b in pieces:
            shape = graph.shape(x)
            x_starts = tuple(a if i == axis else s for i, s in enumerate(starts))
            x_stops = tuple(b if i == axis else s for i, s in enumerate(stops))
            if x_starts == (0,) * len(shape) and x_stops == tuple(shape):
                parts.append(x)
            else:
                part = graph.add("slice", [x], starts=x_starts, stops=x_stops)
                inner = _narrowed(graph, part)  # x may be a concat itself
                if inner is not None:
                    graph.g.remove_node(part)
                parts.append(part if inner is None else inner)
        return parts[0] if len(parts) == 1 else graph.add("concat", parts, axis=axis)


def _groups(operands: list[int], pages: _Pages, limit: int) -> list[list[int]]:
    """Consecutive runs of operands, each reading at most `limit` pages (greedy, in order)."""
    groups: list[list[int]] = []
    for x in operands:
        if groups and pages.reads([*groups[-1], x]) <= limit:
            groups[-1].append(x)
        else:
            groups.append([x])
    return groups


def _too_wide(graph: Graph, n: int, reads: int, limit: int) -> GlcompError:
    where = graph.node(n)["origin"] or "graph"
    return GlcompError(
        f"{where}: kernel for %{n} reads {reads} texture pages, more than the target's {limit} "
        f"texture units, and its {graph.op(n)} of shape {graph.shape(n)} cannot be split further "
        f"(a tensor larger than max_texture_size**2 texels takes one texture unit per page); "
        f"raise max_texture_size or max_texture_units"
    )


def _split_concat(graph: Graph, n: int, pages: _Pages, limit: int) -> None:
    """Replace a concat reading more than `limit` pages by a tree of concats within the limit."""
    axis = graph.attrs(n)["axis"]
    operands = graph.operands(n)
    with origin(graph.node(n)["origin"]):
        while pages.reads(operands) > limit:  # each round has fewer operands than the last
            groups = _groups(operands, pages, limit)
            if all(len(group) == 1 for group in groups):
                raise _too_wide(graph, n, pages.reads(operands), limit)
            operands = [g[0] if len(g) == 1 else graph.add("concat", g, axis=axis) for g in groups]
        new = operands[0] if len(operands) == 1 else graph.add("concat", operands, axis=axis)
    _replace(graph, n, new)


def split_wide_graph(graph: Graph, target: Target) -> Graph:
    """After this pass no node reads more texture pages through its distinct operands than
    `target.max_texture_units` (so the kernel planner can always fit every kernel), and no
    slice reads a concat operand it does not overlap.

    Requires a valid graph; the result computes the same outputs with the same values. Raises
    GlcompError naming the node where a single operand (a tensor split into more pages than the
    target has units) or a pair of operands of a fixed-arity op cannot fit. A graph with
    nothing to rewrite is returned as it is (not copied).
    """
    limit = target.max_texture_units
    pages = _Pages(graph, target)
    if not any(
        (graph.op(n) == "slice" and _pieces(graph, n) is not None) or pages.reads(graph.operands(n)) > limit
        for n in graph.g
    ):
        return graph
    g = graph.copy()
    pages.graph = g  # the copy has the same nodes: what was counted stays valid
    for n in g.topo():
        if n in g.g and g.op(n) == "slice":  # not removed as dead by an earlier rewrite
            new = _narrowed(g, n)
            if new is not None:
                _replace(g, n, new)
    for n in list(g.g.nodes):  # splitting is local: any order will do
        if n not in g.g:
            continue
        reads = pages.reads(g.operands(n))
        if reads <= limit:
            continue
        if g.op(n) != "concat":
            raise _too_wide(g, n, reads, limit)
        _split_concat(g, n, pages, limit)
    return g
