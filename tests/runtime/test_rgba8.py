"""RGBA8 storage (``glcomp.compile(..., storage="rgba8")``): every texture holds float32 values as
their 4 bytes in RGBA8 texels (4x wider textures), decoded on read and encoded on write by the
shaders, so a bundle needs no float texture extension at all.

Tolerance against the float32 reference runtime: storage is exact (every finite float32 round
trips bit for bit, in both dialects), so rgba8 bundles train as float32 GL bundles do: losses at
rtol 1e-5 and states within 1e-5 of their largest element after a few Adam steps (the largest
deviation measured on the test models is about 1e-7, float32 rounding in the shaders' arithmetic).
"""

from __future__ import annotations

import copy
import json
from typing import Any

import numpy as np
import pytest
from browser.support import HIDE, _js
from codegen.test_matmul_tiled import Product, SumLoss, check, tiled_shapes
from conftest import DIALECTS, train_both

from glcomp import optim
from glcomp.codegen.families import environment
from glcomp.codegen.schema import bundle_files
from glcomp.errors import GlcompError
from glcomp.format import texture_bytes, validate_manifest

STEPS = 3
LOSS_RTOL = 1e-5
STATE_RTOL = 1e-5


def _shader(webgl1: bool, width: int, height: int) -> str:
    """A draw that reads logical texel (x, y) of s0 and writes it back: one decode and encode."""
    prelude = (
        environment()
        .get_template("_prelude.j2")
        .render(
            webgl1=webgl1,
            rgba8=True,
            outputs=[{}],
            samplers=["s0"],
            uniforms=[],
            ints=[],
            origins=[],
            kernel_name="copy",
            node_ids="",
        )
    )
    out = "gl_FragColor" if webgl1 else "glc_out0"
    return prelude + (
        "void main() {\n"
        "  int px = int(gl_FragCoord.x);\n"
        f"  vec4 v = glc_texel(s0, px / 4, int(gl_FragCoord.y), {width}, {height});\n"
        f"  {out} = glc_encode(glc_pick(v, px - (px / 4) * 4));\n"
        "}\n"
    )


def _round_trip(gl_ctx: Any, bits: np.ndarray, webgl1: bool, width: int) -> np.ndarray:
    """Draw `bits` (float32 bit patterns, 4 per logical texel) through decode and encode."""
    import moderngl

    from glcomp.codegen.render import vertex_shader
    from glcomp.codegen.target import make_target
    from glcomp.runtime.gl import _QUAD, current_context

    height = bits.size // (4 * width)
    size = (4 * width, height)
    with current_context(gl_ctx):
        ctx = gl_ctx
        objects = [
            ctx.texture(size, 4, data=bits.astype("<u4").tobytes(), dtype="f1"),
            ctx.texture(size, 4, dtype="f1"),
        ]
        src, dst = objects
        for tex in objects:
            tex.filter = (moderngl.NEAREST, moderngl.NEAREST)
        vert = vertex_shader(make_target("webgl1" if webgl1 else "webgl2"))
        prog = ctx.program(vertex_shader=vert, fragment_shader=_shader(webgl1, width, height))
        vbo = ctx.buffer(_QUAD.tobytes())
        vao = ctx.vertex_array(prog, [(vbo, "2f", "a_position")])
        fbo = ctx.framebuffer(color_attachments=[dst])
        objects += [prog, vbo, vao, fbo]
        try:
            prog["s0"].value = 0
            src.use(location=0)
            fbo.use()
            ctx.viewport = (0, 0, *size)
            ctx.disable(moderngl.BLEND)
            vao.render(moderngl.TRIANGLES, vertices=3)
            return np.frombuffer(dst.read(), "<u4").copy()
        finally:
            for obj in reversed(objects):
                obj.release()


SPECIAL = np.array(
    [
        0x00000000,  # +0
        0x80000000,  # -0
        0x00000001,  # smallest denormal
        0x807FFFFF,  # largest negative denormal
        0x00800000,  # smallest normal
        0x80800000,
        0x7F7FFFFF,  # largest finite
        0xFF7FFFFF,
        0x7F800000,  # +inf
        0xFF800000,  # -inf
        0x7FC00000,  # quiet NaN
        0x3F800000,  # 1
        0x3F800001,  # 1 + ulp
        0x3FFFFFFF,  # just below 2
        0x4B7FFFFF,  # 2^24 - 1
        0x33800000,  # 2^-24
    ],
    dtype=np.uint32,
)


def _patterns() -> np.ndarray:
    rng = np.random.default_rng(0)
    random = rng.integers(0, 1 << 32, size=4096 - SPECIAL.size, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([SPECIAL, random])


def _kinds(bits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    return exponent, mantissa


@pytest.mark.parametrize("dialect", DIALECTS)
def test_shader_round_trip_is_exact(gl_ctx: Any, dialect: str):
    """Every float32 bit pattern read and written by a shader comes back as it was, except as
    documented: NaN stays NaN (payload not kept); in GLSL ES 1.00, zeros and denormals come back
    as a zero (the sign of zero may be lost)."""
    bits = _patterns()
    got = _round_trip(gl_ctx, bits, dialect == "webgl1", width=64)
    exponent, mantissa = _kinds(bits)
    nan = (exponent == 0xFF) & (mantissa != 0)
    got_e, got_m = _kinds(got)
    assert np.all((got_e[nan] == 0xFF) & (got_m[nan] != 0)), "a NaN did not stay NaN"
    tiny = exponent == 0
    if dialect == "webgl1":
        assert np.all(got[tiny] & 0x7FFFFFFF == 0), "a zero or denormal did not come back as zero"
        exact = ~nan & ~tiny
    else:
        exact = ~nan
    wrong = np.flatnonzero(got[exact] != bits[exact])
    assert wrong.size == 0, [f"{bits[exact][i]:08x} -> {got[exact][i]:08x}" for i in wrong[:8]]
    assert exact.sum() > 3000  # most patterns are ordinary floats, compared bit for bit


# (model, dialect): every test model in GLSL ES 3.00, the CNN and the LSTM in GLSL ES 1.00 too
# (the MLP runs on the webgl1-mobile preset below). The GLSL ES 1.00 LSTM (its shaders take the
# longest to build) runs with `--slow`; the CNN checks that dialect's decoder in loops meanwhile.
PARITY = [("mlp", "webgl2"), ("cnn", "webgl2"), ("lstm", "webgl2"), ("activations", "webgl2")]
PARITY += [("cnn", "webgl1"), pytest.param("lstm", "webgl1", marks=pytest.mark.slow_only, id="lstm-webgl1")]


@pytest.mark.parametrize(("name", "dialect"), PARITY)
def test_rgba8_bundle_trains_like_the_reference(models: Any, gl_runtime: Any, name: str, dialect: str):
    case = models[name]
    prog = case.compile(dialect, optim.Adam(lr=0.01), storage="rgba8")
    m = prog.bundle().manifest
    assert {t.get("format") for t in m["textures"].values()} == {"rgba8"}
    with gl_runtime(prog) as gl:
        # No float texture at all: every GL texture is RGBA8, 4x as wide as its record.
        assert {tex.dtype for tex in gl.textures.values()} == {"f1"}
        assert all(gl.textures[n].width == 4 * t["width"] for n, t in m["textures"].items())
        got, want = train_both(case, prog, gl, STEPS, STATE_RTOL, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL, err_msg="loss per step")


def test_rgba8_mobile_webgl1_sgd(models: Any, gl_runtime: Any):
    """The weakest preset (one draw buffer, 8 units, 2048-texel textures) with momentum SGD."""
    case = models["mlp"]
    prog = case.compile("webgl1-mobile", optim.SGD(lr=0.1, momentum=0.9), storage="rgba8")
    with gl_runtime(prog) as gl:
        got, want = train_both(case, prog, gl, STEPS, STATE_RTOL, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, want, rtol=LOSS_RTOL, err_msg="loss per step")


def test_rgba8_plans_for_a_quarter_of_the_texture_size(models: Any):
    """Layouts keep to max_texture_size / 4 so the 4x wider GL textures fit the device; the
    manifest records the device's own limits."""
    case = models["cnn"]
    limit = 32
    m = case.compile("webgl2", optim.SGD(lr=0.1), storage="rgba8", max_texture_size=limit).bundle().manifest
    assert m["target"]["max_texture_size"] == limit
    assert max(4 * t["width"] for t in m["textures"].values()) <= limit
    assert max(t["height"] for t in m["textures"].values()) <= limit // 4


def test_rgba8_never_blends(models: Any):
    """Blending adds bytes, not floats: with rgba8 storage the blend pass is off."""
    passes = {"pushdown": True, "mrt": False, "epilogue": False, "join_sums": False}
    case = models["lstm"]
    f32 = case.compile("webgl2", optim.Adam(lr=0.01), passes=passes).bundle().manifest
    assert any(d["blend"] for d in f32["entries"]["train_step"]["draws"])  # blending fires in f32
    m = case.compile("webgl2", optim.Adam(lr=0.01), passes=passes, storage="rgba8").bundle().manifest
    assert not any(d["blend"] for e in m["entries"].values() for d in e["draws"])


def test_rgba8_never_tiles(force: Any, gl_runtime: Any):
    """Tiled matmul draws write float texels of their own (no byte encoding): with rgba8 storage
    the tiling pass is off, even where it fires for float32, and the product stays exact."""
    import glcomp

    force((2, 2))
    shapes = {"x": (5, 7)}
    options = dict(loss=SumLoss(), target="webgl2", max_draw_buffers=8)
    assert tiled_shapes(glcomp.compile(Product(7, 9, "stored"), shapes, **options))  # tiles in f32
    prog = glcomp.compile(Product(7, 9, "stored"), shapes, storage="rgba8", **options)
    assert not tiled_shapes(prog)
    check(prog, gl_runtime, (5, 9))


def test_rgba8_bundle_saves_and_resumes(models: Any, gl_runtime: Any, tmp_path: Any):
    import glcomp

    case = models["mlp"]
    prog = case.compile("webgl2", optim.Adam(lr=0.01), storage="rgba8")
    feeds, y = case.batch(0)
    with gl_runtime(prog) as gl:
        gl.train_step(**feeds, y=y)
        gl.save(tmp_path / "b")
        after = gl.train_step(**feeds, y=y)
    loaded = glcomp.load(tmp_path / "b")
    assert loaded.bundle().manifest["textures"] == prog.bundle().manifest["textures"]
    with gl_runtime(loaded) as gl:
        assert gl.train_step(**feeds, y=y) == after


def _rgba8_manifest(case: Any) -> tuple[dict[str, Any], set[str]]:
    bundle = case.compile("webgl2", optim.Adam(lr=0.01), storage="rgba8").bundle()
    return json.loads(bundle_files(bundle)["manifest.json"].decode()), set(bundle.shaders)


def _too_wide(m: dict[str, Any]) -> None:
    name = next(iter(m["textures"]))
    m["textures"][name]["width"] = m["target"]["max_texture_size"]


def _one_f32(m: dict[str, Any]) -> None:
    del next(iter(m["textures"].values()))["format"]


def _blend(m: dict[str, Any]) -> None:
    m["entries"]["train_step"]["draws"][0]["blend"] = True


BAD_MANIFESTS = {
    "too wide": (_too_wide, "an rgba8 texture is 4x its width wide"),
    "mixed formats": (_one_f32, "either every texture is rgba8 or none is"),
    "blended": (_blend, "rgba8 render targets cannot be blended"),
}


@pytest.mark.parametrize("what", sorted(BAD_MANIFESTS))
def test_validator_rejects_bad_rgba8(models: Any, what: str):
    manifest, names = _rgba8_manifest(models["mlp"])
    validate_manifest(manifest, names)  # the compiled one is valid, states and inputs included
    change, message = BAD_MANIFESTS[what]
    m = copy.deepcopy(manifest)
    change(m)
    with pytest.raises(GlcompError, match=message):
        validate_manifest(m, names)


def test_rgba8_costs_sixteen_bytes_a_texel(models: Any):
    m, _ = _rgba8_manifest(models["mlp"])
    want = sum(16 * t["width"] * t["height"] for t in m["textures"].values())
    assert m["memory"]["texture_bytes"] == texture_bytes(m) == want


# -- the browser runtime ------------------------------------------------------------------------------
# Every float-texture extension a WebGL implementation may offer: hidden, as on a device without any.
FLOAT_EXTENSIONS = [
    "EXT_color_buffer_float",
    "EXT_color_buffer_half_float",
    "EXT_float_blend",
    "OES_texture_float",
    "OES_texture_float_linear",
    "OES_texture_half_float",
    "OES_texture_half_float_linear",
    "WEBGL_color_buffer_float",
]

BROWSER_JS = """
// Count texture allocations by kind: RGBA8 bytes, or anything float.
const count = { bytes: 0, float: 0 };
const storage = WebGL2RenderingContext.prototype.texStorage2D;
WebGL2RenderingContext.prototype.texStorage2D = function (t, l, fmt, ...rest) {
  count[fmt === this.RGBA8 ? "bytes" : "float"]++;
  return storage.call(this, t, l, fmt, ...rest);
};
const image = WebGLRenderingContext.prototype.texImage2D;
WebGLRenderingContext.prototype.texImage2D = function (...args) {
  if (args.length === 9) count[args[7] === this.UNSIGNED_BYTE ? "bytes" : "float"]++;
  return image.apply(this, args);
};
const rt = await g.Runtime.load(arg.base, { quiet: true });
const losses = [];
for (const [x, y] of arg.batches) losses.push(await rt.trainStep({ x, y }));
const pred = await rt.predict({ x: arg.batches[0][0] });
const w = rt.getWeights();
const info = rt.info();
rt.dispose();
const weights = Object.fromEntries(Object.entries(w).map(([k, t]) => [k, Array.from(t.data, Number)]));
return { losses, pred: Array.from(pred.data), weights, count, info, webgl: info.webgl };
"""


@pytest.mark.browser
@pytest.mark.parametrize(
    ("model", "target"),
    [("cnn", "webgl2"), ("mlp", "webgl2"), ("cnn", "webgl1"), ("mlp", "webgl1"), ("mlp", "webgl1-mobile")],
)
def test_rgba8_trains_in_chromium_without_float_extensions(
    browser: Any,
    site: Any,
    gl_runtime: Any,
    models: Any,
    model: str,
    target: str,
) -> None:
    """With every float-texture extension hidden (and WEBGL_draw_buffers too for webgl1-mobile,
    whose draws write one output each), an rgba8 bundle loads, allocates only RGBA8 textures and
    trains as the moderngl runtime does, in WebGL 2 and in WebGL 1 (GLSL ES 1.00, arithmetic
    decoding).

    The WebGL 1 bundles once took SwiftShader about 5 minutes to build their pipelines (the
    decoder's conditionals, inlined at every read inside loop bodies), after which the context was
    lost and the first step read back a loss of 0; they now load and train in seconds. The LSTM is
    left out to keep this test fast (its 40 rgba8 programs train in Chromium too, in about 12 s as a
    WebGL 1 bundle)."""
    case = models[model]
    prog = case.compile(target, optim.Adam(lr=0.01), storage="rgba8")
    name = f"rgba8_{model}_{target}"
    prog.save(site.root / name)
    batches = [case.batch(s) for s in range(STEPS)]
    with gl_runtime(prog) as gl:
        want = [gl.train_step(**feeds, y=y) for feeds, y in batches]
        want_pred = gl.predict(**batches[0][0])
        want_state = gl.state_dict()
    hidden = FLOAT_EXTENSIONS + (["WEBGL_draw_buffers"] if target == "webgl1-mobile" else [])
    context = browser.new_context()
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        # WebGL errors and performance warnings reach the console only (as in the `page` fixture)
        pg.on("console", lambda m: errors.append(m.text) if "GL" in m.text or "warning" in m.text else None)
        pg.add_init_script(HIDE % (json.dumps(hidden), "{}"))
        pg.goto(site.url + "glcomp.js")
        arg = {
            "base": f"/bundle/{name}/",
            "batches": [[feeds["x"].ravel().tolist(), y.tolist()] for feeds, y in batches],
        }
        got = _js(pg, BROWSER_JS, arg)
    finally:
        context.close()
    m = prog.bundle().manifest
    assert got["webgl"] == (1 if target.startswith("webgl1") else 2)
    assert got["info"]["storage"] == "rgba8"
    assert got["count"] == {"bytes": len(m["textures"]), "float": 0}
    np.testing.assert_allclose(got["losses"], want, rtol=LOSS_RTOL, err_msg="loss per step")
    np.testing.assert_allclose(np.reshape(got["pred"], want_pred.shape), want_pred, rtol=1e-5, atol=1e-6)
    for k, v in want_state.items():
        w = np.reshape(got["weights"][k], v.shape)
        assert np.abs(w - v).max() <= STATE_RTOL * (float(np.abs(v).max()) or 1.0), k
    assert not [e for e in errors if "Performance" not in e], errors


@pytest.mark.browser
def test_browser_validator_rejects_bad_rgba8(browser: Any, site: Any, models: Any) -> None:
    """glcomp.js's validateManifest rejects the rgba8 manifests glcomp's own validator rejects."""
    manifest, names = _rgba8_manifest(models["mlp"])
    bad = {}
    for what, (change, _) in BAD_MANIFESTS.items():
        m = copy.deepcopy(manifest)
        change(m)
        bad[what] = m
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(site.url + "glcomp.js")
        got = _js(
            pg,
            """
          const out = { good: null };
          try { g.validateManifest(arg.good, arg.names); } catch (err) { out.good = err.message; }
          for (const [what, m] of Object.entries(arg.bad)) {
            try { g.validateManifest(m, arg.names); out[what] = null; }
            catch (err) { out[what] = err.message; }
          }
          return out;
        """,
            {"good": manifest, "names": sorted(names), "bad": bad},
        )
    finally:
        context.close()
    assert got.pop("good") is None
    for what, (_, message) in BAD_MANIFESTS.items():
        assert got[what] is not None and message in got[what], f"{what}: {got[what]!r}"


# Draw the bit patterns through glc_decode / glc_encode in a bare WebGL 1 context.
ROUND_TRIP_JS = """([vert, frag, bits, W, H]) => {
 const c = document.createElement('canvas'); const gl = c.getContext('webgl');
 const mk = (t, s) => { const sh = gl.createShader(t);
 gl.shaderSource(sh, s);
 gl.compileShader(sh);
 if (!gl.getShaderParameter(sh, gl.COMPILE_STATUS)) throw new Error(gl.getShaderInfoLog(sh));
 return sh;
 };
 const p = gl.createProgram();
 gl.attachShader(p, mk(gl.VERTEX_SHADER, vert));
 gl.attachShader(p, mk(gl.FRAGMENT_SHADER, frag));
 gl.bindAttribLocation(p, 0, 'a_position');
 gl.linkProgram(p);
 if (!gl.getProgramParameter(p, gl.LINK_STATUS)) throw new Error(gl.getProgramInfoLog(p));
 const tex = () => { const t = gl.createTexture(); gl.bindTexture(gl.TEXTURE_2D, t);
   for (const k of [gl.TEXTURE_MIN_FILTER, gl.TEXTURE_MAG_FILTER])
     gl.texParameteri(gl.TEXTURE_2D, k, gl.NEAREST);
   for (const k of [gl.TEXTURE_WRAP_S, gl.TEXTURE_WRAP_T])
     gl.texParameteri(gl.TEXTURE_2D, k, gl.CLAMP_TO_EDGE);
   return t;
   };
 const src = tex();
 const bytes = new Uint8Array(new Uint32Array(bits).buffer);
 gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA, 4*W, H, 0, gl.RGBA, gl.UNSIGNED_BYTE, bytes);
 const dst = tex();
 gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA, 4*W, H, 0, gl.RGBA, gl.UNSIGNED_BYTE, null);
 const fb = gl.createFramebuffer();
 gl.bindFramebuffer(gl.FRAMEBUFFER, fb);
 gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, dst, 0);
 const st = gl.checkFramebufferStatus(gl.FRAMEBUFFER);
 const b = gl.createBuffer();
 gl.bindBuffer(gl.ARRAY_BUFFER, b);
 gl.bufferData(gl.ARRAY_BUFFER, new Float32Array([-1,-1,3,-1,-1,3]), gl.STATIC_DRAW);
 gl.enableVertexAttribArray(0); gl.vertexAttribPointer(0, 2, gl.FLOAT, false, 0, 0);
 gl.useProgram(p);
 gl.activeTexture(gl.TEXTURE0);
 gl.bindTexture(gl.TEXTURE_2D, src);
 gl.uniform1i(gl.getUniformLocation(p, 's0'), 0);
 gl.viewport(0, 0, 4*W, H); gl.drawArrays(gl.TRIANGLES, 0, 3);
 const out = new Uint8Array(4*W*H*4); gl.readPixels(0, 0, 4*W, H, gl.RGBA, gl.UNSIGNED_BYTE, out);
 return [st, gl.getError(), Array.from(new Uint32Array(out.buffer))];
}"""


@pytest.mark.browser
def test_chromium_webgl1_round_trip_is_exact(browser: Any) -> None:
    """The GLSL ES 1.00 arithmetic decoder and encoder are exact on SwiftShader too, and keep to
    the documented special cases there: +-inf exactly, NaN stays NaN, zeros and denormals come
    back as a zero."""
    from glcomp.codegen.render import vertex_shader
    from glcomp.codegen.target import make_target

    bits, (w, h) = _patterns(), (64, 16)
    context = browser.new_context()
    try:
        pg = context.new_page()
        vert, frag = vertex_shader(make_target("webgl1")), _shader(True, w, h)
        status, error, out = pg.evaluate(ROUND_TRIP_JS, [vert, frag, bits.tolist(), w, h])
    finally:
        context.close()
    assert (status, error) == (0x8CD5, 0)  # FRAMEBUFFER_COMPLETE, NO_ERROR
    got = np.array(out, np.uint32)
    exponent, mantissa = _kinds(bits)
    got_e, got_m = _kinds(got)
    nan = (exponent == 0xFF) & (mantissa != 0)
    assert np.all((got_e[nan] == 0xFF) & (got_m[nan] != 0)), "a NaN did not stay NaN"
    tiny = exponent == 0
    assert np.all(got[tiny] & 0x7FFFFFFF == 0), "a zero or denormal did not come back as zero"
    exact = ~nan & ~tiny  # normal floats and +-inf
    wrong = np.flatnonzero(got[exact] != bits[exact])
    assert wrong.size == 0, [f"{bits[exact][i]:08x} -> {got[exact][i]:08x}" for i in wrong[:8]]


@pytest.mark.browser
def test_incomplete_rgba8_framebuffer_is_reported_as_a_lost_device(
    browser: Any,
    site: Any,
    models: Any,
) -> None:
    """An RGBA8 framebuffer is complete on every WebGL implementation, so FRAMEBUFFER_UNSUPPORTED
    there means a device lost before WebGL says so (as after a long pipeline build on SwiftShader,
    when the step before had read back zeros): the error says that, not that float render targets
    are unsupported."""
    case = models["mlp"]
    name = "rgba8_mlp_unsupported"
    case.compile("webgl2", optim.Adam(lr=0.01), storage="rgba8").save(site.root / name)
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.add_init_script(
            "WebGL2RenderingContext.prototype.checkFramebufferStatus = function () {"
            " return this.FRAMEBUFFER_UNSUPPORTED; };"
        )
        pg.goto(site.url + "glcomp.js")
        feeds, y = case.batch(0)
        msg = _js(
            pg,
            """
          // Framebuffers are made (and checked) at load: the error may come from load or a step.
          let rt = null;
          try {
            rt = await g.Runtime.load(arg.base, { quiet: true });
            await rt.trainStep({ x: arg.x, y: arg.y });
            return null;
          } catch (err) { return err.message; } finally { if (rt) rt.dispose(); }
        """,
            {"base": f"/bundle/{name}/", "x": feeds["x"].ravel().tolist(), "y": y.tolist()},
        )
    finally:
        context.close()
    assert msg is not None, "a draw into an incomplete framebuffer went ahead"
    assert "the RGBA8 render targets ['" in msg and "framebuffer status 0x8cdd" in msg, msg
    assert "context is most likely lost" in msg and "float render targets" not in msg, msg
