"""texture_units: no kernel samples more texture pages than the target has texture units.

A kernel samples one texture unit per page of every stored value it reads (hyper-parameters are
uniforms and take none). Where a kernel reads too many, a fused operand is stored instead
(TEXTURE_UNITS), each time the one hiding the most pages behind it while itself fitting the
target (so a long chain of sums is cut every `limit - 1` terms, not at every term), or else the
one hiding the most, until the kernel fits; repeated until no kernel changes.

Guarantees: every kernel reads at most `target.max_texture_units` pages, provided no node reads
more through its own operands (split_wide ensures that; otherwise GlcompError naming the model
part); the kernels are formed again with fusion's guarantees. A plan that fits already is
returned as it is. Not switchable: a target's limit is not optional.
"""

from __future__ import annotations

from collections.abc import Iterable

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import (
    TEXTURE_UNITS,
    NodeIndex,
    constant,
    fed,
    fused_region,
    index_of,
    with_kernels,
)
from glcomp.codegen.target import Target
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph


def texture_units(plan: KernelPlan) -> KernelPlan:
    """Store fused operands until no kernel samples more texture pages than the target has
    texture units (`store_for_texture_units`)."""
    pages = {n: lay.pages for n, lay in plan.layouts.items()}
    kept = set(plan.stored)
    added = store_for_texture_units(plan.graph, plan.target, pages, kept, index_of(plan))
    if not added:
        return plan
    return with_kernels(plan, {**plan.stored, **dict.fromkeys(added, TEXTURE_UNITS)})


def _leaf_sets(graph: Graph, body: list[int], stored: set[int], index: NodeIndex) -> dict[int, set[int]]:
    """For each node of a fused region (in topological order): the stored leaves it reads."""
    sets: dict[int, set[int]] = {}
    for b in body:
        own: set[int] = set()
        for o in index.operands[b]:
            if o in stored or fed(graph, o):
                own.add(o)
            else:
                own |= sets[o]
        sets[b] = own
    return sets


def _samplers(graph: Graph, leaves: Iterable[int], pages: dict[int, int]) -> int:
    return sum(pages[n] for n in leaves if graph.attrs(n).get("role") != "hyper")


def store_for_texture_units(
    graph: Graph, target: Target, pages: dict[int, int], stored: set[int], index: NodeIndex
) -> list[int]:
    """Add fused operands to `stored` until no kernel samples more texture pages than the target
    has units; returns the nodes added, in the order they were chosen (see the module)."""
    added: list[int] = []
    limit = target.max_texture_units
    changed = True
    while changed:  # storing one more value can only reduce sampler pressure elsewhere
        changed = False
        for n in index.topo:
            if n not in stored or fed(graph, n):
                continue
            body, leaves = fused_region(graph, n, stored, index)
            while _samplers(graph, leaves, pages) > limit:
                candidates = [b for b in body if not constant(graph, b)]
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
                body, leaves = fused_region(graph, n, stored, index)
    return added
