"""program.json must describe the computation of shaders.json (glcomp.format.agreement,
Program.check_agreement): the reference runtime runs program.json's graphs and GL the shaders, so
a program.json edited after compiling (and stored again under its new sha256, the manifest
updated: a bundle otherwise valid) made the reference oracle compute other numbers than GL,
silently. Now the reference runtime of such a bundle is refused, naming program.json and the
first kernel that differs, and a constant that is not a number is refused when the bundle is
loaded. Unmodified bundles, in every format version the loader reads, are accepted."""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import as_format_2, as_format_3

import glcomp
from glcomp import GlcompError, nn, optim
from glcomp.format.agreement import disagreement
from glcomp.format.manifest import stored_name
from glcomp.format.shaders import shader_literals


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x: Any) -> Any:
        return self.b(glcomp.relu(self.a(x)) * 0.25)


def _compile(model: Any, **options: Any) -> glcomp.Program:
    return glcomp.compile(
        model, {"x": (2, 4)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=0.01), **options
    )


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    glcomp.manual_seed(5)
    return _compile(_Scaled()).save(tmp_path_factory.mktemp("agreement") / "b")


def restored(source: Path, directory: Path, change: Any) -> Path:
    """A copy of the bundle `source` whose program.json `change` edits, stored again as a save
    stores it: under the name carrying its new sha256 (format 4), the manifest's ``files`` updated;
    the bundle is otherwise valid."""
    shutil.copytree(source, directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    version, files = manifest["version"], manifest["files"]
    old = directory / stored_name(version, "program.json", files["program.json"])
    program = json.loads(old.read_text())
    change(program)
    data = json.dumps(program, allow_nan=False).encode()
    files["program.json"] = hashlib.sha256(data).hexdigest()
    old.unlink()
    (directory / stored_name(version, "program.json", files["program.json"])).write_bytes(data)
    (directory / "manifest.json").write_text(json.dumps(manifest))
    return directory


def _nodes(p: dict[str, Any], op: str) -> list[dict[str, Any]]:
    return [n for g in p["graphs"].values() for n in g["nodes"] if n["op"] == op]


def _scale_to_one(p: dict[str, Any]) -> None:
    """0.25 -> 1.0, a literal the shaders hold elsewhere (load's literal check lets it through)."""
    hits = [n for n in _nodes(p, "const") if n["attrs"]["value"] == 0.25]
    assert hits
    for n in hits:
        n["attrs"]["value"] = 1.0


def _relu_to_sigmoid(p: dict[str, Any]) -> None:
    hits = _nodes(p, "relu")
    assert hits
    for n in hits:
        n["op"] = "sigmoid"


def _rewired(p: dict[str, Any]) -> None:
    """The scaled product reads the layer's output before the relu (an edge moved to a node of
    the same shape)."""
    for g in p["graphs"].values():
        by_id = {n["id"]: n for n in g["nodes"]}
        relu = next(n for n in g["nodes"] if n["op"] == "relu")
        for n in g["nodes"]:
            if n["op"] == "mul" and relu["id"] in n["operands"]:
                n["operands"] = [relu["operands"][0] if o == relu["id"] else o for o in n["operands"]]
                assert by_id[relu["operands"][0]]["shape"] == relu["shape"]


def _reference_verdict(directory: Path) -> str | None:
    try:
        glcomp.load(directory).runtime("reference")
    except GlcompError as err:
        return str(err)
    return None


@pytest.mark.parametrize("change", [_scale_to_one, _relu_to_sigmoid, _rewired])
def test_a_program_json_that_computes_otherwise_is_refused(saved: Path, tmp_path: Path, change: Any) -> None:
    """The edited bundle still loads (GL runs its shaders, and would compute what it computed
    before), but its reference runtime is refused: program.json is named, with the kernel."""
    edited = restored(saved, tmp_path / "e", change)
    program = glcomp.load(edited)
    msg = _reference_verdict(edited)
    assert msg is not None, "the reference runtime of an edited program.json was built"
    assert msg.startswith("bundle program.json: does not describe the computation of shaders.json: "), msg
    assert "graphs.predict: kernel k" in msg, msg
    # A copy of the program shares the verdict.
    with pytest.raises(GlcompError, match=r"^bundle program\.json: "):
        program.with_state(lr=0.5).runtime("reference")


def test_the_constant_edit_passes_the_literal_check(saved: Path, tmp_path: Path) -> None:
    """The case the load-time literal check misses: 1.0 is a literal of the shaders already."""
    assert "1.0" in shader_literals(glcomp.load(saved).bundle().shaders)
    assert glcomp.load(restored(saved, tmp_path / "e", _scale_to_one)).graphs


@pytest.mark.parametrize("value", ["1.0", "0.25", True, None, {"float": "1.0"}, [0.25]])
def test_a_constant_that_is_not_a_number_is_refused_at_load(saved: Path, tmp_path: Path, value: Any) -> None:
    def change(p: dict[str, Any]) -> None:
        for n in _nodes(p, "const"):
            n["attrs"]["value"] = value

    with pytest.raises(
        GlcompError, match=r"^bundle program\.json: graphs\.\w+: node \d+ \(nodes\[\d+\]\) is a "
    ):
        glcomp.load(restored(saved, tmp_path / "e", change))


class _Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = nn.Conv2d(1, 2, 3, padding=1)
        self.f = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x: Any) -> Any:
        return self.f(glcomp.flatten(glcomp.relu(self.c(x)), 1))


class _Masked(nn.Module):
    """Causal attention as char-GPT's head: a constant -inf (masked_fill), which loads."""

    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)
        self.register_buffer("tril", glcomp.tril(glcomp.ones(3, 3)))

    def forward(self, x: Any) -> Any:
        h = self.q(x)
        w = (h @ h.transpose(-2, -1)).masked_fill(self.tril == 0, float("-inf"))
        return glcomp.softmax(w, -1) @ h


def _bundles(root: Path) -> dict[str, Path]:
    glcomp.manual_seed(1)
    out = {
        "scaled": _compile(_Scaled()).save(root / "scaled"),
        "mlp-webgl1": _compile(
            nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)), target="webgl1"
        ).save(root / "webgl1"),
        "f16": _compile(nn.Sequential(nn.Linear(4, 3), nn.LeakyReLU(0.1)), storage="f16").save(root / "f16"),
        "inspect": _compile(nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3)), inspect=["1"]).save(
            root / "inspect"
        ),
        "cnn": glcomp.compile(
            _Conv(),
            {"x": (2, 1, 4, 4)},
            loss=nn.CrossEntropyLoss(),
            optimizer=optim.SGD(lr=0.1, momentum=0.9),
        ).save(root / "cnn"),
        "masked": glcomp.compile(_Masked(), {"x": (2, 3, 4)}).save(root / "masked"),
        "predict-only": glcomp.compile(nn.Sequential(nn.Linear(4, 2), nn.Softmax(1)), {"x": (2, 4)}).save(
            root / "predict"
        ),
    }
    # Older format versions (the loader still reads them): the same shaders, stored otherwise.
    out["format-3"] = as_format_3(_compile(_Scaled()).save(root / "v3"))
    out["format-2"] = as_format_2(as_format_3(_compile(_Scaled()).save(root / "v2")))
    return out


def test_unmodified_bundles_are_accepted(tmp_path: Path) -> None:
    for name, directory in _bundles(tmp_path).items():
        program = glcomp.load(directory)
        assert program._cache.unchecked is not None, name  # not checked before a reference runtime
        runtime = program.runtime("reference")
        assert program._cache.unchecked is None, name  # checked once
        shape = tuple(program.inputs["x"].shape)
        out = runtime.predict(x=np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape))
        assert np.all(np.isfinite(out)), name


def test_a_compiled_program_is_not_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a loaded bundle is compared: a compiled program's bundle is lowered from its graphs."""
    import glcomp.codegen.bundle as codegen

    prog = _compile(_Scaled())
    monkeypatch.setattr(codegen, "lower", None)  # any lowering would fail
    prog.runtime("reference")


def test_disagreement_names_the_first_draw_that_differs(saved: Path) -> None:
    bundle = glcomp.load(saved).bundle()
    manifest, shaders = bundle.manifest, bundle.shaders
    assert disagreement(manifest, shaders, manifest, shaders) is None
    changed = json.loads(json.dumps(manifest))
    changed["hyper"]["lr"], changed["counters"] = 3.0, {}  # state, not computation
    assert disagreement(changed, shaders, manifest, shaders) is None
    first = manifest["entries"]["predict"]["draws"][0]
    fragment = manifest["programs"][first["program"]]["fragment"]
    other = shaders | {fragment: shaders[fragment].replace("0.25", "0.5")}
    msg = disagreement(manifest, other, manifest, shaders)
    assert msg is not None and msg.startswith(f"graphs.predict: kernel {first['kernel']}"), msg
    changed = json.loads(json.dumps(manifest))
    changed["entries"]["train_step"]["draws"].pop()
    msg = disagreement(changed, shaders, manifest, shaders)
    assert msg is not None and msg.startswith("graphs.train_step: its graph compiles to"), msg


def test_the_check_costs_little(tmp_path: Path) -> None:
    """The check lowers the graphs once per loaded bundle: well under a second here."""
    directory = _compile(_Scaled()).save(tmp_path / "b")
    program = glcomp.load(directory)
    start = time.perf_counter()
    program.check_agreement()
    assert time.perf_counter() - start < 5.0
