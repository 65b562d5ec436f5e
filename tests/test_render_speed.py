"""What keeps lowering fast: no reference cycles left behind (compiles run with the cyclic
garbage collector paused, glcomp.ir.gcpause, so every cycle made while rendering stays in memory
until the collection at the end of the compile, which then has to go through all of it), and
compiled templates kept on disk between processes, which a damaged or unwritable cache never
breaks."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import jinja2

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import entry_plan
from glcomp.codegen.pipeline import run_pipeline
from glcomp.codegen.render import (
    KernelRenderer,
    _TemplateCache,
    environment,
    fragment_iterations,
    templates_dir,
)
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


def _render_all(cache: jinja2.BytecodeCache | None) -> list[str]:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())), bytecode_cache=cache)
    return [env.get_template("quad.vert.j2").render(webgl1=w) for w in (False, True)]


def test_compiled_templates_are_reused_and_a_damaged_cache_is_passed_over(tmp_path: Path) -> None:
    want = _render_all(None)
    assert _render_all(_TemplateCache(str(tmp_path))) == want
    (entry,) = list(tmp_path.iterdir())  # the compiled template
    assert _render_all(_TemplateCache(str(tmp_path))) == want  # loaded from the cache
    entry.write_bytes(entry.read_bytes()[:40])  # cut short: not valid marshalled code
    assert _render_all(_TemplateCache(str(tmp_path))) == want
    entry.write_bytes(b"")
    assert _render_all(_TemplateCache(str(tmp_path))) == want
    gone = tmp_path / "gone"
    gone.mkdir()
    cache = _TemplateCache(str(gone))
    os.rmdir(gone)  # nowhere to write: compiled every time, no error
    assert _render_all(cache) == want


def test_dict_attributes_read_as_jinja_reads_them() -> None:
    env = environment()
    plain = jinja2.Environment(undefined=jinja2.StrictUndefined)
    for obj, name in (({"a": 1}, "a"), ({"items": 2}, "items"), ({"get": 3}, "get"), ({}, "a"), ([1], "a")):
        got, want = env.getattr(obj, name), plain.getattr(obj, name)
        assert type(got) is type(want) and (isinstance(got, jinja2.Undefined) or got == want), (obj, name)
