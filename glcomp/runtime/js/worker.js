// Training in a dedicated Worker (docs/worker.md). The page calls the same runtime API as on
// the main thread (trainStep, predict, gradients, train, inspect, getWeights, ...), each a
// message to a module Worker running this file, where a Runtime draws into an OffscreenCanvas
// WebGL context. The worker schedules train steps with MessageChannel tasks (util.js nextTask),
// never requestAnimationFrame, so training keeps its pace in a hidden tab and the page's main
// thread only handles messages. Results come back as transferred ArrayBuffers; errors as
// GlcompError/Error with their message (and `reason`, `losses` where the runtime sets them).
//
//   import { load } from "./glcomp.js";
//   const rt = await load("bundle/", { worker: "auto" }); // rt.thread: "worker" or "main"
//   const losses = await rt.train({ steps: 1000, batches, onStep: (i, loss) => draw(i, loss) });
//
// This one file is both the page's side (WorkerRuntime, load) and the worker's (the message
// handler below runs only in a worker created by WorkerRuntime, named WORKER_NAME).
import { isFrameSource } from "./frames.js";
import { Runtime } from "./runtime.js";
import { GlcompError, isInt, isObj } from "./util.js";

const WORKER_NAME = "glcomp-runtime";
const NO_WEBGL = "no-worker-webgl"; // the `reason` of the error a worker without WebGL gives

/** The ArrayBuffers held by `value` (typed arrays, ArrayBuffers, nested in arrays and objects). */
function transferables(value, out = new Set()) {
  if (value instanceof ArrayBuffer) out.add(value);
  else if (ArrayBuffer.isView(value)) out.add(value.buffer);
  else if (Array.isArray(value)) value.forEach((v) => transferables(v, out));
  else if (value && typeof value === "object") Object.values(value).forEach((v) => transferables(v, out));
  return [...out];
}

// Frame sources that cannot cross to a worker (elements, and canvases, which a worker cannot
// receive while they have a context) go as ImageBitmaps of their current pixels, made with the
// options texImage2D uploads by (no premultiplication, no colour conversion). ImageBitmap,
// VideoFrame and ImageData cross as they are.
const ELEMENT_FRAMES = ["HTMLVideoElement", "HTMLCanvasElement", "HTMLImageElement", "OffscreenCanvas"];
const isElementFrame = (v) => ELEMENT_FRAMES.some((n) => typeof globalThis[n] === "function" && v instanceof globalThis[n]);
const isPlain = (v) => v !== null && typeof v === "object" && (Array.isArray(v) || Object.getPrototypeOf(v) === Object.prototype);

/** Whether `value` (call arguments: input objects, batches) holds an element frame source. */
function holdsElementFrames(value) {
  if (isFrameSource(value)) return isElementFrame(value);
  return isPlain(value) && Object.values(value).some(holdsElementFrames);
}

/** `value` with every element frame source replaced by an ImageBitmap of it (pushed to `made`:
 *  the caller transfers them). `where` names the input in errors. */
async function portableFrames(value, made, where = "") {
  if (isFrameSource(value)) {
    if (!isElementFrame(value)) return value;
    try {
      const bitmap = await createImageBitmap(value, { premultiplyAlpha: "none", colorSpaceConversion: "none" });
      made.push(bitmap);
      return bitmap;
    } catch (err) {
      throw new GlcompError(`input ${JSON.stringify(where)}: a ${value.constructor.name} could not be read into an ImageBitmap `
        + `for the worker (${err.message}); is the video playing, the image loaded?`);
    }
  }
  if (!isPlain(value)) return value;
  const entries = await Promise.all(Object.entries(value).map(async ([k, v]) => [k, await portableFrames(v, made, Array.isArray(value) ? where : k)]));
  return Array.isArray(value) ? entries.map(([, v]) => v) : Object.fromEntries(entries);
}

function errorData(err) {
  return { name: err?.name ?? "Error", message: err?.message ?? String(err), reason: err?.reason, losses: err?.losses };
}

function errorOf(data) {
  const err = data.name === "GlcompError" ? new GlcompError(data.message) : new Error(data.message);
  if (data.name !== "GlcompError") err.name = data.name;
  if (data.reason !== undefined) err.reason = data.reason;
  if (data.losses !== undefined) err.losses = data.losses;
  return err;
}

/** Whether this browser can create a dedicated module Worker with OffscreenCanvas at all (the
 *  worker itself then checks that its OffscreenCanvas gives a WebGL context). */
export function workerSupported() {
  return typeof Worker === "function" && typeof OffscreenCanvas === "function";
}

/** The runtime API of Runtime, run in a dedicated Worker. Every method returns a Promise. */
export class WorkerRuntime {
  /** Load `source` (a URL, resolved against the page, or the bundle's files) in a new worker.
   *  Options as Runtime.load's (`readback`, `contextAttributes`, `keepWeightsEvery`, `quiet`);
   *  `canvas` and `onContextLost` callbacks cannot cross to a worker. Rejects with a GlcompError
   *  whose `reason` is "no-worker-webgl" where the worker has no OffscreenCanvas WebGL. */
  static async load(source, options = {}) {
    if (!workerSupported()) {
      const err = new GlcompError("this browser has no Worker with OffscreenCanvas: training in a worker is not possible here");
      err.reason = NO_WEBGL;
      throw err;
    }
    const url = options.workerUrl ?? new URL("./worker.js", import.meta.url);
    const rt = new WorkerRuntime(new Worker(url, { type: "module", name: WORKER_NAME }));
    if (typeof source === "string" && typeof location !== "undefined") source = new URL(source, location.href).href;
    const opts = Object.fromEntries(Object.entries(options).filter(([k, v]) => typeof v !== "function"
      && !["canvas", "worker", "workerUrl"].includes(k)));
    try {
      const { info, manifest, carried } = await rt._call("load", [source, opts]);
      rt._info = info;
      rt.manifest = manifest;
      rt._carried = carried;
    } catch (err) {
      rt._worker.terminate();
      throw err;
    }
    return rt;
  }

  constructor(worker) {
    this._worker = worker;
    this._pending = new Map();
    this._next = 1;
    this._disposed = false;
    this._sent = Promise.resolve(); // settles once every call made so far has been posted
    this._converting = 0; // calls waiting for their frames to become ImageBitmaps
    /** Where the steps run: "worker" (here) or "main" (Runtime). */
    this.thread = "worker";
    /** Train steps run since load, as of the last reply from the worker. */
    this.steps = 0;
    worker.onmessage = (ev) => this._receive(ev.data);
    worker.onerror = (ev) => this._failAll(new GlcompError(`the glcomp worker failed: ${ev.message ?? "script error"}`));
    worker.onmessageerror = () => this._failAll(new GlcompError("a message from the glcomp worker could not be read"));
  }

  _receive(msg) {
    const call = this._pending.get(msg.id);
    if (!call) return;
    if (typeof msg.steps === "number") this.steps = msg.steps;
    if (msg.progress) {
      call.onProgress?.(msg.progress);
      return;
    }
    this._pending.delete(msg.id);
    if (msg.ok) call.resolve(msg.value);
    else call.reject(errorOf(msg.error));
  }

  _failAll(err) {
    for (const call of this._pending.values()) call.reject(err);
    this._pending.clear();
  }

  /** Send `op` to the worker; resolves to its reply. Calls reach the worker in the order they
   *  are made: one whose arguments hold element frames (a <video>, a canvas) is posted once they
   *  are ImageBitmaps, and the calls made after it wait for it. */
  _call(op, args = [], { transfer = [], onProgress } = {}) {
    if (this._disposed) return Promise.reject(new GlcompError("the runtime was disposed"));
    const id = this._next++;
    return new Promise((resolve, reject) => {
      this._pending.set(id, { resolve, reject, onProgress });
      const convert = holdsElementFrames(args);
      if (!convert && this._converting === 0) {
        this._post(id, op, args, transfer);
        return;
      }
      this._converting++;
      this._sent = this._sent.then(async () => {
        const made = [];
        try {
          const portable = convert ? await portableFrames(args, made) : args;
          if (this._pending.has(id)) this._post(id, op, portable, [...transfer, ...made]);
        } catch (err) {
          made.forEach((b) => b.close());
          if (this._pending.delete(id)) reject(err);
        } finally {
          this._converting--;
        }
      });
    });
  }

  _post(id, op, args, transfer) {
    try {
      this._worker.postMessage({ id, op, args }, transfer);
    } catch (err) {
      const call = this._pending.get(id);
      this._pending.delete(id);
      call?.reject(new GlcompError(`could not send ${op} to the glcomp worker: ${err.message}`));
    }
  }

  /** One optimizer step; resolves to the loss. `transfer: true` moves the inputs' buffers to the
   *  worker instead of copying them (the arrays become empty here). An image input takes the
   *  frame sources Runtime takes; a <video>, <canvas>, <img> or OffscreenCanvas is read into an
   *  ImageBitmap of its current pixels here (it cannot cross to the worker), the rest cross. */
  trainStep(inputs, { transfer = false } = {}) {
    return this._call("trainStep", [inputs], { transfer: transfer ? transferables(inputs) : [] });
  }
  predict(inputs, { transfer = false } = {}) {
    return this._call("predict", [inputs], { transfer: transfer ? transferables(inputs) : [] });
  }
  gradients(inputs, { transfer = false } = {}) {
    return this._call("gradients", [inputs], { transfer: transfer ? transferables(inputs) : [] });
  }

  /** Runtime.train in the worker: `steps` steps over `batches` (an array of input objects, used
   *  in turn; sent once). `onStep(step, loss)` runs here for every `progressEvery`-th step (default
   *  1) and may return false to stop (the worker stops before its next step). Resolves to every
   *  loss. `inflight`, `keepEvery` as Runtime.train; the worker always yields with tasks. */
  async train({ steps, batches, onStep, inflight = 2, keepEvery, progressEvery = 1, transfer = false } = {}) {
    if (typeof batches === "function") {
      throw new GlcompError("train in a worker: batches must be an array of inputs (a function cannot cross to the worker)");
    }
    if (!isInt(progressEvery) || progressEvery < 1) throw new GlcompError("train: progressEvery must be a positive integer");
    const id = this._next; // the id _call is about to use: stop messages name it
    let stopped = false;
    const onProgress = async ({ step, loss }) => {
      if (!onStep || stopped) return;
      if ((await onStep(step, loss)) === false) {
        stopped = true;
        this._worker.postMessage({ id: this._next++, op: "stop", args: [id] });
      }
    };
    const args = [{ steps, batches, inflight, keepEvery, progress: onStep ? progressEvery : 0 }];
    return this._call("train", args, { transfer: transfer ? transferables(batches) : [], onProgress });
  }

  /** The tensor `name` ({shape, dtype, data}); see Runtime.inspect. */
  inspect(name) {
    return this._call("inspect", [name]);
  }
  /** What the worker's WebGL context offers (Runtime.info), plus `thread: "worker"`. */
  info() {
    return { ...this._info, warnings: [...(this._info?.warnings ?? [])], thread: "worker" };
  }
  setLr(lr) {
    return this._call("setLr", [lr]);
  }
  getWeights(options = {}) {
    return this._call("getWeights", [options]);
  }
  setWeights(state) {
    return this._call("setWeights", [state]);
  }
  /** The inputs carried across batches (Runtime.carriedState). */
  get carriedState() {
    return [...(this._carried ?? [])];
  }
  /** Zero the state carried across batches (all of it, or `names`); see Runtime.resetState. */
  resetState(names) {
    return this._call("resetState", [names ?? null]); // null: every carried input
  }
  exportSafetensors(options = {}) {
    return this._call("exportSafetensors", [options]);
  }
  snapshot() {
    return this._call("snapshot");
  }
  liveObjects() {
    return this._call("liveObjects");
  }
  saveToIndexedDB(key, options = {}) {
    return this._call("saveToIndexedDB", [key, options]);
  }
  loadFromIndexedDB(key, options = {}) {
    return this._call("loadFromIndexedDB", [key, options]);
  }

  /** Delete the worker's GL objects and end the worker; pending calls reject. Resolves to the
   *  worker runtime's liveObjects() after its dispose (all zero). */
  async dispose() {
    if (this._disposed) return null;
    try {
      return await this._call("dispose");
    } finally {
      this._disposed = true;
      this._worker.terminate();
      this._failAll(new GlcompError("the runtime was disposed"));
    }
  }
}

/** Load a bundle where training suits the page best. `worker`: "auto" (default: a dedicated
 *  Worker where OffscreenCanvas WebGL exists, else the main thread), true (a worker or a
 *  GlcompError saying why not) or false (the main thread). The runtime's `thread` says which;
 *  a main-thread fallback sets `fallbackReason`. */
export async function load(source, options = {}) {
  const mode = options.worker ?? "auto";
  if (![true, false, "auto"].includes(mode)) throw new GlcompError(`load: worker must be true, false or "auto", got ${String(mode)}`);
  const main = async (reason) => {
    const rt = await Runtime.load(source, options);
    rt.thread = "main";
    if (reason) rt.fallbackReason = reason;
    return rt;
  };
  if (mode === false) return main(null);
  try {
    return await WorkerRuntime.load(source, options);
  } catch (err) {
    if (mode === "auto" && err.reason === NO_WEBGL) return main(err.message);
    throw err;
  }
}

// -- the worker's side ----------------------------------------------------------------------------
function probeWebGL() {
  const canvas = new OffscreenCanvas(1, 1);
  const gl = canvas.getContext("webgl2") || canvas.getContext("webgl");
  if (!gl) return false;
  gl.getExtension("WEBGL_lose_context")?.loseContext();
  return true;
}

function serveWorker(scope) {
  let rt = null;
  const stops = new Set();
  const reply = (id, msg, transfer = []) => scope.postMessage({ id, steps: rt?.steps, ...msg }, transfer);
  const ops = {
    async load(source, opts) {
      if (typeof OffscreenCanvas !== "function" || !probeWebGL()) {
        const err = new GlcompError("this browser's workers have no OffscreenCanvas WebGL context: train on the main thread");
        err.reason = NO_WEBGL;
        throw err;
      }
      rt = await Runtime.load(source, opts);
      return { info: rt.info(), manifest: rt.manifest, carried: rt.carriedState };
    },
    trainStep: (inputs) => rt.trainStep(inputs),
    predict: (inputs) => rt.predict(inputs),
    gradients: (inputs) => rt.gradients(inputs),
    async train({ steps, batches, inflight, keepEvery, progress }, id) {
      const options = { steps, batches, inflight, yieldTo: "task" };
      if (keepEvery !== undefined) options.keepEvery = keepEvery;
      options.onStep = (step, loss) => {
        if (progress && (step % progress === 0 || step === steps - 1)) reply(id, { progress: { step, loss } });
        return !stops.has(id);
      };
      try {
        return await rt.train(options);
      } finally {
        stops.delete(id);
      }
    },
    stop(trainId) {
      stops.add(trainId);
    },
    inspect: (name) => rt.inspect(name),
    setLr: (lr) => rt.setLr(lr),
    getWeights: (options) => rt.getWeights(options),
    setWeights: (state) => rt.setWeights(state),
    resetState: (names) => rt.resetState(names),
    exportSafetensors: (options) => rt.exportSafetensors(options),
    snapshot: () => rt.snapshot(),
    liveObjects: () => rt.liveObjects(),
    saveToIndexedDB: (key, options) => rt.saveToIndexedDB(key, options),
    loadFromIndexedDB: (key, options) => rt.loadFromIndexedDB(key, options),
    dispose() {
      rt?.dispose();
      return rt ? rt.liveObjects() : null;
    },
  };
  scope.onmessage = async (ev) => {
    const { id, op, args } = isObj(ev.data) ? ev.data : {};
    try {
      if (!Object.hasOwn(ops, op)) throw new GlcompError(`the glcomp worker has no operation ${String(op)}`);
      if (op !== "load" && !rt) throw new GlcompError("the glcomp worker has no bundle loaded");
      const value = await ops[op](...(args ?? []), id);
      if (op !== "stop") reply(id, { ok: true, value }, transferables(value));
    } catch (err) {
      reply(id, { ok: false, error: errorData(err) });
    }
  };
}

const scope = globalThis;
if (typeof scope.WorkerGlobalScope === "function" && scope instanceof scope.WorkerGlobalScope && scope.name === WORKER_NAME) {
  serveWorker(scope);
}
