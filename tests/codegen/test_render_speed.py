"""What keeps lowering fast: no reference cycles left behind (compiles run with the cyclic
garbage collector paused, glcomp.ir.gcpause, so every cycle made while rendering stays in memory
until the collection at the end of the compile, which then has to go through all of it), and
Jinja's attribute lookups on dicts without a failed attribute lookup first."""

from __future__ import annotations

import gc

import jinja2

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import entry_plan
from glcomp.codegen.families import environment
from glcomp.codegen.loops import fragment_iterations
from glcomp.codegen.pipeline import run_pipeline
from glcomp.codegen.render import KernelRenderer
from glcomp.codegen.render_cache import RenderCache


def test_rendering_makes_no_cyclic_garbage() -> None:
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    prog = glcomp.compile(model, {"x": (8, 1, 8, 8)}, nn.CrossEntropyLoss(), optim.Adam(lr=1e-3))
    plan = run_pipeline(entry_plan(prog, "train_step"), None, False)
    renderer = KernelRenderer(plan.graph, dict(plan.layouts), plan.target)
    hypers = plan.hypers()
    limit = plan.target.max_loop_iterations
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        counts = [fragment_iterations(plan.graph, k.roots, set(k.leaves), limit) for k in plan.kernels]
        cache = RenderCache()
        lowered = [cache.lower(renderer, plan, k, hypers) for k in plan.kernels]
        garbage = gc.collect()
    finally:
        if was:
            gc.enable()
    assert max(counts) > 0 and all(low.source for low in lowered)
    assert garbage == 0


def test_dict_attributes_read_as_jinja_reads_them() -> None:
    env = environment()
    plain = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for obj, name in (({"a": 1}, "a"), ({"items": 2}, "items"), ({"get": 3}, "get"), ({}, "a"), ([1], "a")):
        got, want = env.getattr(obj, name), plain.getattr(obj, name)
        assert type(got) is type(want) and (isinstance(got, jinja2.Undefined) or got == want), (obj, name)
