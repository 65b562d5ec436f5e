"""Hostile bundles that once hung the GPU, ate the machine or gave silently wrong numbers: each is
refused with a GlcompError naming the file (or loads and computes the same numbers) in Python and
in glcomp.js (headless Chromium), which must judge every one alike."""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser.support import _js
from conftest import as_format_3

import glcomp
from format.test_bundle_fuzz import _files, _inlining_bomb, _shaders, _with_shader, _write
from glcomp import GlcompError, nn, optim
from glcomp.codegen.schema import (
    DEFAULT_ENTRY_BUDGET,
    DEFAULT_LOOP_BUDGET,
    MAX_JSON_BYTES,
    parse_json,
    parse_safetensors,
    read_bundle,
    weights_limit,
)


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    glcomp.manual_seed(1)
    model = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 2))
    prog = glcomp.compile(
        model, {"x": (2, 3)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1, momentum=0.9)
    )
    # Format 3's layout (every file under its plain name: what the cases change by name); the
    # stored names of format 4 are tested in tests/format/test_save_atomic.py.
    return as_format_3(prog.save(tmp_path_factory.mktemp("good") / "b"))


def _edited(good: Path, d: Path, change: Any, name: str = "manifest.json") -> Path:
    """`good` with the JSON file `name` changed by `change` (in place), hashes brought up to date."""
    files = _files(good)
    doc = json.loads(files[name])
    change(doc)
    return _write(files | {name: json.dumps(doc).encode()}, d)


def _py(d: Path) -> str | None:
    """glcomp.load's verdict on `d`: None, or the GlcompError's message (anything else fails)."""
    try:
        glcomp.load(d)
    except GlcompError as err:
        return str(err)
    return None


JS_LOAD = """
const dec = (b64) => Uint8Array.from(atob(b64), (ch) => ch.charCodeAt(0));
const out = {};
for (const [name, files] of Object.entries(arg)) {
  const given = Object.fromEntries(Object.entries(files).map(([k, v]) => [k, dec(v)]));
  try { await g.loadBundle(given); out[name] = null; }
  catch (err) { out[name] = `${err.name}: ${err.message}`; }
}
return out;
"""


def _both(page: Any, cases: dict[str, Path]) -> dict[str, tuple[str | None, str | None]]:
    """Each case's verdict by read_bundle and by glcomp.js's loadBundle."""
    b64 = lambda data: base64.b64encode(data).decode()
    js = _js(page, JS_LOAD, {n: {k: b64(v) for k, v in _files(d).items()} for n, d in cases.items()})
    out = {}
    for name, d in cases.items():
        try:
            read_bundle(d)
            py = None
        except GlcompError as err:
            py = str(err)
        out[name] = (py, js[name])
    return out


# -- 1-3: time: inlining bombs, overloads, loop variables written through calls, entry totals --------
def _bomb_bundles(good: Path, tmp_path: Path) -> dict[str, Path]:
    files = _files(good)
    m = json.loads(files["manifest.json"])
    frag = m["programs"]["p0"]["fragment"]
    text = _shaders(files)[frag]
    cut = text.index("void main()")

    def helper(source: str) -> Path:
        name = f"b{len(made)}"
        made[name] = _write(
            _with_shader(files, frag, text[:cut] + source + "\n" + text[cut:]), tmp_path / name
        )
        return made[name]

    made: dict[str, Path] = {}
    bomb = _inlining_bomb(20).replace("void main() { float y = e_20(0.5); }", "")
    out = {
        "bomb": helper(bomb.replace("e_", "glc_e")),
        "overload": helper(
            "float glc_h(float x) { for (int i = 0; i < 65535; i++) { for (int j = 0; j < 65535; j++) { "
            "x += 1.0; } } return x; }\nfloat glc_h(int x) { return 1.0; }\n"
        ),
        "inout": helper("void glc_w(inout int v) { v = 0; }\n"),
    }
    # the overload and the writer must be called from main to matter
    for name, call in (("overload", "glc_h(1.0);"), ("inout", "for (int i = 0; i < 4; i++) { glc_w(i); }")):
        fs = _files(out[name])
        src = _shaders(fs)[frag]
        body = src.index("{", src.index("void main()")) + 1
        out[name] = _write(_with_shader(fs, frag, src[:body] + call + src[body:]), tmp_path / f"{name}2")
    return out


def test_bombs_and_bypasses_are_refused_alike(page: Any, good: Path, tmp_path: Path) -> None:
    frag = json.loads((good / "manifest.json").read_text())["programs"]["p0"]["fragment"]
    got = _both(page, _bomb_bundles(good, tmp_path))
    want = {
        "bomb": f"bundle shaders.json[{frag}]: line ",
        "overload": "iterations per fragment, more than the ",
        "inout": "the loop variable i is passed to glc_w, which has out or inout parameters",
    }
    for name, expect in want.items():
        py, js = got[name]
        assert py is not None and expect in py, (name, py)
        assert js == f"GlcompError: {py}", (name, py, js)
    assert "inlined would hold more than the 262144 tokens" in got["bomb"][0]


def _many_draws(good: Path, d: Path, copies: int) -> Path:
    """`good` whose programs declare as many loop iterations as the budget per draw allows, and
    whose predict entry runs its draws `copies` times."""

    def change(m: dict[str, Any]) -> None:
        for pid, prog in m["programs"].items():
            frags = max(
                math.prod(d["viewport"])
                for e in m["entries"].values()
                for d in e["draws"]
                if d["program"] == pid
            )
            prog["loop_iterations"] = DEFAULT_LOOP_BUDGET // frags
        m["entries"]["predict"]["draws"] *= copies

    return _edited(good, d, change)


def test_an_entry_has_a_total_budget(page: Any, good: Path, tmp_path: Path) -> None:
    m = json.loads((good / "manifest.json").read_text())
    works = {
        e: sum(
            max(1, m["programs"][d["program"]]["loop_iterations"]) * math.prod(d["viewport"])
            for d in v["draws"]
        )
        for e, v in m["entries"].items()
    }
    top = max(works.values())
    read_bundle(good, entry_budget=top)
    with pytest.raises(GlcompError, match=rf"draws may run {top} fragments .* budget of {top - 1} per entry"):
        read_bundle(good, entry_budget=top - 1)
    # Each draw within the budget per draw, together far beyond the one per entry.
    many = _many_draws(good, tmp_path / "many", DEFAULT_ENTRY_BUDGET // DEFAULT_LOOP_BUDGET)
    few = _edited(
        good,
        tmp_path / "few",
        lambda m: m["entries"]["predict"].update(draws=m["entries"]["predict"]["draws"] * 2),
    )
    got = _both(page, {"many": many, "few": few})
    py, js = got["many"]
    assert py is not None and f"entries.predict: its {len(m['entries']['predict']['draws']) * 16} draws" in py
    assert f"more than the budget of {DEFAULT_ENTRY_BUDGET} per entry" in py
    assert js == f"GlcompError: {py}"
    assert got["few"] == (None, None)


# -- 4: names that are JavaScript's object internals ------------------------------------------------
class _Odd(nn.Module):
    """Parameters named __proto__ and constructor (the state name pattern allows both)."""

    def __init__(self) -> None:
        super().__init__()
        rng = np.random.default_rng(0)
        self.__proto__ = nn.Parameter(rng.standard_normal((3, 2)).astype(np.float32))
        self.constructor = nn.Parameter(rng.standard_normal(2).astype(np.float32))

    def forward(self, x: Any) -> Any:
        return x @ self.__proto__ + self.constructor


def test_proto_and_constructor_state_names_load_and_train_alike(page: Any, site: Any, tmp_path: Path) -> None:
    prog = glcomp.compile(_Odd(), {"x": (4, 3)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.1))
    d = as_format_3(prog.save(site.root / "odd"))
    bundle = read_bundle(d)
    assert {"__proto__", "constructor"} <= set(bundle.weights)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 3)).astype(np.float32)
    y = rng.standard_normal((4, 2)).astype(np.float32)
    ref = glcomp.load(d).runtime("reference")
    want_pred = np.asarray(ref.predict(x=x))
    want_loss = [ref.train_step(x=x, y=y) for _ in range(3)]
    want_w = ref.state_dict()
    got = _js(
        page,
        """
        const b = await g.loadBundle(arg.url);
        const own = ["__proto__", "constructor"].map((k) => Object.hasOwn(b.weights, k));
        const t = g.parseSafetensors(new Uint8Array(arg.weights));
        const rt = await g.Runtime.load(arg.url, { quiet: true });
        const pred = Array.from((await rt.predict({ x: arg.x })).data);
        const losses = [];
        for (let i = 0; i < 3; i++) losses.push(await rt.trainStep({ x: arg.x, y: arg.y }));
        const w = rt.getWeights();
        const out = { own, tensors: Object.keys(t).sort(), pred, losses,
          proto: Array.from(w["__proto__"].data), ctor: Array.from(w.constructor.data),
          names: Object.keys(w).sort() };
        rt.dispose();
        return out;
        """,
        {
            "url": "/bundle/odd/",
            "x": x.ravel().tolist(),
            "y": y.ravel().tolist(),
            "weights": list((d / "weights.safetensors").read_bytes()),
        },
    )
    assert got["own"] == [True, True]
    assert "__proto__" in got["tensors"] and "constructor" in got["tensors"]
    assert got["names"] == sorted(want_w)
    np.testing.assert_allclose(got["pred"], want_pred.ravel(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["losses"], want_loss, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["proto"], want_w["__proto__"].ravel(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["ctor"], want_w["constructor"].ravel(), rtol=1e-4, atol=1e-5)


# -- 5: memory before validation -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["manifest.json", "shaders.json", "program.json", "weights.safetensors"])
def test_huge_sparse_files_are_refused_before_they_are_read(good: Path, tmp_path: Path, name: str) -> None:
    d = _write(_files(good), tmp_path / "b", rehash=False)
    with open(d / name, "r+b") as f:  # 6 GiB, sparse: no disk, but read whole it takes 6 GiB
        f.truncate(6 << 30)
    code = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
        "from glcomp.codegen.schema import read_bundle\n"
        "from glcomp.errors import GlcompError\n"
        "try:\n    read_bundle(__import__('pathlib').Path(sys.argv[1]))\n"
        "except GlcompError as err:\n    print('GlcompError:', err)\n"
    )
    env = os.environ | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(d)], capture_output=True, text=True, timeout=120, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert f"GlcompError: bundle {name}: larger than" in out.stdout, out.stdout


def test_weights_are_capped_by_the_manifest(page: Any, site: Any, good: Path) -> None:
    m = json.loads((good / "manifest.json").read_text())
    limit = weights_limit(m)
    assert limit < MAX_JSON_BYTES + 8 + 8 * 1000
    files = _files(good)
    data = files["weights.safetensors"]
    big = _write(files | {"weights.safetensors": data + b"\0" * (limit + 1 - len(data))}, site.root / "heavy")
    assert (big / "weights.safetensors").stat().st_size == limit + 1
    try:
        read_bundle(big)
        py = None
    except GlcompError as err:
        py = str(err)
    assert py == f"bundle weights.safetensors: larger than {limit} bytes"
    js = _js(
        page,
        "try { await g.loadBundle(arg); return null; } catch (err) { return `${err.name}: ${err.message}`; }",
        "/bundle/heavy/",
    )
    assert js == f"GlcompError: {py}"


def test_nesting_prescan_takes_linear_memory() -> None:
    """A 60 MB string once cost ~7.5 GB in the nesting pre-scan's regular expression."""
    code = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n"
        "from glcomp.codegen.schema import parse_json\n"
        "doc = b'{\"__metadata__\": {\"a\": \"' + b'x' * 60_000_000 + b'\\\\n' * 100_000 + b'\"}}'\n"
        "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "parse_json(doc, 'w')\n"
        "print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) // 1024)\n"
    )
    env = os.environ | {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout) < 1000, f"{out.stdout.strip()} MB more at the peak"
    # the scan still counts what is outside strings, and nothing inside them
    assert parse_json(b'["[[[[", "\\\\", "\\"]"]', "t") == ["[[[[", "\\", '"]']
    with pytest.raises(GlcompError, match="nested deeper than 64"):
        parse_json(b'"\\\\"' + b"[" * 65 + b"]" * 65, "t")


# -- 6 and 7: faults that raised other exceptions, values that broke training -------------------------
def test_other_exceptions_are_glcomp_errors(page: Any, good: Path, tmp_path: Path) -> None:
    def page_offset(m: dict[str, Any]) -> None:
        m["entries"]["predict"]["draws"][0]["page_offset"] = 2**31

    def lr(m: dict[str, Any]) -> None:
        m["hyper"]["lr"] = -1

    cases = {
        "page_offset": _edited(good, tmp_path / "po", page_offset),
        "lr": _edited(good, tmp_path / "lr", lr),
    }
    got = _both(page, cases)
    assert "page_offset" in (got["page_offset"][0] or ""), got
    assert "hyper.lr" in (got["lr"][0] or ""), got
    for py, js in got.values():
        assert js == f"GlcompError: {py}"
    d = _write(_files(good), tmp_path / "dir", rehash=False)
    (d / "manifest.json").unlink()
    (d / "manifest.json").mkdir()
    assert _py(d) == "bundle manifest.json is not a regular file"


def test_float64_weights_beyond_float32_are_refused(page: Any, good: Path, tmp_path: Path) -> None:
    from safetensors.numpy import save

    files = _files(good)
    arrays = parse_safetensors(files["weights.safetensors"])
    name = "0.weight"
    big = arrays | {name: np.full(arrays[name].shape, 1e39, np.float64)}
    d = _write(files | {"weights.safetensors": save(big)}, tmp_path / "f64")
    py, js = _both(page, {"f64": d})["f64"]
    assert py == f"bundle weights.safetensors: '{name}' holds values beyond float32's range"
    assert js == f"GlcompError: {py}"
    fine = arrays | {name: arrays[name].astype(np.float64)}
    assert _both(page, {"ok": _write(files | {"weights.safetensors": save(fine)}, tmp_path / "ok")})[
        "ok"
    ] == (
        None,
        None,
    )


def test_set_lr_refuses_negative_rates_in_the_browser(page: Any, site: Any, good: Path) -> None:
    import shutil

    shutil.copytree(good, site.root / "lr_good", dirs_exist_ok=True)
    got = _js(
        page,
        """
        const rt = await g.Runtime.load("/bundle/lr_good/", { quiet: true });
        let msg = null;
        try { rt.setLr(-1); } catch (err) { msg = `${err.name}: ${err.message}`; }
        rt.setLr(0);
        rt.dispose();
        return msg;
        """,
    )
    assert got == "GlcompError: setLr: expected a finite number >= 0, got -1"


def test_directory_reads_do_not_leak_descriptors(good: Path, tmp_path: Path) -> None:
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(20):
        read_bundle(good)
    assert len(os.listdir("/proc/self/fd")) == before


def _program_variant(good: Path, d: Path, change: Any) -> Path:
    return _edited(good, d, change, "program.json")


def _no_loss(p: dict[str, Any]) -> None:
    del p["graphs"]["train_step"]["outputs"]["loss"]


def _no_predict_outputs(p: dict[str, Any]) -> None:
    p["graphs"]["predict"]["outputs"] = {}


def _wrong_shaped_update(p: dict[str, Any]) -> None:
    outs = p["graphs"]["train_step"]["outputs"]
    outs["param:0.bias"] = outs["param:0.weight"]


def _string_constant(p: dict[str, Any]) -> None:
    for g in p["graphs"].values():
        for n in g["nodes"]:
            if n["op"] == "const":
                n["attrs"]["value"] = "1.0"


def _huge_node(p: dict[str, Any]) -> None:
    g = p["graphs"]["predict"]
    shape = [1 << 28, 2, 3]  # 1.6e9 elements (the reference would hold 6 GB)
    n = g["next"]
    for i, (op, to, src) in enumerate((("reshape", [1, 2, 3], 0), ("expand", shape, n))):
        node = {"id": n + i, "op": op, "shape": to, "dtype": "float32", "attrs": {"shape": to}}
        g["nodes"].append(node | {"origin": "", "operands": [src]})
    g["next"] = n + 2


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (_no_loss, "graphs.train_step: outputs [] != the manifest's ['loss']"),
        (_no_predict_outputs, "graphs.predict: outputs [] != the manifest's ['output']"),
        (_wrong_shaped_update, "graphs.train_step: output 'param:0.bias' has shape (5, 3), expected (5,)"),
        (_string_constant, "is a constant of value '1.0', not a number"),
        (_huge_node, "graphs.predict: its nodes hold 1610612864 elements, more than the 536870912"),
    ],
)
def test_program_json_faults_are_refused_at_load(good: Path, tmp_path: Path, change: Any, want: str) -> None:
    """These raised KeyError, TypeError or a numpy ValueError while training (or, for a wrong
    shape, silently reshaped the parameter at the first step); now glcomp.load refuses them."""
    msg = _py(_program_variant(good, tmp_path / "p", change))
    assert msg is not None and msg.startswith("bundle program.json: ") and want in msg, msg


# -- saving: a save killed between its two renames ---------------------------------------------------
def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_save_killed_between_its_renames_loses_nothing(good: Path, tmp_path: Path) -> None:
    """The old bundle moved aside (.b.old-PID-x/bundle), the new one never renamed in: the next
    save deleted the old bundle and the user's data.safetensors with it. Now the next load or
    save puts the old bundle back; a user's file named like a temporary is never deleted."""
    target = tmp_path / "b"
    prog = glcomp.load(good)
    prog.save(target)
    (target / "data.safetensors").write_bytes(b"the user's data")
    pid = _dead_pid()
    aside = tmp_path / f".b.old-{pid}-killed"
    aside.mkdir()
    os.rename(target, aside / "bundle")
    mine = tmp_path / f".b.old-{pid}-mine"
    mine.write_bytes(b"a user's file")
    assert not target.exists()
    glcomp.load(target)  # the load finds the old bundle again
    assert (target / "data.safetensors").read_bytes() == b"the user's data"
    # killed again, and this time the next save recovers it
    aside.mkdir()
    os.rename(target, aside / "bundle")
    prog.save(target)
    assert (target / "data.safetensors").read_bytes() == b"the user's data"
    assert not aside.exists()
    assert mine.read_bytes() == b"a user's file"
    glcomp.load(target)
