// The Runtime's WebGL context (a part of the Runtime class of runtime.js, which copies these
// methods onto its prototype): creating the context on a canvas and listening for its loss, the
// capability probe (extensions, limits, software renderers, failIfMajorPerformanceCaveat) that
// refuses a bundle the device cannot run, info(), the bookkeeping of every GL object the runtime
// creates (liveObjects(), dispose()), and context loss: contextLost, the "context-lost" error,
// restore() after webglcontextrestored.
import { texelSpan, textureFormat } from "./format/manifest.js";
import { GlcompError, maxOf, repr } from "./util.js";

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

// The mobile target presets of glcomp/codegen/target.py (suggested when a bundle does not fit).
export const PRESETS = {
  "webgl1-mobile": { max_texture_size: 2048, max_draw_buffers: 1, max_texture_units: 8 },
  "webgl2-mobile": { max_texture_size: 4096, max_draw_buffers: 4, max_texture_units: 16 },
};

/** The kinds of GL object a runtime tracks (liveObjects() counts each). */
export const KINDS = ["textures", "framebuffers", "programs", "shaders", "buffers", "syncs"];

export class ContextMethods {
  // -- GL objects and the lost context ----------------------------------------------------------
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

  _alive() {
    if (this._disposed) throw new GlcompError("the runtime was disposed");
    if (this._lost || this.gl.isContextLost()) throw this._lostError();
  }

  // -- the context and the device ---------------------------------------------------------------
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

  /** What the WebGL context offers: renderer, limits, whether it is a software renderer. */
  info() {
    // `variant`: which variant of a variant set was loaded and why (see variants.js), else null.
    return { ...this._info, warnings: [...this._info.warnings], variant: this.variant ?? null };
  }

  /** Live GL objects this runtime owns, by kind (all zero after dispose()). */
  liveObjects() {
    return { ...this._liveCount };
  }

  // -- context loss ----------------------------------------------------------------------------
  /** Whether the WebGL context is lost (until restore()). */
  get contextLost() {
    return this._lost || !!this.gl?.isContextLost();
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
