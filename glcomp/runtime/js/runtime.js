// The browser runtime: runs a validated bundle's entry points with WebGL exactly as
// glcomp/runtime/gl.py does with moderngl.
import { TEXEL_BYTES, texelSpan, textureFormat } from "./format/manifest.js";
import { pack, unpack } from "./format/packing.js";
import { parseSafetensors, writeSafetensors } from "./format/parse.js";
import { checkFeeds, loadBundle, nestedShape } from "./io.js";
import { inspectTensor, visibleOutputs } from "./inspect.js";
import { isFrames, uploadFrames } from "./frames.js";
import {
  GlcompError, fmtList, fmtShape, isInt, isObj, maxOf, nextFrame, nextTask, prod, repr, sameList, sleep,
} from "./util.js";

/** Whether this runs in a page that is hidden (a background tab); false in a worker. */
const pageHidden = () => typeof document !== "undefined" && document.hidden === true;

const QUAD = new Float32Array([-1, -1, 3, -1, -1, 3]); // one triangle covers the viewport
const SOFTWARE_RE = /swiftshader|llvmpipe|softpipe|software|basic render|lavapipe|swrast/i;
const CAVEATS = {}; // "webgl" / "webgl2" -> the probe's answer, once per page or worker

/** Whether the browser refuses a context created with failIfMajorPerformanceCaveat (it would be
 *  a software renderer, or a GPU too slow to count): true, false, or null where no canvas can be
 *  made. The probe's own context is released at once (WEBGL_lose_context). */
function majorPerformanceCaveat(kind) {
  if (kind in CAVEATS) return CAVEATS[kind];
  let canvas = null;
  if (typeof document !== "undefined") canvas = document.createElement("canvas");
  else if (typeof OffscreenCanvas === "function") canvas = new OffscreenCanvas(1, 1);
  let answer = null;
  if (canvas) {
    canvas.width = canvas.height = 1;
    const probe = canvas.getContext(kind, { failIfMajorPerformanceCaveat: true });
    answer = !probe;
    probe?.getExtension("WEBGL_lose_context")?.loseContext();
  }
  CAVEATS[kind] = answer;
  return answer;
}

// -- the runtime -------------------------------------------------------------------------------
/** WebGL wants #version on the very first line; drop blank lines in front of it. Returns the
 *  source and how many lines were dropped (to map driver line numbers back to the file). */
function versionFirst(source) {
  const lead = /^\s*/.exec(source)[0];
  if (!lead || !source.startsWith("#version", lead.length)) return [source, 0];
  return [source.slice(lead.length), lead.split("\n").length - 1];
}

function compileError(kernel, source, log) {
  const header = source.split("\n").slice(0, 12).filter((l) => l.startsWith("//")).join("\n");
  const found = /0:(\d+)/.exec(log || "");
  let line = "";
  if (found) {
    const n = Number(found[1]) + versionFirst(source)[1];
    const lines = source.split("\n");
    if (n > 0 && n <= lines.length) line = `\nGLSL line ${n}: ${lines[n - 1].trim()}`;
  }
  return new GlcompError(`shader for kernel ${kernel} failed to compile or link:\n${header}${line}\ndriver: ${log}`);
}

// The mobile target presets of glcomp/codegen/target.py (suggested when a bundle does not fit).
export const PRESETS = {
  "webgl1-mobile": { max_texture_size: 2048, max_draw_buffers: 1, max_texture_units: 8 },
  "webgl2-mobile": { max_texture_size: 4096, max_draw_buffers: 4, max_texture_units: 16 },
};

const KINDS = ["textures", "framebuffers", "programs", "shaders", "buffers", "syncs"];

/** Runs a glcomp bundle with WebGL 2 (GLSL ES 3.00 bundles) or WebGL 1 (GLSL ES 1.00 bundles). */
export class Runtime {
  /** `source`: a base URL ("bundle/") or the bundle's files. Options: `canvas` (a canvas to take
   *  the context from), `readback` ("async" (default on WebGL 2) or "sync"), `contextAttributes`. */
  static async load(source, options = {}) {
    const bundle = await loadBundle(source, options);
    const rt = new Runtime(bundle, options);
    try {
      await rt._init();
    } catch (err) {
      rt.dispose();
      throw err;
    }
    return rt;
  }

  constructor(bundle, options = {}) {
    this.bundle = bundle;
    this.manifest = bundle.manifest;
    this.options = options;
    this.hyper = { ...this.manifest.hyper };
    this.counters = { ...bundle.counters };
    this.parity = Object.fromEntries(Object.keys(this.manifest.states).map((k) => [k, 0]));
    this.textures = new Map();
    this.programs = new Map();
    this._fbos = new Map();
    this._completeFbos = new Set(); // attachment signatures (formats, sizes) found complete
    this._readFbos = new Map();
    this._live = new Set(); // every GL object this runtime created and has not deleted
    this._liveCount = Object.fromEntries(KINDS.map((k) => [k, 0]));
    this._checkedEntries = new Set();
    this._disposed = false;
    this._lost = false;
    this.drawCalls = 0;
    /** Train steps run since load (trainStep and train), including those lost with the context. */
    this.steps = 0;
    /** Called as onContextLost({steps, kept}) when the WebGL context is lost: `kept` is the step
     *  of the weights restore() will bring back. Set it here or with the load option. */
    this.onContextLost = options.onContextLost ?? null;
    this._keepEvery = options.keepWeightsEvery ?? 100;
    if (!isInt(this._keepEvery) || this._keepEvery < 0) {
      throw new GlcompError(`keepWeightsEvery must be a non-negative integer, got ${repr(this._keepEvery)}`);
    }
    // The weights restore() re-uploads after a context loss: the bundle's until something newer
    // is read back (see snapshot()).
    this._kept = { steps: 0, weights: bundle.weights, counters: { ...bundle.counters } };
  }

  // -- setup ------------------------------------------------------------------------------------
  _track(kind, obj) {
    if (!obj) throw this._lostOr(new GlcompError(`WebGL could not create a ${kind.slice(0, -1)}`));
    this._live.add(obj);
    obj.__glcompKind = kind;
    this._liveCount[kind]++;
    return obj;
  }
  _untrack(obj) {
    if (obj && this._live.delete(obj)) this._liveCount[obj.__glcompKind]--;
  }
  _lostOr(err) {
    return this.gl && (this._lost || this.gl.isContextLost()) ? this._lostError() : err;
  }
  _lostError() {
    const err = new GlcompError(`the WebGL context was lost (after ${this.steps} train steps; the weights of step `
      + `${this._kept.steps} are kept: call restore() once the canvas fires webglcontextrestored)`);
    err.reason = "context-lost";
    return err;
  }

  _createContext() {
    const m = this.manifest;
    const webgl1 = m.target.glsl_version === "100";
    let canvas = this.options.canvas;
    if (!canvas) {
      canvas = typeof document !== "undefined" ? document.createElement("canvas") : new OffscreenCanvas(1, 1);
      canvas.width = canvas.height = 1;
      this._ownCanvas = true;
    }
    this.canvas = canvas;
    const attrs = { alpha: true, antialias: false, depth: false, stencil: false, premultipliedAlpha: false,
      preserveDrawingBuffer: false, powerPreference: "high-performance", ...this.options.contextAttributes };
    const gl = canvas.getContext(webgl1 ? "webgl" : "webgl2", attrs)
      || (webgl1 ? canvas.getContext("experimental-webgl", attrs) : null);
    if (!gl) {
      throw new GlcompError(webgl1
        ? "this browser offers no WebGL context (WebGL is disabled or unsupported)"
        : "this browser offers no WebGL 2 context; compile the model with target='webgl1' for WebGL 1");
    }
    this.gl = gl;
    this.webgl2 = !webgl1;
    this._onLost = (ev) => {
      ev.preventDefault(); // without this the browser never restores the context
      if (this._disposed || this._lost) return;
      this._lost = true;
      if (this.onContextLost) {
        try {
          this.onContextLost({ steps: this.steps, kept: this._kept.steps });
        } catch (err) {
          if (typeof console !== "undefined") console.error(err);
        }
      }
    };
    canvas.addEventListener?.("webglcontextlost", this._onLost);
    this._checkDevice();
  }

  /** Query the context's extensions and limits and refuse a bundle that needs more, naming each
   *  limit, what the bundle needs and what the device has. Run again after a context restore
   *  (extension objects do not survive a loss). */
  _checkDevice() {
    const gl = this.gl;
    const m = this.manifest;
    const dbg = gl.getExtension("WEBGL_debug_renderer_info");
    const renderer = dbg ? gl.getParameter(dbg.UNMASKED_RENDERER_WEBGL) : gl.getParameter(gl.RENDERER);
    const vendor = dbg ? gl.getParameter(dbg.UNMASKED_VENDOR_WEBGL) : gl.getParameter(gl.VENDOR);
    // failIfMajorPerformanceCaveat tells where the renderer string is masked
    const performanceCaveat = majorPerformanceCaveat(this.webgl2 ? "webgl2" : "webgl");
    const software = SOFTWARE_RE.test(`${renderer} ${vendor}`) || performanceCaveat === true;
    const lacks = [];
    const ext = {};
    const progs = Object.entries(m.programs);
    const outputs = maxOf(progs.map(([, p]) => p.outputs), 1);
    const samplers = maxOf(progs.map(([, p]) => p.samplers.length), 0);
    const kernelOf = Object.create(null);
    for (const e of Object.values(m.entries)) for (const d of e.draws) kernelOf[d.program] ??= d.kernel;
    const which = (pid) => `program ${pid}${kernelOf[pid] ? ` (kernel ${kernelOf[pid]})` : ""}`;
    // Additive blending into RGBA32F needs EXT_float_blend; into RGBA16F it comes with the
    // extensions that make RGBA16F renderable.
    const isF32 = (r) => typeof r !== "string" || textureFormat(m.textures[r]) === "f32";
    const blend = Object.values(m.entries).some((e) => e.draws.some((d) => d.blend === true && d.targets.some(isF32)));
    const half = Object.values(m.textures).some((t) => textureFormat(t) === "f16");
    // storage="rgba8": every texture RGBA8, no float texture extension needed.
    const bytes = Object.values(m.textures).some((t) => textureFormat(t) === "rgba8");
    if (bytes) {
      if (!this.webgl2 && outputs > 1) {
        ext.drawBuffers = gl.getExtension("WEBGL_draw_buffers");
        if (!ext.drawBuffers) lacks.push(`WEBGL_draw_buffers (programs write ${outputs} outputs per draw)`);
      }
    } else if (this.webgl2) {
      ext.colorBufferFloat = gl.getExtension("EXT_color_buffer_float");
      if (!ext.colorBufferFloat) {
        lacks.push("EXT_color_buffer_float (rendering into RGBA32F float textures; storage='rgba8' needs none)");
      }
    } else {
      ext.textureFloat = gl.getExtension("OES_texture_float");
      if (!ext.textureFloat) lacks.push("OES_texture_float (float textures; storage='rgba8' needs none)");
      ext.colorBufferFloat = gl.getExtension("WEBGL_color_buffer_float") || gl.getExtension("EXT_color_buffer_float");
      if (!ext.colorBufferFloat) lacks.push("WEBGL_color_buffer_float (rendering into float textures)");
      if (half) {
        // A bundle compiled with storage="f16": RGBA16F temporaries (WebGL 2 has them in core,
        // rendering into them comes with EXT_color_buffer_float).
        ext.textureHalfFloat = gl.getExtension("OES_texture_half_float");
        if (!ext.textureHalfFloat) {
          lacks.push("OES_texture_half_float (half-float textures; compile with storage='f32' for this device)");
        }
        ext.colorBufferHalfFloat = gl.getExtension("EXT_color_buffer_half_float");
        if (!ext.colorBufferHalfFloat) {
          lacks.push("EXT_color_buffer_half_float (rendering into half-float textures; compile with storage='f32' "
            + "for this device)");
        }
      }
      if (outputs > 1) {
        ext.drawBuffers = gl.getExtension("WEBGL_draw_buffers");
        if (!ext.drawBuffers) lacks.push(`WEBGL_draw_buffers (programs write ${outputs} outputs per draw)`);
      }
    }
    if (blend) {
      ext.floatBlend = gl.getExtension("EXT_float_blend");
      if (!ext.floatBlend) lacks.push("EXT_float_blend (additive blending into float textures)");
    }
    ext.parallel = gl.getExtension("KHR_parallel_shader_compile");
    const maxTex = gl.getParameter(gl.MAX_TEXTURE_SIZE);
    let maxDraw = 1;
    let drawLimits = "";
    if (this.webgl2 || ext.drawBuffers) {
      const [db, ca] = this.webgl2 ? [gl.MAX_DRAW_BUFFERS, gl.MAX_COLOR_ATTACHMENTS]
        : [ext.drawBuffers.MAX_DRAW_BUFFERS_WEBGL, ext.drawBuffers.MAX_COLOR_ATTACHMENTS_WEBGL];
      const [nd, nc] = [gl.getParameter(db), gl.getParameter(ca)];
      maxDraw = Math.min(nd, nc);
      drawLimits = `MAX_DRAW_BUFFERS ${nd}, MAX_COLOR_ATTACHMENTS ${nc}`;
    }
    const maxUnits = gl.getParameter(gl.MAX_TEXTURE_IMAGE_UNITS);
    const viewport = gl.getParameter(gl.MAX_VIEWPORT_DIMS);
    const hint = {}; // target limits that would fit this device
    const [bigName, big] = Object.entries(m.textures).reduce((a, [k, t]) => (Math.max(texelSpan(t) * t.width, t.height) > a[1]
      ? [k, Math.max(texelSpan(t) * t.width, t.height)] : a), ["", 1]);
    if (big > maxTex) {
      const t = m.textures[bigName];
      lacks.push(`MAX_TEXTURE_SIZE: textures of ${big} texels per side (the limit here is ${maxTex}), `
        + `texture ${repr(bigName)} is ${texelSpan(t) * t.width}x${t.height}`);
      hint.max_texture_size = maxTex;
    } else if (viewport && big > Math.min(viewport[0], viewport[1])) {
      lacks.push(`MAX_VIEWPORT_DIMS: viewports of ${big} pixels per side (the limit here is ${viewport[0]}x${viewport[1]})`);
      hint.max_texture_size = 2 ** Math.floor(Math.log2(Math.min(viewport[0], viewport[1])));
    }
    if (outputs > maxDraw && (this.webgl2 || ext.drawBuffers)) {
      const [pid] = progs.find(([, p]) => p.outputs === outputs);
      lacks.push(`MAX_DRAW_BUFFERS: ${outputs} draw buffers per draw call (this GPU has ${maxDraw}), `
        + `${which(pid)} writes ${outputs} outputs (${drawLimits})`);
      hint.max_draw_buffers = maxDraw;
    } else if (outputs > 1 && !this.webgl2 && !ext.drawBuffers) {
      hint.max_draw_buffers = 1;
    }
    if (samplers > maxUnits) {
      const [pid] = progs.find(([, p]) => p.samplers.length === samplers);
      lacks.push(`MAX_TEXTURE_IMAGE_UNITS: ${samplers} texture units per shader (this GPU has ${maxUnits}), `
        + `${which(pid)} samples ${samplers} textures`);
      hint.max_texture_units = maxUnits;
    }
    if (blend && !ext.floatBlend) hint.float_blend = false;
    const high = gl.getShaderPrecisionFormat(gl.FRAGMENT_SHADER, gl.HIGH_FLOAT);
    if (high && high.precision < 23) {
      lacks.push(`highp float in fragment shaders (32-bit floats; this GPU offers ${high.precision} bits of `
        + "precision: HIGH_FLOAT of getShaderPrecisionFormat)");
    }
    this._info = { webgl: this.webgl2 ? 2 : 1, renderer, vendor, software, performanceCaveat, maxTextureSize: maxTex,
      maxDrawBuffers: maxDraw, maxTextureUnits: maxUnits, parallelShaderCompile: !!ext.parallel,
      storage: bytes ? "rgba8" : half ? "f16" : "f32",
      readback: this._asyncReadback() ? "async" : "sync", warnings: [] };
    if (software) {
      this._info.warnings.push(`${renderer} is a software renderer (no GPU acceleration): `
        + "training works but is slow; enable hardware acceleration in the browser settings");
    }
    if (lacks.length) {
      const sw = software ? ` It renders with ${renderer}, a software renderer: hardware acceleration may be off.` : "";
      const limits = Object.entries(hint).map(([k, v]) => `, ${k}=${v === false ? "False" : v}`).join("");
      const preset = `${this.webgl2 ? "webgl2" : "webgl1"}-mobile`;
      const p = PRESETS[preset];
      const fits = preset !== m.target.name && p.max_texture_size <= maxTex && p.max_texture_units <= maxUnits
        && (p.max_draw_buffers <= maxDraw || p.max_draw_buffers === 1);
      const fix = limits ? ` Compile the model for this device: glcomp.compile(..., target='${m.target.name ?? "webgl2"}'`
        + `${limits})${fits ? ` or target='${preset}'` : ""}.` : "";
      throw new GlcompError(`this browser cannot run the bundle (WebGL ${this.webgl2 ? 2 : 1}, renderer `
        + `${renderer}); it lacks: ${lacks.join("; ")}.${fix}${sw}`);
    }
    this.ext = ext;
  }

  _asyncReadback() {
    return this.webgl2 && (this.options.readback || "async") === "async";
  }

  async _init() {
    this._createContext();
    await this._setup(this.bundle.weights);
    const sw = this._info.warnings[0];
    if (sw && !this.options.quiet && typeof console !== "undefined") console.warn(`glcomp: ${sw}`);
  }

  /** Create every GL object (textures, buffers, programs) and upload `weights` (all states). */
  async _setup(weights) {
    const gl = this.gl;
    const m = this.manifest;
    gl.disable(gl.DITHER);
    gl.disable(gl.DEPTH_TEST);
    gl.disable(gl.SCISSOR_TEST);
    gl.disable(gl.CULL_FACE);
    gl.disable(gl.BLEND);
    gl.pixelStorei(gl.UNPACK_ALIGNMENT, 4);
    gl.pixelStorei(gl.PACK_ALIGNMENT, 4);
    gl.activeTexture(gl.TEXTURE0);
    while (gl.getError() !== gl.NO_ERROR && !gl.isContextLost()) { /* start from a clean error state */ }
    const totalBytes = Object.values(m.textures).reduce((a, t) => a + TEXEL_BYTES[textureFormat(t)] * t.width * t.height, 0);
    for (const [name, t] of Object.entries(m.textures)) {
      const tex = this._track("textures", gl.createTexture());
      tex.__name = name;
      tex.__w = t.width;
      tex.__h = t.height;
      gl.bindTexture(gl.TEXTURE_2D, tex);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE);
      const half = textureFormat(t) === "f16";
      tex.__format = textureFormat(t);
      tex.__span = texelSpan(t); // rgba8: the GL texture is 4x wider, its bytes the float32s'
      const glWidth = tex.__span * t.width;
      if (tex.__format === "rgba8") {
        if (this.webgl2) gl.texStorage2D(gl.TEXTURE_2D, 1, gl.RGBA8, glWidth, t.height);
        else gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA, glWidth, t.height, 0, gl.RGBA, gl.UNSIGNED_BYTE, null);
      } else if (this.webgl2) gl.texStorage2D(gl.TEXTURE_2D, 1, half ? gl.RGBA16F : gl.RGBA32F, t.width, t.height);
      else {
        const type = half ? this.ext.textureHalfFloat.HALF_FLOAT_OES : gl.FLOAT;
        gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA, t.width, t.height, 0, gl.RGBA, type, null);
      }
      this.textures.set(name, tex);
    }
    gl.bindTexture(gl.TEXTURE_2D, null);
    // One check for all textures: GL errors stay set until read, and each getError waits for the
    // GPU process (one round trip per texture took tens of ms at load).
    const allocError = gl.getError();
    if (allocError !== gl.NO_ERROR || gl.isContextLost()) {
      const why = gl.isContextLost() ? "the WebGL context was lost"
        : allocError === gl.OUT_OF_MEMORY ? "out of GPU memory" : `WebGL error 0x${allocError.toString(16)}`;
      const bytes = (t) => TEXEL_BYTES[textureFormat(t)] * t.width * t.height;
      const [big, t] = Object.entries(m.textures).reduce((a, b) => (bytes(b[1]) > bytes(a[1]) ? b : a),
        ["", { width: 0, height: 0 }]);
      throw new GlcompError(`the bundle's ${Object.keys(m.textures).length} textures (${totalBytes} bytes; the largest, `
        + `${repr(big)}, ${texelSpan(t) * t.width}x${t.height}, ${bytes(t)} bytes) could not be allocated: ${why}`);
    }
    this._vbo = this._track("buffers", gl.createBuffer());
    gl.bindBuffer(gl.ARRAY_BUFFER, this._vbo);
    gl.bufferData(gl.ARRAY_BUFFER, QUAD, gl.STATIC_DRAW);
    await this._compilePrograms();
    // The framebuffers of every draw, made (and checked) now, while the GPU is idle: made at a
    // first draw, each check waited for all the draws queued before it (the JIT compilation of
    // their shaders in software renderers).
    for (const e of Object.values(m.entries)) for (const d of e.draws) this._framebuffer(d.targets);
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    for (const [name, value] of Object.entries(weights)) this._uploadState(name, value);
    const err = gl.getError();
    if (err !== gl.NO_ERROR) throw this._lostOr(new GlcompError(`WebGL error 0x${err.toString(16)} while setting up the bundle`));
  }

  async _compilePrograms() {
    const gl = this.gl;
    const m = this.manifest;
    const shaders = this.bundle.shaders;
    const kernelOf = Object.create(null);
    for (const e of Object.values(m.entries)) for (const d of e.draws) kernelOf[d.program] ??= d.kernel ?? d.program;
    const compile = (type, source) => {
      const sh = this._track("shaders", gl.createShader(type));
      gl.shaderSource(sh, versionFirst(source)[0]);
      gl.compileShader(sh);
      return sh;
    };
    const vert = compile(gl.VERTEX_SHADER, shaders[m.vertex_shader]);
    const pending = [];
    for (const [pid, p] of Object.entries(m.programs)) {
      const frag = compile(gl.FRAGMENT_SHADER, shaders[p.fragment]);
      const prog = this._track("programs", gl.createProgram());
      gl.attachShader(prog, vert);
      gl.attachShader(prog, frag);
      gl.bindAttribLocation(prog, 0, "a_position");
      gl.linkProgram(prog);
      pending.push({ pid, p, prog, frag });
    }
    if (this.ext.parallel) {
      const done = this.ext.parallel.COMPLETION_STATUS_KHR;
      while (!pending.every(({ prog }) => gl.getProgramParameter(prog, done))) {
        if (gl.isContextLost()) break;
        await sleep(2);
      }
    }
    try {
      if (gl.isContextLost()) throw new GlcompError("the WebGL context was lost while compiling the shaders");
      if (!gl.getShaderParameter(vert, gl.COMPILE_STATUS)) {
        throw compileError("quad (vertex shader)", shaders[m.vertex_shader], gl.getShaderInfoLog(vert));
      }
      for (const { pid, p, prog, frag } of pending) {
        if (!gl.getProgramParameter(prog, gl.LINK_STATUS)) {
          const log = gl.getShaderParameter(frag, gl.COMPILE_STATUS) ? gl.getProgramInfoLog(prog) : gl.getShaderInfoLog(frag);
          throw this._lostOr(compileError(kernelOf[pid] || pid, shaders[p.fragment], log));
        }
        const loc = Object.create(null); // names from the bundle are keys: no prototype
        for (const u of [...p.samplers, ...p.uniforms, "u_page_offset"]) loc[u] = gl.getUniformLocation(prog, u);
        this.programs.set(pid, { prog, loc });
      }
    } finally {
      for (const { prog, frag } of pending) {
        gl.detachShader(prog, vert);
        gl.detachShader(prog, frag);
        gl.deleteShader(frag);
        this._untrack(frag);
      }
      gl.deleteShader(vert);
      this._untrack(vert);
    }
  }

  /** What the WebGL context offers: renderer, limits, whether it is a software renderer. */
  info() {
    // `variant`: which variant of a variant set was loaded and why (see variants.js), else null.
    return { ...this._info, warnings: [...this._info.warnings], variant: this.variant ?? null };
  }

  /** Live GL objects this runtime owns, by kind (all zero after dispose()). */
  liveObjects() {
    return { ...this._liveCount };
  }

  // -- textures --------------------------------------------------------------------------------
  _texture(ref) {
    if (typeof ref === "string") return this.textures.get(ref);
    const st = this.manifest.states[ref.state];
    const which = this.parity[ref.state] ^ (ref.version === "next" ? 1 : 0);
    return this.textures.get(st.textures[which][ref.page]);
  }

  _write(refs, flat, layout) {
    // Only states and entry inputs are written, and the validator holds both to float32: RGBA32F
    // ("f32"), or the float32s' bytes in RGBA8 texels ("rgba8").
    const gl = this.gl;
    const pages = pack(flat, layout);
    gl.activeTexture(gl.TEXTURE0);
    refs.forEach((ref, i) => {
      const tex = this._texture(ref);
      gl.bindTexture(gl.TEXTURE_2D, tex);
      if (tex.__span === 4) { // rgba8: the float32s' bytes, little-endian as typed arrays are
        const b = new Uint8Array(pages[i].buffer, pages[i].byteOffset, pages[i].byteLength);
        gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, 0, 4 * tex.__w, tex.__h, gl.RGBA, gl.UNSIGNED_BYTE, b);
      } else gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, 0, tex.__w, tex.__h, gl.RGBA, gl.FLOAT, pages[i]);
    });
    gl.bindTexture(gl.TEXTURE_2D, null);
  }

  _stateRefs(name, version = "cur") {
    const pages = this.manifest.states[name].layout.pages;
    return Array.from({ length: pages }, (_, page) => ({ state: name, version, page }));
  }

  _uploadState(name, flat) {
    this._write(this._stateRefs(name), flat, this.manifest.states[name].layout);
  }

  _framebuffer(targets) {
    const gl = this.gl;
    const texs = targets.map((r) => this._texture(r));
    const key = texs.map((t) => t.__name).join("|");
    let fbo = this._fbos.get(key);
    if (fbo) return fbo;
    fbo = this._track("framebuffers", gl.createFramebuffer());
    gl.bindFramebuffer(gl.FRAMEBUFFER, fbo);
    const db = this.ext.drawBuffers;
    const attach = (i) => (this.webgl2 ? gl.COLOR_ATTACHMENT0 + i : db ? db.COLOR_ATTACHMENT0_WEBGL + i : gl.COLOR_ATTACHMENT0);
    texs.forEach((t, i) => gl.framebufferTexture2D(gl.FRAMEBUFFER, attach(i), gl.TEXTURE_2D, t, 0));
    if (texs.length > 1 || db) {
      const bufs = texs.map((_, i) => attach(i));
      if (this.webgl2) gl.drawBuffers(bufs);
      else db.drawBuffersWEBGL(bufs);
    }
    // Completeness depends on the attachments' formats and sizes only: checked once for each such
    // signature (checkFramebufferStatus waits for the GPU process, and for every draw queued before).
    const signature = texs.map((t) => `${t.__format}:${t.__span * t.__w}x${t.__h}`).join("|");
    if (!this._completeFbos.has(signature)) {
      const status = gl.checkFramebufferStatus(gl.FRAMEBUFFER);
      if (status !== gl.FRAMEBUFFER_COMPLETE) {
        const where = `framebuffer status 0x${status.toString(16)}, renderer ${this._info.renderer}`;
        // Every WebGL implementation renders into RGBA8 textures: an incomplete RGBA8 framebuffer
        // means the device is gone (WebGL reports the context lost only later, and what was read
        // back just before may be zeros).
        throw this._lostOr(new GlcompError(texs[0].__format === "rgba8"
          ? `the RGBA8 render targets ${fmtList(texs.map((t) => t.__name))} cannot be drawn into (${where}): `
            + "the WebGL context is most likely lost (a GPU reset, e.g. after a stall); results read back "
            + "just before this may be wrong"
          : `float render targets are not supported here (${where})`));
      }
      this._completeFbos.add(signature);
    }
    this._fbos.set(key, fbo);
    return fbo;
  }

  _readFramebuffer(tex) {
    let fbo = this._readFbos.get(tex);
    if (fbo) return fbo;
    const gl = this.gl;
    fbo = this._track("framebuffers", gl.createFramebuffer());
    gl.bindFramebuffer(gl.FRAMEBUFFER, fbo);
    gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, tex, 0);
    this._readFbos.set(tex, fbo);
    return fbo;
  }

  /** Read textures synchronously (readPixels into client memory). */
  _readSync(refs, layout) {
    const gl = this.gl;
    const pages = refs.map((ref) => {
      const tex = this._texture(ref);
      gl.bindFramebuffer(gl.FRAMEBUFFER, this._readFramebuffer(tex));
      const data = new Float32Array(tex.__w * tex.__h * 4);
      if (tex.__span === 4) gl.readPixels(0, 0, 4 * tex.__w, tex.__h, gl.RGBA, gl.UNSIGNED_BYTE, new Uint8Array(data.buffer));
      else gl.readPixels(0, 0, tex.__w, tex.__h, gl.RGBA, gl.FLOAT, data);
      return data;
    });
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    // a lost context reads nothing (zeros), never pass that off as data
    if (gl.isContextLost()) throw this._lostError();
    return unpack(pages, layout);
  }

  /** A fresh pixel-pack buffer per readback: Chrome drops its readback shadow copy (with a
   *  performance warning) when a READ buffer is written again after a fence. */
  _createPbo(bytes) {
    const gl = this.gl;
    const pbo = this._track("buffers", gl.createBuffer());
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
    gl.bufferData(gl.PIXEL_PACK_BUFFER, bytes, gl.STREAM_READ);
    pbo.__bytes = bytes;
    return pbo;
  }

  /** Read several outputs: [{refs, layout}] -> Promise<[Float32Array]>. On WebGL 2 the pixels are
   *  copied into pixel-pack buffers, a fence is polled between event-loop tasks, and only then
   *  read with getBufferSubData, so the page never blocks on the GPU. */
  async _readMany(items) {
    if (!this._asyncReadback()) return items.map(({ refs, layout }) => this._readSync(refs, layout));
    const gl = this.gl;
    const reads = items.map(({ refs, layout }) => ({
      layout,
      pages: refs.map((ref) => {
        const tex = this._texture(ref);
        const bytes = tex.__w * tex.__h * 16;
        const pbo = this._createPbo(bytes);
        gl.bindFramebuffer(gl.FRAMEBUFFER, this._readFramebuffer(tex));
        gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
        if (tex.__span === 4) gl.readPixels(0, 0, 4 * tex.__w, tex.__h, gl.RGBA, gl.UNSIGNED_BYTE, 0);
        else gl.readPixels(0, 0, tex.__w, tex.__h, gl.RGBA, gl.FLOAT, 0);
        return pbo;
      }),
    }));
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    const sync = this._track("syncs", gl.fenceSync(gl.SYNC_GPU_COMMANDS_COMPLETE, 0));
    gl.flush();
    try {
      await this._waitSync(sync);
    } finally {
      if (!this._disposed) {
        gl.deleteSync(sync);
        this._untrack(sync);
      }
    }
    if (gl.isContextLost()) throw this._lostError();
    return reads.map(({ layout, pages }) => unpack(pages.map((pbo) => {
      const data = new Float32Array(pbo.__bytes / 4);
      gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
      gl.getBufferSubData(gl.PIXEL_PACK_BUFFER, 0, data);
      gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
      gl.deleteBuffer(pbo);
      this._untrack(pbo);
      return data;
    }), layout));
  }

  async _waitSync(sync) {
    const gl = this.gl;
    for (let polls = 0; ; polls++) {
      if (this._disposed) throw new GlcompError("the runtime was disposed while reading back");
      if (this._lost || gl.isContextLost()) throw this._lostError();
      const s = gl.clientWaitSync(sync, 0, 0);
      if (s === gl.ALREADY_SIGNALED || s === gl.CONDITION_SATISFIED) return;
      if (s === gl.WAIT_FAILED) throw this._lostOr(new GlcompError("waiting for the GPU failed"));
      // A zero-delay task a poll, then 1 ms sleeps so a long wait does not spin; a hidden page's
      // timers wake about once a second, so there it keeps to tasks (MessageChannel tasks are not
      // throttled) and training in a background tab keeps its pace.
      await (polls < 50 || pageHidden() ? nextTask() : sleep(1));
    }
  }

  // -- execution -------------------------------------------------------------------------------
  _alive() {
    if (this._disposed) throw new GlcompError("the runtime was disposed");
    if (this._lost || this.gl.isContextLost()) throw this._lostError();
  }

  /** Upload `inputs`, run the entry point's draws, flip updated states. Returns the readback
   *  (a Promise of {name: Float32Array}) for the outputs named in `read` (all by default). */
  _run(entry, inputs, read) {
    this._alive();
    const m = this.manifest;
    if (!Object.hasOwn(m.entries, entry)) {
      throw new GlcompError(`${entry}: not in this bundle (compile with a loss and an optimizer)`);
    }
    const e = m.entries[entry];
    const specs = Object.fromEntries(Object.keys(e.inputs).map((k) => [k, m.inputs[k]]));
    // Image inputs given as frames (video, canvas, bitmap, ...) go straight to their textures (frames.js).
    const frames = Object.keys(specs).filter((k) => specs[k].image && inputs && isFrames(inputs[k]));
    const without = (o) => Object.fromEntries(Object.entries(o).filter(([k]) => !frames.includes(k)));
    const feeds = frames.length ? checkFeeds(entry, without(specs), without(inputs)) : checkFeeds(entry, specs, inputs);
    for (const k of frames) {
      const tex = this._texture(e.inputs[k][0]);
      if (tex.__span === 4) throw new GlcompError(`input ${repr(k)}: frames need a float input texture (the bundle stores bytes)`);
      uploadFrames(this.gl, tex, k, specs[k].image, inputs[k]);
    }
    const names = read ?? Object.keys(e.outputs);
    for (const n of names) if (!Object.hasOwn(e.outputs, n)) throw new GlcompError(`${entry} has no output ${repr(n)}`);
    const gl = this.gl;
    for (const [name, value] of Object.entries(feeds)) this._write(e.inputs[name], value, m.inputs[name].layout);
    gl.bindBuffer(gl.ARRAY_BUFFER, this._vbo);
    gl.vertexAttribPointer(0, 2, gl.FLOAT, false, 0, 0);
    gl.enableVertexAttribArray(0);
    for (const d of e.draws) this._draw(d);
    gl.disable(gl.BLEND);
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    const result = this._readMany(names.map((n) => ({ refs: e.outputs[n].textures, layout: e.outputs[n].layout })));
    for (const name of e.updates ?? []) this.parity[name] ^= 1;
    this._lastEntry = entry; // whose outputs inspect() reads
    if (!this._checkedEntries.has(entry)) {
      this._checkedEntries.add(entry);
      const err = gl.getError();
      if (err !== gl.NO_ERROR) throw this._lostOr(new GlcompError(`WebGL error 0x${err.toString(16)} while running ${entry}`));
    }
    return result.then((arrays) => Object.fromEntries(names.map((n, i) => [n, arrays[i]])));
  }

  _draw(d) {
    const gl = this.gl;
    const { prog, loc } = this.programs.get(d.program);
    gl.useProgram(prog);
    let unit = 0;
    for (const [sampler, ref] of Object.entries(d.samplers)) {
      gl.activeTexture(gl.TEXTURE0 + unit);
      gl.bindTexture(gl.TEXTURE_2D, this._texture(ref));
      if (loc[sampler]) gl.uniform1i(loc[sampler], unit);
      unit++;
    }
    for (const [uniform, src] of Object.entries(d.uniforms)) {
      if (!loc[uniform]) continue;
      if ("int" in src) gl.uniform1i(loc[uniform], src.int);
      else gl.uniform1f(loc[uniform], this.hyper[src.hyper]);
    }
    if (loc.u_page_offset) gl.uniform1i(loc.u_page_offset, d.page_offset);
    gl.bindFramebuffer(gl.FRAMEBUFFER, this._framebuffer(d.targets));
    gl.viewport(0, 0, d.viewport[0] * this._texture(d.targets[0]).__span, d.viewport[1]); // rgba8: 4 fragments a texel
    if (d.blend) {
      gl.enable(gl.BLEND);
      gl.blendFunc(gl.ONE, gl.ONE);
    } else {
      gl.disable(gl.BLEND);
    }
    gl.drawArrays(gl.TRIANGLES, 0, 3);
    this.drawCalls++;
  }

  _tensor(entry, name, data) {
    return { shape: [...this.manifest.entries[entry].outputs[name].layout.shape], dtype: "float32", data };
  }

  // -- the runtime interface -------------------------------------------------------------------
  /** Run `predict`: the model's output as {shape, dtype, data} (or {name: tensor} for several). */
  async predict(inputs) {
    const out = await this._run("predict", inputs, visibleOutputs(this.manifest.entries.predict ?? { outputs: {} }));
    const names = Object.keys(out);
    if (names.length === 1 && names[0] === "output") return this._tensor("predict", "output", out.output);
    return Object.fromEntries(names.map((n) => [n, this._tensor("predict", n, out[n])]));
  }

  /** Loss and parameter gradients (train mode, no update): {loss, "<param>": tensor, ...}. */
  async gradients(inputs) {
    const out = await this._run("gradients", inputs, visibleOutputs(this.manifest.entries.gradients ?? { outputs: {} }));
    const res = Object.create(null);
    for (const [k, v] of Object.entries(out)) {
      if (k.startsWith("grad:")) res[k.slice(5)] = this._tensor("gradients", k, v);
      else if (k === "loss") res.loss = v[0];
    }
    return res;
  }

  /** One optimizer step; resolves to the loss (read back asynchronously on WebGL 2). */
  trainStep(inputs) {
    if (!Object.hasOwn(this.manifest.entries.train_step?.outputs ?? {}, "loss")) {
      return Promise.reject(new GlcompError("train_step: not in this bundle (compile with a loss and an optimizer)"));
    }
    let result;
    try {
      result = this._run("train_step", inputs, ["loss"]);
    } catch (err) {
      return Promise.reject(err);
    }
    for (const name of Object.keys(this.counters)) this.counters[name] += 1;
    this.steps++;
    return result.then((out) => out.loss[0]);
  }

  /** Train `steps` steps on `batches` (an array of input objects, used in turn, or a function
   *  step -> inputs). Yields to the event loop between steps; keeps up to `inflight` steps
   *  queued on the GPU before waiting for a loss. `onStep(step, loss)` may return false to
   *  stop. `yieldTo`: "task" (default; a zero-delay task) or "frame" (requestAnimationFrame).
   *  `keepEvery` (default: the `keepWeightsEvery` load option, 100): read the whole state back
   *  (snapshot()) whenever that many steps have run since the last one, and when training ends.
   *  When the WebGL context is lost, train stops and rejects with a GlcompError whose `reason` is
   *  "context-lost" and whose `losses` are the losses read before the loss. */
  async train({ steps, batches, onStep, inflight = 2, yieldTo = "task", keepEvery = this._keepEvery } = {}) {
    const get = typeof batches === "function" ? batches : (i) => batches[i % batches.length];
    if (steps === undefined && Array.isArray(batches)) steps = batches.length;
    if (!isInt(steps) || steps < 0) throw new GlcompError("train: steps must be a non-negative integer");
    if (typeof batches !== "function" && (!Array.isArray(batches) || !batches.length)) {
      throw new GlcompError("train: batches must be a non-empty array of inputs or a function step -> inputs");
    }
    const depth = Math.max(1, inflight | 0);
    const losses = [];
    const queue = [];
    let stop = false;
    const settle = async () => {
      const loss = await queue.shift();
      losses.push(loss);
      if (onStep && (await onStep(losses.length - 1, loss)) === false) stop = true;
    };
    const keep = async (force) => {
      if (keepEvery > 0 && this.steps - this._kept.steps >= (force ? 1 : keepEvery)) await this.snapshot();
    };
    try {
      for (let i = 0; i < steps && !stop; i++) {
        const step = this.trainStep(get(i));
        step.catch(() => {}); // settle() sees the failure; the page must not report it as unhandled
        queue.push(step);
        if (queue.length >= depth) await settle();
        await keep(false);
        await (yieldTo === "frame" ? nextFrame() : nextTask());
      }
      while (queue.length) await settle();
      await keep(true);
    } catch (err) {
      if (!this._lost && !this.gl?.isContextLost()) throw err;
      const lost = this._lostError();
      lost.message = `training stopped: ${lost.message}`;
      lost.losses = losses;
      throw lost;
    } finally {
      for (const p of queue) p.catch(() => {});
    }
    return losses;
  }

  /** The tensor `name` ({shape, dtype, data}) read back without changing the computation: a
   *  state, a counter, or a tensor of the entry run last (see inspect.js, docs/inspect.md). */
  inspect(name) {
    return inspectTensor(this, name);
  }

  // -- context loss ----------------------------------------------------------------------------
  /** Whether the WebGL context is lost (until restore()). */
  get contextLost() {
    return this._lost || !!this.gl?.isContextLost();
  }

  /** The step count of the weights that restore() brings back (0: the bundle's own). */
  get keptSteps() {
    return this._kept.steps;
  }

  /** Read the whole state (weights, optimizer state, counters) back and keep it as what
   *  restore() re-uploads after a context loss. Resolves to the number of train steps it holds:
   *  a state with NaN or infinite values (a diverged step) is not kept, the previous one stays.
   *  train() calls it every `keepEvery` steps; setWeights and loadFromIndexedDB keep what they
   *  load. The state is captured when called (later steps do not change it). */
  async snapshot() {
    this._alive();
    const names = Object.keys(this.manifest.states);
    const meta = { steps: this.steps, counters: { ...this.counters } };
    const arrays = await this._readMany(names.map((n) => ({ refs: this._stateRefs(n), layout: this.manifest.states[n].layout })));
    if (this._disposed) throw new GlcompError("the runtime was disposed");
    if (this._lost || this.gl.isContextLost()) throw this._lostError();
    // a diverged state (NaN or inf) is not worth restoring: keep the last finite one
    if (!arrays.every((a) => a.every(Number.isFinite))) return this._kept.steps;
    this._kept = { ...meta, weights: Object.fromEntries(names.map((n, i) => [n, arrays[i]])) };
    return meta.steps;
  }

  /** A copy of the kept state (what restore() would upload), readable while the context is lost:
   *  {steps, weights: {name: Float32Array} (every state, optimizer state included), counters}. */
  keptState() {
    const k = this._kept;
    const weights = Object.fromEntries(Object.entries(k.weights).map(([n, a]) => [n, Float32Array.from(a)]));
    return { steps: k.steps, weights, counters: { ...k.counters } };
  }

  _snapshotSync() {
    const weights = Object.create(null);
    for (const [n, st] of Object.entries(this.manifest.states)) weights[n] = this._readSync(this._stateRefs(n), st.layout);
    this._kept = { steps: this.steps, counters: { ...this.counters }, weights };
  }

  /** After the canvas fired `webglcontextrestored`: check the device again, rebuild every GL
   *  object (textures, framebuffers, programs, buffers) and upload the kept state (see
   *  snapshot()): weights, optimizer state and counters as they were at step `keptSteps`; the
   *  steps run after it are lost (`steps` goes back to `keptSteps`). The learning rate and the
   *  other hyper-parameters live in JavaScript and stay as they are. */
  async restore() {
    if (this._disposed) throw new GlcompError("the runtime was disposed");
    const gl = this.gl;
    if (gl.isContextLost()) {
      throw new GlcompError("restore: the WebGL context is still lost; call restore() after webglcontextrestored");
    }
    if (!this._lost) return; // nothing was lost
    // the old objects died with the context: forget them without deleting
    this._live.clear();
    for (const k of KINDS) this._liveCount[k] = 0;
    this.textures.clear();
    this.programs.clear();
    this._fbos.clear();
    this._completeFbos.clear();
    this._readFbos.clear();
    this._checkedEntries.clear();
    for (const k of Object.keys(this.parity)) this.parity[k] = 0;
    this._checkDevice();
    const kept = this._kept;
    try {
      await this._setup(kept.weights);
    } catch (err) {
      throw this._lostOr(err);
    }
    if (gl.isContextLost()) throw this._lostError();
    this.counters = { ...kept.counters };
    this.steps = kept.steps;
    this._lost = false;
  }

  setLr(lr) {
    if (typeof lr !== "number" || !Number.isFinite(lr) || lr < 0) {
      throw new GlcompError(`setLr: expected a finite number >= 0, got ${repr(lr)}`);
    }
    this.hyper.lr = lr;
  }

  /** Parameters, float buffers and counters, read back now: {name: {shape, dtype, data}}. */
  getWeights({ optimizer = false } = {}) {
    this._alive();
    const out = Object.create(null);
    for (const [name, st] of Object.entries(this.manifest.states)) {
      if (optimizer || st.role === "param" || st.role === "buffer") {
        out[name] = { shape: [...st.layout.shape], dtype: "float32", data: this._readSync(this._stateRefs(name), st.layout) };
      }
    }
    for (const [name, v] of Object.entries(this.counters)) {
      out[name] = { shape: [], dtype: "int64", data: BigInt64Array.of(BigInt(v)) };
    }
    return out;
  }

  _weightShapes(optimizer) {
    const shapes = Object.create(null);
    for (const [k, st] of Object.entries(this.manifest.states)) {
      if (optimizer || st.role === "param" || st.role === "buffer") shapes[k] = st.layout.shape;
    }
    for (const k of Object.keys(this.counters)) shapes[k] = [];
    return shapes;
  }

  _loadAll(state, shapes, owner) {
    const problems = [];
    const missing = Object.keys(shapes).filter((k) => !Object.hasOwn(state, k));
    const extra = Object.keys(state).filter((k) => !Object.hasOwn(shapes, k));
    if (missing.length) problems.push(`missing keys ${fmtList(missing)}`);
    if (extra.length) problems.push(`unexpected keys ${fmtList(extra)}`);
    const values = Object.create(null);
    for (const [key, shape] of Object.entries(shapes)) {
      if (!Object.hasOwn(state, key)) continue;
      let v = state[key];
      let given;
      let data;
      if (isObj(v) && "data" in v) {
        data = ArrayBuffer.isView(v.data) ? v.data : nestedShape(v.data, key)[1];
        given = Array.isArray(v.shape) ? v.shape : [data.length];
      } else if (ArrayBuffer.isView(v)) {
        data = v;
        given = v.length === prod(shape) ? shape : [v.length];
      } else if (Array.isArray(v)) {
        [given, data] = nestedShape(v, key);
        if (given.length === 1 && data.length === prod(shape)) given = shape;
      } else if (typeof v === "number" || typeof v === "bigint") {
        data = [v];
        given = [];
      } else {
        problems.push(`${repr(key)} is not an array`);
        continue;
      }
      if ((!sameList(given, shape) && !(prod(given) === 1 && prod(shape) === 1)) || data.length !== prod(shape)) {
        problems.push(`${repr(key)} expected shape ${fmtShape(shape)} but got ${fmtShape(given)}`);
        continue;
      }
      v = Array.from(data, Number);
      if (!v.every(Number.isFinite)) problems.push(`${repr(key)} holds NaN or infinite values`);
      values[key] = v;
    }
    if (problems.length) throw new GlcompError(`load_state_dict into ${owner}: ${problems.join("; ")} (nothing was loaded)`);
    for (const [k, v] of Object.entries(values)) {
      if (Object.hasOwn(this.counters, k)) this.counters[k] = Math.trunc(v[0]);
      else this._uploadState(k, Float32Array.from(v));
    }
    this._snapshotSync(); // restore() after a context loss brings back what was loaded
  }

  /** Load parameters, float buffers and counters (all of them, shapes checked, finite): an
   *  object of name -> {shape, data} / typed array / nested array, or a safetensors ArrayBuffer. */
  setWeights(state) {
    this._alive();
    if (state instanceof ArrayBuffer || ArrayBuffer.isView(state)) state = parseSafetensors(state, "weights");
    if (!isObj(state)) throw new GlcompError("setWeights: expected an object of name -> array");
    this._loadAll(state, this._weightShapes(false), "runtime");
  }

  /** The weights as a safetensors file (float32 tensors, int64 counters). With `optimizer`,
   *  optimizer state too: a complete weights.safetensors for the bundle. */
  exportSafetensors({ optimizer = false } = {}) {
    const w = this.getWeights({ optimizer });
    const tensors = Object.create(null);
    for (const [k, t] of Object.entries(w)) tensors[k] = { dtype: t.dtype === "int64" ? "I64" : "F32", shape: t.shape, data: t.data };
    return writeSafetensors(tensors);
  }

  _signature() {
    const m = this.manifest;
    return JSON.stringify([Object.keys(m.states).sort().map((k) => [k, m.states[k].role, m.states[k].layout.shape]),
      Object.keys(m.counters).sort()]);
  }

  /** Save everything that training changes (weights, optimizer state, counters, lr) in IndexedDB. */
  async saveToIndexedDB(key, { dbName = "glcomp" } = {}) {
    const record = { format: "glcomp-weights", signature: this._signature(), lr: this.hyper.lr,
      weights: this.exportSafetensors({ optimizer: true }), saved: Date.now() };
    await idb(dbName, "readwrite", (store) => store.put(record, key));
  }

  /** Restore what saveToIndexedDB stored; resolves to false when nothing is stored under `key`. */
  async loadFromIndexedDB(key, { dbName = "glcomp" } = {}) {
    const record = await idb(dbName, "readonly", (store) => store.get(key));
    if (record === undefined) return false;
    if (!isObj(record) || record.format !== "glcomp-weights" || !(record.weights instanceof ArrayBuffer)) {
      throw new GlcompError(`IndexedDB ${repr(key)}: not a glcomp weights record`);
    }
    if (record.signature !== this._signature()) {
      throw new GlcompError(`IndexedDB ${repr(key)}: saved from a bundle with different states`);
    }
    this._alive();
    this._loadAll(parseSafetensors(record.weights, `IndexedDB ${key}`), this._weightShapes(true), "runtime");
    if (typeof record.lr === "number") this.hyper.lr = record.lr;
    return true;
  }

  /** Delete every GL object this runtime created. Pending readbacks reject. */
  dispose() {
    if (this._disposed) return;
    this._disposed = true;
    const gl = this.gl;
    if (gl) {
      for (const obj of [...this._live]) {
        const kind = obj.__glcompKind;
        if (kind === "textures") gl.deleteTexture(obj);
        else if (kind === "framebuffers") gl.deleteFramebuffer(obj);
        else if (kind === "programs") gl.deleteProgram(obj);
        else if (kind === "shaders") gl.deleteShader(obj);
        else if (kind === "buffers") gl.deleteBuffer(obj);
        else if (kind === "syncs") gl.deleteSync(obj);
        this._untrack(obj);
      }
      this.canvas?.removeEventListener?.("webglcontextlost", this._onLost);
      if (this._ownCanvas && this.options.loseContext !== false) gl.getExtension("WEBGL_lose_context")?.loseContext();
    }
    this.textures.clear();
    this.programs.clear();
    this._fbos.clear();
    this._completeFbos.clear();
    this._readFbos.clear();
  }
}

function idb(dbName, mode, op) {
  return new Promise((resolve, reject) => {
    if (typeof indexedDB === "undefined") {
      reject(new GlcompError("IndexedDB is not available here"));
      return;
    }
    const open = indexedDB.open(dbName, 1);
    open.onupgradeneeded = () => open.result.createObjectStore("weights");
    open.onerror = () => reject(new GlcompError(`IndexedDB: ${open.error}`));
    open.onsuccess = () => {
      const db = open.result;
      const tx = db.transaction("weights", mode);
      const req = op(tx.objectStore("weights"));
      tx.oncomplete = () => { db.close(); resolve(req.result); };
      tx.onerror = () => { db.close(); reject(new GlcompError(`IndexedDB: ${tx.error}`)); };
      tx.onabort = () => { db.close(); reject(new GlcompError(`IndexedDB: ${tx.error}`)); };
    };
  });
}
