// The Runtime's executor (a part of the Runtime class of runtime.js, which copies these methods
// onto its prototype): creating the bundle's textures, the quad's vertex buffer, its programs
// (compiled in parallel where KHR_parallel_shader_compile is offered) and framebuffers, uploading
// states and inputs into texture pages, and running an entry point: its draws, the flip of the
// states it updates, and the readback it starts (readback.js).
import { TEXEL_BYTES, texelSpan, textureFormat } from "./format/manifest.js";
import { pack } from "./format/packing.js";
import { checkFeeds } from "./io.js";
import { isFrames, uploadFrames } from "./frames.js";
import { GlcompError, fmtList, repr, sleep } from "./util.js";

const QUAD = new Float32Array([-1, -1, 3, -1, -1, 3]); // one triangle covers the viewport

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

export class ExecutorMethods {
  // -- setup ------------------------------------------------------------------------------------
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

  // -- execution -------------------------------------------------------------------------------
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
}
