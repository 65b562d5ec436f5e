// The fine-tuning page: a pretrained classifier bundle (one image input of shape (batch, 1, H, W)
// with values in [0, 1], one class-index target) learns from examples the user draws on an HxW pad
// or uploads. Batches of the compiled size are sampled, with replacement, from those examples.
// data.safetensors beside the bundle (optional) gives held-out test images (x_test, y_test) and a
// few sample examples (x_train, y_train). Query parameters: bundle (default "bundle/"), data.
// The loss of every step is plotted (chart.js) while a run trains; the page says whether the bundle
// it starts from was trained before it was saved (chart.js's alreadyTrained).
// What a test can drive: window.glcompFinetune.
import { alreadyTrained, drawChart } from "./chart.js";
import { GlcompError, Runtime, downloadBytes, parseSafetensors } from "./glcomp.js";

const params = new URLSearchParams(location.search);
const bundleUrl = params.get("bundle") || "bundle/";
const dataUrl = params.get("data") || new URL("data.safetensors", new URL(bundleUrl, location.href)).href;
const $ = (id) => document.getElementById(id);

const state = {
  status: "loading", // loading | ready | training | error
  examples: [], // { x: Float32Array(H*W), y: class }
  losses: [], // every step's loss, over all runs
  chart: null, // what the loss chart drew last (chart.js): points, tick labels, label boxes
  pretrained: null, // whether the bundle was trained before it was saved (its optimizer state)
  accuracy: null, // { all, byClass } on the held-out test images, after the last evaluation
  error: null,
};

function fail(err) {
  state.status = "error";
  state.error = String(err && err.message ? err.message : err);
  $("error").hidden = false;
  $("error").textContent = state.error;
}

// mulberry32: a seeded PRNG so a fine-tuning run is repeatable
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function modelShape(manifest) {
  const entries = manifest.entries;
  if (!entries.train_step) throw new GlcompError("the bundle has no train_step: compile it with a loss and an optimizer");
  const xNames = Object.keys(entries.predict.inputs);
  const yNames = Object.keys(entries.train_step.inputs).filter((k) => !xNames.includes(k));
  if (xNames.length !== 1 || yNames.length !== 1) {
    throw new GlcompError(`this page fine-tunes classifiers with one image input and one target; the bundle has ${xNames} and ${yNames}`);
  }
  const xs = manifest.inputs[xNames[0]].shape;
  const ys = manifest.inputs[yNames[0]];
  if (xs.length !== 4 || xs[1] !== 1 || !ys.num_classes || ys.shape.length !== 1) {
    throw new GlcompError(`this page needs an input of shape (batch, 1, H, W) and class targets; the bundle's input is ${JSON.stringify(xs)}`);
  }
  return { xName: xNames[0], yName: yNames[0], batch: xs[0], h: xs[2], w: xs[3], classes: ys.num_classes };
}

async function loadData(shape) {
  let res;
  try {
    res = await fetch(dataUrl);
  } catch {
    return null;
  }
  if (!res.ok) return null; // no held-out data: the page still fine-tunes on drawn examples
  const t = parseSafetensors(await res.arrayBuffer(), "data.safetensors");
  const size = shape.h * shape.w;
  const split = (xk, yk) => {
    if (!t[xk] || !t[yk]) return [];
    const x = Float32Array.from(t[xk].data, Number);
    const y = Array.from(t[yk].data, Number);
    if (x.length !== y.length * size) throw new GlcompError(`data.safetensors: ${xk} does not hold ${shape.h}x${shape.w} images`);
    return y.map((c, i) => ({ x: x.subarray(i * size, (i + 1) * size), y: c }));
  };
  return { samples: split("x_train", "y_train"), test: split("x_test", "y_test") };
}

function batchOf(shape, items) {
  const size = shape.h * shape.w;
  const x = new Float32Array(shape.batch * size);
  const y = new Int32Array(shape.batch);
  items.forEach((it, i) => {
    x.set(it.x, i * size);
    y[i] = it.y;
  });
  return { [shape.xName]: x, [shape.yName]: y };
}

/** Logits of each image, in batches of the compiled size (the last batch padded). */
async function logitsOf(rt, shape, images) {
  const out = [];
  for (let s = 0; s < images.length; s += shape.batch) {
    const items = images.slice(s, s + shape.batch).map((x) => ({ x, y: 0 }));
    const real = items.length;
    while (items.length < shape.batch) items.push(items[0]);
    const feeds = batchOf(shape, items);
    delete feeds[shape.yName];
    const res = await rt.predict(feeds);
    const width = res.data.length / shape.batch;
    for (let i = 0; i < real; i++) out.push(res.data.slice(i * width, (i + 1) * width));
  }
  return out;
}

/** The loss chart: every step's loss so far, the axis long enough for `steps` steps. */
function plotLosses(steps = state.losses.length) {
  state.chart = drawChart($("chart"), { losses: state.losses, steps });
}

const argmax = (row) => row.reduce((best, v, i) => (v > row[best] ? i : best), 0);

function softmax(row) {
  const m = Math.max(...row);
  const e = Array.from(row, (v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
}

// -- the drawing pad: an HxW canvas shown enlarged; ink is 1, background 0 ------------------------
function makePad(shape) {
  const pad = $("pad");
  pad.width = shape.w;
  pad.height = shape.h;
  const ctx = pad.getContext("2d", { willReadFrequently: true });
  const ink = new Float32Array(shape.h * shape.w);
  const paint = () => {
    const img = ctx.createImageData(shape.w, shape.h);
    ink.forEach((v, i) => {
      const c = Math.round(255 * Math.min(1, v));
      img.data.set([c, c, c, 255], 4 * i);
    });
    ctx.putImageData(img, 0, 0);
  };
  let down = false;
  const stroke = (ev) => {
    const r = pad.getBoundingClientRect();
    const fx = ((ev.clientX - r.left) / r.width) * shape.w - 0.5;
    const fy = ((ev.clientY - r.top) / r.height) * shape.h - 0.5;
    for (let y = 0; y < shape.h; y++) {
      for (let x = 0; x < shape.w; x++) {
        const d2 = (x - fx) ** 2 + (y - fy) ** 2;
        ink[y * shape.w + x] = Math.min(1, ink[y * shape.w + x] + Math.max(0, 0.9 - 0.6 * d2));
      }
    }
    paint();
  };
  pad.addEventListener("pointerdown", (ev) => { down = true; pad.setPointerCapture(ev.pointerId); stroke(ev); });
  pad.addEventListener("pointermove", (ev) => { if (down) stroke(ev); });
  pad.addEventListener("pointerup", () => { down = false; });
  paint();
  return {
    read: () => Float32Array.from(ink),
    clear: () => { ink.fill(0); paint(); },
    set: (values) => { ink.set(values); paint(); },
  };
}

/** An uploaded picture as HxW ink in [0, 1]: scaled down, grey, dark-on-light pictures inverted. */
async function imageToInk(file, shape) {
  const bitmap = await createImageBitmap(file);
  const canvas = document.createElement("canvas");
  canvas.width = shape.w;
  canvas.height = shape.h;
  const ctx = canvas.getContext("2d", { willReadFrequently: true });
  ctx.drawImage(bitmap, 0, 0, shape.w, shape.h);
  const px = ctx.getImageData(0, 0, shape.w, shape.h).data;
  const grey = new Float32Array(shape.h * shape.w);
  for (let i = 0; i < grey.length; i++) grey[i] = (0.299 * px[4 * i] + 0.587 * px[4 * i + 1] + 0.114 * px[4 * i + 2]) / 255;
  const mean = grey.reduce((a, b) => a + b, 0) / grey.length;
  return mean > 0.5 ? grey.map((v) => 1 - v) : grey;
}

async function main() {
  const rt = await Runtime.load(bundleUrl, { quiet: true });
  const shape = modelShape(rt.manifest);
  const data = await loadData(shape);
  const info = rt.info();
  $("info").textContent = `WebGL ${info.webgl} on ${info.renderer} · software renderer: ${info.software ? "yes" : "no"} · ${shape.classes} classes, `
    + `${shape.h}x${shape.w} images, batches of ${shape.batch}`
    + (data ? ` · ${data.test.length} held-out test images` : "");
  state.pretrained = alreadyTrained(rt);
  $("trained").textContent = state.pretrained
    ? "Starting bundle: already trained (its optimizer state is not zero): fine-tuning continues from it."
    : "Starting bundle: untrained here (its optimizer state is zero: no train step has run on it); "
      + "its weights are the ones it was compiled with.";
  plotLosses(0);
  for (let c = 0; c < shape.classes; c++) $("label").add(new Option(String(c), String(c)));
  const pad = makePad(shape);

  const showCount = () => {
    const per = new Map();
    for (const e of state.examples) per.set(e.y, (per.get(e.y) || 0) + 1);
    const text = [...per.entries()].sort((a, b) => a[0] - b[0]).map(([c, n]) => `${c}: ${n}`).join(", ");
    $("count").textContent = state.examples.length ? `${state.examples.length} examples (${text})` : "no examples yet";
    $("train").disabled = state.examples.length === 0 || state.status !== "ready";
  };

  const api = {
    state,
    shape,
    addExample(pixels, label) {
      const x = Float32Array.from(pixels, Number);
      if (x.length !== shape.h * shape.w) throw new GlcompError(`an example has ${shape.h * shape.w} pixels, got ${x.length}`);
      if (!Number.isInteger(label) || label < 0 || label >= shape.classes) {
        throw new GlcompError(`a label is a class in 0..${shape.classes - 1}, got ${label}`);
      }
      if (!x.every((v) => Number.isFinite(v))) throw new GlcompError("an example's pixels must be finite");
      state.examples.push({ x, y: label });
      showCount();
    },
    useSamples() {
      if (!data || !data.samples.length) throw new GlcompError("data.safetensors holds no sample examples");
      for (const s of data.samples) api.addExample(s.x, s.y);
    },
    /** Accuracy on the held-out test images: overall and per class. */
    async evaluate() {
      if (!data || !data.test.length) return null;
      const logits = await logitsOf(rt, shape, data.test.map((t) => t.x));
      const good = new Array(shape.classes).fill(0);
      const total = new Array(shape.classes).fill(0);
      data.test.forEach((t, i) => {
        total[t.y]++;
        if (argmax(logits[i]) === t.y) good[t.y]++;
      });
      const all = good.reduce((a, b) => a + b, 0) / data.test.length;
      state.accuracy = { all, byClass: good.map((g, c) => (total[c] ? g / total[c] : null)) };
      const groups = state.accuracy.byClass.map((a, c) => (a === null ? "" : `${c}: ${Math.round(100 * a)}%`)).filter(Boolean);
      $("accuracy").textContent = `held-out accuracy ${(100 * all).toFixed(1)}% (${groups.join(", ")})`;
      return state.accuracy;
    },
    /** `steps` Adam steps on batches sampled from the examples; returns the losses. */
    async finetune(steps, seed = 0) {
      if (!state.examples.length) throw new GlcompError("add examples first: draw a digit, pick its label, press Add example");
      if (state.status !== "ready") throw new GlcompError(`the page is ${state.status}`);
      state.status = "training";
      $("train").disabled = true;
      const random = rng(seed);
      const pick = () => state.examples[Math.floor(random() * state.examples.length)];
      const end = state.losses.length + steps; // the chart's axis: this run's last step
      let drawn = 0; // when the chart was last drawn: at most 20 times a second
      try {
        const losses = await rt.train({
          steps,
          batches: () => batchOf(shape, Array.from({ length: shape.batch }, pick)),
          onStep: (i, loss) => {
            state.losses.push(loss);
            $("stats").textContent = `step ${i + 1}/${steps} · loss ${loss.toFixed(4)}`;
            if (performance.now() - drawn > 50) {
              plotLosses(end);
              drawn = performance.now();
            }
            return Number.isFinite(loss);
          },
        });
        if (!losses.every(Number.isFinite)) throw new GlcompError("the loss diverged: reload the page");
        $("export").disabled = false;
        return losses;
      } finally {
        plotLosses(end); // every step run, up to a diverged one
        if (state.status === "training") state.status = "ready";
        showCount();
      }
    },
    /** Class probabilities of one image. */
    async predict(pixels) {
      const [logits] = await logitsOf(rt, shape, [Float32Array.from(pixels, Number)]);
      return softmax(logits);
    },
    exportWeights: () => rt.exportSafetensors(),
    pad,
  };
  window.glcompFinetune = api;

  const guard = (f) => () => Promise.resolve().then(f).catch(fail);
  $("clear").onclick = () => pad.clear();
  $("add").onclick = guard(() => {
    api.addExample(pad.read(), Number($("label").value));
    pad.clear();
  });
  $("samples").onclick = guard(() => api.useSamples());
  $("upload").onchange = guard(async () => {
    for (const file of $("upload").files) api.addExample(await imageToInk(file, shape), Number($("label").value));
  });
  $("train").onclick = guard(async () => {
    await api.finetune(Math.max(1, Math.floor(Number($("steps").value))), state.losses.length);
    await api.evaluate();
  });
  $("predict").onclick = guard(async () => {
    const p = await api.predict(pad.read());
    $("probs").textContent = p.map((v, c) => `${c} ${"#".repeat(Math.round(20 * v)).padEnd(20)} ${(100 * v).toFixed(1)}%`).join("\n");
  });
  $("export").onclick = () => downloadBytes(rt.exportSafetensors(), "finetuned.safetensors");
  state.status = "ready";
  $("add").disabled = false;
  $("predict").disabled = false;
  $("samples").disabled = !(data && data.samples.length);
  showCount();
  await api.evaluate();
}

main().catch(fail);
