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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


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
    base = _draws(_mlp(), (32, 64))
    assert not any(d["kernel"].endswith("_mm") for d in base)  # small products: the one-texel kernel
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
