// The browser runtime: runs a validated bundle's entry points with WebGL exactly as
// glcomp/runtime/gl.py does with moderngl. The Runtime class is composed of one module per
// concern, whose methods it copies onto its prototype: context.js (the context, the capability
// probe, info, GL object bookkeeping, context loss), executor.js (textures, programs, draws,
// running an entry point), readback.js (fences, pixel-pack buffers, unpacking) and
// persistence.js (weights, snapshots, IndexedDB). This module holds loading, the constructor and
// the runtime interface (predict, gradients, trainStep, train, inspect, setLr).
import { loadBundle } from "./io.js";
import { inspectTensor, visibleOutputs } from "./inspect.js";
import { ContextMethods, KINDS } from "./context.js";
import { ExecutorMethods } from "./executor.js";
import { ReadbackMethods } from "./readback.js";
import { PersistenceMethods } from "./persistence.js";
import { GlcompError, isInt, nextFrame, nextTask, repr } from "./util.js";

export { PRESETS } from "./context.js";

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

  async _init() {
    this._createContext();
    await this._setup(this.bundle.weights);
    const sw = this._info.warnings[0];
    if (sw && !this.options.quiet && typeof console !== "undefined") console.warn(`glcomp: ${sw}`);
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

  setLr(lr) {
    if (typeof lr !== "number" || !Number.isFinite(lr) || lr < 0) {
      throw new GlcompError(`setLr: expected a finite number >= 0, got ${repr(lr)}`);
    }
    this.hyper.lr = lr;
  }
}

// Every method (getters included) of the parts, on Runtime.prototype as if written in the class:
// the same names, non-enumerable as class methods are; a name defined twice is a mistake.
for (const part of [ContextMethods, ExecutorMethods, ReadbackMethods, PersistenceMethods]) {
  for (const [name, desc] of Object.entries(Object.getOwnPropertyDescriptors(part.prototype))) {
    if (name === "constructor") continue;
    if (Object.hasOwn(Runtime.prototype, name)) throw new Error(`Runtime.${name} is defined twice`);
    Object.defineProperty(Runtime.prototype, name, desc);
  }
}
