"""Bad and hostile bundles: every fault ends in a GlcompError (never another exception), resources
are bounded before anything is allocated, shader loops are bounded, and the browser runtime's
loader (glcomp.js, in headless Chromium) accepts and rejects exactly the bundles Python does.

The fuzzers mutate a valid bundle structurally with Hypothesis: the manifest (types, sizes,
nesting, counts, names), the weights header (dtypes, shapes, offsets), program.json and the
shaders (loop forms). Their example counts follow the active Hypothesis profile.
"""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser.support import _js
from conftest import as_format_2, as_format_3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import glcomp
from glcomp import nn, optim
from glcomp.cli import main
from glcomp.codegen.schema import (
    DEFAULT_LOOP_BUDGET,
    parse_safetensors,
    read_bundle,
    sha256,
    shader_loop_bound,
)
from glcomp.errors import GlcompError

EXAMPLES = max(10, settings().max_examples // 2)  # follows the active profile
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# -- a small valid bundle, as files ------------------------------------------------------------------
@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    glcomp.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    prog = glcomp.compile(
        model, {"x": (2, 3)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1, momentum=0.9)
    )
    # Format 3's layout (every file under its plain name: what the fuzzers mutate by name); the
    # stored names of format 4 are tested in tests/format/test_save_atomic.py.
    return as_format_3(prog.save(tmp_path_factory.mktemp("good") / "b"))


def _files(d: Path) -> dict[str, bytes]:
    out = {p.name: p.read_bytes() for p in d.iterdir() if p.is_file()}
    if (d / "shaders").is_dir():  # format 1 or 2
        out |= {f"shaders/{p.name}": p.read_bytes() for p in (d / "shaders").iterdir()}
    return out


def _shaders(files: dict[str, bytes]) -> dict[str, str]:
    return json.loads(files["shaders.json"])


def _with_shader(files: dict[str, bytes], name: str, source: str) -> dict[str, bytes]:
    """`files` with shader `name`'s source in shaders.json replaced by `source`."""
    return files | {"shaders.json": json.dumps(_shaders(files) | {name: source}).encode()}


def _write(files: dict[str, bytes], d: Path, rehash: bool = True) -> Path:
    """Write `files` as a bundle in `d` (replaced); with `rehash`, the manifest's sha256 of each
    file is brought up to date so that a mutated file reaches its parser."""
    if rehash:
        try:
            m = json.loads(files["manifest.json"])
        except ValueError:
            m = None
        if isinstance(m, dict) and isinstance(m.get("files"), dict):
            m["files"] = {p: sha256(files[p]) if p in files else h for p, h in m["files"].items()}
            files = {**files, "manifest.json": json.dumps(m).encode()}
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    for path, data in files.items():
        (d / path).parent.mkdir(exist_ok=True)
        (d / path).write_bytes(data)
    return d


def _loads_or_glcomp_error(d: Path) -> str | None:
    """Load `d` as glcomp.load does: None when it loads, the GlcompError's message otherwise.
    Any other exception propagates (and fails the test)."""
    try:
        glcomp.load(d)
    except GlcompError as err:
        return str(err)
    return None


# -- structural mutations ----------------------------------------------------------------------------
NAME_CHARS = "abcxyz019_.#-\n \t/é"
LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, 1, 2, 3, 4, 8, -1, 2**16, 2**17, 2**40, 2**40 + 1, 2**53 + 1, 2.0, 0.5, 1e300, -0.0]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(NAME_CHARS, max_size=10),
    st.sampled_from(["p0", "tex0", "tex0\n", "cur", "next", "300 es", "100", "lr", "x", "F16", "quad.vert"]),
)
VALUES = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(NAME_CHARS, max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, (*prefix, i))
    return out


def _dumps(doc: Any) -> bytes:
    """JSON of `doc`, with each "@nest:N" string replaced by N levels of nested arrays and objects
    (deeper than Python's json module could write)."""
    text = json.dumps(doc)
    for n in (3, 40, 70, 2000):
        text = text.replace(f'"@nest:{n}"', '[{"a":' * (n // 2) + "0" + "}]" * (n // 2))
    return text.encode()


@st.composite
def mutated_json(draw: Any, doc: Any, max_mutations: int = 3) -> Any:
    """`doc` with 1..max_mutations structural changes at random places: a value replaced by any
    JSON value, a key or element removed, added, duplicated or renamed, a number scaled, a value
    nested deeply, or an object's entries multiplied."""
    doc = copy.deepcopy(doc)
    for _ in range(draw(st.integers(1, max_mutations))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        op = draw(
            st.sampled_from(
                ["replace", "delete", "add", "dup", "rename", "scale", "nest", "multiply", "type"]
            )
        )
        if not path:
            if op == "replace":
                doc = draw(VALUES)
            continue
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        value = parent[key]
        if op == "replace":
            parent[key] = draw(VALUES)
        elif op == "delete":
            del parent[key]
        elif op == "add" and isinstance(value, dict):
            value[draw(st.text(NAME_CHARS, min_size=1, max_size=8))] = draw(VALUES)
        elif op == "add" and isinstance(value, list):
            value.append(draw(VALUES))
        elif op == "dup" and isinstance(parent, dict):
            parent[f"{key}{draw(st.sampled_from(['_2', chr(10), ' ', '']))}"] = copy.deepcopy(value)
        elif op == "dup" and isinstance(parent, list):
            parent.append(copy.deepcopy(value))
        elif op == "rename" and isinstance(parent, dict):
            parent[f"{key}{draw(st.sampled_from([chr(10), ' ', '#', 'é', '/x']))}"] = parent.pop(key)
        elif op == "scale" and isinstance(value, int | float) and not isinstance(value, bool):
            parent[key] = value * draw(st.sampled_from([0, -1, 2, 1024, 2**20, 2**40])) + draw(
                st.sampled_from([0, 1, 0.5])
            )
        elif op == "nest":
            parent[key] = f"@nest:{draw(st.sampled_from([3, 40, 70, 2000]))}"
        elif op == "multiply" and isinstance(value, dict) and value:
            first = next(iter(value))
            for i in range(draw(st.sampled_from([2, 50, 400]))):
                value[f"{first}_m{i}"] = copy.deepcopy(value[first])
        elif op == "type":
            parent[key] = draw(st.sampled_from([str(value), [value], {"v": value}, None, True]))
    return doc


def _manifest_cases(good: Path) -> st.SearchStrategy[bytes]:
    m = json.loads((good / "manifest.json").read_text())
    return mutated_json(m).map(_dumps)


LOOP_SNIPPETS = [
    "for (int i = 0; i < 4; i++) { acc += 1.0; }",
    "for (int i = 0; i < 100000; i++) { for (int j = 0; j < 100000; j++) { acc += 1.0; } }",
    "while (true) { acc += 1.0; }",
    "do { acc += 1.0; } while (acc < 1e30);",
    "for (int i = 0; i <= 4; i++) { acc += 1.0; }",
    "for (int i = 0; i < 4; i++) { i = 0; acc += 1.0; }",
    "for (int i = 0; i < 4; i++) { i--; }",
    "for (int i = 0; i < 4; i += 1) { acc += 1.0; }",
    "for (int i = 0; i < 4; i++) acc += 1.0;",
    "for (;;) { }",
    "for (int i = 0; i < u_page_offset; i++) { }",
    "main();",
    "#define LOOP for(;;)\n",
    "#line 3\n",
    "for (int i = 0; i < 4; i++) { // \\\n}",
    "/* unterminated",
    "float é = 1.0;",
    "}",
    "{",
]


@st.composite
def shader_cases(draw: Any, good: Path) -> dict[str, bytes]:
    files = _files(good)
    m = json.loads(files["manifest.json"])
    prog = draw(st.sampled_from(sorted(m["programs"])))
    name = m["programs"][prog]["fragment"]
    text = _shaders(files)[name]
    cut = text.index("void main()")
    body = text.index("{", cut) + 1
    snippet = draw(st.sampled_from(LOOP_SNIPPETS))
    where = draw(st.sampled_from(["main", "top", "random"]))
    if where == "main":
        text = text[:body] + "\nfloat acc = 0.0;\n" + snippet + "\n" + text[body:]
    elif where == "top":
        helper = "float glc_fuzz(float acc) {\n" + snippet + "\nreturn acc;\n}\n"
        text = text[:cut] + helper + text[cut:]
    else:
        at = draw(st.integers(0, len(text)))
        text = text[:at] + snippet + text[at:]
    return _with_shader(files, name, text)


def _shaders_json_cases(good: Path) -> st.SearchStrategy[bytes]:
    return mutated_json(_shaders(_files(good))).map(_dumps)


@st.composite
def weights_cases(draw: Any, good: Path) -> dict[str, bytes]:
    files = _files(good)
    data = files["weights.safetensors"]
    n = int.from_bytes(data[:8], "little")
    header, body = json.loads(data[8 : 8 + n]), data[8 + n :]
    how = draw(st.sampled_from(["header", "dtype", "truncate", "length", "convert"]))
    if how == "header":
        header = draw(mutated_json(header, 2))
    elif how == "dtype":
        name = draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        header[name]["dtype"] = draw(
            st.sampled_from(["F16", "BF16", "BOOL", "U8", "I8", "F64", "I32", "x", 7])
        )
    elif how == "truncate":
        files["weights.safetensors"] = data[: draw(st.integers(0, len(data) - 1))]
        return files
    elif how == "length":
        fake = draw(st.sampled_from([0, 1, 7, n + 1, len(data), 2**32, 2**63, 2**64 - 1]))
        files["weights.safetensors"] = struct.pack("<Q", fake) + data[8:]
        return files
    else:  # every tensor stored in another dtype, consistently (float16, uint8, bool, float64)
        from safetensors.numpy import save

        dtype = draw(st.sampled_from([np.float16, np.uint8, np.bool_, np.float64, np.int32]))
        arrays = parse_safetensors(data)
        files["weights.safetensors"] = save({k: v.astype(dtype) for k, v in arrays.items()})
        return files
    raw = _dumps(header)
    files["weights.safetensors"] = struct.pack("<Q", len(raw)) + raw + body
    return files


# -- Python: every mutation ends in GlcompError -------------------------------------------------------
def test_fuzz_manifest(good: Path, tmp_path: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: Any) -> None:
        files = _files(good) | {"manifest.json": data.draw(_manifest_cases(good))}
        _loads_or_glcomp_error(_write(files, tmp_path / "b", rehash=False))

    run()


def test_fuzz_program_json(good: Path, tmp_path: Path) -> None:
    program = json.loads((good / "program.json").read_text())

    @FUZZ
    @given(doc=mutated_json(program))
    def run(doc: Any) -> None:
        files = _files(good) | {"program.json": _dumps(doc)}
        _loads_or_glcomp_error(_write(files, tmp_path / "b"))

    run()


def test_fuzz_weights(good: Path, tmp_path: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: Any) -> None:
        files = data.draw(weights_cases(good))
        d = _write(files, tmp_path / "b", rehash=data.draw(st.booleans()))
        if _loads_or_glcomp_error(d) is None:  # then states are floats and counters integers
            m = json.loads(files["manifest.json"])
            for name, value in read_bundle(d).weights.items():
                assert value.dtype.kind == ("i" if name in m["counters"] else "f") and value.itemsize >= 4

    run()


def test_fuzz_shaders(good: Path, tmp_path: Path) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: Any) -> None:
        files = data.draw(shader_cases(good))
        d = _write(files, tmp_path / "b")
        if _loads_or_glcomp_error(d) is None:  # then its loops are within what the manifest declares
            m = json.loads(files["manifest.json"])
            for p in m["programs"].values():
                bound = shader_loop_bound(_shaders(files)[p["fragment"]], p["fragment"])
                assert bound <= p["loop_iterations"]

    run()


def test_fuzz_shaders_json(good: Path, tmp_path: Path) -> None:
    @FUZZ
    @given(doc=_shaders_json_cases(good), rehash=st.booleans())
    def run(doc: bytes, rehash: bool) -> None:
        files = _files(good) | {"shaders.json": doc}
        if _loads_or_glcomp_error(_write(files, tmp_path / "b", rehash=rehash)) is None:
            assert _shaders(files) == _shaders(_files(good))  # only a change that changes nothing loads

    run()


# -- findings, one by one ----------------------------------------------------------------------------
def _edit_manifest(good: Path, d: Path, edit: Any) -> Path:
    files = _files(good)
    m = json.loads(files["manifest.json"])
    edit(m)
    return _write(files | {"manifest.json": _dumps(m)}, d, rehash=False)


def _first(d: dict[str, Any]) -> str:
    return next(iter(d))


def _draw(m: dict[str, Any]) -> dict[str, Any]:
    return m["entries"]["train_step"]["draws"][0]


MALFORMED = {  # each raised TypeError, AttributeError, KeyError or RecursionError, or loaded, before
    "state ref names a list": lambda m: _draw(m)["samplers"].update(
        {_first(_draw(m)["samplers"]): {"state": [], "version": "cur", "page": 0}}
    ),
    "programs is a list": lambda m: m.update(programs=["p0"]),
    "deeply nested memory": lambda m: m.update(memory="@nest:2000"),
    "update names a list": lambda m: m["entries"]["train_step"].update(updates=[[]]),
    "state texture is a list": lambda m: m["states"][_first(m["states"])].update(textures=[[["a"]], [["b"]]]),
    "uniform hyper is a list": lambda m: [
        m["programs"][d["program"]].update(uniforms=["u_h"]) or d.update(uniforms={"u_h": {"hyper": []}})
        for e in m["entries"].values()
        for d in e["draws"]
    ],
    "program without samplers": lambda m: m["programs"][_draw(m)["program"]].pop("samplers"),
    "version true": lambda m: m.update(version=True),
    "hyper true": lambda m: m["hyper"].update(lr=True),
    "blend 1": lambda m: _draw(m).update(blend=1),
    "kernel null": lambda m: _draw(m).update(kernel=None),
    "texture name with a newline": lambda m: m["textures"].update({"tex0\n": m["textures"]["tex0"]}),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_manifest_is_a_glcomp_error(good: Path, tmp_path: Path, case: str) -> None:
    d = _edit_manifest(good, tmp_path / "b", MALFORMED[case])
    with pytest.raises(GlcompError, match=r"bundle manifest\.json"):
        glcomp.load(d)


@pytest.mark.parametrize("command", ["run", "serve"])
def test_cli_reports_a_malformed_bundle_in_one_line(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    d = _edit_manifest(good, tmp_path / "b", MALFORMED["state ref names a list"])
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    args = [str(d), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npy")]
    assert main([command, *(args if command == "run" else [str(d), "--port", "0"])]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: bundle manifest.json"), err


@pytest.mark.parametrize("dtype", [np.float16, np.bool_, np.uint8])
def test_weights_of_other_dtypes_are_refused_naming_the_tensor(
    good: Path, tmp_path: Path, dtype: Any
) -> None:
    from safetensors.numpy import save

    files = _files(good)
    arrays = parse_safetensors(files["weights.safetensors"])
    name = next(k for k, v in arrays.items() if v.dtype == np.float32)
    arrays[name] = arrays[name].astype(dtype)
    d = _write(files | {"weights.safetensors": save(arrays)}, tmp_path / "b")
    with pytest.raises(GlcompError, match=rf"weights\.safetensors.*{name!r}"):
        glcomp.load(d)


def test_texture_budget_and_unused_textures(good: Path, tmp_path: Path) -> None:
    import time

    def huge(m: dict[str, Any]) -> None:
        m["target"]["max_texture_size"] = 8192
        m["textures"] |= {f"big{i}": {"width": 8192, "height": 8192} for i in range(8)}

    start = time.perf_counter()
    with pytest.raises(GlcompError, match="more than the budget of 2147483648 bytes"):
        glcomp.load(_edit_manifest(good, tmp_path / "huge", huge))
    assert time.perf_counter() - start < 2  # refused before anything is allocated

    def unused(m: dict[str, Any]) -> None:
        m["textures"]["spare"] = {"width": 2, "height": 2}

    with pytest.raises(GlcompError, match=r"textures \[\"spare\"\] are used by no state"):
        glcomp.load(_edit_manifest(good, tmp_path / "unused", unused))
    total = sum(
        16 * t["width"] * t["height"]
        for t in json.loads((good / "manifest.json").read_text())["textures"].values()
    )
    read_bundle(good, texture_budget_bytes=total)
    with pytest.raises(
        GlcompError, match=f"textures take {total} bytes, more than the budget of {total - 1}"
    ):
        read_bundle(good, texture_budget_bytes=total - 1)


def test_gl_runtime_checks_its_texture_budget(good: Path, gl_ctx: Any) -> None:
    from glcomp.runtime.gl import GLRuntime

    bundle = read_bundle(good)
    with pytest.raises(GlcompError, match="more than the budget of 64 bytes"):
        GLRuntime(bundle, ctx=gl_ctx, texture_budget_bytes=64)
    GLRuntime(bundle, ctx=gl_ctx).release()


# Shaders and the loop bound both loaders compute for them (None: refused).
def _inlining_bomb(depth: int) -> str:
    """e_k calls e_(k-1) twice, for k up to `depth`: no loop, 2^depth copies of e_0 inlined."""
    funcs = ["float e_0(float x) { return x + 1.0; }"]
    funcs += [f"float e_{k}(float x) {{ return e_{k - 1}(e_{k - 1}(x)); }}" for k in range(1, depth + 1)]
    return "\n".join([*funcs, f"void main() {{ float y = e_{depth}(0.5); }}"])


SHADERS = {
    "no loop": ("void main() { gl_FragColor = vec4(0.0); }", 0),
    "one loop": ("void main() { for (int i = 0; i < 7; i++) { } }", 7),
    "nested": ("void main() { for (int i = 0; i < 7; i++) { for (int j = 0; j < 3; j++) { } } }", 7 + 21),
    "sequence": ("void main() { for (int i = 0; i < 7; i++) { } for (int j = 0; j < 5; j++) { } }", 12),
    "calls": (
        "float f(int k) { for (int i = 0; i < 10; i++) { } return 1.0; }\n"
        "float g() { return f(1) + f(2); }\n"
        "void main() { for (int i = 0; i < 3; i++) { g(); } f(0); }",
        3 + 3 * 20 + 10,
    ),
    "comment hides nothing": ("// while (true)\n/* do { } */ void main() { }", 0),
    "while": ("void main() { while (true) { } }", None),
    "do": ("void main() { do { } while (true); }", None),
    "other bound": ("void main() { for (int i = 0; i <= 7; i++) { } }", None),
    "uniform bound": ("uniform int n;\nvoid main() { for (int i = 0; i < n; i++) { } }", None),
    "step": ("void main() { for (int i = 0; i < 7; i += 1) { } }", None),
    "no braces": ("void main() { for (int i = 0; i < 7; i++) i; }", None),
    "writes its variable": ("void main() { for (int i = 0; i < 7; i++) { i = 0; } }", None),
    "decrements its variable": ("void main() { for (int i = 0; i < 7; i++) { --i; } }", None),
    "recursion": ("float f() { return f(); }\nvoid main() { f(); }", None),
    "forward call": (
        "float g();\nfloat f() { return g(); }\nfloat g() { return 1.0; }\nvoid main() { }",
        None,
    ),
    "define": ("#define W while\nvoid main() { }", None),
    "continuation": ("void main() { // x \\\n}", None),
    "unterminated comment": ("void main() { } /*", None),
    "non-ascii": ("void main() { float é = 1.0; }", None),
    "unbalanced": ("void main() { }}", None),
    "loop outside a function": ("for (int i = 0; i < 7; i++) { }\nvoid main() { }", None),
    # A call or parentheses in a parameter's array size must not take the function's name.
    "call in a parameter": (
        "int k(int a[abs(2)]) { for (int i = 0; i < 9; i++) { } return 0; }\n"
        "void main() { int x[2]; k(x); k(x); }",
        None,
    ),
    "parentheses in a parameter": (
        "int k(int a[(2)]) { for (int i = 0; i < 9; i++) { } return 0; }\nvoid main() { int x[2]; k(x); }",
        None,
    ),
    "array parameter": (
        "int k(int a[2]) { for (int i = 0; i < 9; i++) { } return 0; }\n"
        "void main() { int x[2]; k(x); k(x); }",
        18,
    ),
    # Arrays: the compiler declares none; literals in brackets add up to at most 4096.
    "huge array": ("void main() { float big[2147483647]; big[0] = 1.0; }", None),
    "arrays beyond the total": ("void main() { float a[4000]; float b[97]; }", None),
    "array sized by a constant": ("const int N = 9;\nvoid main() { float a[N]; }", None),
    "array indexed by a variable": ("void main() { float a[2]; int j = 1; a[j] = 1.0; }", None),
    "gl_FragData": ("void main() { gl_FragData[0] = vec4(0.0); gl_FragData[3] = vec4(1.0); }", 0),
    # Calls multiply a function's inlined size: no loop, yet 2^20 copies of e0 (tens of GB to compile).
    "inlining bomb": (_inlining_bomb(20), None),
    "inlining within the budget": (_inlining_bomb(12), 0),
    "inlining bomb in a loop": (
        "float f(float x) { return x; }\nvoid main() { float y = 0.0; "
        + "for (int i = 0; i < 2; i++) { "
        + "y = f(y); " * 70000
        + "} }",
        None,
    ),
    # Bounds were kept by name: a second overload of heavy, without loops, replaced the first's
    # bound. A call counts the costliest overload of its name.
    "overloaded": (
        "float heavy(float x) { for (int i = 0; i < 65535; i++) { for (int j = 0; j < 65535; j++) { } } "
        "return x; }\nfloat heavy(int x) { return 1.0; }\nvoid main() { heavy(1.0); }",
        65535 + 65535 * 65535,
    ),
    "overload calling the other": (
        "vec4 m(vec4 a) { for (int i = 0; i < 9; i++) { } return a; }\n"
        "float m(float a) { return m(vec4(a)).x; }\nvoid main() { for (int j = 0; j < 2; j++) { m(1.0); } }",
        2 + 2 * 9,
    ),
    "overload defined after a call": (
        "float heavy(float x) { return x; }\nfloat heavy(int x);\nvoid main() { heavy(1); }\n"
        "float heavy(int x) { for (int i = 0; i < 65535; i++) { } return 1.0; }",
        None,
    ),
    "defined after a call in a function": (
        "float g(float x) { return x; }\nfloat f() { return g(1.0); }\nvec2 g(vec2 x) { return x; }\n"
        "void main() { f(); }",
        None,
    ),
    "declared, then defined": ("void f();\nvoid f() { }\nvoid main() { f(); }", 0),
    "loop variable to inout": (
        "void reset(inout int v) { v = 0; }\nvoid main() { for (int i = 0; i < 7; i++) { reset(i); } }",
        None,
    ),
    "loop variable to out, in parentheses": (
        "void set(float a, out int v) { v = 0; }\n"
        "void main() { for (int i = 0; i < 7; i++) { set(1.0, (i)); } }",
        None,
    ),
    "loop variable by value beside an out": (
        "void set(int k, out int v) { v = k; }\n"
        "void main() { int x; for (int i = 0; i < 7; i++) { set(int(i), x); } }",
        7,
    ),
}


def _py_bound(source: str) -> int | None:
    try:
        return shader_loop_bound(source, "shaders/t.frag")
    except GlcompError:
        return None


def test_shader_loop_bounds() -> None:
    got = {name: _py_bound(src) for name, (src, _) in SHADERS.items()}
    assert got == {name: want for name, (_, want) in SHADERS.items()}


def test_compiled_shaders_declare_their_loop_bounds(good: Path) -> None:
    m = json.loads((good / "manifest.json").read_text())
    bounds = [_py_bound(_shaders(_files(good))[p["fragment"]]) for p in m["programs"].values()]
    assert bounds == [p["loop_iterations"] for p in m["programs"].values()]
    assert max(bounds) > 0


def test_loop_budgets(good: Path, tmp_path: Path) -> None:
    m = json.loads((good / "manifest.json").read_text())
    pid, p = max(m["programs"].items(), key=lambda kv: kv[1]["loop_iterations"])
    files = _files(good)
    infinite = _shaders(files)[p["fragment"]].replace("void main() {", "void main() {\nwhile (true) { }")
    where = re.escape(f"shaders.json[{p['fragment']}]")
    with pytest.raises(GlcompError, match=rf"bundle {where}: line \d+: while loops are not allowed"):
        glcomp.load(_write(_with_shader(files, p["fragment"], infinite), tmp_path / "inf"))

    def understate(m: dict[str, Any]) -> None:
        m["programs"][pid]["loop_iterations"] -= 1

    with pytest.raises(GlcompError, match=f"more than the {p['loop_iterations'] - 1} manifest.json declares"):
        glcomp.load(_edit_manifest(good, tmp_path / "under", understate))

    def overstate(m: dict[str, Any]) -> None:
        m["programs"][pid]["loop_iterations"] = DEFAULT_LOOP_BUDGET

    with pytest.raises(GlcompError, match=r"loop iterations .* more than the budget of 4294967296 per draw"):
        glcomp.load(_edit_manifest(good, tmp_path / "over", overstate))
    draws = [d for e in m["entries"].values() for d in e["draws"]]
    work = max(m["programs"][d["program"]]["loop_iterations"] * math.prod(d["viewport"]) for d in draws)
    read_bundle(good, loop_budget=work)
    with pytest.raises(GlcompError, match=f"more than the budget of {work - 1} per draw"):
        read_bundle(good, loop_budget=work - 1)


# -- the browser runtime accepts and rejects exactly the same bundles ---------------------------------
JS_LOAD_ALL = """
const dec = (b64) => Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
const base = Object.fromEntries(Object.entries(arg.base).map(([k, v]) => [k, dec(v)]));
const out = [];
for (const changed of arg.cases) {  // each case: the files that differ from the valid bundle's
  const given = { ...base, ...Object.fromEntries(Object.entries(changed).map(([k, v]) => [k, dec(v)])) };
  try { await g.loadBundle(given); out.push(null); }
  catch (err) { out.push(`${err.name}: ${err.message}`); }
}
return out;
"""


def _py_outcome(files: dict[str, bytes], d: Path) -> str | None:
    try:
        read_bundle(_write(files, d, rehash=False))
    except GlcompError as err:
        return str(err)
    return None


def test_browser_loader_agrees_with_python(page: Any, good: Path, tmp_path: Path) -> None:
    corpus: list[dict[str, bytes]] = [_files(good)]

    @settings(FUZZ, max_examples=EXAMPLES * 2)
    @given(data=st.data())
    def collect(data: Any) -> None:
        kind = data.draw(st.sampled_from(["manifest", "manifest", "weights", "shader", "shaders.json"]))
        if kind == "manifest":
            files = _files(good) | {"manifest.json": data.draw(_manifest_cases(good))}
        elif kind == "shaders.json":
            files = _files(good) | {"shaders.json": data.draw(_shaders_json_cases(good))}
            files = _write(files, tmp_path / "j") and _files(tmp_path / "j")
        elif kind == "weights":
            files = _write(data.draw(weights_cases(good)), tmp_path / "w") and _files(tmp_path / "w")
        else:
            files = _write(data.draw(shader_cases(good)), tmp_path / "s") and _files(tmp_path / "s")
        corpus.append(files)

    collect()
    python = [_py_outcome(files, tmp_path / "b") for files in corpus]
    base = corpus[0]
    b64 = lambda data: base64.b64encode(data).decode()
    cases = [{k: b64(v) for k, v in files.items() if base.get(k) != v} for files in corpus]
    assert all(set(files) == set(base) for files in corpus)  # no case drops a file
    browser_out = _js(page, JS_LOAD_ALL, {"base": {k: b64(v) for k, v in base.items()}, "cases": cases})
    assert python[0] is None and browser_out[0] is None  # the valid bundle loads in both
    differ = [
        (i, py, js)
        for i, (py, js) in enumerate(zip(python, browser_out, strict=True))
        if (py is None) != (js is None)
    ]
    assert not differ, differ[:5]
    assert all(js is None or js.startswith("GlcompError: ") for js in browser_out), browser_out
    assert sum(py is None for py in python) < len(python) - 1  # the corpus holds rejected bundles


JS_LOAD_FILES = """
const dec = (b64) => Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
const out = {};
for (const [name, files] of Object.entries(arg)) {
  const given = Object.fromEntries(Object.entries(files).map(([k, v]) => [k, dec(v)]));
  try { await g.loadBundle(given); out[name] = null; }
  catch (err) { out[name] = `${err.name}: ${err.message}`; }
}
return out;
"""


def _shaders_json_faults(good: Path, tmp_path: Path) -> dict[str, dict[str, bytes]]:
    """Bundles whose shaders.json is at fault one way each (the manifest's sha256 of it brought
    up to date where the content is at fault), and format 2 bundles, good and tampered."""
    files = _files(good)
    shaders = _shaders(files)
    frag = json.loads(files["manifest.json"])["programs"]["p0"]["fragment"]

    def rehashed(doc: bytes) -> dict[str, bytes]:
        return _files(_write(files | {"shaders.json": doc}, tmp_path / "rehashed"))

    def packed(doc: Any) -> dict[str, bytes]:
        return rehashed(json.dumps(doc).encode())

    legacy = _files(as_format_2(_write(files, tmp_path / "legacy")))
    changed = legacy[f"shaders/{frag}"] + b"// changed\n"
    return {
        "missing": {k: v for k, v in files.items() if k != "shaders.json"},
        "not JSON": rehashed(b'{"p0.frag": '),
        "not an object": packed(sorted(shaders.values())),
        "a number": packed(shaders | {frag: 1}),
        "null": packed(shaders | {frag: None}),
        "a list": packed(shaders | {frag: [shaders[frag]]}),
        "lone surrogate": packed(shaders | {frag: shaders[frag] + "// \ud800\n"}),
        "unknown name": packed(shaders | {"p99999.frag": shaders[frag]}),
        "unsafe name": packed(shaders | {"../x.frag": shaders[frag]}),
        "names sorted by code point": packed(shaders | {"\U0001f600.frag": "", "\uff5e.frag": ""}),
        "missing fragment": packed({k: v for k, v in shaders.items() if k != frag}),
        "missing vertex shader": packed({k: v for k, v in shaders.items() if k != "quad.vert"}),
        "unbounded loop": packed(
            shaders | {frag: shaders[frag].replace("void main() {", "void main() { while (true) { }")}
        ),
        "sha256": files | {"shaders.json": json.dumps(shaders, indent=2).encode()},
        "format 2": legacy,
        "format 2, a shader changed": legacy | {f"shaders/{frag}": changed},
    }


def test_browser_refuses_shaders_json_faults_like_python(page: Any, good: Path, tmp_path: Path) -> None:
    cases = _shaders_json_faults(good, tmp_path)
    python = {name: _py_outcome(files, tmp_path / "b") for name, files in cases.items()}
    b64 = lambda data: base64.b64encode(data).decode()
    js = _js(page, JS_LOAD_FILES, {n: {k: b64(v) for k, v in f.items()} for n, f in cases.items()})
    frag = json.loads(cases["format 2"]["manifest.json"])["programs"]["p0"]["fragment"]
    assert python["format 2"] is None and js["format 2"] is None  # the old layout still loads
    want = {
        "missing": "shaders.json is missing",
        "not JSON": "bundle shaders.json: not valid JSON",
        "not an object": "bundle shaders.json: must be an object of shader file name -> GLSL source",
        "a number": f"bundle shaders.json[{frag}]: must be a string (the shader's GLSL source)",
        "null": f"bundle shaders.json[{frag}]: must be a string",
        "a list": f"bundle shaders.json[{frag}]: must be a string",
        "lone surrogate": f"bundle shaders.json[{frag}]: not Unicode text (a lone surrogate)",
        "unknown name": "bundle shaders.json: holds shader 'p99999.frag', which manifest.json does not name",
        "unsafe name": "bundle shaders.json: holds shader '../x.frag', which manifest.json does not name",
        "names sorted by code point": "bundle shaders.json: holds shader '\uff5e.frag', which manifest",
        "missing fragment": f"bundle shaders.json: shader '{frag}' is missing (manifest.json names it)",
        "missing vertex shader": "bundle shaders.json: shader 'quad.vert' is missing (manifest.json names",
        "unbounded loop": f"bundle shaders.json[{frag}]: line ",
        "sha256": "bundle shaders.json: its sha256 does not match the one manifest.json records",
        "format 2, a shader changed": f"bundle shaders/{frag}: its sha256 does not match",
    }
    for name, expect in want.items():
        assert python[name] is not None and expect in python[name], (name, python[name])
        # Python names the directory of a missing file, and JSON parsers word their errors apart.
        loose = name in ("missing", "not JSON")
        same = js[name] == f"GlcompError: {python[name]}"
        assert same or (loose and expect in js[name]), (name, python[name], js[name])


JS_BOUNDS = """
const out = {};
for (const [name, src] of Object.entries(arg)) {
  try { out[name] = g.shaderLoopBound(src, "shaders/t.frag"); }
  catch (err) { if (err.name !== "GlcompError") throw err; out[name] = null; }
}
return out;
"""


def test_browser_shader_loop_bounds(page: Any, good: Path) -> None:
    sources = {name: src for name, (src, _) in SHADERS.items()}
    sources |= {f"compiled {name}": src for name, src in _shaders(_files(good)).items()}
    assert _js(page, JS_BOUNDS, sources) == {name: _py_bound(src) for name, src in sources.items()}


def test_browser_refuses_dtypes_budgets_and_other_origins(page: Any, site: Any, good: Path) -> None:
    from safetensors.numpy import save

    files = _files(good)
    arrays = parse_safetensors(files["weights.safetensors"])
    name = next(k for k, v in arrays.items() if v.dtype == np.float32)
    half = _files(good) | {"weights.safetensors": save(arrays | {name: arrays[name].astype(np.float16)})}
    bundle = _write(half, site.root / "half")
    shutil.copytree(good, site.root / "fuzz_good", dirs_exist_ok=True)
    other = site.url.replace("127.0.0.1", "localhost")
    got = _js(
        page,
        """
      const msg = async (p) => { try { (await g.Runtime.load(...p)).dispose(); return null; }
        catch (err) { return `${err.name}: ${err.message}`; } };
      return {
        half: await msg([arg.half]),
        budget: await msg(["/bundle/fuzz_good/", { textureBudgetBytes: 64, quiet: true }]),
        loops: await msg(["/bundle/fuzz_good/", { loopBudget: 1, quiet: true }]),
        origin: await msg([arg.other]),
        allowed: await msg([arg.other, { allowOrigins: [new URL(arg.other).origin] }]),
        good: await msg(["/bundle/fuzz_good/", { quiet: true }]),
      };
    """,
        {"half": f"/bundle/{bundle.name}/", "other": other + "bundle/fuzz_good/"},
    )
    assert got["good"] is None
    assert f"weights.safetensors: unreadable (tensor '{name}' has unsupported dtype 'F16'" in got["half"]
    assert "more than the budget of 64 bytes" in got["budget"], got["budget"]
    assert "more than the budget of 1 per draw" in got["loops"], got["loops"]
    assert "refusing to load a bundle from http://localhost" in got["origin"], got["origin"]
    assert got["allowed"] is None or "refusing to load" not in got["allowed"], got["allowed"]


def _many_textures(m: dict[str, Any]) -> None:
    m["textures"] |= {f"t{i}": {"width": 1, "height": 1} for i in range(100_000)}


def test_browser_refuses_many_textures_and_reports_gpu_memory(
    page: Any,
    site: Any,
    good: Path,
    tmp_path: Path,
) -> None:
    many = _edit_manifest(good, site.root / "many", _many_textures)
    with pytest.raises(GlcompError, match="are used by no state"):
        glcomp.load(many)
    shutil.copytree(good, site.root / "fuzz_good2", dirs_exist_ok=True)
    got = _js(
        page,
        """
      const msg = async (url) => {
        try { (await g.Runtime.load(url, { quiet: true })).dispose(); return null; }
        catch (err) { return `${err.name}: ${err.message}`; } };
      const many = await msg("/bundle/many/");
      // The driver runs out of memory on the third texture (the error stays set until getError
      // reads it, as GL errors do): reported as such, nothing left behind.
      const proto = WebGL2RenderingContext.prototype;
      const store = proto.texStorage2D;
      const getError = proto.getError;
      let allocated = 0;
      let outOfMemory = false;
      proto.texStorage2D = function (...a) {
        allocated += 1;
        outOfMemory ||= allocated === 3;
        return store.apply(this, a);
      };
      proto.getError = function () {
        if (outOfMemory) { outOfMemory = false; return this.OUT_OF_MEMORY; }
        return getError.call(this);
      };
      const oom = await msg("/bundle/fuzz_good2/");
      proto.getError = getError;
      proto.texStorage2D = store;
      return { many, oom, live: { ...window.__glLive } };
    """,
    )
    assert got["many"].startswith("GlcompError: ") and "are used by no state" in got["many"], got["many"]
    assert (
        got["oom"].startswith("GlcompError: bundle") is False
        and "could not be allocated: out of GPU memory" in got["oom"]
    )
    assert not any(got["live"].values()), got["live"]


def test_cli_run_needs_a_predict_entry(
    good: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = _files(good)
    m, program = json.loads(files["manifest.json"]), json.loads(files["program.json"])
    del m["entries"]["predict"], program["graphs"]["predict"]
    d = _write(files | {"manifest.json": _dumps(m), "program.json": _dumps(program)}, tmp_path / "b")
    glcomp.load(d)  # a valid bundle that can train but not predict
    np.save(tmp_path / "x.npy", np.zeros((2, 3), np.float32))
    assert main(["run", str(d), "--input", f"x={tmp_path / 'x.npy'}", "-o", str(tmp_path / "y.npy")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {d}: the bundle has no predict entry point"
