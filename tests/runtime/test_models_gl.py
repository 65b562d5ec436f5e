"""Small models end to end on the GL runtime, against the numpy reference runtime.

The models (conftest.MODELS) cover Linear, ReLU, LeakyReLU, Sigmoid, Tanh, Conv2d, BatchNorm2d,
MaxPool2d, AvgPool2d, Flatten, LSTM(batch_first) with indexing, CrossEntropyLoss and MSELoss.
For each dialect: predict, gradients, then 20 train steps with each optimizer, comparing every
step's loss and the final parameters, buffers, optimizer state and counters.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from glcomp import optim

RTOL, ATOL = 1e-4, 1e-5
STEPS = 20
OPTIMIZERS: dict[str, Callable[[], optim.Optimizer]] = {
    "sgd": lambda: optim.SGD(lr=0.1),
    "sgd_momentum": lambda: optim.SGD(lr=0.05, momentum=0.9),
    "sgd_nesterov": lambda: optim.SGD(lr=0.05, momentum=0.9, nesterov=True),
    "adam": lambda: optim.Adam(lr=0.01),
}


def assert_same_arrays(got: dict[str, Any], want: dict[str, Any], what: str) -> None:
    assert sorted(got) == sorted(want), what
    for name in want:
        g, w = np.asarray(got[name]), np.asarray(want[name])
        assert g.shape == w.shape, f"{what} {name}: shape {g.shape} != {w.shape}"
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{what} {name}")


def test_predict_and_gradients(model_case: Any, dialect: str, gl_runtime: Any):
    prog = model_case.compile(dialect)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for seed in (0, 1):
            feeds, y = model_case.batch(seed)
            out_gl, out_ref = gl.predict(**feeds), ref.predict(**feeds)
            assert out_gl.shape == out_ref.shape == model_case.out_shape
            np.testing.assert_allclose(out_gl, out_ref, rtol=RTOL, atol=ATOL, err_msg="predict")
            grads_gl, grads_ref = gl.gradients(**feeds, y=y), ref.gradients(**feeds, y=y)
            assert sorted(grads_ref) == sorted(prog.trainable)
            assert any(np.abs(g).max() > 1e-3 for g in grads_ref.values()), "gradients are all ~0"
            assert_same_arrays(grads_gl, grads_ref, "gradient")
        # gradients() is train mode without an update: nothing may change.
        assert_same_arrays(gl.state_dict(), ref.state_dict(), "state after gradients")
        assert_same_arrays(gl.state_dict(), prog.params | prog.buffers | prog.counters, "initial state")


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_train_steps(model_case: Any, dialect: str, opt: str, gl_runtime: Any):
    prog = model_case.compile(dialect, OPTIMIZERS[opt]())
    ref = prog.runtime("reference")
    batches = [model_case.batch(seed) for seed in range(4)]
    with gl_runtime(prog) as gl:
        initial = gl.state_dict()
        losses_gl, losses_ref = [], []
        for step in range(STEPS):
            feeds, y = batches[step % len(batches)]
            losses_gl.append(gl.train_step(**feeds, y=y))
            losses_ref.append(ref.train_step(**feeds, y=y))
        np.testing.assert_allclose(losses_gl, losses_ref, rtol=RTOL, err_msg="loss per step")
        final = gl.state_dict()
        assert_same_arrays(final, ref.state_dict(), "final state_dict")
        assert_same_arrays(gl.optimizer_state(), ref.opt_state, "optimizer state")
        feeds, _ = batches[0]
        np.testing.assert_allclose(gl.predict(**feeds), ref.predict(**feeds), rtol=RTOL, atol=ATOL)
    # The comparison is not vacuous: training moved every parameter, and counters advanced.
    for name in prog.trainable:
        assert not np.allclose(final[name], initial[name]), f"{name} did not change in {STEPS} steps"
    for name in prog.counters:
        assert int(final[name]) == int(initial[name]) + STEPS


def test_shrunk_limits(model_case: Any, gl_runtime: Any):
    """Tiny textures (tensors split into pages) and 4-iteration loops (split loops), in the
    stricter dialect: predict, gradients and a few Adam steps still match the reference."""
    prog = model_case.compile("webgl1", optim.Adam(lr=0.01), **model_case.shrunk)
    ref = prog.runtime("reference")
    feeds, y = model_case.batch(0)
    with gl_runtime(prog) as gl:
        draws = [d for e in gl.manifest["entries"].values() for d in e["draws"]]
        assert any(d["page_offset"] > 0 for d in draws), "no tensor was split into pages"
        np.testing.assert_allclose(gl.predict(**feeds), ref.predict(**feeds), rtol=RTOL, atol=ATOL)
        assert_same_arrays(gl.gradients(**feeds, y=y), ref.gradients(**feeds, y=y), "gradient")
        for seed in range(3):
            feeds, y = model_case.batch(seed)
            np.testing.assert_allclose(gl.train_step(**feeds, y=y), ref.train_step(**feeds, y=y), rtol=RTOL)
        assert_same_arrays(gl.state_dict(), ref.state_dict(), "state_dict")
