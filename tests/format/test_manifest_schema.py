"""One manifest schema for both loaders: glcomp/format/manifest.schema.json, interpreted by
glcomp/format/jsonschema.py (Python) and glcomp/runtime/js/format/jsonschema.js (browser, through
the generated format/manifest_schema.js). A corpus of a real manifest and its tamperings is accepted and
rejected identically, with the same messages, by Python and by glcomp.js in Chromium."""

from __future__ import annotations

import copy
import json
import posixpath
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from browser.support import _get, _js

import glcomp
from glcomp import nn, optim
from glcomp.codegen.programs import MAX_OFFSET
from glcomp.codegen.schema import parse_json
from glcomp.errors import GlcompError
from glcomp.format import DEFAULT_LOOP_BUDGET, TEXEL_BYTES, VERSIONS, manifest_schema, validate_manifest
from glcomp.format.jsonschema import KEYWORDS, Validator, check_keywords
from glcomp.format.manifest import js_module
from glcomp.ir.graph import DTYPES
from glcomp.program import ENTRY_POINTS
from glcomp.serve import make_server

JS_DIR = Path(glcomp.__file__).parent / "runtime" / "js"
FORMAT_JS = JS_DIR / "format"  # one module per glcomp/format module
PAGES_DIR = Path(glcomp.__file__).parent / "pages"  # the pages, served beside the runtime's modules
FORMAT_PY = sorted((Path(glcomp.__file__).parent / "format").glob("*.py"))
# glcomp/format modules with a browser twin of the same name (the others: bundle writing, file
# writes, program.json and the store, which only Python does, or glcomp.js does in io.js).
FORMAT_TWINS = {"jsonschema", "manifest", "packing", "parse", "shaders"}


def test_js_schema_module_is_generated_from_the_json() -> None:
    """manifest_schema.js is `python3 -m glcomp.format`'s output for the current JSON."""
    assert (FORMAT_JS / "manifest_schema.js").read_text() == js_module()


def test_both_interpreters_know_the_same_keywords() -> None:
    source = (FORMAT_JS / "jsonschema.js").read_text()
    found = re.search(r"const KEYWORDS = new Set\(\[(.*?)\]\);", source, re.S)
    assert found is not None
    assert set(re.findall(r'"([^"]+)"', found[1])) == KEYWORDS
    check_keywords(manifest_schema())  # the schema uses nothing else
    with pytest.raises(ValueError, match="unsupported keyword 'oneOf'"):
        check_keywords({"oneOf": []})
    with pytest.raises(ValueError, match="must be anchored"):
        check_keywords({"pattern": "[a-z]+"})


def test_schema_agrees_with_the_code() -> None:
    """Enumerations and bounds the compiler and runtimes also name in code."""
    s = manifest_schema()
    defs = s["$defs"]
    assert defs["texture"]["properties"]["format"]["enum"] == list(TEXEL_BYTES)
    assert s["properties"]["version"]["enum"] == list(VERSIONS)
    assert list(s["properties"]["entries"]["properties"]) == list(ENTRY_POINTS)
    assert defs["input"]["properties"]["dtype"]["enum"] == list(DTYPES)
    offset = defs["uniformSource"]["properties"]["int"]
    assert (offset["minimum"], offset["maximum"]) == (-MAX_OFFSET, MAX_OFFSET)


def test_validator_messages_name_the_field() -> None:
    v = Validator(manifest_schema(), "manifest.json")
    schema = {"$defs": {}, "type": "object", "properties": {"a": {"type": "array", "items": {"enum": [1]}}}}
    small = Validator(schema, "x.json")
    with pytest.raises(GlcompError, match=r"^bundle x\.json: a\[1\] must be one of \[1\], got true$"):
        small.validate({"a": [1, True]})
    with pytest.raises(GlcompError, match=r"^bundle manifest\.json: manifest must be an object, got \[\]$"):
        v.validate([])


def test_the_browser_modules_are_served_and_import_only_each_other(tmp_path: Path) -> None:
    """glcomp serve hands out every module of the browser runtime, and the modules import only
    modules that exist beside them (so '/glcomp.js' loads whole); the pages are served beside them."""
    import threading

    modules = sorted(p.relative_to(JS_DIR).as_posix() for p in JS_DIR.glob("**/*.js"))
    runtime_parts = {"runtime.js", "context.js", "executor.js", "readback.js", "persistence.js"}
    assert {"glcomp.js", "io.js"} | runtime_parts <= set(modules)
    assert {f"format/{p.stem}.js" for p in FORMAT_PY if p.stem in FORMAT_TWINS} | {
        "format/manifest_schema.js"
    } == {m for m in modules if m.startswith("format/")}
    for name in modules:
        for target in re.findall(
            r'^(?:import|export)[^;]*? from "([^"]+)";', (JS_DIR / name).read_text(), re.M | re.S
        ):
            resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
            assert target.startswith(("./", "../")) and resolved in modules, (name, target)
    # The pages (glcomp/pages) are served beside the runtime's modules and import them as "./x.js";
    # the runtime imports no page.
    pages = sorted(p.name for p in PAGES_DIR.iterdir() if p.suffix in (".js", ".html"))
    assert {"demo.html", "demo.js", "chart.js", "site.html"} <= set(pages)
    assert not set(pages) & set(modules), "a page and a runtime module share a name"
    for name in (p for p in pages if p.endswith(".js")):
        for target in re.findall(
            r'^(?:import|export)[^;]*? from "([^"]+)";', (PAGES_DIR / name).read_text(), re.M | re.S
        ):
            assert target.startswith("./") and target[2:] in {*pages, *modules}, (name, target)
    (tmp_path / "b").mkdir()
    server = make_server(tmp_path / "b")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for name in modules:
            status, body, kind = _get(server.server_address[1], f"/{name}")
            assert (status, kind) == (200, "text/javascript; charset=utf-8"), name
            assert body == (JS_DIR / name).read_bytes()
        for name in pages:
            status, body, kind = _get(server.server_address[1], f"/{name}")
            assert status == 200 and kind.startswith(("text/javascript", "text/html")), name
            assert body == (PAGES_DIR / name).read_bytes()
    finally:
        server.shutdown()
        server.server_close()


# -- manifests the compiler writes --------------------------------------------------------------------
def _compiled_manifests() -> dict[str, tuple[dict[str, Any], set[str]]]:
    glcomp.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    cnn = nn.Sequential(
        nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(2 * 4 * 4, 3)
    )
    loss = nn.CrossEntropyLoss()
    builds = {
        "mlp sgd": (mlp, {"x": (2, 3)}, dict(optimizer=optim.SGD(lr=0.1, momentum=0.9))),
        "mlp adam f16": (mlp, {"x": (2, 3)}, dict(optimizer=optim.Adam(lr=0.01), storage="f16")),
        "mlp adam rgba8": (mlp, {"x": (2, 3)}, dict(optimizer=optim.Adam(lr=0.01), storage="rgba8")),
        "mlp webgl1-mobile": (mlp, {"x": (2, 3)}, dict(optimizer=optim.SGD(lr=0.1), target="webgl1-mobile")),
        "cnn batchnorm": (cnn, {"x": (2, 1, 6, 6)}, dict(optimizer=optim.Adam(lr=0.01))),
        "cnn no passes": (
            cnn,
            {"x": (2, 1, 6, 6)},
            dict(optimizer=optim.SGD(lr=0.1), passes={"fusion": False, "mrt": False, "memplan": False}),
        ),
        "mlp predict only": (mlp, {"x": (2, 3)}, None),
    }
    out = {}
    for name, (model, shapes, opts) in builds.items():
        if opts is None:
            prog = glcomp.compile(model, shapes)
        else:
            prog = glcomp.compile(model, shapes, loss=loss, **opts)
        from glcomp.codegen.schema import bundle_files

        bundle = prog.bundle()
        manifest = json.loads(bundle_files(bundle)["manifest.json"])
        out[name] = (manifest, set(bundle.shaders))
    return out


@pytest.fixture(scope="module")
def compiled() -> dict[str, tuple[dict[str, Any], set[str]]]:
    return _compiled_manifests()


def test_every_compiled_manifest_validates(compiled: dict[str, tuple[dict[str, Any], set[str]]]) -> None:
    for name, (manifest, shaders) in compiled.items():
        validate_manifest(parse_json(json.dumps(manifest).encode(), name), shaders)


# -- the shared corpus: one valid manifest and its tamperings -------------------------------------------
def _draw(m: dict[str, Any], entry: str = "train_step", i: int = 0) -> dict[str, Any]:
    return m["entries"][entry]["draws"][i]


def _state_draw(m: dict[str, Any]) -> dict[str, Any]:
    """A draw that samples a state reference."""
    return next(
        d
        for e in m["entries"].values()
        for d in e["draws"]
        if any(isinstance(r, dict) for r in d["samplers"].values())
    )


def _state_ref(m: dict[str, Any]) -> dict[str, Any]:
    return next(r for r in _state_draw(m)["samplers"].values() if isinstance(r, dict))


def _a_sampler_draw(m: dict[str, Any]) -> dict[str, Any]:
    return next(d for e in m["entries"].values() for d in e["draws"] if d["samplers"])


def _rename_state(m: dict[str, Any], new: str) -> None:
    """Rename the first state everywhere (a valid manifest stays valid)."""
    old = next(iter(m["states"]))
    m["states"] = {new if k == old else k: v for k, v in m["states"].items()}

    def walk(x: Any) -> None:
        if isinstance(x, dict):
            if x.get("state") == old:
                x["state"] = new
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(m["entries"])
    for e in m["entries"].values():
        if "updates" in e:
            e["updates"] = [new if u == old else u for u in e["updates"]]


def _first(d: dict[str, Any]) -> str:
    return next(iter(d))


def _half_texture(m: dict[str, Any]) -> str:
    return next(k for k, t in m["textures"].items() if t.get("format") == "f16")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A tampering that sets the field at dotted `path` ("*" picks the first key) to `value`."""

    def change(m: dict[str, Any]) -> None:
        keys = path.split(".")
        obj: Any = m
        for k in keys[:-1]:
            obj = obj[_first(obj) if k == "*" else (int(k) if isinstance(obj, list) else k)]
        last = keys[-1]
        last_key: Any = _first(obj) if last == "*" else (int(last) if isinstance(obj, list) else last)
        obj[last_key] = value

    return change


def _drop(path: str) -> Callable[[dict[str, Any]], None]:
    def change(m: dict[str, Any]) -> None:
        keys = path.split(".")
        obj: Any = m
        for k in keys[:-1]:
            obj = obj[_first(obj) if k == "*" else k]
        del obj[_first(obj) if keys[-1] == "*" else keys[-1]]

    return change


REQUIRED = ["format", "version", "target", "inputs", "hyper", "states", "counters", "textures"]
REQUIRED += ["vertex_shader", "programs", "entries", "memory"]


# name -> (tampering, whether the result is a valid manifest)
def _as_format_2(m: dict[str, Any]) -> None:
    """The manifest as format 2 writes it: a sha256 per shader file under shaders/."""
    m["version"] = 2
    digest = m["files"].pop("shaders.json")
    names = {m["vertex_shader"]} | {p["fragment"] for p in m["programs"].values()}
    m["files"].update({f"shaders/{n}": digest for n in sorted(names)})


CORPUS: dict[str, tuple[Callable[[dict[str, Any]], None], bool]] = {
    "unchanged": (lambda m: None, True),
    # roles, formats, versions
    "bad role": (_set("states.*.role", "bogus"), False),
    "role not a string": (_set("states.*.role", 1), False),
    "role missing": (_drop("states.*.role"), False),
    "format other": (_set("format", "tensorflowjs"), False),
    "version 4": (_set("version", 4), True),
    "version 5": (_set("version", 5), False),
    "version as a string": (_set("version", "2"), False),
    "version true": (_set("version", True), False),
    "version 1 without files": (lambda m: m.update(version=1) or m.pop("files"), True),
    "version 3 without files": (_drop("files"), False),
    # missing and extra keys
    **{f"missing {k}": (_drop(k), False) for k in REQUIRED},
    "no passes (optional)": (_drop("passes"), True),
    "extra top-level key": (_set("note", "hello"), False),
    "extra texture key": (_set("textures.*.dtype", "f2"), False),
    "extra state key": (_set("states.*.note", 1), False),
    "extra layout key": (_set("states.*.layout.note", 1), False),
    "extra input key": (_set("inputs.x.note", 1), False),
    "extra program key": (_set("programs.*.note", 1), False),
    "extra draw key": (lambda m: _draw(m).update(note=1), False),
    "extra entry key": (_set("entries.train_step.note", 1), False),
    "extra target key": (_set("target.note", 1), False),
    "extra memory key": (_set("memory.note", "__import__('os')"), False),
    "extra state ref key": (lambda m: _state_ref(m).update(note=1), False),
    "extra uniform source key": (
        lambda m: next(
            s for e in m["entries"].values() for d in e["draws"] for s in d["uniforms"].values()
        ).update(int=1),
        False,
    ),
    "draw without kernel and blend": (lambda m: [_draw(m).pop(k) for k in ("kernel", "blend")], True),
    "entry without updates": (_drop("entries.predict.updates"), True),
    "texture format f32 spelled out": (
        lambda m: m["textures"][next(k for k, t in m["textures"].items() if "format" not in t)].update(
            format="f32"
        ),
        True,
    ),
    "target name missing (optional)": (_drop("target.name"), True),
    "target glsl_version missing": (_drop("target.glsl_version"), False),
    "input dtype missing (optional)": (_drop("inputs.x.dtype"), True),
    "input dtype bogus": (_set("inputs.x.dtype", "float8"), False),
    "num_classes null": (_set("inputs.y.num_classes", None), True),
    "num_classes 0": (_set("inputs.y.num_classes", 0), False),
    "num_classes 2.5": (_set("inputs.y.num_classes", 2.5), False),
    # wrong types
    "hyper lr a string": (_set("hyper.lr", "0.1"), False),
    "hyper lr true": (_set("hyper.lr", True), False),
    "hyper lr integral": (_set("hyper.lr", 1), True),
    "blend 1": (lambda m: _draw(m).update(blend=1), False),
    "kernel null": (lambda m: _draw(m).update(kernel=None), False),
    "viewport strings": (lambda m: _draw(m).update(viewport=["1", "1"]), False),
    "viewport of three": (lambda m: _draw(m).update(viewport=[*_draw(m)["viewport"], 1]), False),
    "samplers a list": (lambda m: _a_sampler_draw(m).update(samplers=[]), False),
    "targets a string": (lambda m: _draw(m).update(targets="tex0"), False),
    "targets empty": (lambda m: _draw(m).update(targets=[]), False),
    "updates a string": (_set("entries.train_step.updates", "0.bias"), False),
    "shape holds 1.5": (_set("inputs.x.shape.0", 1.5), False),
    "programs a list": (_set("programs", ["p0"]), False),
    "state ref names a list": (lambda m: _state_ref(m).update(state=[]), False),
    "uniform hyper a list": (
        lambda m: next(
            s for e in m["entries"].values() for d in e["draws"] for s in d["uniforms"].values()
        ).update(hyper=[]),
        False,
    ),
    "uniform names an unknown hyper-parameter": (
        lambda m: next(
            s for e in m["entries"].values() for d in e["draws"] for s in d["uniforms"].values()
        ).update(hyper="momentum"),
        False,
    ),
    "memory a string": (_set("memory", "big"), False),
    "passes holds a number": (_set("passes.fusion", 1), False),
    # names
    "texture name with a space": (
        lambda m: m["textures"].update({"tex 0": {"width": 1, "height": 1}}),
        False,
    ),
    "texture name with a newline": (lambda m: m["textures"].update({"tex0\n": m["textures"]["tex0"]}), False),
    "hyper name with a slash": (_set("hyper.a/b", 1.0), False),
    "program id with an accent": (
        lambda m: m["programs"].update({"pé": m["programs"][_first(m["programs"])]}),
        False,
    ),
    "uniform name upper case": (
        lambda m: m["programs"][_first(m["programs"])]["samplers"].append("S0"),
        False,
    ),
    "shader name with a path": (_set("vertex_shader", "../quad.vert"), False),
    "state name with spaces and a newline": (lambda m: _rename_state(m, "layer 0.weight\nfirst"), True),
    "state name with a tab": (lambda m: _rename_state(m, "w\t1"), True),
    "state name with a zero-width space": (lambda m: _rename_state(m, "w\u200b"), False),
    "state name with a NUL": (lambda m: _rename_state(m, "w\x00"), False),
    "state name of 500 characters": (lambda m: _rename_state(m, "é" * 500), True),
    "state name of 501 characters": (lambda m: _rename_state(m, "w" * 501), False),
    "empty state name": (lambda m: _rename_state(m, ""), False),
    # JavaScript's object internals as names (glcomp.js keeps names in Maps and null-prototype objects)
    "state named __proto__": (lambda m: _rename_state(m, "__proto__"), True),
    "state named constructor": (lambda m: _rename_state(m, "constructor"), True),
    "state named hasOwnProperty": (lambda m: _rename_state(m, "hasOwnProperty"), True),
    "files name outside": (lambda m: m["files"].update({"../x.frag": "0" * 64}), False),
    "files digest upper case": (lambda m: m["files"].update(_set_all(m["files"], "A" * 64)), False),
    # integers and their ranges
    "texture side 2^17": (_set("textures.*.width", 1 << 17), False),
    "texture side 0": (_set("textures.*.width", 0), False),
    "texture side beyond max_texture_size": (_set("target.max_texture_size", 1), False),
    "texture side a float": (_set("textures.*.width", 2.5), False),
    "max_texture_size 0": (_set("target.max_texture_size", 0), False),
    "max_texture_size 2^17": (_set("target.max_texture_size", 1 << 17), False),
    "layout pages 2^40 + 1": (_set("states.*.layout.pages", (1 << 40) + 1), False),
    "loop_iterations 2^40 + 1": (_set("programs.*.loop_iterations", (1 << 40) + 1), False),
    "loop_iterations 2^70": (_set("programs.*.loop_iterations", 1 << 70), False),
    "loop_iterations -1": (_set("programs.*.loop_iterations", -1), False),
    "outputs 17": (_set("programs.*.outputs", 17), False),
    "outputs 0": (_set("programs.*.outputs", 0), False),
    "page_offset -1": (lambda m: _draw(m).update(page_offset=-1), False),
    "page_offset 2^31 - 1": (lambda m: _draw(m).update(page_offset=(1 << 31) - 1), True),
    "page_offset 2^31 (not a GLSL int)": (lambda m: _draw(m).update(page_offset=1 << 31), False),
    "lr -1": (lambda m: m["hyper"].update(lr=-1), False),
    "lr 0": (lambda m: m["hyper"].update(lr=0), True),
    "counter -1": (_set("counters.n", -1), False),
    "counter 3": (_set("counters.n", 3), True),
    "counter named like a state": (lambda m: m["counters"].update({_first(m["states"]): 1}), False),
    "uniform int beyond 2^24": (
        lambda m: _int_uniform(m, MAX_OFFSET + 1),
        False,
    ),
    "uniform int 2^24": (lambda m: _int_uniform(m, MAX_OFFSET), True),
    "memory bytes 2^53 + 1": (_set("memory.texture_bytes", (1 << 53) + 1), False),
    # layouts
    "layout texels wrong": (lambda m: m["states"][_first(m["states"])]["layout"].update(texels=99), False),
    "layout rows wrong": (lambda m: m["inputs"]["x"]["layout"].update(rows=7), False),
    "layout width 3": (lambda m: m["states"][_first(m["states"])]["layout"].update(width=3), False),
    "layout pages 0": (lambda m: m["states"][_first(m["states"])]["layout"].update(pages=0), False),
    "layout shape of 33 dimensions": (_set("inputs.x.layout.shape", [1] * 33), False),
    "input shape differs from its layout": (_set("inputs.x.shape", [2, 4]), False),
    "one texture per page": (lambda m: m["states"][_first(m["states"])]["textures"][0].append("tex0"), False),
    "three state texture sets": (
        lambda m: m["states"][_first(m["states"])]["textures"].append(["tex0"]),
        False,
    ),
    # references
    "unknown sampler texture": (
        lambda m: _a_sampler_draw(m)["samplers"].update({_first(_a_sampler_draw(m)["samplers"]): "nope"}),
        False,
    ),
    "unknown render target": (lambda m: _draw(m)["targets"].__setitem__(0, "nope"), False),
    "unknown state texture": (
        lambda m: m["states"][_first(m["states"])]["textures"][0].__setitem__(0, "nope"),
        False,
    ),
    "unknown entry input texture": (_set("entries.predict.inputs.x.0", "nope"), False),
    "unknown entry input": (lambda m: m["entries"]["predict"]["inputs"].update(z=["tex0"]), False),
    "unknown output texture": (
        lambda m: m["entries"]["predict"]["outputs"]["output"]["textures"].__setitem__(0, "nope"),
        False,
    ),
    "unknown state": (lambda m: _state_ref(m).update(state="nope"), False),
    "state version old": (lambda m: _state_ref(m).update(version="old"), False),
    "state page beyond": (lambda m: _state_ref(m).update(page=5), False),
    "unknown program": (lambda m: _draw(m).update(program="p9999"), False),
    "unknown update": (lambda m: m["entries"]["train_step"]["updates"].append("nope"), False),
    "unknown entry point": (lambda m: m["entries"].update(evaluate=m["entries"]["predict"]), False),
    "missing fragment shader": (_set("programs.*.fragment", "nope.frag"), False),
    "missing vertex shader": (_set("vertex_shader", "other.vert"), False),
    "unused texture": (lambda m: m["textures"].update(spare={"width": 1, "height": 1}), False),
    "sampler names a state texture": (
        lambda m: _a_sampler_draw(m)["samplers"].update(
            {_first(_a_sampler_draw(m)["samplers"]): m["states"][_first(m["states"])]["textures"][0][0]}
        ),
        False,
    ),
    "samples what it renders to": (
        lambda m: _a_sampler_draw(m)["samplers"].update(
            {_first(_a_sampler_draw(m)["samplers"]): _a_sampler_draw(m)["targets"][0]}
        ),
        False,
    ),
    "sampler set differs from the program": (
        lambda m: _a_sampler_draw(m)["samplers"].pop(_first(_a_sampler_draw(m)["samplers"])),
        False,
    ),
    "duplicate uniform name": (
        lambda m: m["programs"][_first(m["programs"])]["uniforms"].append(
            m["programs"][_first(m["programs"])]["samplers"][0]
        ),
        False,
    ),
    "files lacks shaders.json": (lambda m: m["files"].pop("shaders.json"), False),
    "files hashes a shader file (format 3)": (
        lambda m: m["files"].update({f"shaders/{m['vertex_shader']}": "0" * 64}),
        False,
    ),
    "format 2 with a sha256 per shader": (_as_format_2, True),
    "format 2 lacks a shader's sha256": (
        lambda m: _as_format_2(m) or m["files"].pop(f"shaders/{m['vertex_shader']}"),
        False,
    ),
    "format 2 hashing shaders.json": (
        lambda m: _as_format_2(m) or m["files"].update({"shaders.json": "0" * 64}),
        False,
    ),
    # formats
    "texture format f8": (lambda m: m["textures"][_half_texture(m)].update(format="f8"), False),
    "texture format 16": (lambda m: m["textures"][_half_texture(m)].update(format=16), False),
    "state texture f16": (
        lambda m: m["textures"][m["states"][_first(m["states"])]["textures"][0][0]].update(format="f16"),
        False,
    ),
    "input texture f16": (
        lambda m: m["textures"][m["entries"]["predict"]["inputs"]["x"][0]].update(format="f16"),
        False,
    ),
    "one texture rgba8": (lambda m: m["textures"][_half_texture(m)].update(format="rgba8"), False),
    "state texture rgba8": (
        lambda m: m["textures"][m["states"][_first(m["states"])]["textures"][0][0]].update(format="rgba8"),
        False,
    ),
}


def _loop_budget_share(m: dict[str, Any], fragments_per_texel: int) -> None:
    """Give the first program the most loop iterations per fragment its largest draw may run
    within the default loop budget when a texel takes `fragments_per_texel` fragments."""
    pid = _first(m["programs"])
    texels = max(
        d["viewport"][0] * d["viewport"][1]
        for e in m["entries"].values()
        for d in e["draws"]
        if d["program"] == pid
    )
    m["programs"][pid]["loop_iterations"] = DEFAULT_LOOP_BUDGET // (texels * fragments_per_texel)


def _wide_texture(m: dict[str, Any]) -> None:
    """Widen a temporary texture (and what refers to it) to half of max_texture_size: within the
    limit as a record, twice past it as the 4x wider GL texture."""
    name = next(t for t in m["textures"] if t.startswith("tex"))
    m["textures"][name]["width"] = m["target"]["max_texture_size"] // 2


# The same corpus idea for storage="rgba8" (every texture RGBA8, 4x its record's width).
RGBA8_CORPUS: dict[str, tuple[Callable[[dict[str, Any]], None], bool]] = {
    "unchanged": (lambda m: None, True),
    "one texture f32": (lambda m: next(iter(m["textures"].values())).pop("format"), False),
    "state texture f16": (
        lambda m: m["textures"][m["states"][_first(m["states"])]["textures"][0][0]].update(format="f16"),
        False,
    ),
    "input texture f32": (
        lambda m: m["textures"][m["entries"]["predict"]["inputs"]["x"][0]].pop("format"),
        False,
    ),
    "blended draw": (lambda m: _draw(m).update(blend=True), False),
    "draw without blend (optional)": (lambda m: _draw(m).pop("blend"), True),
    "texture 4x wider than max_texture_size": (_wide_texture, False),
    "loop budget with 4 fragments a texel": (lambda m: _loop_budget_share(m, 4), True),
    "loop budget of 1 fragment a texel": (lambda m: _loop_budget_share(m, 1), False),
}
ALL_CORPUS = {**CORPUS, **{f"rgba8: {k}": v for k, v in RGBA8_CORPUS.items()}}


def _set_all(d: dict[str, Any], value: Any) -> dict[str, Any]:
    return {k: value for k in d}


def _int_uniform(m: dict[str, Any], value: int) -> None:
    """Give the first program with no uniforms an integer uniform holding `value`."""
    pid = next(p for p, prog in m["programs"].items() if not prog["uniforms"])
    m["programs"][pid]["uniforms"].append("u_fuzz")
    for e in m["entries"].values():
        for d in e["draws"]:
            if d["program"] == pid:
                d["uniforms"]["u_fuzz"] = {"int": value}


@pytest.fixture(scope="module")
def corpus(compiled: dict[str, tuple[dict[str, Any], set[str]]]) -> tuple[dict[str, str], list[str]]:
    """The tampered manifests as JSON text (name -> text), and the shader names present (the
    f16 and the rgba8 manifest have the same programs)."""
    out = {}
    for base, corpus, prefix in (("mlp adam f16", CORPUS, ""), ("mlp adam rgba8", RGBA8_CORPUS, "rgba8: ")):
        manifest, shaders = compiled[base]
        for name, (change, _) in corpus.items():
            m = copy.deepcopy(manifest)
            change(m)
            out[prefix + name] = json.dumps(m)
    assert set(compiled["mlp adam f16"][1]) == set(compiled["mlp adam rgba8"][1])
    return out, sorted(shaders)


def _python_outcome(text: str, shaders: list[str]) -> str | None:
    try:
        validate_manifest(parse_json(text.encode(), "manifest.json"), set(shaders))
    except GlcompError as err:
        return str(err)
    return None


def test_python_judges_the_corpus(corpus: tuple[dict[str, str], list[str]]) -> None:
    texts, shaders = corpus
    wrong = {}
    for name, text in texts.items():
        got = _python_outcome(text, shaders)
        if (got is None) != ALL_CORPUS[name][1]:
            wrong[name] = got or "accepted"
    assert not wrong, wrong
    assert len(set(texts.values())) == len(texts)  # every tampering changed the manifest


JS_VALIDATE_ALL = """
const out = {};
for (const [name, text] of Object.entries(arg.texts)) {
  try { g.validateManifest(JSON.parse(text), arg.shaders); out[name] = null; }
  catch (err) { if (err.name !== "GlcompError") throw err; out[name] = err.message; }
}
return out;
"""


def _comparable(message: str) -> str:
    """A message with quoted values normalised (Python's repr escapes characters that JS prints)
    and numbers beyond 2^53 (which JavaScript rounds)."""
    message = re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"", "'…'", message)
    return re.sub(r"\d[\d.e+]{15,}", "N", message)


@pytest.mark.browser
def test_browser_judges_the_corpus_like_python(page: Any, corpus: tuple[dict[str, str], list[str]]) -> None:
    texts, shaders = corpus
    browser_out = _js(page, JS_VALIDATE_ALL, {"texts": texts, "shaders": shaders})
    python = {name: _python_outcome(text, shaders) for name, text in texts.items()}
    differ = {
        n: (python[n], browser_out[n]) for n in texts if (python[n] is None) != (browser_out[n] is None)
    }
    assert not differ, differ
    messages = {
        n: (python[n], browser_out[n])
        for n in texts
        if python[n] is not None and _comparable(python[n]) != _comparable(browser_out[n])
    }
    assert not messages, messages
