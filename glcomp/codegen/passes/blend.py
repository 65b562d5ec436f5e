"""blend: sums of kernel results are added by the blender, not by a kernel.

A stored value that is a tree of `add`s over results of loop kernels (a weight gradient summed
over LSTM time steps, say) needs every term in a texture of its own and one more draw to add
them up. Where the target can blend float render targets, each term's kernel instead renders
straight into the sum's texture: the first with blending off (it overwrites), the rest with
additive blending (ONE, ONE). The terms' textures and the summing draw disappear.

Guarantees: those of `blend_accumulation`. Off with ``passes={"blend": False}``, on targets
that cannot blend float render targets, and with rgba8 storage (blending would add bytes, not
floats).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from glcomp.codegen.kernel_plan import KernelPlan
from glcomp.codegen.kernels import FUSIBLE, Kernel
from glcomp.codegen.layout import Layout
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op


@dataclass
class BlendPlan:
    """`into[root] = sum` sends a term kernel's output to the sum's texture; `blend` names the
    kernels that add into it (every term but the first)."""

    into: dict[int, int] = field(default_factory=dict)
    blend: set[str] = field(default_factory=set)


def blend(plan: KernelPlan) -> KernelPlan:
    """Add sums of loop results with additive blending, on targets that blend float textures
    (never with rgba8 storage: blending would add bytes, not floats)."""
    if not (plan.switches["blend"] and plan.target.float_blend) or plan.storage == "rgba8":
        return plan
    kernels, blends = blend_accumulation(list(plan.kernels), plan.graph, plan.layouts)
    return plan.replace(kernels=kernels, into=blends.into, blended=frozenset(blends.blend))


def blend_accumulation(
    kernels: list[Kernel], graph: Graph, layouts: dict[int, Layout]
) -> tuple[list[Kernel], BlendPlan]:
    """Replace add-tree kernels by blended writes of their terms.

    Guarantees: a sum is rewritten only when each term is the single result of a loop kernel
    (not an MRT group; the first term, written unblended, may be a loop result of a group), is
    read by nothing but the add tree (exactly once), is not an output, and has exactly the sum's
    layout (one page); the term kernels keep their order, so the sum is complete before its first
    reader runs.
    """
    plan = BlendPlan()
    by_root = {k.roots[0]: k for k in kernels if len(k.roots) == 1}
    in_group = {r: k for k in kernels if len(k.roots) > 1 for r in k.roots}
    outputs = set(graph.outputs.values())
    drop: set[str] = set()
    for k in kernels:
        if k.template != "map" or len(k.roots) != 1:
            continue
        total = k.roots[0]
        tree = [*k.body, total]
        if not all(get_op(graph.op(n)).blend_add for n in tree) or len(k.leaves) < 2:
            continue
        uses = Counter(src for n in tree for src in graph.operands(n))
        terms = list(k.leaves)
        writer = {t: by_root.get(t) or in_group.get(t) for t in terms}
        if any(w is None for w in writer.values()):
            continue
        # The first term's draw overwrites the sum unblended, so it may also write other targets
        # (an MRT group) when that term is a loop result; the blended terms are their draws' only
        # result, so blending touches nothing else.
        first = min(terms, key=lambda t: kernels.index(writer[t]))
        single = {t: by_root[t].template != "map" for t in terms if t in by_root}
        if first not in by_root:
            single[first] = get_op(graph.op(first)).kind not in (*FUSIBLE, "source")
        ok = all(
            single.get(t, False)
            and uses[t] == 1
            and graph.read_count(t) == 1
            and t not in outputs
            and layouts[t] == layouts[total]
            and layouts[t].pages == 1
            for t in terms
        )
        if not ok or any(uses[n] != 1 for n in k.body):
            continue
        order = sorted(terms, key=lambda t: kernels.index(writer[t]))
        for i, t in enumerate(order):
            plan.into[t] = total
            if i:
                plan.blend.add(writer[t].name)
        drop.add(k.name)
    return [k for k in kernels if k.name not in drop], plan
