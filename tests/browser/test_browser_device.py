"""Every WebGL device: a lost WebGL context in the browser runtime, and bundles planned for (and
checked against) a device's limits: the mobile target presets, refusals naming the limit."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

import glcomp
from browser.support import HIDE, Site, _batches, _cnn, _js, _mlp, _save
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.target import TARGETS, make_target

pytestmark = pytest.mark.browser

# -- context loss ------------------------------------------------------------------------------------
LOSE_JS = """
const { base, batches } = arg;
const feed = (i) => ({ x: batches[i][0], y: batches[i][1] });
// the kept state, read back asynchronously (getWeights would stall the GPU pipeline)
const flat = (k) => Object.fromEntries(Object.entries(k.weights).map(([n, a]) => [n, Array.from(a)]));
const events = [];
const onContextLost = (e) => events.push(e);
const rt = await g.Runtime.load(base, { quiet: true, keepWeightsEvery: 4, onContextLost });
const before = await rt.train({ steps: 8, batches: feed });
const kept = rt.keptSteps;
const w8 = flat(rt.keptState());
const ext = rt.gl.getExtension("WEBGL_lose_context");
const lostEvent = new Promise((r) => rt.canvas.addEventListener("webglcontextlost", r, { once: true }));
let stopped = null;
try {
  const onStep = (i) => { if (i === 1) ext.loseContext(); };
  await rt.train({ steps: 50, batches: (i) => feed(8 + i), onStep });
} catch (err) {
  stopped = { name: err.name, message: err.message, reason: err.reason, losses: err.losses.length };
}
await lostEvent;
const lostSteps = rt.steps;
const errorOf = async (f) => {
  try { await f(); return null; } catch (err) { return [err.reason, err.message]; }
};
const whileLost = { trainStep: await errorOf(() => rt.trainStep(feed(0))),
  getWeights: await errorOf(() => rt.getWeights()), restore: await errorOf(() => rt.restore()),
  lost: rt.contextLost, kept: rt.keptState().steps,
  keptSame: JSON.stringify(flat(rt.keptState())) === JSON.stringify(w8) };
const restoredEvent = new Promise((r) => rt.canvas.addEventListener("webglcontextrestored", r,
  { once: true }));
ext.restoreContext();
await restoredEvent;
await rt.restore();
const afterRestore = { steps: rt.steps, lost: rt.contextLost, live: rt.liveObjects(),
  kept: await rt.snapshot() };
const wr = flat(rt.keptState());
const after = await rt.train({ steps: 4, batches: (i) => feed(8 + i) });
const w12 = flat(rt.keptState());
rt.dispose();
const ref = await g.Runtime.load(base, { quiet: true });
const refBefore = await ref.train({ steps: 8, batches: feed });
const refAfter = await ref.train({ steps: 4, batches: (i) => feed(8 + i) });
const w12ref = flat(ref.keptState());
ref.dispose();
return { before, kept, w8, events, stopped, lostSteps, whileLost, afterRestore, wr, after, w12, refBefore,
  refAfter, w12ref, disposed: rt.liveObjects() };
"""


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_context_loss_stops_training_and_restore_continues(page: Any, site: Site, target: str) -> None:
    name = f"lose_{target}"
    if not (site.root / name).exists():
        _save(_mlp(target), site.root / name)
    batches = [(x.tolist(), y.tolist()) for x, y in _batches("mlp", seed=7, count=12)]
    got = _js(page, LOSE_JS, {"base": f"/bundle/{name}/", "batches": batches})
    m = json.loads((site.root / name / "manifest.json").read_text())

    # training stops cleanly with a clear reason, and the callback says what is kept
    assert got["before"] == got["refBefore"]
    assert got["kept"] == 8  # the end of train() keeps the state it reached
    stopped = got["stopped"]
    assert stopped is not None, "train() went on after the context was lost"
    assert stopped["name"] == "GlcompError" and stopped["reason"] == "context-lost", stopped
    assert "training stopped" in stopped["message"] and "weights of step 8 are kept" in stopped["message"]
    assert "restore()" in stopped["message"], stopped
    assert stopped["losses"] >= 1
    assert len(got["events"]) == 1 and got["events"][0]["kept"] == 8, got["events"]
    assert got["events"][0]["steps"] == got["lostSteps"] > 8
    lost = got["whileLost"]
    assert lost["lost"] is True and lost["kept"] == 8 and lost["keptSame"] is True, lost
    assert lost["trainStep"][0] == "context-lost" and lost["getWeights"][0] == "context-lost", lost
    assert "still lost" in lost["restore"][1], lost

    # restore rebuilds every GL object and re-uploads the kept state: weights, optimizer, counters
    after = got["afterRestore"]
    assert after["steps"] == after["kept"] == 8 and after["lost"] is False
    assert after["live"]["textures"] == len(m["textures"]) and after["live"]["programs"] == len(m["programs"])
    assert after["live"]["buffers"] >= 1
    assert got["wr"] == got["w8"], "restore() did not bring back the kept weights exactly"
    # training continues from the kept step as if nothing had been lost
    np.testing.assert_allclose(got["after"], got["refAfter"], rtol=1e-6, atol=1e-7)
    for k, want in got["w12ref"].items():
        np.testing.assert_allclose(got["w12"][k], want, rtol=1e-5, atol=1e-6, err_msg=k)
    assert got["w12"] != got["w8"]
    assert not any(got["disposed"].values()), got["disposed"]
    assert not page.errors, page.errors


def test_a_diverged_state_is_not_kept(page: Any, site: Site) -> None:
    name = "lose_webgl2"
    if not (site.root / name).exists():
        _save(_mlp("webgl2"), site.root / name)
    x, y = _batches("mlp", seed=1, count=1)[0]
    got = _js(
        page,
        """
      const { base, x, y } = arg;
      const rt = await g.Runtime.load(base, { quiet: true, keepWeightsEvery: 0 });
      await rt.trainStep({ x, y });
      const good = await rt.snapshot();
      rt.setLr(1e38);  // the next steps overflow the weights
      const losses = await rt.train({ steps: 3, batches: [{ x, y }], keepEvery: 1 });
      const kept = await rt.snapshot();
      rt.dispose();
      return { good, kept, losses };
    """,
        {"base": f"/bundle/{name}/", "x": x.tolist(), "y": y.tolist()},
    )
    # step 2 (the first at lr 1e38) leaves huge but finite weights, so its loss is finite and the
    # forward pass of step 3 overflows: the states after steps 3 and 4 hold NaN and are not kept
    assert got["good"] == 1 and np.isfinite(got["losses"][0]) and not np.isfinite(got["losses"][1:]).any()
    assert got["kept"] == 2, got


# -- device limits ---------------------------------------------------------------------------------
def _cnn_for(target: str, **limits: Any) -> glcomp.Program:
    """test_browser's CNN (same seed, same weights) compiled for `target` and `limits`."""
    glcomp.manual_seed(4)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, 3),
    )
    return glcomp.compile(
        model,
        inputs={"x": (4, 1, 8, 8)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.Adam(lr=1e-2),
        target=target,
        **limits,
    )


# -----------------------------------------------------------------------------------
LOW_PRECISION = """
(() => {
  for (const proto of [WebGLRenderingContext.prototype, WebGL2RenderingContext.prototype]) {
    const get = proto.getShaderPrecisionFormat;
    proto.getShaderPrecisionFormat = function (s, p) {
      const f = get.call(this, s, p);
      return p === this.HIGH_FLOAT ? { rangeMin: f.rangeMin, rangeMax: f.rangeMax, precision: PRECISION } : f;
    };
  }
})();
"""


def _limited_page(
    browser: Any, site: Site, hidden: list[str], limits: dict[str, int], precision: int = 0
) -> Any:
    """A page whose WebGL reports smaller limits (and lacks `hidden` extensions)."""
    context = browser.new_context()
    pg = context.new_page()
    pg.add_init_script(HIDE % (json.dumps(hidden), json.dumps(limits)))
    if precision:
        pg.add_init_script(LOW_PRECISION.replace("PRECISION", str(precision)))
    pg.goto(site.url + "glcomp.js")
    return pg


LOAD_JS = """
const { base, batches } = arg;
let rt;
try { rt = await g.Runtime.load(base, { quiet: true }); } catch (err) { return { error: err.message }; }
const losses = [];
for (const [x, y] of batches) losses.push(await rt.trainStep({ x, y }));
const info = rt.info();
rt.dispose();
return { losses, info };
"""


def test_bundle_exceeding_the_device_is_refused_naming_the_limit(browser: Any, site: Site) -> None:
    name = "limits_webgl2"
    if not (site.root / name).exists():
        _save(_cnn("webgl2"), site.root / name)
    m = json.loads((site.root / name / "manifest.json").read_text())
    units = max(len(p["samplers"]) for p in m["programs"].values())
    widest = next(pid for pid, p in m["programs"].items() if len(p["samplers"]) == units)
    outputs = max(p["outputs"] for p in m["programs"].values())
    assert units > 4 and outputs > 1  # the bundle needs more than the page will report
    pg = _limited_page(browser, site, [], {"MAX_TEXTURE_IMAGE_UNITS": 4, "MAX_DRAW_BUFFERS": 1})
    try:
        msg = _js(pg, LOAD_JS, {"base": f"/bundle/{name}/", "batches": []})["error"]
        assert msg.startswith("this browser cannot run the bundle"), msg
        assert (
            f"MAX_TEXTURE_IMAGE_UNITS: {units} texture units per shader (this GPU has 4), "
            f"program {widest} (kernel " in msg
        ), msg
        assert f"samples {units} textures" in msg, msg
        assert f"MAX_DRAW_BUFFERS: {outputs} draw buffers per draw call (this GPU has 1)" in msg, msg
        assert "MAX_DRAW_BUFFERS 1, MAX_COLOR_ATTACHMENTS" in msg, msg
        # the fix it names compiles a bundle that this device runs, with the same losses as moderngl
        assert "glcomp.compile(..., target='webgl2', max_draw_buffers=1, max_texture_units=4)" in msg, msg
        assert "webgl2-mobile" not in msg  # 16 units: it would not fit either
        prog = _cnn_for("webgl2", max_texture_units=4, max_draw_buffers=1)
        _save(prog, site.root / "limits_fit")
        batches = _batches("cnn", seed=2, count=3)
        got = _js(
            pg,
            LOAD_JS,
            {"base": "/bundle/limits_fit/", "batches": [(x.tolist(), y.tolist()) for x, y in batches]},
        )
        assert "error" not in got, got
        assert got["info"]["maxTextureUnits"] == 4 and got["info"]["maxDrawBuffers"] == 1
        ref = prog.runtime("reference")
        want = [ref.train_step(x=x, y=y) for x, y in batches]
        np.testing.assert_allclose(got["losses"], want, rtol=1e-4, atol=1e-5)
    finally:
        pg.context.close()


def test_refuses_a_device_without_highp_float(browser: Any, site: Site) -> None:
    name = "limits_webgl2"
    if not (site.root / name).exists():
        _save(_cnn("webgl2"), site.root / name)
    pg = _limited_page(browser, site, [], {}, precision=10)
    try:
        msg = _js(pg, LOAD_JS, {"base": f"/bundle/{name}/", "batches": []})["error"]
    finally:
        pg.context.close()
    assert "highp float in fragment shaders" in msg and "offers 10 bits" in msg and "HIGH_FLOAT" in msg, msg


PRESET_LIMITS = {  # what the presets promise, checked against the planner's output below
    "webgl1-mobile": {"max_texture_size": 2048, "max_draw_buffers": 1, "max_texture_units": 8},
    "webgl2-mobile": {"max_texture_size": 4096, "max_draw_buffers": 4, "max_texture_units": 16},
}


def test_mobile_presets(browser: Any, site: Site, gl_runtime: Any) -> None:
    """The presets exist in the compiler and in glcomp.js alike, compile end to end within their
    limits, run on moderngl like the reference, and the WebGL 1 one trains in a page that reports
    only what the preset assumes (8 units, no WEBGL_draw_buffers, no EXT_float_blend)."""
    pg = _limited_page(
        browser,
        site,
        ["WEBGL_draw_buffers", "EXT_float_blend"],
        {"MAX_TEXTURE_IMAGE_UNITS": 8, "MAX_TEXTURE_SIZE": 2048},
    )
    try:
        js_presets = _js(pg, "return g.PRESETS;")
        assert set(js_presets) == set(PRESET_LIMITS) <= set(TARGETS)
        batches = _batches("cnn", seed=3, count=3)
        for name, limits in PRESET_LIMITS.items():
            t = make_target(name)
            assert {k: getattr(t, k) for k in limits} == limits == js_presets[name]
            assert t.float_blend is False and t.webgl1 == name.startswith("webgl1")
            prog = _cnn_for(name)
            m = build_bundle(prog).manifest
            assert m["target"]["name"] == name
            assert max(len(p["samplers"]) for p in m["programs"].values()) <= limits["max_texture_units"]
            assert max(p["outputs"] for p in m["programs"].values()) <= limits["max_draw_buffers"]
            assert not any(d.get("blend") for e in m["entries"].values() for d in e["draws"])
            ref = prog.runtime("reference")
            want = [ref.train_step(x=x, y=y) for x, y in batches]
            with gl_runtime(prog) as gl:
                np.testing.assert_allclose(
                    [gl.train_step(x=x, y=y) for x, y in batches], want, rtol=1e-4, atol=1e-5
                )
            if name == "webgl1-mobile":
                _save(prog, site.root / name)
                # a saved preset bundle loads back as the same preset
                assert glcomp.load(site.root / name).options["target"] == name
                feed = [(x.tolist(), y.tolist()) for x, y in batches]
                got = _js(pg, LOAD_JS, {"base": f"/bundle/{name}/", "batches": feed})
                assert "error" not in got, got
                assert got["info"]["webgl"] == 1 and got["info"]["maxTextureUnits"] == 8
                np.testing.assert_allclose(got["losses"], want, rtol=1e-4, atol=1e-5)
        # the webgl2 default (16 units, MRT) does not fit this page; the message points at the preset
        if not (site.root / "limits_webgl1").exists():
            _save(_cnn("webgl1"), site.root / "limits_webgl1")
        msg = _js(pg, LOAD_JS, {"base": "/bundle/limits_webgl1/", "batches": []}).get("error", "")
        assert "WEBGL_draw_buffers" in msg and "target='webgl1-mobile'" in msg, msg
    finally:
        pg.context.close()
