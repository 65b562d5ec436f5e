"""What runtimes take from callers and what a save writes: only real, finite numbers within float32's
range (the runtimes compute in float32), each fault a GlcompError naming the tensor; and no save
writes a bundle that glcomp.load would refuse.

Before: load_state_dict took float64 1e39 (inf on the GPU) and complex weights (the imaginary part
dropped), inputs of complex dtype were taken with their imaginary part dropped, timedelta labels
were taken as integers, and complex labels and torch tensors that require grad gave raw numpy or
torch errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError


@pytest.fixture(scope="module")
def prog() -> glcomp.Program:
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    return glcomp.compile(model, {"x": (6, 5)}, nn.CrossEntropyLoss(), optim.Adam(lr=0.01))


@pytest.fixture(params=["reference", "gl"])
def runtime(request: pytest.FixtureRequest, prog: glcomp.Program, gl_ctx: Any) -> Any:
    rt = prog.runtime(request.param, ctx=gl_ctx) if request.param == "gl" else prog.runtime("reference")
    yield rt
    rt.release()


def _torch() -> Any:
    return pytest.importorskip("torch")


STATE_FAULTS = {
    "float64 beyond float32's range": (
        lambda v: np.full(v.shape, 1e39),
        r"'0\.weight' holds values up to 1e\+39, beyond float32's range",
    ),
    "complex": (lambda v: v + 1j, r"'0\.weight' holds complex128 values; real numbers"),
    "timedelta": (lambda v: v.astype("m8[s]"), r"'0\.weight' holds timedelta64\[s\] values"),
    "a torch tensor that requires grad": (
        lambda v: _torch().tensor(v, requires_grad=True),
        r"'0\.weight' is a torch tensor that requires grad: pass tensor\.detach\(\)",
    ),
}


@pytest.mark.parametrize("fault", sorted(STATE_FAULTS))
def test_load_state_dict_refuses_what_float32_cannot_hold(fault: str, runtime: Any) -> None:
    change, message = STATE_FAULTS[fault]
    before = runtime.state_dict()
    bad = dict(before)
    bad["0.weight"] = change(np.asarray(before["0.weight"], np.float64))
    with pytest.raises(
        GlcompError, match=rf"^load_state_dict into runtime: {message}.*\(nothing was loaded\)$"
    ):
        runtime.load_state_dict(bad)
    for name, value in runtime.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    fine = dict(before)
    fine["0.weight"] = np.asarray(before["0.weight"], np.float64) * 0 + 3e38  # float64, within range
    runtime.load_state_dict(fine)
    # ...and the optimizer state is checked the same way
    opt = runtime.optimizer_state()
    name = sorted(opt)[0]
    with pytest.raises(GlcompError, match=rf"the optimizer state: '{name}' holds complex"):
        runtime.load_state_dict(before, optimizer=opt | {name: np.asarray(opt[name]) + 1j})


def _feeds(**changes: Any) -> dict[str, Any]:
    return {"x": np.ones((6, 5), np.float32), "y": np.zeros(6, np.int64)} | changes


FEED_FAULTS = {
    "complex inputs": (
        _feeds(x=np.ones((6, 5)) + 1j),
        r"^input 'x' must hold numbers: booleans, integers or floats \(not complex numbers or times\), "
        r"got dtype complex128$",
    ),
    "timedelta labels": (
        _feeds(y=np.zeros(6, "m8[s]")),
        r"^input 'y' must hold numbers: .* timedelta64\[s\]$",
    ),
    "complex labels": (
        _feeds(y=np.zeros(6, np.complex64)),
        r"^input 'y' must hold numbers: .* complex64$",
    ),
    "strings": (_feeds(y=np.array(["0"] * 6)), r"^input 'y' must hold numbers: .* <U1$"),
}


@pytest.mark.parametrize("fault", sorted(FEED_FAULTS))
def test_inputs_must_be_real_numbers(fault: str, runtime: Any) -> None:
    feeds, message = FEED_FAULTS[fault]
    with pytest.raises(GlcompError, match=message):
        runtime.train_step(**feeds)
    with pytest.raises(GlcompError, match=message):
        runtime.gradients(**feeds)
    if "'x'" in message:
        with pytest.raises(GlcompError, match=message):
            runtime.predict(x=feeds["x"])


def test_torch_tensors_are_inputs_unless_they_require_grad(runtime: Any) -> None:
    torch = _torch()
    x = torch.ones(6, 5)
    got = runtime.predict(x=x)
    np.testing.assert_array_equal(got, runtime.predict(x=np.ones((6, 5), np.float32)))
    with pytest.raises(
        GlcompError, match=r"^input 'x' is a torch tensor that requires grad: pass tensor\.detach\(\)"
    ):
        runtime.predict(x=x.requires_grad_(True))


def test_a_save_never_writes_a_bundle_that_glcomp_load_refuses(prog: glcomp.Program, tmp_path: Path) -> None:
    """A diverged state (NaN weights: glcomp.load refuses them) is not saved over a good bundle."""
    d = tmp_path / "b"
    prog.save(d)
    before = {p.name: p.read_bytes() for p in d.iterdir()}
    rt = prog.runtime("reference")
    rt.params["0.weight"] = np.full_like(rt.params["0.weight"], np.nan)
    with pytest.raises(GlcompError, match=r"refusing to save: the state '0\.weight' holds NaN"):
        rt.save(d)
    assert {p.name: p.read_bytes() for p in d.iterdir()} == before
    glcomp.load(d)
    for lr in (float("nan"), float("inf"), -1.0):  # as set_lr, the optimizers refuse these
        with pytest.raises(GlcompError, match="learning rate"):
            optim.Adam(lr=lr)
