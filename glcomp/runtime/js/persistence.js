// The Runtime's persistence (a part of the Runtime class of runtime.js, which copies these
// methods onto its prototype): the weights read and written (getWeights, setWeights,
// exportSafetensors, the checks of _loadAll shared with the worker, resetState for the state
// carried across batches), the snapshots of the whole
// state that restore() brings back after a context loss (snapshot, keptState, keptSteps), and
// saving to and loading from IndexedDB.
import { parseSafetensors, writeSafetensors } from "./format/parse.js";
import { nestedShape } from "./io.js";
import { GlcompError, fmtList, fmtShape, isObj, prod, repr, sameList } from "./util.js";

export class PersistenceMethods {
  // -- snapshots -------------------------------------------------------------------------------
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

  // -- weights ---------------------------------------------------------------------------------
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

  /** The inputs carried across batches (glcomp.compile's `carry=`, kept in program.json's
   *  options): train_step, and predict compiled with carry_predict, write them. */
  get carriedState() {
    return [...(this.bundle.carried ?? [])];
  }

  /** Zero the state carried across batches, as Python's rt.reset_state(): every carried input,
   *  or those `names` gives (one name or an array of them); a GlcompError naming any other name
   *  (nothing is reset then). restore() after a context loss brings the zeros back too. */
  resetState(names) {
    this._alive();
    const known = this.carriedState;
    let chosen;
    if (names === undefined || names === null) chosen = known;
    else if (typeof names === "string") chosen = [names];
    else if (Array.isArray(names) && names.every((n) => typeof n === "string")) chosen = [...names];
    else throw new GlcompError(`resetState: expected a name or an array of names, got ${repr(names)}`);
    const carried = new Set(known);
    const unknown = chosen.filter((n) => !carried.has(n));
    if (unknown.length) {
      throw new GlcompError(`resetState: ${fmtList(unknown)} are not carried state; the carried inputs are `
        + `${fmtList(known)} (glcomp.compile's carry=)`);
    }
    const kept = Object.assign(Object.create(null), this._kept.weights);
    for (const name of chosen) {
      const size = prod(this.manifest.states[name].layout.shape);
      this._uploadState(name, new Float32Array(size));
      kept[name] = new Float32Array(size);
    }
    this._kept = { ...this._kept, weights: kept };
  }

  /** The weights as a safetensors file (float32 tensors, int64 counters). With `optimizer`,
   *  optimizer state too: a complete weights.safetensors for the bundle. */
  exportSafetensors({ optimizer = false } = {}) {
    const w = this.getWeights({ optimizer });
    const tensors = Object.create(null);
    for (const [k, t] of Object.entries(w)) tensors[k] = { dtype: t.dtype === "int64" ? "I64" : "F32", shape: t.shape, data: t.data };
    return writeSafetensors(tensors);
  }

  // -- IndexedDB -------------------------------------------------------------------------------
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
