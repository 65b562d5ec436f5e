// A browser site of a glcomp federation (glcomp federated site --browser): this page holds the
// site's data, trains the bundle served beside it with glcomp.js, and hands back only weights.
//
// The page talks to its bridge (the site's Python process, same origin, 127.0.0.1): it tells the
// bridge how many rows it holds (POST /api/data, the count only), long-polls for a round's job
// (GET /api/job: the global weights, the batch order, the steps, the learning rate), trains the
// steps from those weights with the optimizer state zeroed (as a Python site does each round),
// and posts the trained parameters and buffers with the example count and every step's loss
// (POST /api/job/<id>/update). The bridge checks them; any masking (SecAgg+) is done in Python.
//
// Data: a .safetensors file the user picks (tensors named as the bundle's input and target, N
// rows each), kept in IndexedDB so that a reload keeps it; or, for tests,
// window.glcompSite.setData({x: Float32Array, y: Int32Array}). The page shows the round, the
// local loss curve and what was sent (bytes, norms).
import { GlcompError, Runtime, parseSafetensors } from "./glcomp.js";
import { drawChart } from "./chart.js";

const $ = (id) => document.getElementById(id);
const DB = "glcomp-site";
const DATA_KEY = "site-data";

const state = {
  status: "loading", // loading | no-data | waiting | training | error
  round: null,
  rows: null,
  rounds: [], // per round: {round, steps, losses, sent: {bytes, tensors: {name: {shape, bytes, norm}}, updateNorm}, answer}
  error: null,
  lastJob: 0,
};

let rt = null;
let spec = null; // {xName, yName, batch, xSize, xDtype, yDtype}
let data = null; // {x: typed array (rows * xSize), y: typed array (rows), rows}
// A test hook: a function (update, job) -> update applied to what is about to be sent (tests use
// it to send a bad update and see the bridge refuse it). Never set by the page itself.
let tamper = null;

function show(status, text) {
  state.status = status;
  $("status").textContent = text;
}

function fail(err) {
  state.error = String(err && err.message ? err.message : err);
  $("error").hidden = false;
  $("error").textContent = state.error;
}

function specOf(manifest) {
  const entries = manifest.entries;
  if (!entries.train_step) throw new GlcompError("the bundle has no train_step: compile it with a loss and an optimizer");
  const xNames = Object.keys(entries.predict.inputs);
  const yNames = Object.keys(entries.train_step.inputs).filter((k) => !xNames.includes(k));
  if (xNames.length !== 1 || yNames.length !== 1) {
    throw new GlcompError(`a site page trains models with one input and one target; the bundle has ${xNames} and ${yNames}`);
  }
  const x = manifest.inputs[xNames[0]];
  const y = manifest.inputs[yNames[0]];
  const xSize = x.shape.slice(1).reduce((a, b) => a * b, 1);
  const ySize = y.shape.slice(1).reduce((a, b) => a * b, 1);
  return { xName: xNames[0], yName: yNames[0], batch: x.shape[0], xSize, ySize, xDtype: x.dtype, yDtype: y.dtype };
}

const ARRAYS = { float32: Float32Array, int32: Int32Array };

/** Check and keep the site's data: {[input]: rows x features, [target]: rows}. */
function takeData(arrays) {
  const pick = (name, dtype, size) => {
    const v = arrays[name];
    if (!v) throw new GlcompError(`the data holds no ${JSON.stringify(name)} (the bundle's input and target are ${spec.xName}, ${spec.yName})`);
    const values = ArrayBuffer.isView(v) ? v : v.data;
    const Type = ARRAYS[dtype] || Float32Array;
    const out = Type.from(values, Number);
    if (out.length % size !== 0) throw new GlcompError(`${name}: ${out.length} values are not whole rows of ${size}`);
    if (dtype === "float32" && !out.every(Number.isFinite)) throw new GlcompError(`${name} holds NaN or infinite values`);
    return out;
  };
  const x = pick(spec.xName, spec.xDtype, spec.xSize);
  const y = pick(spec.yName, spec.yDtype, spec.ySize);
  const rows = x.length / spec.xSize;
  if (y.length / spec.ySize !== rows) throw new GlcompError(`${spec.xName} has ${rows} rows, ${spec.yName} ${y.length / spec.ySize}`);
  if (rows < spec.batch) throw new GlcompError(`${rows} rows, fewer than one batch of ${spec.batch}`);
  return { x, y, rows };
}

function idb(mode, fn) {
  return new Promise((resolve, reject) => {
    const open = indexedDB.open(DB, 1);
    open.onupgradeneeded = () => open.result.createObjectStore("data");
    open.onerror = () => reject(open.error);
    open.onsuccess = () => {
      const tx = open.result.transaction("data", mode);
      const req = fn(tx.objectStore("data"));
      tx.oncomplete = () => { open.result.close(); resolve(req.result); };
      tx.onerror = () => { open.result.close(); reject(tx.error); };
    };
  });
}

async function post(path, body) {
  const res = await fetch(path, { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  const reply = await res.json().catch(() => ({}));
  if (!res.ok) throw new GlcompError(reply.error || `${path}: HTTP ${res.status}`);
  return reply;
}

async function setData(arrays, { keep = false } = {}) {
  data = takeData(arrays);
  state.rows = data.rows;
  if (keep) {
    await idb("readwrite", (s) => s.put({ [spec.xName]: data.x, [spec.yName]: data.y }, DATA_KEY));
  }
  $("rows").textContent = `${data.rows} rows here (they stay in this page)`;
  await post("/api/data", { rows: data.rows });
  show("waiting", "waiting for the server's next round");
  return data.rows;
}

async function forgetData() {
  await idb("readwrite", (s) => s.delete(DATA_KEY));
  $("rows").textContent = "data forgotten (reload to pick again)";
}

// -- encoding weights -------------------------------------------------------------------------------
function toBase64(f32) {
  const bytes = new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength);
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(s);
}

function fromBase64(text) {
  const s = atob(text);
  const bytes = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) bytes[i] = s.charCodeAt(i);
  return new Float32Array(bytes.buffer);
}

function norm(values) {
  let t = 0;
  for (const v of values) t += v * v;
  return Math.sqrt(t);
}

// -- a round ---------------------------------------------------------------------------------------
async function train(job) {
  state.round = job.round;
  $("round").textContent = `round ${job.round}`;
  if (!data || data.rows !== job.rows) throw new GlcompError(`the page holds ${data ? data.rows : 0} rows, the job is for ${job.rows}`);
  const global = {};
  for (const [k, t] of Object.entries(job.weights)) global[k] = { shape: t.shape, data: fromBase64(t.data) };
  // The global weights, this page's own counters, the optimizer state zeroed (a Python site's
  // optimizer="reset"): every state of the bundle, loaded at once (the runtime checks them all).
  const all = rt.getWeights({ optimizer: true });
  const load = {};
  for (const [k, t] of Object.entries(all)) {
    const role = rt.manifest.states[k]?.role;
    if (Object.hasOwn(global, k)) load[k] = global[k];
    else if (role === "state") load[k] = { shape: t.shape, data: new Float32Array(t.data.length) };
    else load[k] = t;
  }
  rt._loadAll(load, rt._weightShapes(true), "runtime");
  if (typeof job.lr === "number") rt.setLr(job.lr);
  const { batch } = spec;
  const x = new (ARRAYS[spec.xDtype] || Float32Array)(batch * spec.xSize);
  const y = new (ARRAYS[spec.yDtype] || Float32Array)(batch * spec.ySize);
  const losses = [];
  const c = (job.proximal_mu || 0) * rt.hyper.lr;
  const entry = { round: job.round, steps: job.steps, losses, sent: null, answer: null };
  state.rounds.push(entry);
  for (let step = 0; step < job.steps; step++) {
    for (let i = 0; i < batch; i++) {
      const row = job.order[step * batch + i];
      x.set(data.x.subarray(row * spec.xSize, (row + 1) * spec.xSize), i * spec.xSize);
      y.set(data.y.subarray(row * spec.ySize, (row + 1) * spec.ySize), i * spec.ySize);
    }
    const loss = await rt.trainStep({ [spec.xName]: x, [spec.yName]: y });
    if (!Number.isFinite(loss)) throw new GlcompError(`local training diverged at step ${step + 1} of round ${job.round} (loss ${loss})`);
    losses.push(loss);
    if (c > 0) { // FedProx: the proximal step w <- (w + lr mu w_global) / (1 + lr mu), as a Python site does
      const w = rt.getWeights();
      for (const k of job.trainable) {
        const g = global[k].data;
        w[k] = { shape: w[k].shape, data: Float32Array.from(w[k].data, (v, i) => (v + c * g[i]) / (1 + c)) };
      }
      rt.setWeights(w);
    }
    if (step % 5 === 4 || step === job.steps - 1) drawChart($("chart"), { losses, steps: job.steps });
  }
  const after = rt.getWeights();
  const weights = {};
  const tensors = {};
  let bytes = 0;
  let diff = 0;
  for (const k of Object.keys(job.weights)) {
    const t = after[k];
    const f = Float32Array.from(t.data);
    weights[k] = { shape: t.shape, dtype: "float32", data: toBase64(f) };
    const g = global[k].data;
    for (let i = 0; i < f.length; i++) diff += (f[i] - g[i]) ** 2;
    tensors[k] = { shape: t.shape, bytes: f.byteLength, norm: norm(f) };
    bytes += f.byteLength;
  }
  let update = { num_examples: data.rows, losses, lr: rt.hyper.lr, weights, renderer: rt.info().renderer ?? "unknown" };
  if (tamper) update = tamper(update, job) || update;
  entry.sent = { bytes, tensors, updateNorm: Math.sqrt(diff) };
  showSent(entry);
  return update;
}

function showSent(entry) {
  const lines = [`round ${entry.round}: ${entry.steps} steps, loss ${entry.losses[0].toFixed(4)} → ${entry.losses.at(-1).toFixed(4)}`,
    `sent ${entry.sent.bytes} bytes of weights (no data), update norm ${entry.sent.updateNorm.toPrecision(4)}`];
  for (const [k, t] of Object.entries(entry.sent.tensors)) lines.push(`  ${k} [${t.shape.join(", ")}] ${t.bytes} B, norm ${t.norm.toPrecision(4)}`);
  $("sent").textContent = lines.join("\n");
}

async function loop() {
  for (;;) {
    let job;
    try {
      const res = await fetch(`/api/job?after=${state.lastJob}`);
      if (res.status === 204) continue;
      if (!res.ok) throw new GlcompError(`/api/job: HTTP ${res.status}`);
      job = await res.json();
    } catch (err) {
      fail(`the bridge did not answer (${err.message || err}); retrying`);
      await new Promise((r) => setTimeout(r, 2000));
      continue;
    }
    state.lastJob = job.id;
    show("training", `training round ${job.round} (${job.steps} steps)`);
    let update;
    try {
      update = await train(job);
    } catch (err) {
      fail(err);
      await post(`/api/job/${job.id}/fail`, { error: String(err.message || err) }).catch(() => {});
      show("waiting", "waiting for the server's next round");
      continue;
    }
    const entry = state.rounds.at(-1);
    try {
      await post(`/api/job/${job.id}/update`, update);
      entry.answer = "accepted";
      $("error").hidden = true;
    } catch (err) {
      entry.answer = `refused: ${err.message || err}`;
      fail(`the bridge refused this page's update: ${err.message || err}`);
    }
    show("waiting", `round ${job.round} sent; waiting for the server's next round`);
  }
}

async function start() {
  rt = await Runtime.load("bundle/", { quiet: true });
  spec = specOf(rt.manifest);
  $("info").textContent = `model: ${spec.xName} ${JSON.stringify(rt.manifest.inputs[spec.xName].shape)} → ${spec.yName}; `
    + `WebGL ${rt.info().webgl}, ${rt.info().renderer ?? ""}`;
  $("file").addEventListener("change", async () => {
    const file = $("file").files[0];
    if (!file) return;
    try {
      await setData(parseSafetensors(await file.arrayBuffer(), file.name), { keep: true });
    } catch (err) {
      fail(err);
    }
  });
  $("forget").addEventListener("click", () => forgetData().catch(fail));
  const kept = await idb("readonly", (s) => s.get(DATA_KEY)).catch(() => null);
  if (kept) await setData(kept).catch(fail);
  else show("no-data", "pick this site's data file (.safetensors) to take part");
  loop();
}

window.glcompSite = {
  state,
  setData: (arrays) => setData(arrays),
  setTamper: (fn) => { tamper = fn; },
  ready: start().catch((err) => { show("error", "could not start"); fail(err); throw err; }),
};
