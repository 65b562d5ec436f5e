"""The code-generation pipeline as data: an ordered list of named `KernelPlan -> KernelPlan` passes.

Each pass has one name, used everywhere: it is the name of its function in this module, its key
in ``passes={...}`` when it can be switched (options.PASSES), and what ``dump_after=`` takes.
A pass never changes the plan it is given; one switched off returns it as it is (``fusion`` off
still plans kernels, one per op, and ``memplan`` off still assigns textures, none shared).

    pushdown, fold_views, split_reductions,  IR rewrites (switchable)
    split_weight_grads
    split_wide, isolate_states               IR rewrites the target and the bundle need
    layout                                   the topological order and every node's texture layout
    fusion, epilogue, texture_units          which values are stored, and the kernels computing them
    mrt, blend                               kernels merged into multi-target draws, blended sums
    tiling                                   large matmuls as register-blocked draws plus a gather
    memplan                                  a texture slot for every temporary

`run_pipeline` runs them in this order; `check_plan` may be run after each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from glcomp.codegen import plan as kernels_of
from glcomp.codegen.blend import blend_accumulation
from glcomp.codegen.kernel_plan import KernelPlan, check_plan
from glcomp.codegen.layout import Layout, layout_for
from glcomp.codegen.memplan import assign_slots
from glcomp.codegen.mrt import mrt_fusion
from glcomp.codegen.options import PASSES
from glcomp.codegen.split_wide import split_wide as split_wide_graph
from glcomp.codegen.tiled import choose_tiling, split_epilogues
from glcomp.errors import GlcompError
from glcomp.ir import passes as ir
from glcomp.ir.ops import get_op
from glcomp.ir.tensor import Tensor


def pushdown(plan: KernelPlan) -> KernelPlan:
    """Push transposes below matmuls and sums (opt-in)."""
    if not plan.switches["pushdown"]:
        return plan
    return plan.replace(graph=ir.transpose_pushdown(plan.graph))


def fold_views(plan: KernelPlan) -> KernelPlan:
    """Fold transposes of transposes and reshapes of reshapes, so loop kernels see stored
    operands behind double transposes."""
    if not plan.switches["fold_views"]:
        return plan
    return plan.replace(graph=ir.fold_views(plan.graph))


def split_reductions(plan: KernelPlan) -> KernelPlan:
    """Reduce long sums and maxima with few outputs in two stages (before kernel planning:
    each stage becomes a kernel of its own)."""
    if not plan.switches["split_reductions"]:
        return plan
    return plan.replace(graph=ir.split_reductions(plan.graph))


def split_weight_grads(plan: KernelPlan) -> KernelPlan:
    """Split long convolution weight gradients with small outputs into partial gradients over
    batch chunks, added up (before kernel planning: each part becomes a kernel of its own)."""
    if not plan.switches["split_weight_grads"]:
        return plan
    return plan.replace(graph=ir.split_weight_grads(plan.graph))


def split_wide(plan: KernelPlan) -> KernelPlan:
    """Keep every node within the target's texture units (glcomp.codegen.split_wide)."""
    return plan.replace(graph=split_wide_graph(plan.graph, plan.target))


def isolate_states(plan: KernelPlan) -> KernelPlan:
    """Give every written-back state a node of its own: a state's new texture must not be an
    input texture or shared with another output (identity copies are inserted where needed).
    A plan whose states are isolated already is returned as it is."""
    g = plan.graph
    states = [n for key, n in g.outputs.items() if key.partition(":")[0] in ("param", "buffer", "state")]
    if len(set(states)) == len(states) and not any(get_op(g.op(n)).feed for n in states):
        return plan
    g = g.copy()
    seen: set[int] = set()
    for key, n in list(g.outputs.items()):
        if key.partition(":")[0] not in ("param", "buffer", "state"):
            continue
        if get_op(g.op(n)).feed or n in seen:
            g.outputs[key] = Tensor(g, n).detach().node
        seen.add(g.outputs[key])
    return plan.replace(graph=g)


def layout(plan: KernelPlan) -> KernelPlan:
    """The graph is final from here on: its topological order, each node's operands and each
    node's texture layout, computed once."""
    g, size = plan.graph, plan.target.max_texture_size
    order = g.topo()
    by_shape: dict[tuple[int, ...], Layout] = {}  # layouts are values: one per distinct shape
    layouts = {}
    for n in g.nodes():
        shape = g.shape(n)
        if shape not in by_shape:
            by_shape[shape] = layout_for(shape, size)
        layouts[n] = by_shape[shape]
    return plan.replace(
        order=tuple(order), operands={n: tuple(g.operands(n)) for n in order}, layouts=layouts
    )


def _index(plan: KernelPlan) -> kernels_of.NodeIndex:
    return kernels_of.NodeIndex(plan.graph, list(plan.order), plan.operands)


def _kernels(plan: KernelPlan, stored: dict[int, str]) -> KernelPlan:
    return plan.replace(stored=stored, kernels=kernels_of.form_kernels(plan.graph, stored, _index(plan)))


def fusion(plan: KernelPlan) -> KernelPlan:
    """Store inputs, outputs, loop results, values read more than once and costly loop
    operands; fuse everything else into the kernels that read it (off: one kernel per op)."""
    stored = kernels_of.storage_reasons(plan.graph, plan.switches["fusion"], list(plan.order))
    for n in plan.state_out():
        if stored.get(n) == kernels_of.OUTPUT:
            stored[n] = kernels_of.STATE
    return _kernels(plan, stored)


def epilogue(plan: KernelPlan) -> KernelPlan:
    """Run a loop kernel inside the elementwise kernel that alone reads it, once per element."""
    if not (plan.switches["fusion"] and plan.switches["epilogue"]):
        return plan
    kept = set(plan.stored)
    kernels_of.fuse_epilogues(plan.graph, kept, list(plan.order))
    if len(kept) == len(plan.stored):
        return plan
    return _kernels(plan, {n: why for n, why in plan.stored.items() if n in kept})


def texture_units(plan: KernelPlan) -> KernelPlan:
    """Store fused operands until no kernel samples more texture pages than the target has
    texture units (glcomp.codegen.plan.store_for_texture_units)."""
    pages = {n: lay.pages for n, lay in plan.layouts.items()}
    kept = set(plan.stored)
    added = kernels_of.store_for_texture_units(plan.graph, plan.target, pages, kept, _index(plan))
    if not added:
        return plan
    return _kernels(plan, {**plan.stored, **dict.fromkeys(added, kernels_of.TEXTURE_UNITS)})


def mrt(plan: KernelPlan) -> KernelPlan:
    """Merge consecutive kernels that share inputs into multi-target draws (glcomp.codegen.mrt)."""
    if not plan.switches["mrt"]:
        return plan
    fixed = set(plan.state_out())
    kernels, resized = mrt_fusion(list(plan.kernels), plan.graph, plan.layouts, plan.target, fixed)
    return plan.replace(kernels=kernels, layouts={**plan.layouts, **resized})


def blend(plan: KernelPlan) -> KernelPlan:
    """Add sums of loop results with additive blending, on targets that blend float textures
    (never with rgba8 storage: blending would add bytes, not floats)."""
    if not (plan.switches["blend"] and plan.target.float_blend) or plan.storage == "rgba8":
        return plan
    kernels, blends = blend_accumulation(list(plan.kernels), plan.graph, plan.layouts)
    return plan.replace(kernels=kernels, into=blends.into, blended=frozenset(blends.blend))


def tiling(plan: KernelPlan) -> KernelPlan:
    """Large matmuls run as a register-blocked draw into tiles plus a gather draw, where the
    cost model says that pays on the target (glcomp.codegen.tiled); a product fused into an
    epilogue is split off into a kernel of its own first where tiling it pays for the draws.
    Off with rgba8 storage: tiled draws write float texels of their own (no byte encoding)."""
    if not plan.switches["tiling"] or plan.storage == "rgba8":
        return plan
    keep = set(plan.blended)
    kernels, products = split_epilogues(list(plan.kernels), plan.graph, dict(plan.layouts), plan.target, keep)
    layouts = dict(plan.layouts)  # one copy for all kernels: choose_tiling only reads it
    chosen = {k.name: choose_tiling(plan.graph, k, layouts, plan.target) for k in kernels}
    tilings = {name: t for name, t in chosen.items() if t is not None and name not in keep}
    if not tilings:
        return plan
    stored = {**plan.stored, **dict.fromkeys(sorted(products - set(plan.stored)), kernels_of.LOOP)}
    return plan.replace(kernels=kernels, stored=stored, tilings=tilings)


def memplan(plan: KernelPlan) -> KernelPlan:
    """A texture slot per page of every temporary, reused by liveness (off: none shared)."""
    steps = plan.steps()
    pinned = set(plan.readback().values())
    slots = assign_slots(steps, plan.temporaries(), pinned, plan.switches["memplan"])
    return plan.replace(memory={n: tuple(s) for n, s in slots.items()})


@dataclass(frozen=True)
class Pass:
    """A named step of the pipeline: `run` maps a plan to a new plan; `switchable` passes can be
    turned off with ``passes={name: False}``."""

    name: str
    run: Callable[[KernelPlan], KernelPlan]

    @property
    def switchable(self) -> bool:
        return self.name in PASSES


PIPELINE: tuple[Pass, ...] = tuple(
    Pass(f.__name__, f)
    for f in (
        pushdown,
        fold_views,
        split_reductions,
        split_weight_grads,
        split_wide,
        isolate_states,
        layout,
        fusion,
        epilogue,
        texture_units,
        mrt,
        blend,
        tiling,
        memplan,
    )
)
PASS_NAMES: tuple[str, ...] = tuple(p.name for p in PIPELINE)
assert set(PASSES) <= set(PASS_NAMES), "every switchable pass is a pipeline pass"


def check_pass_name(name: str | None, what: str = "dump_after") -> None:
    """GlcompError unless `name` is None or names a pass of the pipeline."""
    if name is not None and name not in PASS_NAMES:
        raise GlcompError(f"{what}: unknown pass {name!r}; passes in order: {list(PASS_NAMES)}")


def run_pipeline(
    plan: KernelPlan,
    dump_after: str | None = None,
    check: bool = False,
    dump: Callable[[str], None] = print,
) -> KernelPlan:
    """Run every pass of PIPELINE on `plan`, in order. With `check`, `check_plan` runs after each
    pass; `dump` gets ``str(plan)`` after the pass named `dump_after`."""
    check_pass_name(dump_after)
    for p in PIPELINE:
        plan = p.run(plan).replace(done=(*plan.done, p.name))
        if check:
            check_plan(plan)
        if p.name == dump_after:
            dump(str(plan))
    return plan
