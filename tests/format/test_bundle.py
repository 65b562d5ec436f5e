"""Bundles on disk: save, load and run them, and refuse tampered ones.

A saved bundle must behave exactly like the in-memory runtime of the same program. Loading treats
the directory as untrusted data: every fault below raises GlcompError naming it, and nothing in a
bundle is ever executed (no pickle, no eval).
"""

from __future__ import annotations

import builtins
import json
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import as_format_2, as_format_3, stored_path
from safetensors.numpy import load_file, save_file

import glcomp
from glcomp import optim
from glcomp.codegen.bundle import load_bundle
from glcomp.errors import GlcompError


def _data(case: Any) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return case.batch(0)


@pytest.fixture(scope="module")
def saved(
    models: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Any, glcomp.Program, Path]:
    """One saved bundle (the MLP with Adam, WebGL 2) that tamper tests copy and break."""
    case = models["mlp"]
    prog = case.compile("webgl2", optim.Adam(lr=0.01))
    directory = tmp_path_factory.mktemp("bundle") / "mlp"
    prog.save(directory)
    return case, prog, directory


@pytest.fixture
def bundle_dir(saved: tuple[Any, glcomp.Program, Path], tmp_path: Path) -> Path:
    """A fresh copy of the saved bundle, free to tamper with, as format 3 stored it (every file
    under its plain name: what a tamper names is the file it changes; tests/format/test_save_atomic.py
    tampers with the stored names of format 4)."""
    copy = tmp_path / "bundle"
    shutil.copytree(saved[2], copy)
    return as_format_3(copy)


def read_manifest(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "manifest.json").read_text())


def write_manifest(directory: Path, manifest: dict[str, Any]) -> None:
    (directory / "manifest.json").write_text(json.dumps(manifest))


def edit_manifest(directory: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    m = read_manifest(directory)
    change(m)
    write_manifest(directory, m)


def edit_weights(directory: Path, change: Callable[[dict[str, np.ndarray]], Any]) -> None:
    weights = load_file(str(directory / "weights.safetensors"))
    change(weights)
    save_file(weights, str(directory / "weights.safetensors"))


def first_draw(m: dict[str, Any], entry: str = "predict", with_uniform: bool = False) -> dict[str, Any]:
    return next(d for d in m["entries"][entry]["draws"] if d["uniforms"] or not with_uniform)


def fragment_of(m: dict[str, Any], pid: str = "p0") -> str:
    return m["programs"][pid]["fragment"]


def read_shaders(directory: Path) -> dict[str, str]:
    return json.loads((directory / "shaders.json").read_text())


def edit_shaders(directory: Path, change: Callable[[dict[str, Any]], Any]) -> None:
    """Change shaders.json's object (the manifest's sha256 of it is left as it was)."""
    shaders = read_shaders(directory)
    change(shaders)
    (directory / "shaders.json").write_text(json.dumps(shaders))


# -- round trip --------------------------------------------------------------------------------------
def test_saved_bundle_runs_like_the_in_memory_runtime(
    models: dict[str, Any], dialect: str, gl_runtime: Any, tmp_path: Path
):
    case = models["cnn"]
    prog = case.compile(dialect, optim.Adam(lr=0.01))
    prog.save(tmp_path / "cnn")
    feeds, y = _data(case)
    with gl_runtime(prog) as mem, gl_runtime(load_bundle(tmp_path / "cnn")) as disk:
        assert disk.manifest == mem.manifest
        np.testing.assert_array_equal(disk.predict(**feeds), mem.predict(**feeds))
        got, want = disk.gradients(**feeds, y=y), mem.gradients(**feeds, y=y)
        assert sorted(got) == sorted(want) == sorted(prog.trainable)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        for seed in range(3):
            feeds, y = case.batch(seed)
            assert disk.train_step(**feeds, y=y) == mem.train_step(**feeds, y=y)
        got, want = disk.state_dict(), mem.state_dict()
        assert sorted(got) == sorted(want)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
        # ...and both still agree with the reference after those steps.
        ref = prog.runtime("reference")
        for seed in range(3):
            feeds, y = case.batch(seed)
            ref.train_step(**feeds, y=y)
        for name, value in ref.state_dict().items():
            np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_glcomp_load_returns_a_working_runtime(saved: tuple[Any, glcomp.Program, Path]):
    case, prog, directory = saved
    feeds, y = _data(case)
    loaded = glcomp.load(str(directory))
    assert isinstance(loaded, glcomp.Program)
    runtime = loaded.runtime("gl")
    try:
        ref = prog.runtime("reference")
        np.testing.assert_allclose(runtime.predict(**feeds), ref.predict(**feeds), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(runtime.train_step(**feeds, y=y), ref.train_step(**feeds, y=y), rtol=1e-4)
    finally:
        runtime.release()
        runtime.ctx.release()


def test_manifest_contents(saved: tuple[Any, glcomp.Program, Path]):
    _, prog, directory = saved
    m = read_manifest(directory)
    for key in ("format", "version", "target", "inputs", "textures", "programs", "entries"):
        assert key in m, key
    assert m["format"] == "glcomp-bundle"
    assert m["version"] == 4
    assert m["target"]["name"] == "webgl2" and m["target"]["glsl_version"] == "300 es"
    assert {k: v["shape"] for k, v in m["inputs"].items()} == {"x": [6, 5], "y": [6]}
    assert m["inputs"]["y"]["num_classes"] == 3
    assert set(m["entries"]) == {"predict", "gradients", "train_step"}
    size = m["target"]["max_texture_size"]
    for name, tex in m["textures"].items():
        for side in (tex["width"], tex["height"]):
            assert 1 <= side <= size and side & (side - 1) == 0, (name, tex)
    # One file holds every shader, exactly those the manifest names; no shaders/ folder. Each
    # file but the manifest is stored under a name carrying its sha256 (format 4), beside the
    # lock file of saves.
    stored = {path: stored_path(directory, path).name for path in m["files"]}
    assert stored == {
        path: f"{path.rpartition('.')[0]}.{m['files'][path][:16]}.{path.rpartition('.')[2]}"
        for path in m["files"]
    }
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [".glcomp.lock", "manifest.json", *stored.values()]
    )
    shaders = json.loads(stored_path(directory, "shaders.json").read_text())
    assert set(shaders) == {m["vertex_shader"]} | {p["fragment"] for p in m["programs"].values()}
    assert all(isinstance(source, str) and source.startswith("#version") for source in shaders.values())
    assert sorted(m["files"]) == ["program.json", "shaders.json", "weights.safetensors"]
    used = {d["program"] for e in m["entries"].values() for d in e["draws"]}
    assert used == set(m["programs"])
    # Weights: every parameter, buffer and optimizer state, with the program's initial values.
    weights = load_file(str(stored_path(directory, "weights.safetensors")))
    expected = prog.params | prog.buffers | prog.opt_state
    assert set(m["states"]) == set(expected)
    assert set(weights) == set(expected) | set(prog.counters)
    for name, value in expected.items():
        np.testing.assert_array_equal(weights[name], value, err_msg=name)


def test_save_refuses_a_users_directory_and_keeps_files_beside_a_bundle(
    models: dict[str, Any], tmp_path: Path
):
    prog = models["mlp"].compile("webgl1")
    directory = tmp_path / "mine"
    (directory / "notes").mkdir(parents=True)
    mine = {directory / "notes.txt": "my notes\n", directory / "notes" / "data.csv": "a,b\n1,2\n"}
    for path, text in mine.items():
        path.write_text(text)
        os.utime(path, (1_000_000_000, 1_000_000_000))
    with pytest.raises(GlcompError, match="not empty and holds no glcomp bundle"):
        prog.save(directory)  # a directory that holds no bundle is not overwritten
    assert sorted(p.name for p in directory.iterdir()) == ["notes", "notes.txt"]
    bundle = tmp_path / "bundle"
    prog.save(bundle)
    for path in mine:  # files the user put beside a bundle...
        target = bundle / path.relative_to(directory)
        target.parent.mkdir(exist_ok=True)
        shutil.copy2(path, target)
    prog.save(bundle)
    prog.save(bundle)  # ...survive saving again over it
    for path, text in mine.items():
        target = bundle / path.relative_to(directory)
        assert target.read_text() == text
        assert target.stat().st_mtime == 1_000_000_000
    assert (bundle / "manifest.json").is_file()
    assert load_bundle(bundle).manifest == {k: v for k, v in read_manifest(bundle).items() if k != "files"}


def test_every_test_model_bundle_validates(model_case: Any, dialect: str, tmp_path: Path):
    """No false alarms: what the compiler writes, the loader accepts (default and shrunk limits)."""
    for variant, limits in (("default", {}), ("shrunk", model_case.shrunk)):
        prog = model_case.compile(dialect, optim.SGD(lr=0.1, momentum=0.9), **limits)
        prog.save(tmp_path / variant)
        bundle = load_bundle(tmp_path / variant)
        assert set(bundle.manifest["entries"]) == {"predict", "gradients", "train_step"}
        assert set(bundle.weights) == set(prog.params) | set(prog.buffers) | set(prog.opt_state) | set(
            prog.counters
        )
        for name, value in (prog.params | prog.buffers | prog.opt_state | prog.counters).items():
            assert bundle.weights[name].shape == np.shape(value), name


# -- tampering ---------------------------------------------------------------------------------------
def _remove_shader(d: Path) -> None:
    edit_shaders(d, lambda s: s.pop(fragment_of(read_manifest(d))))


def _outside_name(name: str) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        target = d.parent / "x.frag"
        target.write_text(read_shaders(d)[fragment_of(read_manifest(d))])
        path = name.replace("ABS", str(target))
        edit_manifest(d, lambda m: m["programs"]["p0"].update(fragment=path))

    return change


def _symlink_shaders_file(outside: bool) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        target = (d.parent / "evil.json") if outside else (d / "copy.json")
        shutil.move(d / "shaders.json", target)
        (d / "shaders.json").symlink_to(target)

    return change


def _format_2(change: Callable[[Path], None]) -> Callable[[Path], None]:
    """`change` applied to the bundle rewritten as format 2 (a file per shader under shaders/)."""

    def apply(d: Path) -> None:
        load_bundle(as_format_2(d))  # loads before the change
        change(d)

    return apply


def _remove_shader_file(d: Path) -> None:
    (d / "shaders" / fragment_of(read_manifest(d))).unlink()


def _symlink_shader(outside: bool) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        frag = d / "shaders" / fragment_of(read_manifest(d))
        target = (d.parent / "evil.frag") if outside else (d / "shaders" / "copy.frag")
        target.write_text(frag.read_text())
        frag.unlink()
        frag.symlink_to(target)

    return change


def _symlink_shader_dir(d: Path) -> None:
    outside = d.parent / "elsewhere"
    shutil.move(d / "shaders", outside)
    (d / "shaders").symlink_to(outside, target_is_directory=True)


def _loop_in_shader(d: Path) -> None:
    name = fragment_of(read_manifest(d))
    edit_shaders(
        d, lambda s: s.update({name: s[name].replace("void main() {", "void main() {\nwhile (true) { }")})
    )


def _append_to_shader(d: Path) -> None:
    name = fragment_of(read_manifest(d))
    edit_shaders(d, lambda s: s.update({name: s[name] + "// changed\n"}))


def _weights(change: Callable[[dict[str, np.ndarray]], Any]) -> Callable[[Path], None]:
    return lambda d: edit_weights(d, change)


def _manifest(change: Callable[[dict[str, Any]], Any]) -> Callable[[Path], None]:
    return lambda d: edit_manifest(d, change)


def _set_sampler(m: dict[str, Any], ref: Any) -> None:
    d = first_draw(m)
    d["samplers"][next(iter(d["samplers"]))] = ref


def _alias(m: dict[str, Any]) -> None:
    d = first_draw(m)
    d["samplers"][next(iter(d["samplers"]))] = d["targets"][0]


def _alias_state(m: dict[str, Any]) -> None:
    """A draw that samples the current version of the state it writes the next version of is
    fine; one that samples the `next` version it renders to is not."""
    d = next(d for d in m["entries"]["train_step"]["draws"] if isinstance(d["targets"][0], dict))
    d["samplers"][next(iter(d["samplers"]))] = dict(d["targets"][0])


def _state_texture_by_name(m: dict[str, Any]) -> None:
    """Sampling a state's texture by its name hides that it is the one being rendered to on
    every other step (which set is current flips with each update)."""
    d = next(d for d in m["entries"]["train_step"]["draws"] if isinstance(d["targets"][0], dict))
    target = d["targets"][0]
    d["samplers"][next(iter(d["samplers"]))] = m["states"][target["state"]]["textures"][1][target["page"]]


def _input_texture_size(m: dict[str, Any]) -> None:
    m["inputs"]["x"]["layout"].update(width=8, height=4)  # consistent in itself, not with tex0


def _output_texture_size(m: dict[str, Any]) -> None:
    m["entries"]["predict"]["outputs"]["output"]["layout"].update(width=1, height=8)


def _texture_side(m: dict[str, Any]) -> None:
    name = next(n for n in m["textures"] if n.startswith("tex"))
    m["textures"][name]["width"] = 3


def _layout_rows(m: dict[str, Any]) -> None:
    m["inputs"]["x"]["layout"]["rows"] += 1


def _state_layout_texels(m: dict[str, Any]) -> None:
    m["states"]["0.weight"]["layout"]["texels"] += 1


def _input_shape(m: dict[str, Any]) -> None:
    m["inputs"]["x"]["shape"] = [6, 4]


def _uniform(m: dict[str, Any]) -> None:
    d = first_draw(m, "train_step", with_uniform=True)
    d["uniforms"][next(iter(d["uniforms"]))] = {"hyper": "__import__('os').system('true')"}


def _nan(w: dict[str, np.ndarray]) -> None:
    w["0.weight"] = w["0.weight"].copy()
    w["0.weight"][0, 0] = np.nan


TAMPER: dict[str, tuple[Callable[[Path], None], str]] = {
    "missing shader": (_remove_shader, r"bundle shaders\.json: shader 'p0\.frag' is missing"),
    "missing vertex shader": (
        lambda d: edit_shaders(d, lambda s: s.pop("quad.vert")),
        r"bundle shaders\.json: shader 'quad\.vert' is missing \(manifest\.json names it\)",
    ),
    "missing shaders.json": (lambda d: (d / "shaders.json").unlink(), r"shaders\.json is missing"),
    "shaders.json not JSON": (
        lambda d: (d / "shaders.json").write_text('{"p0.frag": "void main() {}",'),
        r"bundle shaders\.json: not valid JSON",
    ),
    "shaders.json not an object": (
        lambda d: (d / "shaders.json").write_text(json.dumps(list(read_shaders(d).values()))),
        r"bundle shaders\.json: must be an object of shader file name -> GLSL source",
    ),
    "shader not a string": (
        lambda d: edit_shaders(d, lambda s: s.update({"p0.frag": ["void main() {}"]})),
        r"bundle shaders\.json\[p0\.frag\]: must be a string",
    ),
    "shader a lone surrogate": (
        lambda d: (d / "shaders.json").write_text(
            json.dumps(read_shaders(d) | {"p0.frag": read_shaders(d)["p0.frag"] + "// \ud800\n"})
        ),
        r"bundle shaders\.json\[p0\.frag\]: not Unicode text",
    ),
    "shader the manifest does not name": (
        lambda d: edit_shaders(d, lambda s: s.update({"p99999.frag": s["p0.frag"]})),
        r"bundle shaders\.json: holds shader 'p99999\.frag', which manifest\.json does not name",
    ),
    "unsafe shader name": (
        lambda d: edit_shaders(d, lambda s: s.update({"../x.frag": s["p0.frag"]})),
        r"bundle shaders\.json: holds shader '\.\./x\.frag', which manifest\.json does not name",
    ),
    "shader loops without bound": (_loop_in_shader, r"shaders\.json\[p0\.frag\]: line \d+: while loops"),
    "shader changed": (
        _append_to_shader,
        r"bundle shaders\.json: its sha256 does not match the one manifest\.json records",
    ),
    "shaders.json without sha256": (
        _manifest(lambda m: m["files"].pop("shaders.json")),
        r"files: no sha256 for shaders\.json",
    ),
    "format 3 hashing a shader file": (
        _manifest(lambda m: m["files"].update({"shaders/p0.frag": "0" * 64})),
        r"files: shaders/p0\.frag is not a file of format version 3",
    ),
    "symlinked shaders.json (outside)": (
        _symlink_shaders_file(True),
        r"bundle shaders\.json: 'shaders\.json' is a symbolic link",
    ),
    "symlinked shaders.json (inside)": (
        _symlink_shaders_file(False),
        r"bundle shaders\.json: 'shaders\.json' is a symbolic link",
    ),
    "format 2: missing shader file": (_format_2(_remove_shader_file), r"shader 'p0\.frag' is missing"),
    "format 2: missing vertex shader": (
        _format_2(lambda d: (d / "shaders" / "quad.vert").unlink()),
        r"vertex shader 'quad\.vert'",
    ),
    "format 2: shader changed": (
        _format_2(
            lambda d: (d / "shaders" / "p0.frag").write_text((d / "shaders" / "p0.frag").read_text() + "//")
        ),
        r"bundle shaders/p0\.frag: its sha256 does not match",
    ),
    "format 2: shader loops without bound": (
        _format_2(
            lambda d: (d / "shaders" / "p0.frag").write_text(
                (d / "shaders" / "p0.frag")
                .read_text()
                .replace("void main() {", "void main() {\nwhile (true) { }")
            )
        ),
        r"bundle shaders/p0\.frag: line \d+: while loops",
    ),
    "format 2 hashing shaders.json": (
        _format_2(lambda d: edit_manifest(d, lambda m: m["files"].update({"shaders.json": "0" * 64}))),
        r"files: shaders\.json is a file of format version 3, not 2",
    ),
    "shader path ../x.frag": (_outside_name("../x.frag"), r"'\.\./x\.frag' is not a plain file name"),
    "absolute shader path": (_outside_name("ABS"), r"shader name '/.* is not a plain file name"),
    "vertex shader outside": (
        _manifest(lambda m: m.update(vertex_shader="../../quad.vert")),
        r"'\.\./\.\./quad\.vert' is not a plain file name",
    ),
    "format 2: symlinked shader (outside)": (
        _format_2(_symlink_shader(True)),
        r"shader 'p0\.frag' (is a symbolic link|lies outside)",
    ),
    "format 2: symlinked shader (inside)": (
        _format_2(_symlink_shader(False)),
        r"shader 'p0\.frag' is a symbolic link",
    ),
    "format 2: symlinked shaders folder": (
        _format_2(_symlink_shader_dir),
        r"lies outside the bundle|symbolic link",
    ),
    "wrong weight shape": (
        _weights(lambda w: w.update({"0.weight": np.zeros((5, 8), np.float32)})),
        r"'0\.weight' has shape \(5, 8\), expected \(8, 5\)",
    ),
    "missing weight": (_weights(lambda w: w.pop("2.bias")), r"missing \['2\.bias'\]"),
    "extra weight": (
        _weights(lambda w: w.update(bogus=np.zeros(3, np.float32))),
        r"unexpected \['bogus'\]",
    ),
    "NaN in weights": (_weights(_nan), r"'0\.weight' holds NaN"),
    "unknown texture in a draw": (
        _manifest(lambda m: _set_sampler(m, "tex_nope")),
        r"draws\[0\]\.samplers\.\w+ refers to unknown texture 'tex_nope'",
    ),
    "unknown render target": (
        _manifest(lambda m: first_draw(m)["targets"].__setitem__(0, "tex_nope")),
        r"draws\[0\]\.targets refers to unknown texture 'tex_nope'",
    ),
    "unknown program": (
        _manifest(lambda m: first_draw(m).update(program="p9999")),
        r"unknown program 'p9999'",
    ),
    "unknown state": (
        _manifest(lambda m: _set_sampler(m, {"state": "nope", "version": "cur", "page": 0})),
        r"unknown state 'nope'",
    ),
    "unknown state update": (
        _manifest(lambda m: m["entries"]["train_step"]["updates"].append("nope")),
        r"updates: unknown state 'nope'",
    ),
    "sampler aliases render target": (_manifest(_alias), r"samples a texture it renders to"),
    "sampler aliases state target": (_manifest(_alias_state), r"samples a texture it renders to"),
    "sampler names a state texture": (
        _manifest(_state_texture_by_name),
        r"names state texture 'state\w+' directly",
    ),
    "input layout differs from its texture": (
        _manifest(_input_texture_size),
        r"inputs\.x: a texture's size is not",
    ),
    "output layout differs from its texture": (
        _manifest(_output_texture_size),
        r"outputs\.output: a texture's size is not",
    ),
    "unknown format version": (_manifest(lambda m: m.update(version=99)), r"unknown format version 99"),
    "version as a string": (_manifest(lambda m: m.update(version="1")), r"unknown format version '1'"),
    "wrong format string": (
        _manifest(lambda m: m.update(format="tensorflowjs")),
        r"format must be 'glcomp-bundle', got 'tensorflowjs'",
    ),
    "invalid JSON": (
        lambda d: (d / "manifest.json").write_text('{"format": "glcomp-bundle",'),
        r"not valid JSON",
    ),
    "manifest not an object": (
        lambda d: (d / "manifest.json").write_text("[1, 2]"),
        r"manifest must be an object",
    ),
    "missing manifest": (lambda d: (d / "manifest.json").unlink(), r"manifest\.json is missing"),
    "missing weights": (lambda d: (d / "weights.safetensors").unlink(), r"weights\.safetensors is missing"),
    "non-power-of-two texture": (_manifest(_texture_side), r"textures\.tex\d+\.width must be a power of two"),
    "layout rows inconsistent with shape": (
        _manifest(_layout_rows),
        r"inputs\.x\.layout rows/row_len disagree",
    ),
    "state layout texels wrong": (
        _manifest(_state_layout_texels),
        r"states\.0\.weight\.layout\.texels is wrong",
    ),
    "input shape differs from its layout": (
        _manifest(_input_shape),
        r"inputs\.x\.layout\.shape \[6, 5\] != \[6, 4\]",
    ),
    "uniform not naming a hyper-parameter": (
        _manifest(_uniform),
        r"uniforms\.u_\w+ must name a hyper-parameter",
    ),
    "pickled weights": (
        lambda d: (d / "weights.safetensors").write_bytes(pickle.dumps({"0.weight": [1.0]})),
        r"weights\.safetensors: unreadable",
    ),
}


@pytest.mark.parametrize("fault", sorted(TAMPER))
def test_tampered_bundle_is_rejected(fault: str, bundle_dir: Path):
    tamper, message = TAMPER[fault]
    load_bundle(bundle_dir)  # the untouched copy loads
    tamper(bundle_dir)
    with pytest.raises(GlcompError, match=message):
        glcomp.load(str(bundle_dir))


def test_format_2_bundles_load_and_save_as_format_4(saved: tuple[Any, glcomp.Program, Path], tmp_path: Path):
    """Bundles saved before shaders.json (a file per shader under shaders/) load as they did, the
    same bundle; saving over one writes format 4 and leaves no shaders/ folder behind (a bundle
    file of the old format, not the user's), while the user's files stay."""
    directory = saved[2]
    old = as_format_2(shutil.copytree(directory, tmp_path / "old"))
    assert (old / "shaders").is_dir() and not (old / "shaders.json").exists()
    (old / "notes.txt").write_text("mine\n")
    new, legacy = load_bundle(directory), load_bundle(old)
    assert legacy.manifest == new.manifest | {"version": 2}  # new: format 4
    assert legacy.shaders == new.shaders
    assert legacy.program == new.program
    assert sorted(legacy.weights) == sorted(new.weights)
    for name, value in new.weights.items():
        np.testing.assert_array_equal(legacy.weights[name], value, err_msg=name)
    glcomp.load(old).save(old)
    stored = sorted(stored_path(old, p).name for p in ("program.json", "shaders.json", "weights.safetensors"))
    assert sorted(p.name for p in old.iterdir()) == sorted(
        [".glcomp.lock", "manifest.json", "notes.txt", *stored]
    )
    assert (old / "notes.txt").read_text() == "mine\n"
    assert load_bundle(old).manifest == new.manifest
    assert (
        stored_path(old, "shaders.json").read_bytes() == stored_path(directory, "shaders.json").read_bytes()
    )


def test_not_a_directory(tmp_path: Path):
    with pytest.raises(GlcompError, match="not a directory"):
        glcomp.load(str(tmp_path / "nothing here"))


class _Trap:
    """Unpickling this runs os.system: a bundle loader that unpickles would create the file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {self.marker}",))


def test_loading_never_executes_anything(bundle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    marker = tmp_path / "pwned"
    payload = f"__import__('os').system('touch {marker}')"
    # Python-looking strings where the manifest holds free text: treated as data.
    m = read_manifest(bundle_dir)
    for e in m["entries"].values():
        for d in e["draws"]:
            d["kernel"] = payload
    write_manifest(bundle_dir, m)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("bundle loading must not execute or unpickle anything")

    with monkeypatch.context() as patch:
        for module, name in [
            (builtins, "eval"),
            (builtins, "exec"),
            (builtins, "compile"),
            (pickle, "load"),
            (pickle, "loads"),
        ]:
            patch.setattr(module, name, refuse)
        bundle = load_bundle(bundle_dir)
    assert all(d["kernel"] == payload for e in bundle.manifest["entries"].values() for d in e["draws"])
    assert not marker.exists()

    # ...and where names are expected, such strings are refused outright.
    for field in ("format", "vertex_shader"):
        broken = tmp_path / f"broken_{field}"
        shutil.copytree(bundle_dir, broken)
        edit_manifest(broken, lambda m, f=field: m.update({f: payload}))
        with pytest.raises(GlcompError):
            glcomp.load(str(broken))
    named = tmp_path / "broken_hyper"
    shutil.copytree(bundle_dir, named)
    edit_manifest(named, lambda m: m["hyper"].update({payload: 1.0}))
    with pytest.raises(GlcompError, match="hyper has an invalid name"):
        glcomp.load(str(named))
    # A pickle bomb in place of the weights is rejected, not unpickled.
    (bundle_dir / "weights.safetensors").write_bytes(pickle.dumps(_Trap(marker)))
    with pytest.raises(GlcompError, match="unreadable"):
        glcomp.load(str(bundle_dir))
    assert not marker.exists()
