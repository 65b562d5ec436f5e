"""glcomp.train.train, called directly: it learns, refuses bad arguments by name, and writes every
output file atomically."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glcomp.errors import GlcompError
from glcomp.train import TrainResult, train

# Two separable classes in 4-d: a linear model learns them in a few epochs.
EXAMPLE = """
import numpy as np
import glcomp
from glcomp import nn, optim


def build():
    glcomp.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((80, 4)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int32)
    return {
        "model": nn.Sequential(nn.Linear(4, 2)),
        "inputs": {"x": (8, 4)},
        "loss": nn.CrossEntropyLoss(),
        "optimizer": optim.SGD(lr=0.5),
        "data": {"x_train": x[:64], "y_train": y[:64], "x_test": x[64:], "y_test": y[64:]},
        "batch_size": 8,
        "epochs": 1,
    }
"""


@pytest.fixture
def example(tmp_path: Path) -> Path:
    path = tmp_path / "separable.py"
    path.write_text(EXAMPLE)
    return path


def _run(example: Path, out: Path, **kw: Any) -> TrainResult:
    result = train(example, runtime="reference", out=out, **kw)
    result.runtime.release()
    return result


def test_loss_decreases_and_the_run_is_saved(example: Path, tmp_path: Path) -> None:
    lines: list[str] = []
    result = _run(example, tmp_path / "run", epochs=6, log=lines.append)
    assert len(result.losses) == 6 * 8  # 64 samples in batches of 8, six epochs
    assert np.mean(result.losses[-8:]) < 0.5 * np.mean(result.losses[:8])
    assert result.metrics["test_accuracy"] >= 0.8
    assert result.metrics["steps"] == 48 and result.metrics["final_loss"] == result.losses[-1]
    assert json.loads((result.out / "metrics.json").read_text()) == result.metrics
    assert {"weights.safetensors", "metrics.json", "bundle"} <= {p.name for p in result.out.iterdir()}
    assert any(line.startswith("training: 6 epochs x 8 steps") for line in lines)
    assert any(line.startswith("test accuracy: ") for line in lines)


def test_silent_without_log(example: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _run(example, tmp_path / "run", steps=3)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"steps": 0}, "steps"),
        ({"steps": 2.5}, "steps"),
        ({"steps": True}, "steps"),
        ({"epochs": -1}, "epochs"),
        ({"steps": 3, "epochs": 1}, "steps or epochs"),
        ({"runtime": "cuda"}, "runtime"),
    ],
)
def test_bad_argument_is_named(example: Path, tmp_path: Path, kwargs: dict[str, Any], named: str) -> None:
    kwargs = {"runtime": "reference", **kwargs}
    with pytest.raises(GlcompError, match=rf"^train: (give )?{named}\b"):
        train(example, out=tmp_path / "run", **kwargs)
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_bad_example_is_named(tmp_path: Path) -> None:
    with pytest.raises(GlcompError, match=r"missing\.py: no such file"):
        train(tmp_path / "missing.py", runtime="reference", out=tmp_path / "run")
    bad = tmp_path / "bad.py"
    bad.write_text(EXAMPLE.replace('"batch_size": 8', '"batch_size": 0'))
    with pytest.raises(GlcompError, match="batch_size and epochs must be positive"):
        train(bad, runtime="reference", out=tmp_path / "run")


def test_outputs_are_written_atomically(
    example: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import glcomp.format.files as files

    replaced: list[str] = []
    real_replace = os.replace

    def spy(src: Any, dst: Any, **kw: Any) -> None:
        replaced.append(Path(dst).name)
        real_replace(src, dst, **kw)

    monkeypatch.setattr(files.os, "replace", spy)  # os.replace itself
    out = tmp_path / "run"
    first = _run(example, out, steps=2)
    # Each file arrives whole by a rename over its path (the bundle is renamed in as a folder).
    assert {"weights.safetensors", "loss.png", "metrics.json"} <= set(replaced)
    assert "loss.png" in first.saved
    before = {name: (out / name).read_bytes() for name in ("metrics.json", "loss.png")}

    def fail_on_metrics(src: Any, dst: Any, **kw: Any) -> None:
        if Path(dst).name == "metrics.json":
            raise OSError(28, "No space left on device")
        real_replace(src, dst, **kw)

    monkeypatch.setattr(files.os, "replace", fail_on_metrics)
    with pytest.raises(OSError, match="No space left"):
        _run(example, out, steps=5)
    # The failed write left the earlier metrics.json as it was and no temporary beside it.
    assert (out / "metrics.json").read_bytes() == before["metrics.json"]
    assert json.loads(before["metrics.json"])["steps"] == 2
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert (out / "loss.png").read_bytes() != before["loss.png"]  # the new run's curve did land
