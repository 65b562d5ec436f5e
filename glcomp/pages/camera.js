// The camera fine-tuning page: a classifier bundle whose one input is an image input (camera
// frames, see glcomp/transforms/preprocess.py) and whose target is a class index learns 2 or more
// classes from frames the user records with the camera (getUserMedia). Recorded frames are kept
// as ImageBitmaps; a train step takes a batch of them (sampled with replacement) and the bundle's
// shaders preprocess and augment them. Live predictions read the <video> element itself. The
// export holds the parameters under their torch names (no counters). Built by
// examples/camera_finetune.py. Query parameters: bundle (default "bundle/"). The loss of every
// step is plotted (chart.js) while a run trains; the page says whether the bundle it starts from
// was trained before it was saved (chart.js's alreadyTrained).
// What a test can drive: window.glcompCamera.
import { alreadyTrained, drawChart } from "./chart.js";
import { GlcompError, Runtime, downloadBytes, writeSafetensors } from "./glcomp.js";

const params = new URLSearchParams(location.search);
const bundleUrl = params.get("bundle") || "bundle/";
const $ = (id) => document.getElementById(id);

const state = {
  status: "loading", // loading | ready | recording | training | error
  classes: 2, // how many classes the user records (2..shape.classes)
  names: [],
  examples: [], // { frame: ImageBitmap, y: class }
  losses: [], // every step's loss, over all runs
  chart: null, // what the loss chart drew last (chart.js): points, tick labels, label boxes
  pretrained: null, // whether the bundle was trained before it was saved (its optimizer state)
  prediction: null, // { label, probs } of the last live prediction
  camera: null, // { width, height, scaled } once the camera runs
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

/** The bundle's image input, target and sizes; a GlcompError for bundles this page cannot use. */
function modelShape(manifest) {
  const entries = manifest.entries;
  if (!entries.train_step) throw new GlcompError("the bundle has no train_step: compile it with a loss and an optimizer");
  const xNames = Object.keys(entries.predict.inputs);
  const yNames = Object.keys(entries.train_step.inputs).filter((k) => !xNames.includes(k));
  if (xNames.length !== 1 || yNames.length !== 1) {
    throw new GlcompError(`this page fine-tunes classifiers with one image input and one target; the bundle has ${xNames} and ${yNames}`);
  }
  const image = manifest.inputs[xNames[0]].image;
  const ys = manifest.inputs[yNames[0]];
  if (!image) {
    throw new GlcompError(`input ${JSON.stringify(xNames[0])} is not an image input: compile the model with `
      + "glcomp.transforms.Preprocess as its first layer (see examples/camera_finetune.py)");
  }
  if (!ys.num_classes || ys.num_classes < 2 || ys.shape.length !== 1) {
    throw new GlcompError(`this page needs class targets (2 classes or more); the bundle's target is ${JSON.stringify(ys.shape)}`);
  }
  return { xName: xNames[0], yName: yNames[0], batch: image.batch, width: image.width, height: image.height,
    classes: ys.num_classes };
}

const argmax = (row) => row.reduce((best, v, i) => (v > row[best] ? i : best), 0);

function softmax(row) {
  const m = Math.max(...row);
  const e = Array.from(row, (v) => Math.exp(v - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((v) => v / s);
}

const nextVideoFrame = (video) => new Promise((resolve) => {
  if (video.requestVideoFrameCallback) video.requestVideoFrameCallback(() => resolve());
  else setTimeout(resolve, 1000 / 30);
});

/** The camera in `video`, asked for the bundle's frame size. Where the camera cannot give that
 *  size, a canvas of the compiled size scales it (the one 2-D canvas draw this page may make). */
async function openCamera(video, shape) {
  if (!navigator.mediaDevices?.getUserMedia) throw new GlcompError("this browser offers no camera (navigator.mediaDevices.getUserMedia)");
  const exact = { width: { exact: shape.width }, height: { exact: shape.height } };
  let stream;
  try {
    stream = await navigator.mediaDevices.getUserMedia({ video: exact, audio: false });
  } catch (err) {
    if (err.name !== "OverconstrainedError") throw new GlcompError(`the camera is not available: ${err.message || err.name}`);
    stream = await navigator.mediaDevices.getUserMedia({ video: { width: shape.width, height: shape.height }, audio: false });
  }
  video.srcObject = stream;
  await video.play();
  while (!video.videoWidth) await nextVideoFrame(video);
  const scaled = video.videoWidth !== shape.width || video.videoHeight !== shape.height;
  let source = video;
  if (scaled) {
    const canvas = new OffscreenCanvas(shape.width, shape.height);
    const ctx = canvas.getContext("2d");
    source = { canvas, draw: () => { ctx.drawImage(video, 0, 0, shape.width, shape.height); return canvas; } };
  }
  return { stream, width: video.videoWidth, height: video.videoHeight, scaled, frame: () => (scaled ? source.draw() : video) };
}

/** The loss chart: every step's loss so far, the axis long enough for `steps` steps. */
function plotLosses(steps = state.losses.length) {
  state.chart = drawChart($("chart"), { losses: state.losses, steps });
}

async function main() {
  const rt = await Runtime.load(bundleUrl, { quiet: true });
  const shape = modelShape(rt.manifest);
  const info = rt.info();
  const soft = info.software ? "yes" : "no";
  const caveat = info.performanceCaveat === null ? "unknown" : info.performanceCaveat ? "yes" : "no";
  $("info").textContent = `WebGL ${info.webgl} on ${info.renderer} · software renderer: ${soft} `
    + `(failIfMajorPerformanceCaveat refused: ${caveat}) · ${shape.width}x${shape.height} frames, `
    + `batches of ${shape.batch}, up to ${shape.classes} classes`;
  state.pretrained = alreadyTrained(rt);
  $("trained").textContent = state.pretrained
    ? "Starting bundle: already trained (its optimizer state is not zero): fine-tuning continues from it."
    : "Starting bundle: untrained here (its optimizer state is zero: no train step has run on it); "
      + "its weights are the ones it was compiled with.";
  plotLosses(0);
  if (info.software) {
    $("warning").hidden = false;
    $("warning").textContent = "This page renders in software (no GPU acceleration): fine-tuning works but slowly.";
  }
  const guard = (f) => () => Promise.resolve().then(f).catch(fail);
  const video = $("video");
  let camera = null;
  let live = null; // the running live-prediction loop

  const used = () => [...new Set(state.examples.map((e) => e.y))].sort((a, b) => a - b);
  const showClasses = () => {
    const box = $("classes");
    box.replaceChildren();
    for (let c = 0; c < state.classes; c++) {
      const row = document.createElement("div");
      const name = Object.assign(document.createElement("input"), { type: "text", value: state.names[c] });
      name.oninput = () => { state.names[c] = name.value || `class ${c}`; };
      const rec = Object.assign(document.createElement("button"), { textContent: "Record", id: `record-${c}` });
      rec.disabled = !camera || state.status !== "ready";
      rec.onclick = guard(() => api.record(c, Number($("seconds").value)));
      const n = state.examples.filter((e) => e.y === c).length;
      const count = Object.assign(document.createElement("span"), { className: "muted", textContent: ` ${n} frames` });
      row.append(name, " ", rec, count);
      box.append(row);
    }
    $("train").disabled = used().length < 2 || state.status !== "ready";
  };

  const api = {
    state,
    shape,
    info,
    video,
    /** Start the camera (asked for the bundle's frame size) and the live predictions. */
    async start() {
      if (camera) return state.camera;
      camera = await openCamera(video, shape);
      state.camera = { width: camera.width, height: camera.height, scaled: camera.scaled };
      showClasses();
      if ($("live").checked) api.live(true);
      return state.camera;
    },
    /** How many classes to record (2..the bundle's). Frames of classes beyond it are dropped. */
    setClasses(n) {
      if (!Number.isInteger(n) || n < 2 || n > shape.classes) throw new GlcompError(`classes: 2..${shape.classes}, got ${n}`);
      state.classes = n;
      state.examples = state.examples.filter((e) => e.y < n);
      showClasses();
    },
    /** Keep the camera's current frame as an example of class `label`; returns the frame. */
    async capture(label) {
      if (!camera) throw new GlcompError("start the camera first");
      if (!Number.isInteger(label) || label < 0 || label >= state.classes) {
        throw new GlcompError(`a label is a class in 0..${state.classes - 1}, got ${label}`);
      }
      const frame = await createImageBitmap(camera.frame(), { premultiplyAlpha: "none", colorSpaceConversion: "none" });
      state.examples.push({ frame, y: label });
      return frame;
    },
    /** Record class `label` for `seconds`: one frame per new video frame. */
    async record(label, seconds = 3) {
      if (!(seconds > 0 && seconds <= 60)) throw new GlcompError(`seconds: a number in (0, 60], got ${seconds}`);
      if (state.status !== "ready") throw new GlcompError(`the page is ${state.status}`);
      state.status = "recording";
      showClasses();
      const end = performance.now() + 1000 * seconds;
      try {
        while (performance.now() < end) {
          await api.capture(label);
          $("stats").textContent = `recording ${state.names[label]}: ${state.examples.filter((e) => e.y === label).length} frames`;
          await nextVideoFrame(video);
        }
      } finally {
        state.status = "ready";
        showClasses();
      }
    },
    /** `steps` Adam steps on batches sampled from the recorded frames; returns the losses. */
    async finetune(steps, seed = 0) {
      if (used().length < 2) throw new GlcompError("record frames of at least two classes first");
      if (state.status !== "ready") throw new GlcompError(`the page is ${state.status}`);
      const wasLive = live !== null;
      await api.live(false); // one thing at a time on the GPU
      state.status = "training";
      showClasses();
      const random = rng(seed);
      const pick = () => state.examples[Math.floor(random() * state.examples.length)];
      const started = performance.now();
      const end = state.losses.length + steps; // the chart's axis: this run's last step
      let drawn = 0; // when the chart was last drawn: at most 20 times a second
      try {
        const losses = await rt.train({
          steps,
          batches: () => {
            const items = Array.from({ length: shape.batch }, pick);
            return { [shape.xName]: items.map((e) => e.frame), [shape.yName]: Int32Array.from(items, (e) => e.y) };
          },
          onStep: (i, loss) => {
            state.losses.push(loss);
            const rate = (1000 * (i + 1)) / (performance.now() - started);
            $("stats").textContent = `step ${i + 1}/${steps} · loss ${loss.toFixed(4)} · ${rate.toFixed(1)} steps/s`;
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
        showClasses();
        if (wasLive) api.live(true);
      }
    },
    /** Class probabilities of frames (an array of sources of the compiled size, or the camera's
     *  video when none are given), over the recorded classes (all classes before any recording). */
    async predict(frames) {
      const sources = frames ?? [camera ? camera.frame() : null];
      if (!sources[0]) throw new GlcompError("start the camera first");
      const out = [];
      const classes = used().length ? used() : [...Array(shape.classes).keys()];
      for (let s = 0; s < sources.length; s += shape.batch) {
        const chunk = sources.slice(s, s + shape.batch);
        const real = chunk.length;
        while (chunk.length < shape.batch) chunk.push(chunk[0]);
        const res = await rt.predict({ [shape.xName]: chunk });
        const width = res.data.length / shape.batch;
        for (let i = 0; i < real; i++) {
          const probs = softmax(classes.map((c) => res.data[i * width + c]));
          out.push({ label: classes[argmax(probs)], probs: Object.fromEntries(classes.map((c, k) => [c, probs[k]])) });
        }
      }
      return out;
    },
    /** Start (true) or stop (false) predicting the video frame by frame. */
    async live(on) {
      if (!on) {
        const running = live;
        live = null;
        await running?.done;
        return;
      }
      if (live || !camera) return;
      const loop = {};
      live = loop;
      loop.done = (async () => {
        while (live === loop) {
          const [p] = await api.predict();
          state.prediction = p;
          $("label").textContent = `${state.names[p.label]} ${(100 * p.probs[p.label]).toFixed(0)}%`;
          $("probs").textContent = Object.entries(p.probs)
            .map(([c, v]) => `${state.names[c].padEnd(12)} ${"#".repeat(Math.round(20 * v)).padEnd(20)} ${(100 * v).toFixed(1)}%`)
            .join("\n");
          await nextVideoFrame(video);
        }
      })().catch(fail);
    },
    /** The trained parameters as a safetensors file, named as torch names them (counters left out). */
    exportWeights() {
      const w = rt.getWeights();
      const params = Object.create(null);
      for (const [k, t] of Object.entries(w)) if (t.dtype === "float32") params[k] = { dtype: "F32", shape: t.shape, data: t.data };
      return writeSafetensors(params);
    },
    runtime: rt,
  };
  window.glcompCamera = api;

  for (let n = 2; n <= shape.classes; n++) $("count").add(new Option(String(n), String(n)));
  state.names = Array.from({ length: shape.classes }, (_, c) => `class ${c}`);
  $("count").onchange = guard(() => api.setClasses(Number($("count").value)));
  $("camera").onclick = guard(async () => {
    await api.start();
    $("camera").disabled = true;
  });
  $("live").onchange = guard(() => api.live($("live").checked));
  $("train").onclick = guard(() => api.finetune(Math.max(1, Math.floor(Number($("steps").value))), state.losses.length));
  $("export").onclick = () => downloadBytes(api.exportWeights(), "camera-finetuned.safetensors");
  state.status = "ready";
  showClasses();
}

main().catch(fail);
