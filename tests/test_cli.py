"""The ``glcomp`` command line through ``glcomp.cli.main``: info, compile, run, train and errors.

Tests that need OpenGL ask for the shared `gl_ctx` fixture (tests/conftest.py), which fails rather
than skips when no context can be created; the CLI itself opens contexts of its own.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import stored_path

import glcomp
from glcomp.cli import load_model, load_source, main
from glcomp.codegen.explain import draw_costs

MODEL = """
import glcomp
from glcomp import nn

glcomp.manual_seed(0)
net = nn.Sequential(nn.Linear(4, 3))
answer = 42


def make():
    glcomp.manual_seed(1)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def broken():
    return 1 / 0
"""

EXAMPLE = """
import numpy as np
import glcomp
from glcomp import nn, optim


def build():
    glcomp.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32)
    return {
        "model": nn.Sequential(nn.Linear(4, 2)),
        "inputs": {"x": (8, 4)},
        "loss": nn.CrossEntropyLoss(),
        "optimizer": optim.SGD(lr=0.5),
        "data": {"x_train": x[:40], "y_train": y[:40], "x_test": x[40:], "y_test": y[40:]},
        "batch_size": 8,
        "epochs": 2,
    }
"""


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    path = tmp_path / "tiny_model.py"
    path.write_text(MODEL)
    return path


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def test_info(gl_ctx: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    for label in ("GL renderer", "GL version", "max texture size", "max draw buffers", "texture units"):
        assert label in out
    assert "float render targets:" in out and "float blending:" in out
    assert main(["info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["max_texture_size"] >= 1024 and isinstance(info["float_render_targets"], bool)


def test_compile_and_run(
    gl_ctx: Any, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    args = ["compile", f"{model_file}:net", "-o", str(out), "--input", "x=8,4"]
    assert main([*args, "--loss", "cross_entropy", "--optimizer", "adam", "--lr", "0.05"]) == 0
    assert "train_step" in capsys.readouterr().out
    prog = glcomp.load(str(out))
    manifest = prog.bundle().manifest
    assert set(manifest["entries"]) == {"predict", "gradients", "train_step"}
    assert manifest["hyper"]["lr"] == prog.lr == pytest.approx(0.05)

    w, b = prog.params["0.weight"], prog.params["0.bias"]
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(out), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "y.npy"), x @ w.T + b, rtol=1e-5, atol=1e-5)

    # Any number of rows: batches of 8, the last one padded.
    np.save(tmp_path / "x13.npy", np.concatenate([x, x[:5]]))
    assert (
        main(["run", str(out), "--input", f"x={tmp_path / 'x13.npy'}", "-o", str(tmp_path / "y13.npy")]) == 0
    )
    y13 = np.load(tmp_path / "y13.npy")
    assert y13.shape == (13, 3)
    np.testing.assert_allclose(y13[8:], (x @ w.T + b)[:5], rtol=1e-5, atol=1e-5)


def test_compile_factory_webgl1_and_overwrite_bundle(gl_ctx: Any, model_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    assert (
        main(["compile", f"{model_file}:make", "-o", str(out), "--input", "x=2,4", "--target", "webgl1"]) == 0
    )
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["target"]["glsl_version"] == "100" and set(manifest["entries"]) == {"predict"}
    # A bundle directory may be replaced by a new bundle; no stale shaders stay behind.
    (out / "notes.txt").write_text("mine")
    first = stored_path(out, "shaders.json")
    assert main(["compile", f"{model_file}:net", "-o", str(out), "--input", "x=2,4"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {manifest["vertex_shader"]} | {p["fragment"] for p in manifest["programs"].values()}
    assert set(json.loads(stored_path(out, "shaders.json").read_text())) == listed
    assert not (out / "shaders").exists() and not first.exists()
    assert (out / "notes.txt").read_text() == "mine"
    glcomp.load(str(out))


def test_compile_importable_module_name(
    model_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(model_file.parent)
    monkeypatch.syspath_prepend(str(model_file.parent))
    out = tmp_path / "by_name"
    assert main(["compile", "tiny_model:net", "-o", str(out), "--input", "x=2,4"]) == 0
    assert (out / "manifest.json").is_file()


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("missing_file.py:net", "no such file"),
        ("{model}:nothing", "has no attribute 'nothing'"),
        ("{model}", "expected MODULE:ATTR"),
        ("{model}:answer", "is a int, not a glcomp.nn.Module"),
        ("{model}:broken", "ZeroDivisionError"),
        ("no_such_module_xyz:net", "no module named 'no_such_module_xyz'"),
    ],
)
def test_bad_module_attr(
    target: str, expected: str, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(["compile", target.format(model=model_file), "-o", str(out), "--input", "x=2,4"])
    assert code == 2
    assert expected in _error(capsys)
    assert not out.exists()


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("x=2,a", "integers"),
        ("x", "NAME=D0,D1"),
        ("2,4", "NAME=D0,D1"),
        ("x=0,4", "positive"),
        ("x=2,5", "(2, 5)"),  # the model wants 4 features: the compiler's message
        ("z=2,4", "'z'"),
    ],
)
def test_bad_input(
    spec: str, expected: str, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["compile", f"{model_file}:net", "-o", str(tmp_path / "o"), "--input", spec]) == 2
    assert expected in _error(capsys)


def test_run_errors(
    gl_ctx: Any, model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert main(["compile", f"{model_file}:net", "-o", str(out), "--input", "x=2,4"]) == 0
    capsys.readouterr()
    assert (
        main(["run", str(out), "--input", f"x={tmp_path / 'none.npy'}", "-o", str(tmp_path / "y.npy")]) == 2
    )
    assert "no such file" in _error(capsys)
    np.save(tmp_path / "bad.npy", np.zeros((2, 5), np.float32))
    assert main(["run", str(out), "--input", f"x={tmp_path / 'bad.npy'}", "-o", str(tmp_path / "y.npy")]) == 2
    assert "(2, 5)" in _error(capsys)
    assert (
        main(["run", str(tmp_path), "--input", f"x={tmp_path / 'bad.npy'}", "-o", str(tmp_path / "y.npy")])
        == 2
    )
    assert "manifest.json is missing" in _error(capsys)


def test_refuses_to_overwrite_non_bundle(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    assert main(["compile", f"{model_file}:net", "-o", str(out), "--input", "x=2,4"]) == 2
    assert "refusing to overwrite" in _error(capsys)
    assert sorted(p.name for p in out.iterdir()) == ["thesis.tex"]
    assert (out / "thesis.tex").read_text() == "years of work"
    # A plain file in the way is refused too.
    assert main(["compile", f"{model_file}:net", "-o", str(out / "thesis.tex"), "--input", "x=2,4"]) == 2
    assert "not a directory" in _error(capsys)


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert main(["compile", "m.py:net"]) == 2  # no -o
    assert main(["train", "x.py", "--steps", "0"]) == 2
    assert main(["--help"]) == 0
    capsys.readouterr()


@pytest.mark.parametrize("runtime", [pytest.param("gl", marks=pytest.mark.gl), "reference"])
def test_train(
    runtime: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], request: pytest.FixtureRequest
) -> None:
    if runtime == "gl":
        request.getfixturevalue("gl_ctx")  # fails, never skips, without OpenGL
    from safetensors.numpy import load_file

    example = tmp_path / "tiny_example.py"
    example.write_text(EXAMPLE)
    out = tmp_path / "run"
    assert main(["train", str(example), "--steps", "6", "--runtime", runtime, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "6 steps" in text and "test accuracy:" in text
    assert "padded with 6 zero rows" in text  # 10 test samples in batches of 8

    weights = load_file(str(out / "weights.safetensors"))
    assert set(weights) == {"0.weight", "0.bias"} and weights["0.weight"].shape == (2, 4)
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 6 and 0.0 <= metrics["test_accuracy"] <= 1.0

    from glcomp.codegen.bundle import load_bundle

    trained = load_bundle(out / "bundle").weights  # the bundle carries the trained weights
    np.testing.assert_array_equal(trained["0.weight"], weights["0.weight"])
    initial = load_source(str(example)).build()["model"].state_dict()["0.weight"]
    assert not np.allclose(initial, weights["0.weight"])
    data = load_file(str(out / "bundle" / "data.safetensors"))  # what `glcomp serve` trains on
    spec = load_source(str(example)).build()["data"]
    np.testing.assert_array_equal(data["x_test"], np.asarray(spec["x_test"], np.float32))


def test_train_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    example = tmp_path / "no_build.py"
    example.write_text("x = 1\n")
    assert main(["train", str(example)]) == 2
    assert "defines no build()" in _error(capsys)
    example.write_text(EXAMPLE.replace('"inputs": {"x": (8, 4)}', '"inputs": {"x": (4, 4)}'))
    assert main(["train", str(example), "--out", str(tmp_path / "o")]) == 2
    assert "batch_size" in _error(capsys)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    assert main(["train", str(example), "--out", str(tmp_path / "mine")]) == 2
    assert "refusing to write" in _error(capsys)
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["notes.txt"]
    example.write_text(textwrap.dedent("def build():\n    return {'model': 1}\n"))
    assert main(["train", str(example)]) == 2
    assert "returned no" in _error(capsys)


def test_explain_model_and_bundle(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [f"{model_file}:net", "--input", "x=8,4", "--loss", "cross_entropy", "--optimizer", "sgd"]
    assert main(["explain", *args]) == 0
    text = capsys.readouterr().out
    for entry in ("predict", "gradients", "train_step"):
        assert f"{entry}: " in text and " draws, " in text
    prog = glcomp.compile(
        load_model(f"{model_file}:net"), {"x": (8, 4)}, glcomp.nn.CrossEntropyLoss(), glcomp.optim.SGD(lr=0.1)
    )
    manifest = prog.bundle().manifest
    n = len(manifest["entries"]["train_step"]["draws"])
    assert f"train_step: {n} draws" in text
    assert "0 (Linear)" in text  # each draw names the model parts it computes
    # The estimate: viewport texels x loop iterations per texel, summed per entry.
    want = sum(draw_costs(manifest, "train_step"))
    assert f"estimated work {want:,} texel-loop iterations" in text
    prog.save(tmp_path / "b")
    assert main(["explain", str(tmp_path / "b")]) == 0
    assert f"train_step: {n} draws" in capsys.readouterr().out
    assert main(["explain", f"{model_file}:net", "--input", "x=8,4", "--optimizer", "sgd"]) == 2
    _error(capsys)


def test_explain_dump_after_prints_the_plans_after_a_pass(
    model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--dump-after PASS`` prints each entry point's kernel plan after that pass (the passes
    after it do not run), for a model and for a saved bundle alike; an unknown pass name is an
    error that lists the passes, before anything is compiled."""
    args = [f"{model_file}:net", "--input", "x=8,4", "--loss", "cross_entropy"]
    assert main(["explain", *args, "--dump-after", "fusion"]) == 0
    text = capsys.readouterr().out
    assert text.count("plan ") == 2 and "plan predict after fusion: " in text
    assert "plan gradients after fusion: " in text and " writes %" in text and "@" not in text  # no memplan
    prog = glcomp.compile(load_model(f"{model_file}:net"), {"x": (8, 4)}, glcomp.nn.CrossEntropyLoss())
    assert text == prog.explain(dump_after="fusion") + "\n"
    prog.save(tmp_path / "b")
    assert main(["explain", str(tmp_path / "b"), "--dump-after", "memplan"]) == 0
    assert "plan gradients after memplan: " in capsys.readouterr().out
    assert main(["explain", *args, "--dump-after", "fuse"]) == 2
    assert _error(capsys) == (
        "error: --dump-after: unknown pass 'fuse'; passes in order: ['pushdown', 'fold_views', "
        "'join_sums', 'split_reductions', 'pointwise', 'split_weight_grads', 'split_wide', 'isolate_states', "
        "'layout', "
        "'fusion', 'epilogue', 'texture_units', 'mrt', 'blend', 'tiling', 'memplan']"
    )
    with pytest.raises(glcomp.GlcompError, match=r"dump_after: unknown pass 'fuse'; passes in order"):
        prog.explain(dump_after="fuse")
    prog.graphs = {}
    with pytest.raises(glcomp.GlcompError, match=r"without IR graphs .* no kernel plans to dump"):
        prog.explain(dump_after="fusion")
