"""Variant sets (glcomp.compile_variants): one model as f32, f16 and rgba8 bundles with their device
requirements; Python forces any variant, glcomp.js (variants.js) probes the device and picks the
first it supports, saying which and why in rt.info().variant. Devices are simulated in Chromium by
hiding extensions and lowering highp precision.

Tolerances per variant against the float32 reference after 3 Adam steps: f32 and rgba8 store
float32 exactly (1e-5 relative); f16 rounds temporaries to half precision (1e-2 on losses, as in
test_storage)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser.support import HIDE, _js

import glcomp
from glcomp import optim
from glcomp.errors import GlcompError

STEPS = 3
LOSS_RTOL = {"f32": 1e-5, "f16": 1e-2, "rgba8": 1e-5}
FLOAT_EXTENSIONS = ["EXT_color_buffer_float", "OES_texture_float", "WEBGL_color_buffer_float"]


def _variants(case: Any, target: str = "webgl2") -> glcomp.VariantSet:
    glcomp.manual_seed(7)
    return glcomp.compile_variants(
        case.build(), case.inputs, loss=case.loss(), optimizer=optim.Adam(lr=0.01), target=target
    )


_SETS: dict[str, glcomp.VariantSet] = {}


def _set(models: Any, target: str = "webgl2") -> glcomp.VariantSet:
    if target not in _SETS:
        _SETS[target] = _variants(models["mlp"], target)
    return _SETS[target]


def test_requirements_per_variant(models: Any):
    vs = _set(models)
    assert vs.names == ["f32", "f16", "rgba8"]
    req = {n: vs.requirements(n) for n in vs.names}
    assert req["f32"]["float_textures"] and not req["f32"]["half_float_textures"]
    assert req["f16"]["float_textures"] and req["f16"]["half_float_textures"]  # states stay RGBA32F
    assert not req["rgba8"]["float_textures"] and not req["rgba8"]["half_float_textures"]
    assert not req["rgba8"]["float_blend"]
    assert {r["webgl"] for r in req.values()} == {2}


def test_saved_set_loads_and_any_variant_can_be_forced(models: Any, gl_runtime: Any, tmp_path: Path):
    case = models["mlp"]
    _set(models).save(tmp_path / "v")
    index = json.loads((tmp_path / "v" / "variants.json").read_text())
    assert [v["name"] for v in index["variants"]] == ["f32", "f16", "rgba8"]
    loaded = glcomp.load_variants(tmp_path / "v")
    ref = loaded.runtime("reference")
    batches = [case.batch(s) for s in range(STEPS)]
    want = [ref.train_step(**feeds, y=y) for feeds, y in batches]
    for name in loaded.names:
        prog = loaded.program(name)
        with gl_runtime(prog) as gl:
            got = [gl.train_step(**feeds, y=y) for feeds, y in batches]
        np.testing.assert_allclose(got, want, rtol=LOSS_RTOL[name], err_msg=name)
    with loaded.runtime("gl", variant="rgba8") as gl:
        assert {t.dtype for t in gl.textures.values()} == {"f1"}
    with pytest.raises(GlcompError, match="no variant 'f64'"):
        loaded.runtime("gl", variant="f64")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ix: ix["variants"][0].update(path="../f32"), "path must be the variant's name"),
        (lambda ix: ix["variants"][1]["requires"].update(float_textures=False), "requires does not match"),
        (lambda ix: ix.update(format="glcomp-bundle"), "format must be 'glcomp-variants'"),
        (lambda ix: ix["variants"][2].update(name="f32"), "must be a new name"),
    ],
    ids=["path", "requires", "format", "duplicate"],
)
def test_bad_index_is_refused(models: Any, tmp_path: Path, change: Any, message: str):
    root = _set(models).save(tmp_path / "v")
    index = json.loads((root / "variants.json").read_text())
    change(index)
    (root / "variants.json").write_text(json.dumps(index))
    with pytest.raises(GlcompError, match=message):
        glcomp.load_variants(root)


def test_compile_variants_refuses_bad_specs(models: Any):
    case = models["mlp"]
    with pytest.raises(GlcompError, match="distinct"):
        glcomp.compile_variants(case.build(), case.inputs, variants=["f32", "f32"])
    with pytest.raises(GlcompError, match="storage must be one of"):
        glcomp.compile_variants(case.build(), case.inputs, variants=["f8"])


# -- choosing in the browser --------------------------------------------------------------------------
PICK_JS = """
const v = await import('/variants.js');
try {
  const rt = await v.loadVariants(arg.base, { quiet: true, variant: arg.variant });
  const losses = [];
  for (const [x, y] of arg.batches) losses.push(await rt.trainStep({ x, y }));
  const info = rt.info();
  rt.dispose();
  return { variant: info.variant, storage: info.storage, losses };
} catch (err) {
  return { error: err.message };
}
"""

PRECISION = """
(() => {
  for (const proto of [WebGLRenderingContext.prototype, WebGL2RenderingContext.prototype]) {
    const get = proto.getShaderPrecisionFormat;
    proto.getShaderPrecisionFormat = function (shader, type) {
      const f = get.call(this, shader, type);
      return type === this.HIGH_FLOAT ? { rangeMin: 15, rangeMax: 15, precision: 10 } : f;
    };
  }
})();
"""


def _pick(browser: Any, site: Any, name: str, hidden: list[str], batches: Any, **kw: Any) -> Any:
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.add_init_script(HIDE % (json.dumps(hidden), "{}"))
        if kw.get("no_highp"):
            pg.add_init_script(PRECISION)
        pg.goto(site.url + "glcomp.js")
        arg = {"base": f"/bundle/{name}/", "batches": batches, "variant": kw.get("variant")}
        return _js(pg, PICK_JS, arg)
    finally:
        context.close()


# (target, hidden extensions, no highp, forced variant) -> the variant chosen, or an error.
DEVICES = [
    ("webgl2", [], False, None, "f32"),
    ("webgl2", ["EXT_color_buffer_float"], False, None, "rgba8"),
    ("webgl1-mobile", ["EXT_color_buffer_half_float"], False, None, "f32"),
    ("webgl2", [], False, "f16", "f16"),
    ("webgl2", [], True, None, "error"),
]


@pytest.mark.browser
@pytest.mark.parametrize(
    ("target", "hidden", "no_highp", "forced", "expect"),
    DEVICES,
    ids=["full", "no-float-targets", "webgl1-no-half", "forced", "no-highp"],
)
def test_browser_picks_the_best_supported_variant(
    browser: Any,
    site: Any,
    models: Any,
    target: str,
    hidden: list[str],
    no_highp: bool,
    forced: str | None,
    expect: str,
) -> None:
    case = models["mlp"]
    vs = _set(models, target)
    name = f"variants_{target}"
    if not (site.root / name / "variants.json").exists():
        vs.save(site.root / name)
    batches = [case.batch(s) for s in range(STEPS)]
    js_batches = [[feeds["x"].ravel().tolist(), y.tolist()] for feeds, y in batches]
    got = _pick(browser, site, name, hidden, js_batches, no_highp=no_highp, variant=forced)
    if expect == "error":
        assert "error" in got and got["error"].startswith("this browser can run none"), got
        assert all(n in got["error"] for n in vs.names) and "highp" in got["error"], got
        return
    assert "error" not in got, got
    variant = got["variant"]
    assert variant["name"] == expect and got["storage"] == expect, got
    before = vs.names[: vs.names.index(expect)] if forced is None else []
    assert [s["name"] for s in variant["skipped"]] == before, variant
    for s in variant["skipped"]:
        assert "lacks" in s["reason"] and any(h in s["reason"] for h in hidden), s
    assert ("forced" in variant["reason"]) == (forced is not None), variant
    ref = vs.program(expect).runtime("reference")
    want = [ref.train_step(**feeds, y=y) for feeds, y in batches]
    np.testing.assert_allclose(got["losses"], want, rtol=LOSS_RTOL[expect])
