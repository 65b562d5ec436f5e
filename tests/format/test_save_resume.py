"""Saving and resuming training: runtimes save their current state, `glcomp.load` gives back a
Program that resumes exactly, saves are atomic (a failed or interrupted save leaves the previous
bundle loadable; readers never see a mix of two saves), and any torch name round-trips.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import as_format_3, stored_path

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import load_bundle
from glcomp.errors import GlcompError
from glcomp.format import store as schema

OPTIMIZERS = {"adam": lambda: optim.Adam(lr=0.01), "sgd-momentum": lambda: optim.SGD(lr=0.05, momentum=0.9)}


def _runtime(prog: glcomp.Program, kind: str, gl_ctx: Any) -> Any:
    return prog.runtime(kind, ctx=gl_ctx) if kind == "gl" else prog.runtime(kind)


def _train(rt: Any, case: Any, steps: range) -> None:
    for step in steps:
        if step == 3:
            rt.set_lr(0.004)  # the learning rate is state too
        feeds, y = case.batch(step)
        rt.train_step(**feeds, y=y)


def _release(rt: Any) -> None:
    if hasattr(rt, "release"):
        rt.release()


def _everything(rt: Any) -> dict[str, np.ndarray]:
    """Parameters, buffers, counters and optimizer state of a runtime."""
    state = rt.state_dict()
    state |= rt.optimizer_state() if hasattr(rt, "optimizer_state") else dict(rt.opt_state)
    return state


# -- 1. runtimes save their current state ------------------------------------------------------------
@pytest.mark.parametrize("kind", ["reference", "gl"])
def test_runtime_save_writes_the_current_state(
    kind: str, models: dict[str, Any], gl_ctx: Any, tmp_path: Path
):
    case = models["cnn"]  # BatchNorm: running statistics and a step counter
    prog = case.compile("webgl2", optim.Adam(lr=0.01))
    rt = _runtime(prog, kind, gl_ctx)
    try:
        _train(rt, case, range(5))
        rt.save(tmp_path / "b")
        want = _everything(rt)
    finally:
        _release(rt)
    bundle = load_bundle(tmp_path / "b")
    assert set(bundle.weights) == set(want)
    for name, value in want.items():
        np.testing.assert_array_equal(bundle.weights[name], value, err_msg=name)
    assert bundle.manifest["hyper"]["lr"] == pytest.approx(0.004)
    assert bundle.manifest["counters"] == {"1.num_batches_tracked": 5}
    assert float(bundle.weights["opt.step"]) == 5.0
    initial = prog.params["0.weight"]
    assert not np.array_equal(bundle.weights["0.weight"], initial)  # trained, not initial, weights


# -- 2. glcomp.load gives a Program ----------------------------------------------------------------
def test_load_returns_a_program_that_reuses_its_bundle(
    models: dict[str, Any], gl_ctx: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    case = models["mlp"]
    prog = case.compile("webgl2", optim.Adam(lr=0.01))
    prog.save(tmp_path / "a")
    loaded = glcomp.load(tmp_path / "a")
    assert isinstance(loaded, glcomp.Program)
    assert loaded.trainable == prog.trainable and loaded.lr == prog.lr
    assert {k: str(g) for k, g in loaded.graphs.items()} == {k: str(g) for k, g in prog.graphs.items()}

    import glcomp.codegen.bundle as bundle_module

    def no_compile(*args: Any) -> Any:
        raise AssertionError("a loaded program must run its bundle, not compile again")

    monkeypatch.setattr(bundle_module, "build_bundle", no_compile)
    feeds, _ = case.batch(0)
    gl = loaded.runtime("gl", ctx=gl_ctx)
    try:
        want = prog.runtime("reference").predict(**feeds)
        np.testing.assert_allclose(gl.predict(**feeds), want, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(loaded.runtime("reference").predict(**feeds), want)
    finally:
        gl.release()
    loaded.save(tmp_path / "again")  # re-saving a loaded program needs no compiler either
    assert sorted(os.listdir(tmp_path / "a")) == sorted(os.listdir(tmp_path / "again"))
    assert (tmp_path / "a" / "manifest.json").read_bytes() == (
        tmp_path / "again" / "manifest.json"
    ).read_bytes()
    for name in ("program.json", "shaders.json", "weights.safetensors"):
        a, again = stored_path(tmp_path / "a", name), stored_path(tmp_path / "again", name)
        assert a.read_bytes() == again.read_bytes(), name


def _rehash(directory: Path, name: str) -> None:
    """Record a changed file's sha256 in the manifest, as a crafted bundle would."""
    m = json.loads((directory / "manifest.json").read_text())
    m["files"][name] = schema.sha256((directory / name).read_bytes())
    (directory / "manifest.json").write_text(json.dumps(m))


def _edit_program(directory: Path, change: Any) -> None:
    data = json.loads((directory / "program.json").read_text())
    change(data)
    (directory / "program.json").write_text(json.dumps(data))
    _rehash(directory, "program.json")


def _node(data: dict[str, Any], op: str) -> dict[str, Any]:
    return next(n for n in data["graphs"]["predict"]["nodes"] if n["op"] == op)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: _node(d, "matmul").update(op="os.system"), r"unknown op 'os\.system'"),
        (lambda d: _node(d, "matmul").update(shape=[6, -1]), r"bad shape \[6, -1\]"),
        (lambda d: _node(d, "matmul").update(shape=[6, 7]), r"shape \(6, 7\) != inferred"),
        (lambda d: _node(d, "matmul").update(operands=[999]), r"operands must list earlier nodes"),
        (lambda d: _node(d, "relu").update(attrs={"x": {"__reduce__": 1}}), r"unexpected object"),
        (lambda d: d["order"].update(params=["0.weight"]), r"order\.params does not list"),
        (lambda d: d.update(version=9), r"unknown version 9"),
    ],
)
def test_program_json_is_validated(change: Any, message: str, models: dict[str, Any], tmp_path: Path):
    models["mlp"].compile("webgl2", optim.Adam(lr=0.01)).save(tmp_path / "b")
    _edit_program(as_format_3(tmp_path / "b"), change)
    with pytest.raises(GlcompError, match=rf"program\.json.*{message}"):
        glcomp.load(tmp_path / "b")


# -- 3. exact resume -------------------------------------------------------------------------------------
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
@pytest.mark.parametrize("kind", ["reference", "gl"])
def test_resume_is_exact(kind: str, opt: str, models: dict[str, Any], gl_ctx: Any, tmp_path: Path):
    """10 steps in one go == 5 steps, save, load, 5 steps (a BatchNorm model, Adam or SGD momentum)."""
    case = models["cnn"]
    prog = case.compile("webgl2", OPTIMIZERS[opt]())
    straight, first = _runtime(prog, kind, gl_ctx), _runtime(prog, kind, gl_ctx)
    try:
        _train(straight, case, range(10))
        _train(first, case, range(5))
        first.save(tmp_path / "half")
    finally:
        _release(first)
    resumed = _runtime(glcomp.load(tmp_path / "half"), kind, gl_ctx)
    try:
        _train(resumed, case, range(5, 10))
        got, want = _everything(resumed), _everything(straight)
        feeds, _ = case.batch(99)
        assert set(got) == set(want)
        for name in want:
            if kind == "reference":
                np.testing.assert_array_equal(got[name], want[name], err_msg=name)
            else:
                np.testing.assert_allclose(got[name], want[name], rtol=1e-6, atol=0, err_msg=name)
        np.testing.assert_allclose(resumed.predict(**feeds), straight.predict(**feeds), rtol=1e-6, atol=0)
    finally:
        _release(resumed)
        _release(straight)


# -- 4. repr ----------------------------------------------------------------------------------------------
def test_program_repr_is_a_short_summary(models: dict[str, Any]):
    prog = models["cnn"].compile("webgl2", optim.Adam(lr=0.01))
    text = repr(prog)
    count = sum(v.size for v in prog.params.values())
    assert len(text) < 250 and "\n" not in text, text
    assert f"parameters={count}" in text and "texture_bytes=" in text, text
    assert "predict=" in text and "train_step=" in text, text  # draws per entry point
    assert "array" not in text


# -- 5. atomic saves ----------------------------------------------------------------------------------
def _temporaries(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize("failure", ["disk full while writing", "rename into place fails"])
def test_a_failed_save_leaves_the_previous_bundle(
    failure: str, models: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    case = models["mlp"]
    old = case.compile("webgl2", optim.Adam(lr=0.01))
    old.save(tmp_path / "b")
    before = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    rt = old.runtime("reference")
    _train(rt, case, range(2))
    if failure == "disk full while writing":
        real = schema._write_new
        written: list[str] = []

        def write(fd: int, name: str, data: bytes, *args: Any) -> None:
            if not written:  # the new weights (shaders.json and program.json are kept: the same bytes)
                raise OSError(errno.ENOSPC, "No space left on device")
            written.append(name)
            real(fd, name, data, *args)

        monkeypatch.setattr(schema, "_write_new", write)
        why = "No space left on device"
    else:
        real_replace = os.replace

        def replace(src: Any, dst: Any, **kwargs: Any) -> None:
            if src == "manifest.json":  # the switch to the new bundle
                raise OSError(errno.EIO, "I/O error")
            real_replace(src, dst, **kwargs)

        monkeypatch.setattr(schema.os, "replace", replace)
        why = "I/O error"
    with pytest.raises(GlcompError, match=rf"{tmp_path / 'b'}: could not save the bundle \({why}\)"):
        rt.save(tmp_path / "b")
    monkeypatch.undo()
    after = {p.relative_to(tmp_path): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert after == before
    assert _temporaries(tmp_path) == []  # the temporary directory went too
    feeds, _ = case.batch(0)
    loaded = glcomp.load(tmp_path / "b")
    np.testing.assert_array_equal(
        loaded.runtime("reference").predict(**feeds), old.runtime("reference").predict(**feeds)
    )


def test_stale_temporaries_are_cleaned_on_the_next_save(models: dict[str, Any], tmp_path: Path):
    """A save killed midway leaves its staging folder (and stored files no manifest names) inside
    the bundle directory: the next save removes them. Folders beside the bundle named like the
    temporaries of saves before format 4 are left alone: a save writes nothing outside the
    bundle directory and deletes nothing there (see test_save_atomic.py for what it recovers)."""
    prog = models["mlp"].compile("webgl2")
    prog.save(tmp_path / "b")
    before = sorted(os.listdir(tmp_path / "b"))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    dead = int(gone.stdout)  # a process that has exited
    stale = [f".b.tmp-{dead}-x1", f".b.old-{os.getpid()}-y2", f".b.tmp-{os.getpid()}-z3"]
    for name in stale:
        (tmp_path / name / "shaders").mkdir(parents=True)
        (tmp_path / name / "manifest.json").write_text("{")
    (tmp_path / ".other.tmp-1-x").mkdir()  # another bundle's: not ours to touch
    staging = tmp_path / "b" / f"{schema.STAGING_PREFIX}{dead}-0123456789ab"
    staging.mkdir()
    (staging / "weights.0123456789abcdef.safetensors").write_bytes(b"half a file")
    (tmp_path / "b" / "weights.fedcba9876543210.safetensors").write_bytes(b"renamed in, never named")
    prog.save(tmp_path / "b")
    assert _temporaries(tmp_path) == sorted([*stale, ".other.tmp-1-x"])
    assert sorted(os.listdir(tmp_path / "b")) == before


def test_symbolic_links_are_never_followed(models: dict[str, Any], tmp_path: Path):
    prog = models["mlp"].compile("webgl2", optim.SGD(lr=0.1))
    good = tmp_path / "good"
    prog.save(good)
    outside = tmp_path / "outside"
    outside.mkdir()
    for name in ("manifest.json", "weights.safetensors"):
        broken = tmp_path / f"link-{name}"
        prog.save(broken)
        as_format_3(broken)  # the weights under their plain name (format 4: tests/format/test_save_atomic.py)
        (outside / name).write_bytes((broken / name).read_bytes())
        (broken / name).unlink()
        (broken / name).symlink_to(outside / name)
        with pytest.raises(GlcompError, match=rf"{name}.*symbolic link"):
            glcomp.load(broken)
    # Saving over a bundle whose weights are a link never writes through it (nor removes it:
    # the save removes only regular files of the old bundle).
    kept = (outside / "weights.safetensors").read_bytes()
    rt = prog.runtime("reference")
    rt.train_step(**{"x": np.ones((6, 5), np.float32)}, y=np.zeros(6, np.int64))
    rt.save(tmp_path / "link-weights.safetensors")
    assert (outside / "weights.safetensors").read_bytes() == kept
    assert not stored_path(tmp_path / "link-weights.safetensors", "weights.safetensors").is_symlink()
    assert glcomp.load(tmp_path / "link-weights.safetensors").state().keys() == prog.state().keys()
    # A symbolic link as the save target is refused; its target is left alone.
    (tmp_path / "alias").symlink_to(outside, target_is_directory=True)
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(GlcompError, match="symbolic link"):
        prog.save(tmp_path / "alias")
    assert sorted(p.name for p in outside.iterdir()) == before
    # A non-empty directory that holds no bundle (its manifest is a link) is refused.
    with pytest.raises(GlcompError, match="holds no glcomp bundle"):
        prog.save(tmp_path / "link-manifest.json")


# -- 6. no mixed bundles ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_programs() -> tuple[glcomp.Program, glcomp.Program]:
    """The same model compiled two ways (other weights, other passes): the same state names and
    shapes, so a bundle mixing their files would look whole without the recorded hashes."""
    progs = []
    for seed, passes in ((1, {}), (2, {"fusion": False, "mrt": False})):
        glcomp.manual_seed(seed)
        model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
        opt = optim.Adam(lr=0.01)
        progs.append(glcomp.compile(model, {"x": (6, 5)}, nn.CrossEntropyLoss(), opt, passes=passes))
    return progs[0], progs[1]


def test_a_file_of_another_save_is_detected(two_programs: Any, tmp_path: Path):
    a, b = two_programs
    a.save(tmp_path / "a")
    b.save(tmp_path / "b")
    glcomp.manual_seed(3)  # same shapes as a, other values
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    c = glcomp.compile(model, {"x": (6, 5)}, nn.CrossEntropyLoss(), optim.Adam(lr=0.01))
    c.save(tmp_path / "c")
    for name in "abc":
        as_format_3(tmp_path / name)
    weights = (tmp_path / "a" / "weights.safetensors").read_bytes()
    (tmp_path / "a" / "weights.safetensors").write_bytes(b"")  # what a reader might catch mid-write
    with pytest.raises(GlcompError, match=r"weights\.safetensors"):
        glcomp.load(tmp_path / "a")
    (tmp_path / "a" / "weights.safetensors").write_bytes(weights)
    m = json.loads((tmp_path / "a" / "manifest.json").read_text())
    mixed = tmp_path / "mixed"
    # b's shaders.json names programs a's manifest does not (b fuses nothing); c's weights have
    # a's names and shapes, and a's shaders.json written otherwise holds the same shaders.
    relaid = json.dumps(json.loads((tmp_path / "a" / "shaders.json").read_text()), indent=2).encode()
    for data, name, why in (
        ((tmp_path / "b" / "shaders.json").read_bytes(), "shaders.json", r"holds shader '\w+\.frag', which"),
        (
            (tmp_path / "c" / "weights.safetensors").read_bytes(),
            "weights.safetensors",
            "its sha256 does not match",
        ),
        (relaid, "shaders.json", "its sha256 does not match"),
    ):
        shutil.rmtree(mixed, ignore_errors=True)
        shutil.copytree(tmp_path / "a", mixed)
        (mixed / name).write_bytes(data)
        assert m["files"][name] != schema.sha256((mixed / name).read_bytes())
        with pytest.raises(GlcompError, match=rf"bundle {name}: {why}"):
            glcomp.load(mixed)


def test_concurrent_saves_and_loads_never_mix(two_programs: Any, gl_ctx: Any, tmp_path: Path):
    a, b = two_programs
    feeds = {"x": np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)}
    want = [p.runtime("reference").predict(**feeds) for p in (a, b)]
    for p in (a, b):
        p.bundle()  # lower both before the race
    target = tmp_path / "shared"
    b.save(target)
    start = time.perf_counter()
    glcomp.load(target)
    # A pause between saves longer than a load of b takes (b has more shaders to check): a
    # reader slower than one save would otherwise always find its directory replaced, a clean
    # error every time but never a read of b. Saves of four files are quick, so this is set by
    # the reader's speed on this machine now, not by a fixed time.
    pause = max(0.02, 3 * (time.perf_counter() - start))
    a.save(target)
    stop = threading.Event()
    saves: list[int] = []
    errors: list[BaseException] = []

    def writer() -> None:
        try:
            while not stop.is_set():
                (a, b)[len(saves) % 2].save(target)
                saves.append(1)
                time.sleep(pause)
        except BaseException as err:  # reported by the main thread
            errors.append(err)

    thread = threading.Thread(target=writer)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # the writer waits for the interpreter lock after every file
    thread.start()
    outcomes = {"a": 0, "b": 0, "error": 0}
    messages: list[str] = []
    try:
        deadline = time.monotonic() + 30
        i = 0
        # Until both versions were read at least once (a loaded machine may need more tries).
        while (len(saves) < 4 or i < 12 or not (outcomes["a"] and outcomes["b"])) and (
            time.monotonic() < deadline
        ):
            i += 1
            time.sleep(0.05)  # let the writer run (GL calls hold the interpreter lock)
            try:
                loaded = glcomp.load(target)
                rt = loaded.runtime("gl", ctx=gl_ctx) if i % 4 == 0 else None
            except GlcompError as err:
                outcomes["error"] += 1
                messages.append(str(err).splitlines()[0])
                continue
            got = loaded.runtime("reference").predict(**feeds)
            which = [k for k, w in enumerate(want) if np.array_equal(got, w)]
            assert len(which) == 1, "a load gave neither program: a mixed bundle"
            if rt is not None:  # the shaders and weights agree too
                try:
                    np.testing.assert_allclose(rt.predict(**feeds), want[which[0]], rtol=1e-5, atol=1e-6)
                finally:
                    rt.release()
            outcomes["ab"[which[0]]] += 1
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(interval)
    assert not errors, errors
    assert len(saves) >= 4 and outcomes["a"] >= 1 and outcomes["b"] >= 1, (len(saves), outcomes, messages)
    assert _temporaries(tmp_path) == []


# -- 7. any torch name ------------------------------------------------------------------------------
class OddNames(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.add_module("my layer", nn.Linear(4, 3))
        setattr(self, "odd\nname", nn.Linear(3, 2))

    def forward(self, x: Any) -> Any:
        return getattr(self, "odd\nname")(getattr(self, "my layer")(x).relu())


def test_names_with_spaces_and_newlines_round_trip(gl_ctx: Any, tmp_path: Path):
    glcomp.manual_seed(0)
    prog = glcomp.compile(OddNames(), {"x": (2, 4)}, loss=nn.MSELoss(), optimizer=optim.Adam(lr=0.01))
    assert set(prog.params) == {"my layer.weight", "my layer.bias", "odd\nname.weight", "odd\nname.bias"}
    x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
    y = np.ones((2, 2), np.float32)
    rt = prog.runtime("gl", ctx=gl_ctx)
    try:
        for _ in range(2):
            rt.train_step(x=x, y=y)
        rt.save(tmp_path / "b")
        want = _everything(rt)
        out = rt.predict(x=x)
    finally:
        rt.release()
    assert all(" " not in p.name and "\n" not in p.name for p in (tmp_path / "b").rglob("*"))
    loaded = glcomp.load(tmp_path / "b")
    ref = loaded.runtime("reference")
    got = _everything(ref)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    np.testing.assert_allclose(ref.predict(x=x), out, rtol=1e-5, atol=1e-6)
