"""The code-generation pipeline as data: an ordered list of named `KernelPlan -> KernelPlan` passes.

Each pass has one name, used everywhere: it is the name of its module under
glcomp.codegen.passes and of the function there, its key in ``passes={...}`` when it can be
switched (options.PASSES), and what ``dump_after=`` takes. A pass never changes the plan it is
given; one switched off returns it as it is (``fusion`` off still plans kernels, one per op, and
``memplan`` off still assigns textures, none shared). Each pass module states its guarantees.

    pushdown, fold_views, join_sums,         IR rewrites (switchable; the rewrites themselves are
    split_reductions, pointwise,             glcomp.ir.passes', the IR never imports codegen)
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

from glcomp.codegen.kernel_plan import KernelPlan, check_plan
from glcomp.codegen.options import PASSES
from glcomp.codegen.passes.blend import blend
from glcomp.codegen.passes.epilogue import epilogue
from glcomp.codegen.passes.fold_views import fold_views
from glcomp.codegen.passes.fusion import fusion
from glcomp.codegen.passes.isolate_states import isolate_states
from glcomp.codegen.passes.join_sums import join_sums
from glcomp.codegen.passes.layout import layout
from glcomp.codegen.passes.memplan import memplan
from glcomp.codegen.passes.mrt import mrt
from glcomp.codegen.passes.pointwise import pointwise
from glcomp.codegen.passes.pushdown import pushdown
from glcomp.codegen.passes.split_reductions import split_reductions
from glcomp.codegen.passes.split_weight_grads import split_weight_grads
from glcomp.codegen.passes.split_wide import split_wide
from glcomp.codegen.passes.texture_units import texture_units
from glcomp.codegen.passes.tiling import tiling
from glcomp.errors import GlcompError


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
        join_sums,
        split_reductions,
        pointwise,
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
    until: str | None = None,
) -> KernelPlan:
    """Run every pass of PIPELINE on `plan`, in order (with `until`, the passes up to and
    including the one of that name). With `check`, `check_plan` runs after each pass; `dump`
    gets ``str(plan)`` after the pass named `dump_after`. Unknown names raise GlcompError."""
    check_pass_name(dump_after)
    check_pass_name(until, "until")
    for p in PIPELINE:
        plan = p.run(plan).replace(done=(*plan.done, p.name))
        if check:
            check_plan(plan)
        if p.name == dump_after:
            dump(str(plan))
        if p.name == until:
            break
    return plan
