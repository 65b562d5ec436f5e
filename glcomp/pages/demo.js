// The demo page: load a bundle and data.safetensors (x_train, y_train, x_test, y_test) from beside
// it, train with the browser runtime, draw the loss live, report test accuracy, offer the weights.
// Labels may be one class per sample or one per position (a language model's next characters:
// accuracy is then counted per position). When data.safetensors also holds `vocab` (the code
// points of a character model's tokens), the page samples text from the model after each epoch.
// Query parameters: bundle (default "bundle/"), data, epochs, steps (per epoch, at most), lr,
// seed, sample (characters to generate, default 200), autostart=1.
import { drawChart as drawLossChart } from "./chart.js";
import { GlcompError, Runtime, downloadBytes, nextTask, parseSafetensors } from "./glcomp.js";

const params = new URLSearchParams(location.search);
const bundleUrl = params.get("bundle") || "bundle/";
const dataUrl = params.get("data") || new URL("data.safetensors", new URL(bundleUrl, location.href)).href;
const $ = (id) => document.getElementById(id);

// What a test (or a curious user) can read: window.glcompDemo.
const demo = {
  status: "loading", // loading | ready | training | done | error
  losses: [],
  accuracies: [], // per epoch, on the test set
  accuracy: null,
  metric: "accuracy",
  msPerStep: null, // training time per step, the first step (shader compilation) excluded
  firstStepMs: null,
  steps: 0,
  pretrained: false, // whether the bundle's weights were trained before (see alreadyTrained)
  chart: null, // what the chart drew last: tick labels and label boxes (chart.js)
  error: null,
  info: null,
  sample: null, // text sampled from a character model after the last epoch (with a vocab)
};
window.glcompDemo = demo;

function fail(err) {
  demo.status = "error";
  demo.error = String(err && err.message ? err.message : err);
  $("error").hidden = false;
  $("error").textContent = `${err && err.name === "GlcompError" ? "" : "error: "}${demo.error}`;
  $("start").disabled = true;
  $("stop").disabled = true;
}

const prod = (a) => a.reduce((x, y) => x * y, 1);

// A small seeded PRNG (mulberry32) so a run is repeatable.
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

function shuffled(n, random) {
  const idx = Array.from({ length: n }, (_, i) => i);
  for (let i = n - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [idx[i], idx[j]] = [idx[j], idx[i]];
  }
  return idx;
}

async function loadData(manifest) {
  let res;
  try {
    res = await fetch(dataUrl);
  } catch (err) {
    throw new GlcompError(`could not fetch ${dataUrl} (${err.message})`);
  }
  if (!res.ok) {
    throw new GlcompError(`no training data at ${dataUrl} (HTTP ${res.status}); write one beside the bundle with `
      + "glcomp.serve.export_data(dir, x_train, y_train, x_test, y_test)");
  }
  const t = parseSafetensors(await res.arrayBuffer(), "data.safetensors");
  for (const k of ["x_train", "y_train", "x_test", "y_test"]) {
    if (!t[k]) throw new GlcompError(`data.safetensors has no ${k}`);
  }
  const entries = manifest.entries;
  if (!entries.train_step) throw new GlcompError("the bundle has no train_step: compile it with a loss and an optimizer");
  const xNames = Object.keys(entries.predict.inputs);
  const yNames = Object.keys(entries.train_step.inputs).filter((k) => !xNames.includes(k));
  if (xNames.length !== 1 || yNames.length !== 1) {
    throw new GlcompError(`the demo trains models with one input and one target; this one has ${xNames} and ${yNames}`);
  }
  const xSpec = manifest.inputs[xNames[0]];
  const ySpec = manifest.inputs[yNames[0]];
  const batch = xSpec.shape[0];
  const xSize = prod(xSpec.shape.slice(1));
  const ySize = prod(ySpec.shape.slice(1));
  const sets = {};
  for (const split of ["train", "test"]) {
    const x = t[`x_${split}`];
    const y = t[`y_${split}`];
    const n = x.shape[0];
    if (prod(x.shape.slice(1)) !== xSize || y.shape[0] !== n || prod(y.shape.slice(1)) !== ySize) {
      throw new GlcompError(`data.safetensors: x_${split} ${JSON.stringify(x.shape)} / y_${split} `
        + `${JSON.stringify(y.shape)} do not fit the model's inputs ${JSON.stringify(xSpec.shape)} / ${JSON.stringify(ySpec.shape)}`);
    }
    sets[split] = { n, x: Float32Array.from(x.data, Number), y: Float64Array.from(y.data, Number) };
  }
  if (sets.train.n < batch) throw new GlcompError(`only ${sets.train.n} training samples for batches of ${batch}`);
  let vocab = null;
  if (t.vocab) {
    vocab = Array.from(t.vocab.data, (c) => String.fromCodePoint(Number(c)));
    if (vocab.length !== ySpec.num_classes || xSpec.shape.length !== 2 || ySize !== xSize) {
      throw new GlcompError(`data.safetensors: a vocab of ${vocab.length} characters needs a model of token ids `
        + `(batch, T) predicting ${vocab.length} classes per position; this one takes ${JSON.stringify(xSpec.shape)} `
        + `and ${ySpec.num_classes} classes of ${JSON.stringify(ySpec.shape)}`);
    }
  }
  return { ...sets, xName: xNames[0], yName: yNames[0], batch, xSize, ySize, classes: ySpec.num_classes, vocab };
}

function makeBatch(data, set, indices) {
  const { batch, xSize, ySize, classes } = data;
  const x = new Float32Array(batch * xSize);
  const y = classes ? new Int32Array(batch * ySize) : new Float32Array(batch * ySize);
  indices.forEach((s, i) => {
    x.set(set.x.subarray(s * xSize, (s + 1) * xSize), i * xSize);
    for (let j = 0; j < ySize; j++) y[i * ySize + j] = set.y[s * ySize + j];
  });
  return { [data.xName]: x, [data.yName]: y };
}

/** Test accuracy (classification; per position when each sample has several labels) or mean
 * squared error, in batches of the compiled size. */
async function evaluate(rt, data) {
  const { batch, test } = data;
  let good = 0;
  let sq = 0;
  for (let start = 0; start < test.n; start += batch) {
    const idx = [];
    for (let i = start; i < Math.min(start + batch, test.n); i++) idx.push(i);
    const real = idx.length;
    while (idx.length < batch) idx.push(idx[0]); // pad the last batch; padded rows are ignored
    const feeds = makeBatch(data, test, idx);
    delete feeds[data.yName];
    const out = await rt.predict(feeds);
    const width = out.data.length / batch;
    const classes = width / data.ySize; // scores per position
    for (let i = 0; i < real; i++) {
      const row = out.data.subarray(i * width, (i + 1) * width);
      if (data.classes) {
        for (let p = 0; p < data.ySize; p++) {
          const off = p * classes;
          let best = 0;
          for (let c = 1; c < classes; c++) if (row[off + c] > row[off + best]) best = c;
          if (best === test.y[idx[i] * data.ySize + p]) good++;
        }
      } else {
        for (let c = 0; c < width; c++) sq += (row[c] - test.y[idx[i] * width + c]) ** 2;
      }
    }
  }
  return data.classes ? good / (test.n * data.ySize) : sq / (test.n * data.ySize);
}

/** `count` characters sampled one at a time from a character model's next-character distribution
 * (softmax of the last position's logits), after a prompt: the first test window. The compiled
 * batch is filled with copies of the window and row 0 is read. */
async function sampleText(rt, data, count, random) {
  const { batch, xSize, vocab } = data;
  const ids = Array.from(data.test.x.subarray(0, xSize), Number);
  const prompt = ids.map((i) => vocab[i]).join("");
  let text = "";
  const x = new Float32Array(batch * xSize);
  for (let n = 0; n < count; n++) {
    const window = ids.slice(-xSize);
    for (let b = 0; b < batch; b++) x.set(window, b * xSize);
    const out = await rt.predict({ [data.xName]: x });
    const logits = out.data.subarray((xSize - 1) * vocab.length, xSize * vocab.length);
    const top = Math.max(...logits);
    const weights = Array.from(logits, (v) => Math.exp(v - top));
    let u = random() * weights.reduce((a, b) => a + b, 0);
    let next = 0;
    while (next < weights.length - 1 && u >= weights[next]) u -= weights[next++];
    ids.push(next);
    text += vocab[next];
  }
  return { prompt, text };
}

// -- the texture inspector: a chosen tensor as a heat map (docs/inspect.md) ----------------------
/** The tensors the bundle lets the page inspect: parameters and what inspect=[...] kept. */
function inspectNames(manifest) {
  const kept = Object.keys(manifest.entries.train_step?.outputs ?? {}).filter((k) => k.startsWith("inspect:"))
    .map((k) => k.slice("inspect:".length));
  const params = Object.entries(manifest.states).filter(([, st]) => st.role === "param").map(([k]) => k);
  return [...kept, ...params];
}

let heatBusy = false;
/** Draw the tensor chosen in #tensor as a heat map (rows: the first axis, columns: the rest;
 *  blue negative, red positive, scaled by its largest magnitude). Skips while a readback runs. */
async function drawHeat(rt) {
  const name = $("tensor").value;
  if (!name || heatBusy) return;
  heatBusy = true;
  try {
    const t = await rt.inspect(name);
    const rows = t.shape.length > 1 ? t.shape[0] : 1;
    const cols = Math.max(1, t.data.length / rows);
    const canvas = $("heat");
    canvas.width = cols;
    canvas.height = rows;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(cols, rows);
    const big = t.data.reduce((a, v) => Math.max(a, Math.abs(Number(v))), 0) || 1;
    t.data.forEach((v, i) => {
      const u = Number(v) / big;
      img.data.set(u >= 0 ? [255, 255 * (1 - u), 255 * (1 - u), 255] : [255 * (1 + u), 255 * (1 + u), 255, 255], 4 * i);
    });
    ctx.putImageData(img, 0, 0);
    $("heat-label").textContent = `${name} ${JSON.stringify(t.shape)}, |max| ${big.toPrecision(3)}`;
  } catch (err) {
    $("heat-label").textContent = err.message;
  } finally {
    heatBusy = false;
  }
}

// A bundle saved after training holds a non-zero optimizer state: the moments of a parameter
// (opt.<parameter>.<slot>: momentum, Adam's averages) start at zero and change with every step.
function alreadyTrained(rt) {
  const { weights } = rt.keptState(); // the bundle's own state, before any step here
  const names = Object.keys(weights);
  const params = names.filter((n) => !n.startsWith("opt."));
  return names.some((n) => params.some((p) => n.startsWith(`opt.${p}.`)) && weights[n].some((v) => v !== 0));
}

function drawChart(losses, accuracies, epochs, stepsPerEpoch) {
  demo.chart = drawLossChart($("chart"), { losses, accuracies, epochs, stepsPerEpoch });
}

async function main() {
  const rt = await Runtime.load(bundleUrl, { quiet: true });
  $("tensor").replaceChildren(...inspectNames(rt.manifest).map((n) => new Option(n, n)));
  $("tensor").onchange = () => drawHeat(rt);
  demo.info = rt.info();
  $("info").textContent = `WebGL ${demo.info.webgl} on ${demo.info.renderer} · software renderer: ${demo.info.software ? "yes" : "no"}`;
  if (demo.info.warnings.length) {
    $("warning").hidden = false;
    $("warning").textContent = demo.info.warnings.join(" ");
  }
  const data = await loadData(rt.manifest);
  demo.metric = data.classes ? "accuracy" : "mse";
  const maxSteps = Math.floor(Number(params.get("steps") || 0));
  const stepsPerEpoch = Math.min(Math.floor(data.train.n / data.batch), maxSteps > 0 ? maxSteps : Infinity);
  const sampleChars = Math.max(0, Math.floor(Number(params.get("sample") ?? 200)));
  $("lr").value = params.get("lr") || String(rt.hyper.lr);
  if (params.get("epochs")) $("epochs").value = params.get("epochs");
  $("info").textContent += ` · ${data.train.n} training and ${data.test.n} test samples, batches of ${data.batch}`;
  demo.pretrained = alreadyTrained(rt);
  if (demo.pretrained) {
    $("info").textContent += " · this bundle is already trained (its optimizer state is not zero): training here"
      + " continues from its weights, so the loss starts low";
  }
  drawChart([], [], Number($("epochs").value), stepsPerEpoch);
  let stopRequested = false;
  let trained = false;

  const run = async () => {
    const epochs = Math.max(1, Math.floor(Number($("epochs").value)));
    const lr = Number($("lr").value);
    if (Number.isFinite(lr) && lr > 0) rt.setLr(lr);
    demo.status = "training";
    demo.losses = [];
    demo.accuracies = [];
    stopRequested = false;
    let diverged = null;
    $("start").disabled = true;
    $("stop").disabled = false;
    const seed = Number(params.get("seed") || 0);
    let lastDraw = 0;
    let trainMs = 0;
    let stepStart = performance.now();
    for (let epoch = 0; epoch < epochs && !stopRequested; epoch++) {
      const order = shuffled(data.train.n, rng(seed * 1000 + epoch + 1));
      await rt.train({
        steps: stepsPerEpoch,
        batches: (i) => makeBatch(data, data.train, order.slice(i * data.batch, (i + 1) * data.batch)),
        onStep: (_, loss) => {
          if (!Number.isFinite(loss)) {
            // Stop at the first non-finite loss instead of training on NaN weights.
            diverged = { step: demo.losses.length + 1, loss };
            return false;
          }
          demo.losses.push(loss);
          demo.steps = demo.losses.length;
          const now = performance.now();
          if (demo.steps === 1) demo.firstStepMs = now - stepStart;
          else trainMs += now - stepStart;
          stepStart = now;
          if (demo.steps > 1) demo.msPerStep = trainMs / (demo.steps - 1);
          if (now - lastDraw > 50) {
            lastDraw = now;
            drawChart(demo.losses, demo.accuracies, epochs, stepsPerEpoch);
            drawHeat(rt);
            $("stats").textContent = `epoch ${epoch + 1}/${epochs} · step ${demo.steps} · loss ${loss.toFixed(4)}`
              + (demo.msPerStep ? ` · ${demo.msPerStep.toFixed(1)} ms/step` : "");
          }
          return !stopRequested;
        },
      });
      if (diverged) {
        throw new GlcompError(`training diverged at step ${diverged.step} (loss ${diverged.loss}); `
          + "lower the learning rate and reload the page");
      }
      const score = await evaluate(rt, data);
      stepStart = performance.now();
      demo.accuracies.push(score);
      demo.accuracy = score;
      const perPosition = data.ySize > 1 ? " per position" : "";
      $("accuracy").textContent = data.classes
        ? `test accuracy${perPosition} after epoch ${epoch + 1}: ${(100 * score).toFixed(1)}%`
        : `test MSE after epoch ${epoch + 1}: ${score.toPrecision(4)}`;
      if (data.vocab && sampleChars > 0) {
        const { prompt, text } = await sampleText(rt, data, sampleChars, rng(seed * 1000 + epoch + 7));
        demo.sample = prompt + text;
        $("sample-head").hidden = false;
        $("sample-head").textContent = `sampled after epoch ${epoch + 1} (prompt: the first test window, in grey)`;
        $("sample").hidden = false;
        $("sample-prompt").textContent = prompt;
        $("sample-text").textContent = text;
      }
      await nextTask();
    }
    drawChart(demo.losses, data.classes ? demo.accuracies : [], epochs, stepsPerEpoch);
    const last = demo.losses[demo.losses.length - 1];
    $("stats").textContent = `${demo.steps} steps · final loss ${last === undefined ? "-" : last.toFixed(4)}`
      + (demo.msPerStep ? ` · ${demo.msPerStep.toFixed(1)} ms/step` : "")
      + (demo.firstStepMs ? ` (the first step took ${Math.round(demo.firstStepMs)} ms: shader compilation)` : "");
    trained = true;
    demo.status = "done";
    $("start").disabled = false;
    $("stop").disabled = true;
    $("download").disabled = false;
  };

  $("start").onclick = () => run().catch(fail);
  $("stop").onclick = () => { stopRequested = true; };
  $("download").onclick = () => {
    if (!trained) return;
    downloadBytes(rt.exportSafetensors(), "weights.safetensors");
  };
  demo.status = "ready";
  $("start").disabled = false;
  if (params.get("autostart") === "1") await run();
}

main().catch(fail);
