"""The torch round trip (docs/porting-roundtrip.md): torch weights into glcomp, train on either
runtime, `save_weights`, and the torch twin loads the file with ``strict=True`` and computes what
glcomp computes. A model with BatchNorm, so integer buffers (``num_batches_tracked``) and running
statistics travel too, and a model with dropout, so the random-number counter (``rng.step``)
must stay out of the file, as the optimizer state does."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
from safetensors.numpy import load_file  # noqa: E402


def model(ns: Any) -> Any:
    return ns.Sequential(
        ns.Conv2d(1, 3, 3, padding=1), ns.BatchNorm2d(3), ns.ReLU(), ns.Dropout(0.25),
        ns.Flatten(), ns.Linear(3 * 4 * 4, 4),
    )  # fmt: skip


def batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 1, 4, 4)).astype(np.float32), rng.integers(0, 4, 6)


def torch_twin() -> Any:
    torch.manual_seed(0)
    return model(torch.nn)


def glcomp_from_torch(tnet: Any) -> Any:
    """torch -> glcomp, as docs/porting-roundtrip.md shows it."""
    gnet = model(nn)
    gnet.load_state_dict({k: v.numpy() for k, v in tnet.state_dict().items()})
    return gnet


def compiled(gnet: Any) -> Any:
    return glcomp.compile(gnet, {"x": (6, 1, 4, 4)}, nn.CrossEntropyLoss(), optim.Adam(lr=0.01))


def check_torch_loads(path: Path, state: dict[str, np.ndarray]) -> Any:
    """The torch twin loads `path` strictly, holding exactly `state`; returns it in eval mode."""
    tnet = torch_twin()
    loaded = safetensors_torch.load_file(str(path))
    tnet.load_state_dict(loaded, strict=True)  # raises on any missing or unexpected key
    assert set(loaded) == set(tnet.state_dict())
    for k, v in tnet.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), state[k], err_msg=k)
        assert v.dtype == tnet.state_dict()[k].dtype
    return tnet.eval()


@pytest.mark.parametrize("kind", ["reference", "gl"])
def test_save_weights_loads_strictly_in_torch(kind: str, tmp_path: Path, gl_ctx: Any) -> None:
    prog = compiled(glcomp_from_torch(torch_twin()))
    options = {"ctx": gl_ctx} if kind == "gl" else {}
    with prog.runtime(kind, **options) as rt:
        for step in range(3):
            x, y = batch(step)
            rt.train_step(x=x, y=y)
        state = rt.state_dict()
        assert all(isinstance(v, np.ndarray) for v in state.values()), {k: type(v) for k, v in state.items()}
        nbt = state["1.num_batches_tracked"]
        assert isinstance(nbt, np.ndarray) and nbt.shape == () and nbt.dtype == np.int64 and int(nbt) == 3
        assert any(k.startswith("opt.") for k in rt.optimizer_state())
        path = rt.save_weights(tmp_path / "w.safetensors")
        x, _ = batch(9)
        ours = rt.predict(x=x)
    saved = load_file(str(path))
    assert not any(k.startswith(("opt.", "rng.")) or k == "lr" for k in saved)
    tnet = check_torch_loads(path, state)
    with torch.no_grad():
        theirs = tnet(torch.from_numpy(x)).numpy()
    out = ours if isinstance(ours, np.ndarray) else next(iter(ours.values()))
    np.testing.assert_allclose(out, theirs, rtol=1e-3, atol=1e-4)


def test_state_dict_values_are_arrays_for_safetensors(tmp_path: Path) -> None:
    """``safetensors.numpy.save_file(rt.state_dict(), ...)`` works after a train step (a numpy
    scalar num_batches_tracked made it raise)."""
    from safetensors.numpy import save_file

    rt = compiled(model(nn)).runtime("reference")
    x, y = batch()
    rt.train_step(x=x, y=y)
    save_file(rt.state_dict(), str(tmp_path / "s.safetensors"))
    assert load_file(str(tmp_path / "s.safetensors"))["1.num_batches_tracked"].shape == ()


def test_program_save_weights(tmp_path: Path) -> None:
    tnet = torch_twin()
    prog = compiled(glcomp_from_torch(tnet))
    path = prog.save_weights(tmp_path / "p.safetensors")
    assert path == tmp_path / "p.safetensors"
    check_torch_loads(path, {k: v.numpy() for k, v in tnet.state_dict().items()})


def test_torch_to_glcomp_through_a_file(tmp_path: Path) -> None:
    """torch saves with safetensors.torch; glcomp's Module and runtimes load the file."""
    tnet = torch_twin()
    tnet.train()
    with torch.no_grad():
        tnet(torch.randn(6, 1, 4, 4))  # running statistics and num_batches_tracked move
    safetensors_torch.save_file(tnet.state_dict(), str(tmp_path / "t.safetensors"))
    state = load_file(str(tmp_path / "t.safetensors"))
    gnet = model(nn)
    gnet.load_state_dict(state)
    rt = compiled(model(nn)).runtime("reference")
    rt.load_state_dict(state, optimizer="reset")
    x, _ = batch(3)
    with torch.no_grad():
        theirs = tnet.eval()(torch.from_numpy(x)).numpy()
    ours = rt.predict(x=x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    assert int(rt.state_dict()["1.num_batches_tracked"]) == 1


def test_save_weights_is_atomic_and_leaves_no_temporary(tmp_path: Path, monkeypatch: Any) -> None:
    prog = compiled(model(nn))
    path = tmp_path / "w.safetensors"
    prog.save_weights(path)
    before = path.read_bytes()

    def fail(*args: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(glcomp.GlcompError, match="cannot write"):
        prog.with_state(params={k: v + 1 for k, v in prog.params.items()}).save_weights(path)
    assert path.read_bytes() == before  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w.safetensors"]


def test_save_weights_refuses_nan_and_directories(tmp_path: Path) -> None:
    prog = compiled(model(nn))
    bad = prog.with_state(params={k: np.full_like(v, np.nan) for k, v in prog.params.items()})
    with pytest.raises(glcomp.GlcompError, match="NaN"):
        bad.save_weights(tmp_path / "w.safetensors")
    with pytest.raises(glcomp.GlcompError, match="is a directory"):
        prog.save_weights(tmp_path)
    assert list(tmp_path.iterdir()) == []
