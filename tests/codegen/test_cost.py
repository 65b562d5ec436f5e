"""The one cost model (glcomp/codegen/cost.py): the decisions that trade work against draws read
their numbers from it, in its unit, and the calibration script measures that unit."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen import cost

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))


def _draws(model: nn.Module, shape: tuple[int, ...]) -> list[dict[str, Any]]:
    glcomp.manual_seed(0)
    prog = glcomp.compile(model, {"x": shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1))
    return prog.bundle().manifest["entries"]["train_step"]["draws"]


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


def test_mrt_merges_by_the_draw_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    def mk() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 10))

    base = len(_draws(mk(), (8, 1, 8, 8)))
    monkeypatch.setattr(cost, "DRAW", 0)  # a draw costs nothing: merging never pays
    free = len(_draws(mk(), (8, 1, 8, 8)))
    monkeypatch.setattr(cost, "DRAW", 1 << 40)  # a draw costs everything: merge whatever may merge
    dear = len(_draws(mk(), (8, 1, 8, 8)))
    assert dear <= base <= free and dear < free


def test_tiling_by_the_blocked_draw_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost, "BLOCKED_DRAW", 1 << 40)  # a blocked draw costs everything: none tiled
    base = _draws(_mlp(), (32, 64))
    assert not any(d["kernel"].endswith("_mm") for d in base)
    monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)  # the fetch count alone decides: it favours tiling
    free = _draws(_mlp(), (32, 64))
    blocked = [d for d in free if d["kernel"].endswith("_mm") and len(d["targets"]) > 1]
    assert blocked and len(free) > len(base)


def test_calibration_measures_the_unit(gl_ctx: Any) -> None:
    import calibrate

    with gl_ctx:  # make the shared context current (runtimes switch contexts)
        r = calibrate.measure(gl_ctx, k_small=4, k_large=20)
    assert r["element_iteration_s"] > 0 and r["draw_s"] > 0
    assert r["draw_in_iterations"] == pytest.approx(r["draw_s"] / r["element_iteration_s"])


# -- constants per device class ---------------------------------------------------------------------
def _compiled_draws(model: nn.Module, shape: tuple[int, ...], **options: Any) -> int:
    glcomp.manual_seed(0)
    prog = glcomp.compile(
        model, {"x": shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1), **options
    )
    return len(prog.bundle().manifest["entries"]["train_step"]["draws"])


def test_a_target_carries_its_cost_constants_and_the_decisions_follow_them() -> None:
    from glcomp.codegen.target import make_target

    default, gpu = make_target("webgl2"), make_target("webgl2-gpu")
    assert cost.draws(3, target=default) == 3 * cost.DRAW  # the cost model's own constants
    assert cost.draws(2, blocked=True, target=default) == 2 * cost.BLOCKED_DRAW
    assert cost.draws(2, target=gpu) == 2 * gpu.draw_cost and gpu.draw_cost != cost.DRAW
    assert cost.draws(1, blocked=True, target=make_target("webgl2", blocked_draw_cost=7)) == 7
    # the manifest records device limits only: its schema and older loaders stay as they are
    assert "draw_cost" not in default.to_json() and "blocked_draw_cost" not in gpu.to_json()

    def mk() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 10))

    base = _compiled_draws(mk(), (8, 1, 8, 8))
    free = _compiled_draws(mk(), (8, 1, 8, 8), draw_cost=1)  # merging never pays
    dear = _compiled_draws(mk(), (8, 1, 8, 8), draw_cost=1 << 40)  # merge whatever may merge
    assert dear <= base <= free and dear < free
    # a product left untiled where blocked draws are dear is blocked where they are cheap
    untiled = _compiled_draws(_mlp(), (64, 64), blocked_draw_cost=1 << 40)
    assert _compiled_draws(_mlp(), (64, 64), blocked_draw_cost=1) > untiled  # block + reader draws
    with pytest.raises(glcomp.GlcompError, match="draw_cost must be a positive int"):
        _compiled_draws(_mlp(), (64, 64), draw_cost=0)


def test_the_gpu_preset_trains_like_the_reference(gl_runtime: Any) -> None:
    """webgl2-gpu: 8 draw buffers, 8192-texel textures and a GPU's cost constants (more merged and
    blocked draws); GL and the reference runtime take the same steps."""
    import numpy as np

    glcomp.manual_seed(3)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 64, 32),
        nn.ReLU(),
        nn.Linear(32, 3),
    )
    prog = glcomp.compile(
        model,
        {"x": (16, 1, 8, 8)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.Adam(lr=1e-2),
        target="webgl2-gpu",
    )
    manifest = prog.bundle().manifest
    assert manifest["target"]["name"] == "webgl2-gpu" and manifest["target"]["max_draw_buffers"] == 8
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(16, 1, 8, 8)).astype(np.float32), rng.integers(0, 3, size=16)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(3):
            assert gl.train_step(x=x, y=y) == pytest.approx(ref.train_step(x=x, y=y), rel=1e-4)
        state = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, state[name], rtol=1e-4, atol=1e-5, err_msg=name)
