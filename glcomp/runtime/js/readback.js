// The Runtime's readback (a part of the Runtime class of runtime.js, which copies these methods
// onto its prototype): reading texture pages back into Float32Arrays, synchronously (readPixels)
// or, on WebGL 2, through pixel-pack buffers and a fence polled between event-loop tasks
// (_waitSync) so the page never blocks on the GPU, and unpacking the pages into tensors.
import { unpack } from "./format/packing.js";
import { GlcompError, nextTask, sleep } from "./util.js";

/** Whether this runs in a page that is hidden (a background tab); false in a worker. */
const pageHidden = () => typeof document !== "undefined" && document.hidden === true;

export class ReadbackMethods {
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
}
