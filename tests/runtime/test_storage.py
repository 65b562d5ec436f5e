"""Half-float storage (``glcomp.compile(..., storage="f16")``).

Temporaries are RGBA16F; states, entry inputs and the loss stay RGBA32F; shaders compute in
float32 registers. Tolerance against the float32 reference runtime: one rounding to half
precision costs at most 2^-11 ~ 4.9e-4 of the value, and a value passes through a few stored
temporaries per kernel chain (forward, backward, update) and five training steps, so losses
are compared at rtol 1e-2 (about 20 half-precision roundings) and states relative to their
largest element at 2e-2 (the largest deviation measured on the test models is 7.5e-3, the CNN's
BatchNorm statistics; the others stay near 1e-3). The float32 bundles must be unchanged.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser.support import HIDE, _js
from conftest import MODELS, train_both

import glcomp
from glcomp import optim
from glcomp.codegen.schema import bundle_files, texture_bytes, validate_manifest
from glcomp.errors import GlcompError

STEPS = 5
LOSS_RTOL = 1e-2
STATE_RTOL = 2e-2  # relative to the array's largest magnitude


def formats(manifest: dict[str, Any]) -> dict[str, str]:
    return {name: t.get("format", "f32") for name, t in manifest["textures"].items()}


@pytest.mark.parametrize("name", ["mlp", "cnn", "lstm", "activations"])
def test_f16_bundle_trains_like_the_reference(models: Any, name: str, gl_runtime: Any):
    case = models[name]
    prog = case.compile("webgl2", optim.Adam(lr=0.01), storage="f16")
    m = prog.bundle().manifest
    half = [t for t, f in formats(m).items() if f == "f16"]
    assert half, "no texture is half precision"
    with gl_runtime(prog) as gl:
        assert {gl.textures[t].dtype for t in half} == {"f2"}
        assert {gl.textures[t].dtype for t in m["textures"] if t not in half} == {"f4"}
        got, want = train_both(case, prog, gl, STEPS, STATE_RTOL, atol_rel=STATE_RTOL)
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL, err_msg="loss per step")
    # Not vacuous: half-precision storage does change the numbers (float32 GL agrees to ~1e-6).
    assert np.abs(got - want).max() / np.abs(want).max() > 1e-5


def test_f16_webgl1_sgd_trains(models: Any, gl_runtime: Any):
    case = models["cnn"]
    prog = case.compile("webgl1", optim.SGD(lr=0.1, momentum=0.9), storage="f16")
    with gl_runtime(prog) as gl:
        got, want = train_both(case, prog, gl, STEPS, STATE_RTOL, atol_rel=STATE_RTOL)
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL, err_msg="loss per step")


def test_manifest_records_formats(models: Any):
    case = models["cnn"]
    m = case.compile("webgl2", optim.Adam(lr=0.01), storage="f16").bundle().manifest
    fmt = formats(m)
    assert set(fmt.values()) == {"f16", "f32"}
    for name, st in m["states"].items():  # parameters, buffers and moments stay float32
        assert all(fmt[t] == "f32" for group in st["textures"] for t in group), name
    for entry, e in m["entries"].items():
        for name, refs in e["inputs"].items():
            assert all(fmt[r] == "f32" for r in refs), f"{entry} input {name}"
        if "loss" in e["outputs"]:
            assert all(fmt[r] == "f32" for r in e["outputs"]["loss"]["textures"]), entry
        for d in e["draws"]:  # one format per draw's render targets
            assert len({fmt[r] if isinstance(r, str) else "f32" for r in d["targets"]}) == 1
    # Predictions and gradients are read back from half-precision textures.
    assert fmt[m["entries"]["predict"]["outputs"]["output"]["textures"][0]] == "f16"
    assert any(fmt[o["textures"][0]] == "f16" for k, o in m["entries"]["gradients"]["outputs"].items())
    want = sum((8 if fmt[n] == "f16" else 16) * t["width"] * t["height"] for n, t in m["textures"].items())
    assert m["memory"]["texture_bytes"] == texture_bytes(m) == want
    f32 = case.compile("webgl2", optim.Adam(lr=0.01)).bundle().manifest
    assert m["memory"]["texture_bytes"] < f32["memory"]["texture_bytes"]


def test_f32_bundles_are_unchanged(models: Any, tmp_path: Path):
    """The default writes no format field: manifests are byte for byte what they were."""
    case = models["lstm"]
    default = case.compile("webgl2", optim.SGD(lr=0.1)).bundle()
    explicit = case.compile("webgl2", optim.SGD(lr=0.1), storage="f32").bundle()
    assert all("format" not in t for t in default.manifest["textures"].values())
    assert json.dumps(default.manifest, sort_keys=True) == json.dumps(explicit.manifest, sort_keys=True)
    assert default.shaders == explicit.shaders
    half = case.compile("webgl2", optim.SGD(lr=0.1), storage="f16").bundle()
    assert half.shaders == default.shaders  # only the storage differs, not the code
    strip = copy.deepcopy(half.manifest)
    for t in strip["textures"].values():
        t.pop("format", None)
    strip["memory"] = default.manifest["memory"]
    assert json.dumps(strip, sort_keys=True) == json.dumps(default.manifest, sort_keys=True)


def test_f16_bundle_saves_and_loads(models: Any, tmp_path: Path, gl_runtime: Any):
    case = models["mlp"]
    prog = case.compile("webgl2", optim.Adam(lr=0.01), storage="f16")
    feeds, y = case.batch(0)
    with gl_runtime(prog) as gl:
        gl.train_step(**feeds, y=y)
        gl.save(tmp_path / "b")
        after = gl.train_step(**feeds, y=y)
    loaded = glcomp.load(tmp_path / "b")
    assert formats(loaded.bundle().manifest) == formats(prog.bundle().manifest)
    with gl_runtime(loaded) as gl:
        assert gl.train_step(**feeds, y=y) == after


@pytest.mark.parametrize("bad", ["f64", "F16", 16, None])
def test_compile_rejects_unknown_storage(models: Any, bad: Any):
    with pytest.raises(GlcompError, match="storage must be one of"):
        models["mlp"].compile("webgl2", storage=bad)


def _first_half(m: dict[str, Any]) -> str:
    return next(n for n, t in m["textures"].items() if t.get("format") == "f16")


def _state_texture(m: dict[str, Any]) -> str:
    return next(iter(m["states"].values()))["textures"][0][0]


def _mixed_targets(m: dict[str, Any]) -> None:
    d = next(d for e in m["entries"].values() for d in e["draws"] if len(d["targets"]) > 1)
    m["textures"][d["targets"][0]]["format"] = "f32"
    m["textures"][d["targets"][1]]["format"] = "f16"


BAD_MANIFESTS: dict[str, tuple[Any, str]] = {
    "unknown format": (lambda m: m["textures"][_first_half(m)].update(format="f8"), "format must be one of"),
    "format not a string": (
        lambda m: m["textures"][_first_half(m)].update(format=16),
        "format must be one of",
    ),
    "unknown field": (lambda m: m["textures"][_first_half(m)].update(dtype="f2"), "unknown fields"),
    "half state": (lambda m: m["textures"][_state_texture(m)].update(format="f16"), "must be f32"),
    "half input": (
        lambda m: m["textures"][m["entries"]["predict"]["inputs"]["x"][0]].update(format="f16"),
        "input texture .* must be f32",
    ),
    "mixed targets": (_mixed_targets, "render targets must all have one format"),
}


_HALF: dict[str, tuple[str, set[str]]] = {}


def half_manifest(case: Any) -> tuple[dict[str, Any], set[str]]:
    """A float16 bundle's manifest as written (with the files' digests) and its shader names."""
    if case.name not in _HALF:
        bundle = case.compile("webgl2", optim.Adam(lr=0.01), storage="f16").bundle()
        _HALF[case.name] = (bundle_files(bundle)["manifest.json"].decode(), set(bundle.shaders))
    text, names = _HALF[case.name]
    return json.loads(text), names


@pytest.mark.parametrize("what", sorted(BAD_MANIFESTS))
def test_validator_rejects_bad_formats(models: Any, what: str):
    manifest, names = half_manifest(models["cnn"])
    validate_manifest(manifest, names)  # the compiled one is valid
    change, message = BAD_MANIFESTS[what]
    m = copy.deepcopy(manifest)
    change(m)
    with pytest.raises(GlcompError, match=message):
        validate_manifest(m, names)


def test_budget_counts_half_textures_at_eight_bytes(models: Any):
    m, names = half_manifest(models["cnn"])
    size = texture_bytes(m)
    validate_manifest(m, names, texture_budget_bytes=size)
    with pytest.raises(GlcompError, match="more than the budget"):
        validate_manifest(m, names, texture_budget_bytes=size - 1)


# -- the browser runtime ------------------------------------------------------------------------------
BROWSER_JS = """
// Count half-float allocations: RGBA16F storage (WebGL 2), HALF_FLOAT_OES texels (WebGL 1).
let half = 0;
const storage = WebGL2RenderingContext.prototype.texStorage2D;
WebGL2RenderingContext.prototype.texStorage2D = function (t, l, fmt, ...rest) {
  if (fmt === this.RGBA16F) half++;
  return storage.call(this, t, l, fmt, ...rest);
};
const image = WebGLRenderingContext.prototype.texImage2D;
WebGLRenderingContext.prototype.texImage2D = function (...args) {
  if (args.length === 9 && args[7] === 0x8d61) half++;  // HALF_FLOAT_OES
  return image.apply(this, args);
};
const rt = await g.Runtime.load(arg.base, { quiet: true });
const losses = [];
for (const [x, y] of arg.batches) losses.push(await rt.trainStep({ x, y }));
const pred = await rt.predict({ x: arg.batches[0][0] });
const w = rt.getWeights();
rt.dispose();
const weights = Object.fromEntries(Object.entries(w).map(([k, t]) => [k, Array.from(t.data, Number)]));
return { losses, pred: Array.from(pred.data), weights, half, live: { ...window.__glLive } };
"""


# With transposes pushed down and MRT and epilogue fusion off, the LSTM's recurrent weight
# gradient is summed by additive blending, here into RGBA16F targets.
BLEND = {"pushdown": True, "mrt": False, "epilogue": False, "join_sums": False}
BROWSER_CASES = [("cnn", "webgl2", {}), ("cnn", "webgl1", {}), ("lstm", "webgl2", BLEND)]


@pytest.mark.browser
@pytest.mark.parametrize(
    ("model", "target", "passes"), BROWSER_CASES, ids=["cnn", "cnn-webgl1", "lstm-blend"]
)
def test_f16_bundle_trains_in_chromium(
    page: Any,
    site: Any,
    gl_runtime: Any,
    models: Any,
    model: str,
    target: str,
    passes: dict[str, bool],
) -> None:
    """The same f16 bundle in Chromium (SwiftShader) and on moderngl: both round temporaries to
    half precision (GL lets either round or truncate), so they agree to the f16 tolerances."""
    case = models[model]
    prog = case.compile(target, optim.Adam(lr=0.01), storage="f16", passes=passes)
    if passes:
        m = prog.bundle().manifest
        blended = [t for d in m["entries"]["train_step"]["draws"] if d["blend"] for t in d["targets"]]
        assert blended and all(m["textures"][t].get("format") == "f16" for t in blended)
    name = f"f16_{model}_{target}"
    prog.save(site.root / name)
    batches = [case.batch(s) for s in range(STEPS)]
    with gl_runtime(prog) as gl:
        want = [gl.train_step(**feeds, y=y) for feeds, y in batches]
        want_pred = gl.predict(**batches[0][0])
        want_state = gl.state_dict()
    arg = {
        "base": f"/bundle/{name}/",
        "batches": [[feeds["x"].ravel().tolist(), y.tolist()] for feeds, y in batches],
    }
    got = _js(page, BROWSER_JS, arg)
    m = prog.bundle().manifest
    assert got["half"] == sum(t.get("format") == "f16" for t in m["textures"].values()) > 0
    np.testing.assert_allclose(got["losses"], want, rtol=LOSS_RTOL, err_msg="loss per step")
    scale = float(np.abs(want_pred).max())
    np.testing.assert_allclose(np.reshape(got["pred"], want_pred.shape), want_pred, atol=STATE_RTOL * scale)
    for k, v in want_state.items():
        w = np.reshape(got["weights"][k], v.shape)
        assert np.abs(w - v).max() <= STATE_RTOL * (float(np.abs(v).max()) or 1.0), k
    assert got["live"] and not any(got["live"].values()), got["live"]
    # Chrome's "GPU stall due to ReadPixels" performance note (getWeights reads synchronously)
    # comes and goes with the machine's load; anything else (WebGL errors) fails the test.
    assert not [e for e in page.errors if "Performance" not in e], page.errors


@pytest.mark.browser
def test_browser_validator_rejects_bad_formats(page: Any) -> None:
    """glcomp.js's validateManifest rejects the manifests glcomp's own validator rejects."""
    manifest, names = half_manifest(MODELS["cnn"])
    bad = {}
    for what, (change, message) in BAD_MANIFESTS.items():
        m = copy.deepcopy(manifest)
        change(m)
        bad[what] = (m, message)
    got = _js(
        page,
        """
      const out = { good: null };
      try { g.validateManifest(arg.good, arg.names); } catch (err) { out.good = err.message; }
      for (const [what, m] of Object.entries(arg.bad)) {
        try { g.validateManifest(m, arg.names); out[what] = null; } catch (err) { out[what] = err.message; }
      }
      return out;
    """,
        {"good": manifest, "names": sorted(names), "bad": {k: m for k, (m, _) in bad.items()}},
    )
    assert got.pop("good") is None
    for what, (_, message) in bad.items():
        assert got[what] is not None, f"{what}: glcomp.js accepted it"
        assert re.search(message, got[what]), f"{what}: {got[what]!r}"


@pytest.mark.browser
def test_webgl1_without_half_float_is_refused(browser: Any, site: Any, models: Any) -> None:
    name = "f16_caps"
    models["mlp"].compile("webgl1", optim.SGD(lr=0.1), storage="f16").save(site.root / name)
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.add_init_script(
            HIDE % (json.dumps(["OES_texture_half_float", "EXT_color_buffer_half_float"]), "{}")
        )
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
    assert msg is not None, "an f16 bundle loaded without half-float textures"
    assert msg.startswith("this browser cannot run the bundle"), msg
    assert "OES_texture_half_float" in msg and "EXT_color_buffer_half_float" in msg, msg
    assert "storage='f32'" in msg, msg
