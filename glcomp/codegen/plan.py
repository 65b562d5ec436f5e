"""Kernel planning: decide which values live in textures and group the rest into kernels.

Every op that needs a loop of its own (matmul, conv, pool, reduce) roots a kernel. Elementwise,
movement and index ops are fused into the kernel that reads them: they become small GLSL
functions the reader calls per element, so a permute before a matmul or a bias add after it costs
no draw call. A fused value is recomputed where it is read; to keep that linear, a value with more
than one reader (counted through views) gets a texture of its own.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from glcomp.codegen import cost
from glcomp.codegen.target import Target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.ir.ops.registry import LOOP_KINDS

FUSIBLE = ("elementwise", "movement", "index")


def _fed(graph: Graph, n: int) -> bool:
    """A graph input: a texture or uniform the runtime feeds."""
    return get_op(graph.op(n)).feed


def _constant(graph: Graph, n: int) -> bool:
    """A source written into the shader: never stored, never sampled."""
    rule = get_op(graph.op(n))
    return rule.kind == "source" and not rule.feed


@dataclass(frozen=True)
class Kernel:
    """One draw call's worth of work: `roots` are written (one render target each), `body` are
    the fused nodes computed on the way (topological order), `leaves` the textures read.
    Kernels are values: passes build new ones and never change the lists of one they were given."""

    name: str
    roots: list[int]
    body: list[int]
    leaves: list[int]
    template: str
    origins: list[str] = field(default_factory=list)


def _readers_through_views(graph: Graph, n: int, memo: dict[int, int]) -> int:
    """How many non-view nodes read `n`, following chains of movement ops."""
    if n in memo:
        return memo[n]
    count = 0
    for edge in graph.g.out_edges(n):
        user = edge[1]
        if get_op(graph.op(user)).kind == "movement":
            count += _readers_through_views(graph, user, memo)
        else:
            count += 1
    memo[n] = count
    return count


def _recompute_cost(graph: Graph, n: int, stored: set[int]) -> int:
    """Roughly how many ops recomputing fused node `n` costs (the ops' `cost`: transcendentals
    count double, movement nothing)."""
    cost, seen, stack = 0, set(), [n]
    while stack:
        m = stack.pop()
        rule = get_op(graph.op(m))
        if m in seen or m in stored or rule.kind == "source":
            continue
        seen.add(m)
        cost += rule.cost
        stack.extend(graph.operands(m))
    return cost


def materialized(graph: Graph, fusion: bool = True) -> set[int]:
    """The nodes whose values are stored in textures: inputs, outputs, loop-kernel results and
    computed values read more than once. Constants and views of stored values never are.
    With `fusion` off every computed node is stored (one kernel per op, to measure fusion)."""
    return set(storage_reasons(graph, fusion))


# Why a value is stored (KernelPlan.stored): the first reason that applies, in this order.
INPUT, OUTPUT, STATE, LOOP, MULTI_READER, LOOP_OPERAND, UNFUSED, TEXTURE_UNITS = (
    "input",
    "output",
    "state",
    "loop",
    "multi-reader",
    "loop-operand",
    "unfused",
    "texture-units",
)


def storage_reasons(graph: Graph, fusion: bool = True, order: list[int] | None = None) -> dict[int, str]:
    """`materialized` with the reason each node is stored (INPUT, OUTPUT, LOOP, MULTI_READER,
    LOOP_OPERAND, or UNFUSED with `fusion` off), in the order the nodes were chosen. `order` is
    graph.topo() when the caller has it."""
    if not fusion:
        return {
            n: INPUT if _fed(graph, n) else UNFUSED
            for n in graph.nodes()
            if not _constant(graph, n) and not (_fed(graph, n) and graph.attrs(n)["role"] == "hyper")
        }
    order = graph.topo() if order is None else order
    stored: dict[int, str] = {}
    memo: dict[int, int] = {}
    outputs = set(graph.outputs.values())
    for n in order:
        kind = get_op(graph.op(n)).kind
        if _fed(graph, n) and graph.attrs(n)["role"] != "hyper":
            stored[n] = INPUT
        elif n in outputs:
            stored[n] = OUTPUT
        elif kind in LOOP_KINDS:
            stored[n] = LOOP
        elif kind in ("elementwise", "index") and _readers_through_views(graph, n, memo) > 1:
            stored[n] = MULTI_READER
    # A matmul or convolution reads each operand element many times; a fused operand would be
    # recomputed at every read, so store operands that are more than a cheap op or two.
    for n in order:
        if get_op(graph.op(n)).rereads:
            for src in graph.operands(n):
                while get_op(graph.op(src)).kind == "movement" and src not in stored:
                    (src,) = graph.operands(src)[:1]
                if src not in stored and _recompute_cost(graph, src, stored.keys()) > cost.RECOMPUTE:
                    stored[src] = LOOP_OPERAND
    return stored


def _epilogue_reader(graph: Graph, n: int, stored: set[int]) -> int | None:
    """The stored elementwise value that alone reads loop result `n`, each element at most once
    (through elementwise ops and one-to-one views), or None."""
    while True:
        users = [dst for _, dst in graph.g.out_edges(n)]
        if len(users) != 1:
            return None
        (user,) = users
        rule = get_op(graph.op(user))
        if rule.kind not in ("elementwise", "movement") or rule.broadcast:
            return None  # a broadcast would recompute the loop once per copy
        if user in stored:
            return user
        n = user


def fuse_epilogues(graph: Graph, stored: set[int], order: list[int] | None = None) -> None:
    """Un-store loop results that one elementwise kernel reads once per element: the loop then
    runs inside that kernel (a matmul with its bias add, or with the SGD update that consumes
    it) and saves a draw and a texture. `order` is graph.topo() when the caller has it."""
    outputs = set(graph.outputs.values())
    taken: set[int] = set()
    for n in graph.topo() if order is None else order:
        loop = get_op(graph.op(n)).kind in LOOP_KINDS
        if loop and n in stored and n not in outputs:
            reader = _epilogue_reader(graph, n, stored)
            # One loop per epilogue kernel: several (a sum of per-step products) make a shader
            # that software rasterizers compile and run very slowly.
            if reader is not None and reader not in taken:
                taken.add(reader)
                stored.discard(n)


def _fused_region(
    graph: Graph, root: int, stored: Collection[int], index: NodeIndex | None = None
) -> tuple[list[int], list[int]]:
    """Nodes computed inside root's kernel and the stored leaves it reads."""
    index = index or NodeIndex(graph)
    body: set[int] = set()
    leaves: set[int] = set()
    stack = list(index.operands[root])
    while stack:
        n = stack.pop()
        if n in stored or _fed(graph, n):  # hyper-parameters are uniforms, still leaves
            leaves.add(n)
        elif n not in body:
            body.add(n)
            stack.extend(index.operands[n])
    return sorted(body, key=index.position.__getitem__), sorted(leaves)


class NodeIndex:
    """Each node's operands and position in graph.topo(), computed once per plan (or taken
    from `order` and `operands` when the caller has them)."""

    def __init__(
        self,
        graph: Graph,
        order: list[int] | None = None,
        operands: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        self.topo = graph.topo() if order is None else order
        self.position = {n: i for i, n in enumerate(self.topo)}
        self.operands = operands if operands is not None else {n: graph.operands(n) for n in self.topo}


def _leaf_sets(graph: Graph, body: list[int], stored: set[int], index: NodeIndex) -> dict[int, set[int]]:
    """For each node of a fused region (in topological order): the stored leaves it reads."""
    sets: dict[int, set[int]] = {}
    for b in body:
        own: set[int] = set()
        for o in index.operands[b]:
            if o in stored or _fed(graph, o):
                own.add(o)
            else:
                own |= sets[o]
        sets[b] = own
    return sets


def _samplers(graph: Graph, leaves: Iterable[int], pages: dict[int, int]) -> int:
    return sum(pages[n] for n in leaves if graph.attrs(n).get("role") != "hyper")


def plan_kernels(
    graph: Graph, target: Target, pages: dict[int, int], fusion: bool = True, epilogue: bool = True
) -> tuple[list[Kernel], set[int]]:
    """Group the graph into kernels in execution order.

    Guarantees: every stored non-input node is the root of exactly one kernel, kernels come
    in dependency order, and no kernel samples more textures than the target has units (fused
    operands are stored instead, each time the one reading the most pages that still fits, until
    the kernel fits) provided no node reads more pages through its own operands (split_wide
    ensures that). `pages` gives the number of texture pages per node (split tensors need one
    sampler each).
    """
    stored = materialized(graph, fusion)
    if fusion and epilogue:
        fuse_epilogues(graph, stored)
    index = NodeIndex(graph)
    store_for_texture_units(graph, target, pages, stored, index)
    return form_kernels(graph, stored, index), stored


def store_for_texture_units(
    graph: Graph, target: Target, pages: dict[int, int], stored: set[int], index: NodeIndex
) -> list[int]:
    """Add fused operands to `stored` until no kernel samples more texture pages than the target
    has units; returns the nodes added, in the order they were chosen (see plan_kernels)."""
    added: list[int] = []
    limit = target.max_texture_units
    changed = True
    while changed:  # storing one more value can only reduce sampler pressure elsewhere
        changed = False
        for n in index.topo:
            if n not in stored or _fed(graph, n):
                continue
            body, leaves = _fused_region(graph, n, stored, index)
            while _samplers(graph, leaves, pages) > limit:
                candidates = [b for b in body if not _constant(graph, b)]
                if not candidates:
                    raise GlcompError(
                        f"{graph.node(n)['origin']}: kernel for %{n} reads "
                        f"{_samplers(graph, leaves, pages)} texture pages, more than the target's "
                        f"{target.max_texture_units} texture units"
                    )
                # Store the fused operand that hides the most leaves behind it while fitting the
                # target itself (a long chain of sums is then cut every `limit - 1` terms, not
                # at every term), or else the one hiding the most leaves.
                sets = _leaf_sets(graph, body, stored, index)
                reads = {b: _samplers(graph, sets[b], pages) for b in candidates}
                best = max(candidates, key=lambda b: (reads[b] <= limit, reads[b], -b))
                stored.add(best)
                added.append(best)
                changed = True
                body, leaves = _fused_region(graph, n, stored, index)
    return added


def form_kernels(graph: Graph, stored: Collection[int], index: NodeIndex) -> list[Kernel]:
    """One kernel per stored non-input node, in topological order: the node as its root, the
    fused nodes it computes as its body and the stored values it reads as its leaves."""
    kernels: list[Kernel] = []
    for n in index.topo:
        if n not in stored or _fed(graph, n):
            continue
        body, leaves = _fused_region(graph, n, stored, index)
        rule = get_op(graph.op(n))
        template = rule.template if rule.kind not in FUSIBLE and rule.kind != "source" else "map"
        origins = sorted({graph.node(m)["origin"] for m in [*body, n] if graph.node(m)["origin"]})
        kernels.append(Kernel(f"k{len(kernels)}_{graph.op(n)}", [n], body, leaves, template, origins))
    return kernels
