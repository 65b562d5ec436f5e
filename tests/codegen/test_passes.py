"""Code-generation passes: switching each one off changes draws or memory, never results.

Also pins the training-loop contracts of issue "training on the GPU": MRT and blend groups,
static memory (no GL object is created after load, over 10,000 steps), the learning rate as a
uniform, gradient clipping, and sparse loss readback.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import LastStep
from hypothesis import given, settings

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.ir.interpret import evaluate
from glcomp.ir.passes import pushdown
from glcomp.testing import random_graphs

PASS_SETTINGS = [
    {},
    {"mrt": False},
    {"fusion": False},
    {"memplan": False},
    {"mrt": False, "blend": False},
    {"pushdown": True},
    {"pushdown": True, "mrt": False},
    {"epilogue": False},
    {"pushdown": True, "mrt": False, "epilogue": False},
]


def _compile(model: nn.Module, passes: dict[str, bool], opt: optim.Optimizer | None = None) -> glcomp.Program:
    return glcomp.compile(
        model,
        inputs={"x": (4, 4, 3)},
        loss=nn.CrossEntropyLoss(),
        optimizer=opt or optim.Adam(lr=1e-2),
        passes=passes,
    )


def _batch() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    return rng.normal(size=(4, 4, 3)).astype(np.float32), np.array([0, 1, 1, 0])


@pytest.mark.parametrize(
    "passes", PASS_SETTINGS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()) or "default"
)
def test_pass_settings_agree_with_reference(gl_runtime: Any, passes: dict[str, bool]) -> None:
    glcomp.manual_seed(1)
    model = LastStep(3, 5, 2)
    prog = _compile(model, passes)
    ref = prog.runtime("reference")
    x, y = _batch()
    with gl_runtime(prog) as gl:
        for name, g in ref.gradients(x=x, y=y).items():
            np.testing.assert_allclose(gl.gradients(x=x, y=y)[name], g, rtol=1e-4, atol=1e-5, err_msg=name)
        for _ in range(5):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-4)
        want = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, want[name], rtol=1e-4, atol=1e-5, err_msg=name)
        manifest = gl.manifest
    assert manifest["passes"] == {**manifest["passes"], **passes}


def _draws(prog: glcomp.Program, entry: str = "train_step") -> list[dict[str, Any]]:
    return build_bundle(prog).manifest["entries"][entry]["draws"]


def test_mrt_writes_several_targets_and_saves_draws() -> None:
    glcomp.manual_seed(1)
    model = LastStep(3, 5, 2)
    fused = _draws(_compile(model, {}))
    plain = _draws(_compile(model, {"mrt": False}))
    assert len(fused) < len(plain)
    assert max(len(d["targets"]) for d in fused) > 1
    assert all(len(d["targets"]) == 1 for d in plain)


def test_adam_update_is_one_draw_per_parameter() -> None:
    # W, m and v of each parameter come out of one draw with three render targets.
    glcomp.manual_seed(1)
    prog = glcomp.compile(
        nn.Linear(6, 3), inputs={"x": (4, 6)}, loss=nn.MSELoss(), optimizer=optim.Adam(lr=1e-2)
    )
    draws = _draws(prog)
    written = [{t["state"] for t in d["targets"] if isinstance(t, dict)} for d in draws]
    for param in ("weight", "bias"):
        group = next(w for w in written if param in w)
        assert group >= {param, f"opt.{param}.exp_avg", f"opt.{param}.exp_avg_sq"}


def test_blend_accumulates_time_steps(gl_runtime: Any) -> None:
    """With transposes pushed down, MRT and epilogue fusion off (both would merge the terms into
    fewer draws) and the per-step products kept as a sum (join_sums off), the recurrent weight's
    gradient is summed by additive blending; results equal the summing kernel's."""
    glcomp.manual_seed(2)
    model = LastStep(3, 5, 2)
    x, y = _batch()
    blended = _compile(model, {"pushdown": True, "mrt": False, "epilogue": False, "join_sums": False})
    summed = _compile(
        model, {"pushdown": True, "mrt": False, "epilogue": False, "join_sums": False, "blend": False}
    )
    draws = _draws(blended, "gradients")
    assert sum(d["blend"] for d in draws) >= 2
    assert len(draws) < len(_draws(summed, "gradients"))
    with gl_runtime(blended) as a, gl_runtime(summed) as b:
        ga, gb = a.gradients(x=x, y=y), b.gradients(x=x, y=y)
    for name in gb:
        np.testing.assert_allclose(ga[name], gb[name], rtol=1e-5, atol=1e-6, err_msg=name)


def test_blend_falls_back_without_float_blending() -> None:
    glcomp.manual_seed(2)
    prog = glcomp.compile(
        LastStep(3, 5, 2),
        inputs={"x": (4, 4, 3)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(lr=0.1),
        passes={"pushdown": True, "mrt": False},
        float_blend=False,
    )
    assert not any(d["blend"] for d in _draws(prog, "gradients"))


def test_epilogue_runs_loops_inside_their_reader() -> None:
    # A weight gradient's matmul runs inside the SGD update that alone reads it.
    def bundle(passes: dict[str, bool]) -> dict[str, Any]:
        glcomp.manual_seed(1)
        # the benchmark's mlp workload: large enough that the MRT cost model declines groups
        model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10))
        prog = glcomp.compile(
            model,
            inputs={"x": (64, 64)},
            loss=nn.CrossEntropyLoss(),
            optimizer=optim.SGD(lr=0.1),
            passes=passes,
        )
        return build_bundle(prog).manifest

    # tiling off: a product blocked on its own is split off its epilogue again (test_matmul_tiled.py)
    fused, plain = bundle({"tiling": False}), bundle({"epilogue": False, "tiling": False})
    assert len(fused["entries"]["train_step"]["draws"]) < len(plain["entries"]["train_step"]["draws"])
    assert fused["memory"]["texture_bytes"] < plain["memory"]["texture_bytes"]


def test_memory_plan_reuses_textures() -> None:
    glcomp.manual_seed(1)
    model = LastStep(3, 5, 2)
    planned = build_bundle(_compile(model, {})).manifest["memory"]["texture_bytes"]
    unplanned = build_bundle(_compile(model, {"memplan": False})).manifest["memory"]["texture_bytes"]
    assert planned < unplanned


def test_no_draw_samples_its_own_target() -> None:
    glcomp.manual_seed(1)
    for passes in PASS_SETTINGS:
        for d in _draws(_compile(LastStep(3, 5, 2), passes)):
            reads = {repr(r) for r in d["samplers"].values()}
            assert not reads & {repr(t) for t in d["targets"]}, d["kernel"]


def test_unknown_pass_is_rejected() -> None:
    with pytest.raises(glcomp.GlcompError, match="unknown passes"):
        build_bundle(_compile(LastStep(3, 5, 2), {"fuse_everything": True}))


def test_gl_objects_do_not_grow_over_10000_steps(gl_runtime: Any) -> None:
    glcomp.manual_seed(0)
    prog = glcomp.compile(
        nn.Linear(2, 2), inputs={"x": (2, 2)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=1e-3, momentum=0.9)
    )
    x = np.array([[0.5, -1.0], [1.0, 0.25]], np.float32)
    y = np.zeros((2, 2), np.float32)
    with gl_runtime(prog) as gl:
        gl.train_steps([{"x": x, "y": y}] * 2)
        before = gl.gl_objects()
        losses = gl.train_steps([{"x": x, "y": y}] * 10_000, read_every=1000)
        assert gl.gl_objects() == before
        assert len(losses) == 10
        assert losses[-1] < losses[0]


def test_learning_rate_is_a_uniform(gl_runtime: Any) -> None:
    glcomp.manual_seed(0)
    prog = glcomp.compile(
        nn.Linear(3, 2), inputs={"x": (4, 3)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.1)
    )
    ref = prog.runtime("reference")
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    y = np.ones((4, 2), np.float32)
    with gl_runtime(prog) as gl:
        for lr in (0.1, 0.0, 0.5):
            gl.set_lr(lr)
            ref.set_lr(lr)
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-5)
        before = gl.state_dict()
        gl.set_lr(0.0)
        gl.train_step(x=x, y=y)
        for name, value in gl.state_dict().items():
            np.testing.assert_array_equal(value, before[name])


@pytest.mark.parametrize("clip", [{"clip_grad_value": 0.01}, {"clip_grad_norm": 0.05}])
def test_gradient_clipping(gl_runtime: Any, clip: dict[str, float]) -> None:
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    y = np.ones((4, 2), np.float32) * 3
    clipped = glcomp.compile(
        model, inputs={"x": (4, 3)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=1.0), **clip
    )
    free = glcomp.compile(model, inputs={"x": (4, 3)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=1.0))
    ref, plain = clipped.runtime("reference", dtype=np.float64), free.runtime("reference", dtype=np.float64)
    grads = plain.gradients(x=x, y=y)
    start = plain.state_dict()
    ref.train_step(x=x, y=y)
    after = ref.state_dict()
    if "clip_grad_value" in clip:
        want = {k: np.clip(g, -0.01, 0.01) for k, g in grads.items()}
    else:
        norm = np.sqrt(sum((g**2).sum() for g in grads.values()))
        want = {k: g * min(1.0, 0.05 / (norm + 1e-6)) for k, g in grads.items()}
    for name, g in want.items():
        np.testing.assert_allclose(start[name] - after[name], g, rtol=1e-6, atol=1e-9, err_msg=name)
    with gl_runtime(clipped) as gl:
        gl.train_step(x=x, y=y)
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, after[name], rtol=1e-4, atol=1e-6, err_msg=name)


@settings(max_examples=40, deadline=None)
@given(case=random_graphs())
def test_transpose_pushdown_preserves_values(case: Any) -> None:
    before = evaluate(case.graph, case.feeds, np.float64)
    graph = pushdown(case.graph)
    graph.validate()
    after = evaluate(graph, case.feeds, np.float64)
    for name, value in before.items():
        np.testing.assert_allclose(after[name], value, rtol=1e-10, atol=1e-12, err_msg=name)


def test_transpose_pushdown_guarantee() -> None:
    glcomp.manual_seed(0)
    graph = _compile(LastStep(3, 5, 2), {}).graphs["gradients"]
    out = pushdown(graph)
    for n in out.nodes():
        if out.op(n) == "permute":
            (src,) = out.operands(n)
            single = out.g.out_degree(src) == 1 and src not in out.outputs.values()
            assert not (single and out.op(src) in ("matmul", "add", "permute")), n
