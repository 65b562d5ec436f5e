"""The browser runtime (glcomp/runtime/js/glcomp.js) in headless Chromium, against the moderngl runtime.
The `browser`, `site` and `page` fixtures are in tests/conftest.py, their helpers and the models
trained here in tests/browser/support.py.

Chromium renders WebGL with SwiftShader (a CPU implementation), so these tests need no GPU, only
the Debian `chromium` package and the `playwright` Python package (its own browser downloads are
not used). They fail, never skip, when Chromium is missing.
"""

from __future__ import annotations

import base64
import json
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import as_format_2, as_format_3, stored_path

import glcomp
from browser.support import HIDE, MODELS, STEPS, Site, _batches, _cnn, _get, _js, _mlp, _save
from glcomp import nn, optim
from glcomp.codegen.bundle import load_bundle
from glcomp.errors import GlcompError
from glcomp.runtime.feeds import check_feeds
from glcomp.serve import add_serve_command, cmd_serve, export_data, make_server

pytestmark = pytest.mark.browser

RTOL, ATOL = 1e-4, 1e-5
CASES = [(m, t) for m in ("mlp", "cnn") for t in ("webgl2", "webgl1")] + [
    ("lstm_blend", "webgl2"),
    ("tiled", "webgl2"),
]


# -- parity with the moderngl runtime ----------------------------------------------------------------
PARITY_JS = """
const { batches, base, split } = arg;
const rt = await g.Runtime.load(base, { quiet: true });
const feed = (i) => ({ x: batches[i][0], y: batches[i][1] });
const pred = await rt.predict({ x: batches[0][0] });
const grads = await rt.gradients(feed(0));
const losses = [];
for (let i = 0; i < split; i++) losses.push(await rt.trainStep(feed(i + 1)));
const rest = await rt.train({ steps: batches.length - 1 - split, batches: (i) => feed(split + 1 + i),
  inflight: 3 });
losses.push(...rest);
const after = await rt.predict({ x: batches[0][0] });
const w = rt.getWeights();
const weights = Object.fromEntries(Object.entries(w).map(([k, t]) => [k, { shape: t.shape, dtype: t.dtype,
  data: Array.from(t.data, Number) }]));
const info = rt.info();
const drawCalls = rt.drawCalls;
rt.dispose();
const flat = (v) => (typeof v === "number" ? v : Array.from(v.data));
return { pred: Array.from(pred.data), predShape: pred.shape, after: Array.from(after.data), losses, weights,
  info, drawCalls, grads: Object.fromEntries(Object.entries(grads).map(([k, v]) => [k, flat(v)])),
  own: rt.liveObjects(), api: { ...window.__glLive } };
"""


@pytest.mark.parametrize(("model", "target"), CASES, ids=[f"{m}-{t}" for m, t in CASES])
def test_matches_moderngl_runtime(page: Any, site: Site, gl_runtime: Any, model: str, target: str) -> None:
    prog = MODELS[model][0](target)
    name = f"{model}_{target}"
    _save(prog, site.root / name)
    batches = _batches(model)
    with gl_runtime(prog) as rt:
        x0, y0 = batches[0]
        want_pred = rt.predict(x=x0)
        want_grads = rt.gradients(x=x0, y=y0)
        want_loss = float(rt.run("gradients", {"x": x0, "y": y0}, read=["loss"])["loss"])
        want_losses = [rt.train_step(x=x, y=y) for x, y in batches[1:]]
        want_after = rt.predict(x=x0)
        want_state = rt.state_dict()
    arg = {
        "base": f"/bundle/{name}/",
        "split": 10,
        "batches": [[x.ravel().tolist(), y.tolist()] for x, y in batches],
    }
    got = _js(page, PARITY_JS, arg)
    assert got["info"]["webgl"] == (2 if target == "webgl2" else 1)
    assert got["info"]["readback"] == ("async" if target == "webgl2" else "sync")
    assert tuple(got["predShape"]) == want_pred.shape
    np.testing.assert_allclose(np.reshape(got["pred"], want_pred.shape), want_pred, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got["grads"]["loss"], want_loss, rtol=RTOL, atol=ATOL)
    assert sorted(got["grads"]) == sorted([*want_grads, "loss"])
    for k, v in want_grads.items():
        np.testing.assert_allclose(np.reshape(got["grads"][k], v.shape), v, rtol=RTOL, atol=ATOL, err_msg=k)
    np.testing.assert_allclose(got["losses"], want_losses, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.reshape(got["after"], want_after.shape), want_after, rtol=RTOL, atol=ATOL)
    assert sorted(got["weights"]) == sorted(want_state)
    for k, v in want_state.items():
        w = got["weights"][k]
        assert tuple(w["shape"]) == v.shape, k
        np.testing.assert_allclose(np.reshape(w["data"], v.shape), v, rtol=RTOL, atol=ATOL, err_msg=k)
        assert w["dtype"] == ("int64" if np.issubdtype(v.dtype, np.integer) else "float32"), k
    entries = json.loads((site.root / name / "manifest.json").read_text())["entries"]
    if model == "lstm_blend":
        blended = sum(bool(d.get("blend")) for d in entries["train_step"]["draws"])
        assert blended >= 2, "the compiler emitted no blend draws to test"
    assert got["drawCalls"] == sum(
        len(entries[e]["draws"]) * n for e, n in [("predict", 2), ("gradients", 1), ("train_step", STEPS)]
    )
    # dispose() leaves nothing behind, by the runtime's count and by the WebGL API's
    assert got["own"] and not any(got["own"].values()), got["own"]
    assert "createTexture" in got["api"] and not any(got["api"].values()), got["api"]
    # Reading the weights back is synchronous: Chromium may note a "GPU stall due to ReadPixels"
    # (a performance warning, depending on timing, seen under load); any other GL message fails.
    assert not [e for e in page.errors if "GPU stall due to ReadPixels" not in e], page.errors


# -- tampered bundles ---------------------------------------------------------------------------------
def _first_draw(m: dict[str, Any]) -> dict[str, Any]:
    return m["entries"]["predict"]["draws"][0]


def _mutate_alias(m: dict[str, Any]) -> None:
    d = _first_draw(m)
    d["samplers"][sorted(d["samplers"])[0]] = d["targets"][0]


def _mutate_texture_size(m: dict[str, Any]) -> None:
    m["textures"][sorted(m["textures"])[0]]["width"] = 3


def _mutate_state_texture(m: dict[str, Any]) -> None:
    st = m["states"][sorted(m["states"])[0]]
    st["textures"][1][0] = "nowhere"


def _mutate_layout(m: dict[str, Any]) -> None:
    m["states"][sorted(m["states"])[0]]["layout"]["texels"] += 1


def _mutate_uniform_name(m: dict[str, Any]) -> None:
    m["programs"][sorted(m["programs"])[0]]["samplers"].append("Bad-Name")


def _mutate_shader_path(m: dict[str, Any]) -> None:
    m["programs"][sorted(m["programs"])[0]]["fragment"] = "../../manifest.json"


MANIFEST_TAMPERS = {
    "version": (lambda m: m.update(version=99), "unknown format version"),
    "no-hashes": (lambda m: m.pop("files"), "files must be an object"),
    "format": (lambda m: m.update(format="something-else"), "format must be"),
    "missing-field": (lambda m: m.pop("programs"), "missing fields"),
    "alias": (_mutate_alias, "samples a texture it renders to"),
    "texture-size": (_mutate_texture_size, "must be a power of two"),
    "state-texture": (_mutate_state_texture, "refers to unknown texture"),
    "layout": (_mutate_layout, "texels is wrong"),
    "uniform-name": (_mutate_uniform_name, "must match ^[a-z][a-z0-9_]{0,40}$, got 'Bad-Name'"),
    "shader-path": (_mutate_shader_path, "is not a plain file name"),
    "program-ref": (lambda m: _first_draw(m).update(program="nope"), "unknown program"),
    "blend": (lambda m: _first_draw(m).update(blend="yes"), "blend must be a boolean"),
    "viewport": (lambda m: _first_draw(m).update(viewport=[1, 1]), "must all match the viewport"),
    "entry": (
        lambda m: m["entries"].update(evaluate=m["entries"]["predict"]),
        "entries: unknown fields ['evaluate']",
    ),
}


def _tamper_weights(src: Path, dst: Path, how: str) -> None:
    from safetensors.numpy import load_file, save_file

    w = load_file(str(src / "weights.safetensors"))
    key = sorted(w)[0]
    if how == "nan":
        w[key] = w[key].copy()
        w[key].flat[-1] = np.nan  # the last element: every one is checked
    elif how == "shape":
        w[key] = np.zeros((*w[key].shape, 2), np.float32)
    elif how == "missing":
        del w[key]
    if how == "truncated":
        (dst / "weights.safetensors").write_bytes((src / "weights.safetensors").read_bytes()[:40])
    elif how == "header":
        raw = bytearray((src / "weights.safetensors").read_bytes())
        raw[0:8] = (10**9).to_bytes(8, "little")
        (dst / "weights.safetensors").write_bytes(bytes(raw))
    else:
        save_file(w, str(dst / "weights.safetensors"))


WEIGHT_TAMPERS = {
    "nan": "NaN or infinite",
    "shape": "has shape",
    "missing": "missing [",
    "truncated": "unreadable",
    "header": "unreadable",
}


def test_tampered_bundles_are_rejected(page: Any, site: Site) -> None:
    # Format 3's layout: the cases change files by name (format 4's: tests/format/test_save_atomic.py).
    good = as_format_3(_save(_mlp("webgl2"), site.root / "good"))
    cases: dict[str, str] = {}
    for case, (mutate, expect) in MANIFEST_TAMPERS.items():
        d = site.root / f"bad_{case}"
        shutil.copytree(good, d)
        m = json.loads((good / "manifest.json").read_text())
        mutate(m)
        (d / "manifest.json").write_text(json.dumps(m))
        cases[case] = expect
    for case, expect in WEIGHT_TAMPERS.items():
        d = site.root / f"bad_{case}"
        shutil.copytree(good, d)
        _tamper_weights(good, d, case)
        cases[case] = expect
    shaders = json.loads((good / "shaders.json").read_text())
    d = site.root / "bad_no-shader"
    shutil.copytree(good, d)
    (d / "shaders.json").write_text(json.dumps({k: v for k, v in shaders.items() if k != "p0.frag"}))
    cases["no-shader"] = "bundle shaders.json: shader 'p0.frag' is missing"
    d = site.root / "bad_shader-changed"  # a shader of another save: its sha256 differs
    shutil.copytree(good, d)
    (d / "shaders.json").write_text(json.dumps(shaders | {"p0.frag": shaders["p0.frag"] + "// changed\n"}))
    cases["shader-changed"] = "bundle shaders.json: its sha256 does not match"
    d = site.root / "bad_no-shaders-json"
    shutil.copytree(good, d)
    (d / "shaders.json").unlink()
    cases["no-shaders-json"] = "shaders.json is missing"
    legacy = as_format_2(shutil.copytree(good, site.root / "legacy"))  # as format 2 saved bundles
    d = as_format_2(shutil.copytree(good, site.root / "bad_v2-no-shader"))
    (d / "shaders" / "p0.frag").unlink()
    cases["v2-no-shader"] = "programs.p0: shader 'p0.frag' is missing"
    d = as_format_2(shutil.copytree(good, site.root / "bad_v2-shader-changed"))
    with (d / "shaders" / "p0.frag").open("a") as f:
        f.write("// changed\n")
    cases["v2-shader-changed"] = "bundle shaders/p0.frag: its sha256 does not match"
    d = site.root / "bad_no-weights"
    shutil.copytree(good, d)
    (d / "weights.safetensors").unlink()
    cases["no-weights"] = "weights.safetensors is missing"

    # glcomp's own loader rejects every one of them too, with the same message
    python = {}
    for case in cases:
        with pytest.raises(GlcompError) as err:
            load_bundle(site.root / f"bad_{case}")
        python[case] = str(err.value)
    x = _batches("mlp", seed=5, count=1)[0][0]
    want = load_bundle(legacy)  # a format 2 bundle loads in Python...
    assert want.manifest["version"] == 2 and want.shaders == load_bundle(good).shaders

    got = _js(
        page,
        """
      const out = {};
      for (const c of arg.cases) {
        try { const rt = await g.Runtime.load(`/bundle/bad_${c}/`); rt.dispose(); out[c] = null; }
        catch (err) { out[c] = `${err.name}: ${err.message}`; }
      }
      const ok = await g.Runtime.load('/bundle/good/', { quiet: true });
      const old = await g.Runtime.load('/bundle/legacy/', { quiet: true });
      const preds = [];
      for (const rt of [ok, old]) preds.push(Array.from((await rt.predict({ x: arg.x })).data));
      ok.dispose();
      old.dispose();
      return { out, preds, live: { ...window.__glLive } };
    """,
        {"cases": sorted(cases), "x": x.tolist()},
    )
    assert got["preds"][0] == got["preds"][1]  # ...and in the browser, the same program
    for case, expect in cases.items():
        msg = got["out"][case]
        assert msg is not None, f"{case}: the browser accepted a tampered bundle"
        assert msg.startswith("GlcompError: "), f"{case}: {msg}"
        assert expect in msg, f"{case}: {msg!r} does not mention {expect!r}"
        if case not in ("no-weights", "no-shaders-json"):  # Python names the directory there
            assert msg == f"GlcompError: {python[case]}", case
    assert not any(got["live"].values()), got["live"]  # rejected bundles leave no GL objects behind


def test_load_from_files_and_feed_errors(page: Any, site: Site) -> None:
    """A bundle given as File objects (a picked folder), and input checks that match feeds.py."""
    d = as_format_3(_save(_mlp("webgl2"), site.root / "files"))  # format 4's: test_save_atomic.py
    files = {
        "manifest.json": (d / "manifest.json").read_text(),
        "weights.safetensors": base64.b64encode((d / "weights.safetensors").read_bytes()).decode(),
        "program.json": (d / "program.json").read_text(),
        "shaders.json": (d / "shaders.json").read_text(),
    }
    shaders = json.loads(files["shaders.json"])  # a format 2 bundle's files: one per shader
    legacy = json.loads((as_format_2(shutil.copytree(d, site.root / "files2")) / "manifest.json").read_text())
    x, y = _batches("mlp", seed=5, count=1)[0]
    bad_feeds = {
        "labels-range": {"x": x.tolist(), "y": [7] * 8},
        "labels-negative": {"x": x.tolist(), "y": [-1] + [0] * 7},
        "labels-float": {"x": x.tolist(), "y": [0.5] * 8},
        "shape": {"x": x[:7].tolist(), "y": y.tolist()},
        "nan": {"x": [[float("nan")] * 20] * 8, "y": y.tolist()},
        "unknown": {"x": x.tolist(), "y": y.tolist(), "z": [1]},
        "missing": {"x": x.tolist()},
    }
    got = _js(
        page,
        """
      const bytes = Uint8Array.from(atob(arg.files["weights.safetensors"]), (c) => c.charCodeAt(0));
      const common = [new File([bytes], "weights.safetensors"),
        new File([arg.files["program.json"]], "program.json")];
      const list = [new File([arg.files["manifest.json"]], "manifest.json"), ...common,
        new File([arg.files["shaders.json"]], "shaders.json")];
      const legacy = [new File([JSON.stringify(arg.legacy)], "manifest.json"), ...common,
        ...Object.entries(arg.shaders).map(([n, s]) => new File([s], n))];
      const rt = await g.Runtime.load(list, { quiet: true });
      const old = await g.Runtime.load(legacy, { quiet: true });
      const same = JSON.stringify(Array.from((await old.predict({ x: arg.x })).data));
      old.dispose();
      const out = {};
      for (const [name, feeds] of Object.entries(arg.bad)) {
        try { await rt.trainStep(feeds); out[name] = null; } catch (err) { out[name] = err.message; }
      }
      // typed arrays of the right length are accepted as the manifest's shape
      const pred = await rt.predict({ x: Float32Array.from(arg.x.flat()) });
      const loss = await rt.trainStep({ x: arg.x, y: Int32Array.from(arg.y) });
      const missing = {};
      for (const [name, files] of [["shaders.json", list], ["p0.frag", legacy]]) {
        try { await g.Runtime.load(files.filter((f) => f.name !== name)); }
        catch (err) { missing[name] = err.message; }
      }
      rt.dispose();
      const predicted = Array.from(pred.data);
      return { out, pred: predicted, loss, missing, same: same === JSON.stringify(predicted) };
    """,
        {
            "files": files,
            "shaders": shaders,
            "legacy": legacy,
            "bad": bad_feeds,
            "x": x.tolist(),
            "y": y.tolist(),
        },
    )
    specs = json.loads(files["manifest.json"])["inputs"]
    for name, feeds in bad_feeds.items():
        with pytest.raises(GlcompError) as err:
            check_feeds("train_step", specs, feeds)
        assert got["out"][name] == str(err.value), name
    ref = _mlp("webgl2").runtime("reference")
    np.testing.assert_allclose(np.reshape(got["pred"], (8, 5)), ref.predict(x=x), rtol=RTOL, atol=ATOL)
    assert np.isfinite(got["loss"])
    assert got["same"]  # the format 2 files predict what the format 3 ones do
    assert got["missing"] == {
        "shaders.json": "bundle: shaders.json is missing",
        "p0.frag": "bundle manifest.json: programs.p0: shader 'p0.frag' is missing",
    }


def test_export_indexeddb_and_set_weights(page: Any, site: Site) -> None:
    from safetensors.numpy import load as load_safetensors

    _save(_cnn("webgl2"), site.root / "persist")
    batches = _batches("cnn", seed=9, count=6)
    got = _js(
        page,
        """
      const rt = await g.Runtime.load('/bundle/persist/', { quiet: true, readback: "sync" });
      const feed = (i) => ({ x: arg.batches[i][0], y: arg.batches[i][1] });
      await rt.train({ steps: 3, batches: [0, 1, 2].map(feed) });
      const exported = rt.exportSafetensors();
      const weights = Object.fromEntries(Object.entries(rt.getWeights())
        .map(([k, t]) => [k, Array.from(t.data, Number)]));
      await rt.saveToIndexedDB("digits");
      const saved = Array.from((await rt.predict({ x: arg.batches[5][0] })).data);
      const lossBefore = await rt.trainStep(feed(3));
      await rt.trainStep(feed(4));
      const found = await rt.loadFromIndexedDB("digits");
      const absent = await rt.loadFromIndexedDB("no-such-key");
      const restored = Array.from((await rt.predict({ x: arg.batches[5][0] })).data);
      const lossAgain = await rt.trainStep(feed(3));  // optimizer state came back too
      rt.setWeights(exported);
      const reset = Array.from((await rt.predict({ x: arg.batches[5][0] })).data);
      const errors = [];
      const first = Object.keys(rt.getWeights())[0];
      const now = rt.getWeights();
      for (const bad of [{}, { ...now, [first]: [1, 2, 3] }, { ...now, extra: [1] }]) {
        try { rt.setWeights(bad); errors.push(null); } catch (err) { errors.push(err.message); }
      }
      const other = await g.Runtime.load('/bundle/persist/', { quiet: true });
      const fresh = Array.from((await other.predict({ x: arg.batches[5][0] })).data);
      await other.loadFromIndexedDB("digits");
      const other2 = Array.from((await other.predict({ x: arg.batches[5][0] })).data);
      rt.dispose();
      other.dispose();
      return { exported: Array.from(new Uint8Array(exported)), weights, saved, restored, reset, lossBefore,
        lossAgain, found, absent, errors, fresh, other2 };
    """,
        {"batches": [[x.ravel().tolist(), y.tolist()] for x, y in batches]},
    )
    tensors = load_safetensors(bytes(got["exported"]))
    assert sorted(tensors) == sorted(got["weights"])
    for k, v in tensors.items():
        np.testing.assert_array_equal(v.ravel(), np.asarray(got["weights"][k], v.dtype), err_msg=k)
    assert tensors["1.num_batches_tracked"].dtype == np.int64 and int(tensors["1.num_batches_tracked"]) == 3
    assert got["found"] is True and got["absent"] is False
    np.testing.assert_array_equal(got["restored"], got["saved"])
    np.testing.assert_array_equal(got["reset"], got["saved"])
    np.testing.assert_array_equal(got["other2"], got["saved"])
    assert not np.allclose(got["fresh"], got["saved"])
    assert got["lossAgain"] == got["lossBefore"]
    assert "missing keys" in got["errors"][0]
    assert "expected shape" in got["errors"][1]
    assert "unexpected keys ['extra']" in got["errors"][2]


# -- blending and missing capabilities ----------------------------------------------------------------
_BLEND_FRAG = """#version 300 es
// scale: 1.5 * x
precision highp float;
precision highp int;
precision highp sampler2D;
layout(location = 0) out vec4 glc_out0;
uniform int u_page_offset;
uniform sampler2D s_x;
uniform float u_h0;
void main() { glc_out0 = texelFetch(s_x, ivec2(gl_FragCoord.xy), 0) * (1.5 + u_h0); }
"""


def _blend_bundle(directory: Path) -> Path:
    """A hand-written bundle: draw x * 1.5 into a texture, then add it again with blending."""
    from glcomp.codegen.bundle import Bundle
    from glcomp.codegen.layout import layout_for
    from glcomp.codegen.render import vertex_shader
    from glcomp.codegen.target import make_target

    target = make_target("webgl2")
    lay = layout_for((3, 8), target.max_texture_size).to_json()
    size = {"width": lay["width"], "height": lay["height"]}
    draw = {
        "kernel": "k0_scale",
        "program": "p0",
        "samplers": {"s_x": "t_in"},
        "uniforms": {"u_h0": {"hyper": "lr"}},
        "page_offset": 0,
        "targets": ["t_out"],
        "viewport": [lay["width"], lay["height"]],
    }
    manifest = {
        "format": "glcomp-bundle",
        "version": 1,
        "target": target.to_json(),
        "inputs": {"x": {"shape": [3, 8], "dtype": "float32", "layout": lay}},
        "hyper": {"lr": 0.0},
        "states": {},
        "counters": {},
        "textures": {"t_in": size, "t_out": dict(size)},
        "vertex_shader": "quad.vert",
        "programs": {
            "p0": {
                "fragment": "p0.frag",
                "samplers": ["s_x"],
                "uniforms": ["u_h0"],
                "outputs": 1,
                "loop_iterations": 0,
            }
        },
        "entries": {
            "predict": {
                "inputs": {"x": ["t_in"]},
                "updates": [],
                "outputs": {"output": {"layout": lay, "textures": ["t_out"]}},
                "draws": [draw, draw | {"blend": True}],
            }
        },
        "memory": {"texture_bytes": 2 * 16 * lay["width"] * lay["height"], "textures": 2},
    }
    Bundle(manifest, {"quad.vert": vertex_shader(target), "p0.frag": _BLEND_FRAG}, {}).save(directory)
    return directory


def test_blend_draws_match_moderngl(page: Any, site: Site, gl_runtime: Any) -> None:
    bundle = load_bundle(_blend_bundle(site.root / "blend"))
    x = np.arange(24, dtype=np.float32).reshape(3, 8) - 5
    with gl_runtime(bundle) as rt:
        want = rt.predict(x=x)
        rt.set_lr(0.5)
        want_lr = rt.predict(x=x)
    np.testing.assert_allclose(want, 3 * x)
    got = _js(
        page,
        """
      const rt = await g.Runtime.load('/bundle/blend/', { quiet: true });
      const a = await rt.predict({ x: arg });
      rt.setLr(0.5);
      const b = await rt.predict({ x: arg });
      rt.dispose();
      return [Array.from(a.data), Array.from(b.data)];
    """,
        x.tolist(),
    )
    np.testing.assert_allclose(np.reshape(got[0], x.shape), want, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(np.reshape(got[1], x.shape), want_lr, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize(
    ("target", "hidden", "limits", "expect"),
    [
        ("webgl2", ["EXT_color_buffer_float"], {}, ["EXT_color_buffer_float"]),
        ("webgl2", [], {"MAX_TEXTURE_SIZE": 4}, ["texels per side (the limit here is 4)"]),
        ("webgl2", [], {"MAX_DRAW_BUFFERS": 1}, ["draw buffers per draw call (this GPU has 1)"]),
        (
            "webgl1",
            ["OES_texture_float", "WEBGL_draw_buffers"],
            {},
            ["OES_texture_float", "WEBGL_draw_buffers (programs write"],
        ),
    ],
    ids=["color-buffer-float", "texture-size", "draw-buffers", "webgl1-extensions"],
)
def test_missing_capabilities_are_reported(
    browser: Any, site: Site, target: str, hidden: list[str], limits: dict[str, int], expect: list[str]
) -> None:
    name = f"caps_{target}"
    if not (site.root / name).exists():
        _save(_cnn(target), site.root / name)
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.add_init_script(HIDE % (json.dumps(hidden), json.dumps(limits)))
        pg.goto(site.url + "glcomp.js")
        msg = _js(
            pg,
            """
          try { (await g.Runtime.load(arg, { quiet: true })).dispose(); return null; }
          catch (err) { return err.message; }
        """,
            f"/bundle/{name}/",
        )
    finally:
        context.close()
    assert msg is not None, "the runtime loaded without what it needs"
    assert msg.startswith("this browser cannot run the bundle"), msg
    for part in expect:
        assert part in msg, msg
    assert "SwiftShader" in msg and "software renderer" in msg, msg  # names the software renderer


# -- the demo page ------------------------------------------------------------------------------------
def test_demo_trains_digits(browser: Any, tmp_path: Path) -> None:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    y = digits.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(x))
    x, y = x[order], y[order]
    n = int(0.8 * len(x))
    glcomp.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10)
    )
    prog = glcomp.compile(
        model, inputs={"x": (32, 1, 8, 8)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2)
    )
    bundle = _save(prog, tmp_path / "digits")
    server = make_server(bundle, data=(x[:n], y[:n], x[n:], y[n:]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = browser.new_context(accept_downloads=True)
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        start = time.perf_counter()
        pg.goto(f"http://127.0.0.1:{server.server_address[1]}/?epochs=3&autostart=1")
        steps = 3 * (n // 32)
        try:
            pg.wait_for_function("['done', 'error'].includes(window.glcompDemo?.status)", timeout=180_000)
        except PlaywrightTimeout:
            demo = pg.evaluate("window.glcompDemo")
            pytest.fail(
                f"the demo did not finish in 180 s: status {demo['status']}, {demo['steps']} of "
                f"{steps} steps, {demo['msPerStep']} ms/step (a loaded machine?)",
                pytrace=False,
            )
        seconds = time.perf_counter() - start
        demo = pg.evaluate("window.glcompDemo")
        assert demo["status"] == "done", demo["error"]
        assert demo["steps"] == len(demo["losses"]) == steps
        print(
            f"\ndemo: {steps} steps + 3 evaluations in {seconds:.1f} s on {demo['info']['renderer']}; "
            f"{demo['msPerStep']:.1f} ms/step, first step {demo['firstStepMs']:.0f} ms; "
            f"test accuracy {demo['accuracies']}"
        )
        assert demo["accuracy"] >= 0.9, demo["accuracies"]
        assert np.mean(demo["losses"][-10:]) < np.mean(demo["losses"][:10])
        assert pg.locator("#accuracy").inner_text().startswith("test accuracy after epoch 3")
        with pg.expect_download() as dl:
            pg.click("#download")
        path = dl.value.path()
        from safetensors.numpy import load_file

        weights = load_file(str(path))
        assert sorted(weights) == sorted(prog.params)
        assert not errors, errors
    finally:
        context.close()
        server.shutdown()
        server.server_close()


# -- the server -----------------------------------------------------------------------------------------
def test_server_serves_only_the_bundle_and_the_runtime(tmp_path: Path) -> None:
    bundle = tmp_path / "b"
    _save(_mlp("webgl1"), bundle)
    (tmp_path / "secret.json").write_text("{}")
    (bundle / "link.json").symlink_to(tmp_path / "secret.json")
    (bundle / ".hidden.json").write_text("{}")
    (bundle / "notes.txt").write_text("x")
    export_data(bundle, np.zeros((4, 2)), np.arange(4), np.zeros((2, 2)), np.arange(2))
    server = make_server(bundle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        assert server.server_address[0] == "127.0.0.1"
        status, body, kind = _get(port, "/")
        assert status == 200 and kind.startswith("text/html") and b"demo.js" in body
        status, _, kind = _get(port, "/glcomp.js")
        assert status == 200 and kind.startswith("text/javascript")
        assert _get(port, "/bundle/manifest.json")[0] == 200
        stored = stored_path(bundle, "shaders.json").name  # format 4: a name carrying its sha256
        assert _get(port, f"/bundle/{stored}")[0] == 200
        assert _get(port, "/bundle/shaders.json")[0] == 404
        assert _get(port, "/bundle/.glcomp.lock")[0] == 404
        assert _get(port, "/bundle/data.safetensors")[0] == 200
        assert _get(port, "/bundle/manifest.json", "HEAD")[0] == 200
        for path in [
            "/bundle/../secret.json",
            "/bundle/%2e%2e/secret.json",
            "/bundle/..%2fsecret.json",
            "/bundle/shaders/../manifest.json",
            "/bundle/link.json",
            "/bundle/.hidden.json",
            "/bundle/notes.txt",
            "/bundle/",
            "/bundle",
            "/bundle/shaders",
            "/../serve.py",
            "/js/../../serve.py",
            "/%2e%2e/serve.py",
            "/bundle//etc/passwd",
            "/bundle/%00.json",
            "/glcomp.js/",
            "/nope.js",
            "//etc/passwd",
        ]:
            assert _get(port, path)[0] == 404, path
        assert _get(port, "/glcomp.js", host="evil.example:80")[0] == 403
        assert _get(port, "/glcomp.js", "POST")[0] == 501
    finally:
        server.shutdown()
        server.server_close()


def test_serve_command_and_export_data(tmp_path: Path) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="glcomp")
    sub = parser.add_subparsers(dest="command")
    add_serve_command(sub)
    args = parser.parse_args(["serve", str(tmp_path), "--port", "0"])
    assert args.func is cmd_serve and args.port == 0 and args.data is None
    path = export_data(tmp_path, np.ones((3, 1, 2, 2)), np.array([0, 1, 2]), np.ones((1, 1, 2, 2)), [1])
    from safetensors.numpy import load_file

    data = load_file(str(path))
    assert data["x_train"].dtype == np.float32 and data["y_train"].dtype == np.int64
    with pytest.raises(GlcompError, match="same number of samples"):
        export_data(tmp_path, np.ones((3, 2)), np.arange(2), np.ones((1, 2)), [1])
    with pytest.raises(GlcompError, match="NaN"):
        export_data(tmp_path, np.full((2, 2), np.nan), np.arange(2), np.ones((1, 2)), [1])
    with pytest.raises(GlcompError, match="not a directory"):
        make_server(tmp_path / "missing")
