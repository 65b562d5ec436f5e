// The workloads of benchmarks/bench.py in TensorFlow.js (layers API, WebGL backend), for
// benchmarks/bench_browser.py --peers tfjs. Same layer shapes, optimizer and learning rate as the
// glcomp models; weight initialisation is tfjs's own (gpt: a transformer written by hand on
// tf.variable weights, initialised as the example's). Images are NHWC (tfjs's native layout) where
// glcomp's are NCHW: the same number of values per batch, the same convolutions.
//
// A timed step mirrors glcomp.js's `await rt.trainStep(batch)`: upload the batch, one
// `optimizer.minimize(() => loss, true)` (forward, backward, update) and read the loss back
// (`await loss.data()`, or `loss.dataSync()` with readback "sync").
//
// The page must have loaded tf.min.js (global `tf`) and installed the GL call counters of
// bench_browser.py (globalThis.__glCounts) before `bench` is called.

/** An LSTM(inputs, units) over `steps` steps, its last output into Linear units-10, batch
 *  `batch`, Adam 1e-3. recurrentActivation sigmoid as in torch (tfjs's default is hardSigmoid).
 *  The recurrent kernel starts glorotUniform: tfjs's default, orthogonal, runs a QR decomposition
 *  on the GPU at model creation that compiles about 3000 shader programs (two minutes on
 *  SwiftShader), which is initialisation, not training. */
function lstmWorkload(batch, steps, inputs, units) {
  return {
    torchShape: [batch, steps, inputs],
    xShape: [batch, steps, inputs],
    classes: 10,
    model: (tf) =>
      tf.sequential({
        layers: [
          tf.layers.lstm({
            inputShape: [steps, inputs], units, recurrentActivation: "sigmoid", recurrentInitializer: "glorotUniform",
          }),
          tf.layers.dense({ units: 10 }),
        ],
      }),
    optimizer: (tf) => tf.train.adam(1e-3, 0.9, 0.999, 1e-8),
  };
}

const adam = (tf) => tf.train.adam(1e-3, 0.9, 0.999, 1e-8);

/** bench.py's vgg: VGG-style CIFAR CNN, 3x32x32 (NHWC here), conv 16, conv 16, maxpool 2, conv 32,
 *  conv 32, maxpool 2 (3x3, "same" = torch's padding 1 at stride 1, ReLU after each conv), flatten,
 *  Linear 2048-64, ReLU, Linear 64-10; batch 32, Adam 1e-3. Flatten reads NHWC where torch reads
 *  NCHW: another order of the same 2048 values into the same Linear. */
function vggModel(tf) {
  const conv = (filters, first = false) =>
    tf.layers.conv2d({
      ...(first ? { inputShape: [32, 32, 3] } : {}), filters, kernelSize: 3, padding: "same", activation: "relu",
    });
  return tf.sequential({
    layers: [
      conv(16, true), conv(16), tf.layers.maxPooling2d({ poolSize: 2 }),
      conv(32), conv(32), tf.layers.maxPooling2d({ poolSize: 2 }),
      tf.layers.flatten(),
      tf.layers.dense({ units: 64, activation: "relu" }),
      tf.layers.dense({ units: 10 }),
    ],
  });
}

/** bench.py's mobilenet: conv 3-16 3x3 stride 2 + BatchNorm + ReLU, then depthwise-separable
 *  blocks (depthwiseConv2d 3x3, depth multiplier 1 = torch's groups = channels, + BatchNorm + ReLU;
 *  pointwise conv 1x1 + BatchNorm + ReLU) 16-32 (stride 1), 32-64 (stride 2), 64-64 (stride 1),
 *  global average pool, Linear 64-10; batch 32, Adam 1e-3; convolutions without bias, as in
 *  bench.py. "same" padding at stride 2 pads 0 before and 1 after where torch's padding 1 pads 1
 *  and 1: the same output sizes (16x16, 8x8) and FLOPs.
 *
 *  BatchNorm in training mode: both normalise with the batch mean and biased batch variance over
 *  N, H, W, then scale and shift per channel (gamma, beta: the only trainable BatchNorm weights).
 *  Given momentum 0.9 and epsilon 1e-5 here to match torch's momentum 0.1 and eps 1e-5 (tfjs's
 *  defaults are 0.99 and 1e-3: tfjs's momentum is the weight of the old value, torch's of the
 *  batch's). One difference remains, in the running statistics only (unused by a train step):
 *  torch's running variance averages the unbiased batch variance, tfjs's moving variance the
 *  biased one. */
function mobilenetModel(tf) {
  const bnRelu = () => [tf.layers.batchNormalization({ momentum: 0.9, epsilon: 1e-5 }), tf.layers.reLU()];
  const layers = [
    tf.layers.conv2d({ inputShape: [32, 32, 3], filters: 16, kernelSize: 3, strides: 2, padding: "same", useBias: false }),
    ...bnRelu(),
  ];
  for (const [filters, strides] of [[32, 1], [64, 2], [64, 1]]) {
    layers.push(
      tf.layers.depthwiseConv2d({ kernelSize: 3, strides, padding: "same", depthMultiplier: 1, useBias: false }),
      ...bnRelu(),
      tf.layers.conv2d({ filters, kernelSize: 1, useBias: false }),
      ...bnRelu(),
    );
  }
  layers.push(tf.layers.globalAveragePooling2d({}), tf.layers.dense({ units: 10 }));
  return tf.sequential({ layers });
}

const batchNorm = (tf) => tf.layers.batchNormalization({ momentum: 0.9, epsilon: 1e-5 });

/** bench.py's resnet, in the functional API (tf.model; tf.layers.add joins each block's branches):
 *  conv 3-16 3x3 + BatchNorm + ReLU, basic blocks (conv 3x3 + BatchNorm + ReLU, conv 3x3 +
 *  BatchNorm, plus the shortcut, then ReLU) at 16, 16, 16-32 stride 2 and 32 channels, global
 *  average pool, Linear 32-10; batch 16, Adam 1e-3; convolutions without bias, BatchNorm as in
 *  mobilenetModel (torch's momentum and eps). The stride-2 block's shortcut is a 1x1 conv at
 *  stride 2 + BatchNorm, as in torch (padding 0 either way: the same pixels); its 3x3 conv at
 *  stride 2 pads as mobilenet's (the same output size). */
function resnetModel(tf) {
  const conv = (filters, kernelSize, strides = 1) =>
    tf.layers.conv2d({ filters, kernelSize, strides, padding: "same", useBias: false });
  const convBn = (x, filters, kernelSize, strides) => batchNorm(tf).apply(conv(filters, kernelSize, strides).apply(x));
  const block = (x, filters, strides) => {
    const y = convBn(tf.layers.reLU().apply(convBn(x, filters, 3, strides)), filters, 3, 1);
    const short = strides !== 1 || x.shape[3] !== filters ? convBn(x, filters, 1, strides) : x;
    return tf.layers.reLU().apply(tf.layers.add().apply([y, short]));
  };
  const input = tf.input({ shape: [32, 32, 3] });
  let x = tf.layers.reLU().apply(convBn(input, 16, 3, 1));
  for (const [filters, strides] of [[16, 1], [16, 1], [32, 2], [32, 1]]) x = block(x, filters, strides);
  const output = tf.layers.dense({ units: 10 }).apply(tf.layers.globalAveragePooling2d({}).apply(x));
  return tf.model({ inputs: input, outputs: output });
}

/** bench.py's hourglass, in the functional API: 3x64x64 (NHWC here), three stages down (conv 3x3
 *  stride 2 + BatchNorm + ReLU: 16, 32, 64 channels), conv 64 3x3 + ReLU, three stages up
 *  (conv2dTranspose 4x4 stride 2 + BatchNorm + ReLU: 32, 16, 16), the first two each plus
 *  (tf.layers.add) the encoder's output at that resolution, a 1x1 conv to 16 heat maps at 64x64;
 *  batch 8, mean squared error, Adam 1e-3. "same" padding of the transposed convolution doubles
 *  the size as torch's padding 1 does (4x4, stride 2); BatchNorm as in mobilenetModel. */
function hourglassModel(tf) {
  const bnRelu = (x) => tf.layers.reLU().apply(batchNorm(tf).apply(x));
  const down = (x, filters) => bnRelu(tf.layers.conv2d({ filters, kernelSize: 3, strides: 2, padding: "same" }).apply(x));
  const up = (x, filters) =>
    bnRelu(tf.layers.conv2dTranspose({ filters, kernelSize: 4, strides: 2, padding: "same" }).apply(x));
  const input = tf.input({ shape: [64, 64, 3] });
  const d1 = down(input, 16);
  const d2 = down(d1, 32);
  const mid = tf.layers.conv2d({ filters: 64, kernelSize: 3, padding: "same", activation: "relu" }).apply(down(d2, 64));
  let y = tf.layers.add().apply([up(mid, 32), d2]);
  y = tf.layers.add().apply([up(y, 16), d1]);
  const output = tf.layers.conv2d({ filters: 16, kernelSize: 1 }).apply(up(y, 16));
  return tf.model({ inputs: input, outputs: output });
}

/** examples/char_gpt.py's transformer by hand on tf.variable weights, for bench.py's gpt (batch 16,
 *  block 32, n_embd 64, 4 heads of 16, 2 layers, dropout 0, the 58 characters of
 *  examples/data/coriolanus.txt) and its gpt_small and gpt_medium (`config`'s sizes). Every weight
 *  has the torch twin's name and shape (a Linear's weight is [out, in], applied as x @ W^T), in the
 *  order of torch's model.parameters(): token and position embeddings; per block, LayerNorm ln1,
 *  one key/query/value Linear without bias per head, q @ k^T * head_size^-0.5, the causal mask
 *  (masked_fill with -inf: tf.where), softmax, @ v, the heads concatenated, the projection Linear
 *  with bias, the residual; LayerNorm ln2, Linear n_embd-4*n_embd, GELU (torch's exact erf form),
 *  Linear back, the residual; the final LayerNorm and the lm head. LayerNorm: tf.moments over the
 *  channels (biased variance), eps 1e-5, weight and bias. Initialised as the example's
 *  _init_weights: N(0, 0.02) Linear and Embedding weights, zero biases, LayerNorm weight 1 and bias
 *  0. `apply(idx)` takes int32 ids [batch, block] and returns the logits as [batch * block, vocab],
 *  the example's view before its cross-entropy. `trainableWeights` mimics a layers model's (shape,
 *  originalName, read() -> the tf.Variable). */
function gptModel(tf, { vocab, block, embd, heads, layers }) {
  const weights = []; // in creation order, which is torch's registration order
  const param = (name, init) => {
    const v = tf.variable(init, true);
    weights.push({ shape: v.shape, originalName: name, read: () => v });
    return v;
  };
  const normal = (name, shape) => param(name, tf.randomNormal(shape, 0, 0.02));
  const linear = (name, cin, cout, bias = true) => ({
    weight: normal(`${name}.weight`, [cout, cin]),
    bias: bias ? param(`${name}.bias`, tf.zeros([cout])) : null,
  });
  const layerNorm = (name) => ({
    weight: param(`${name}.weight`, tf.ones([embd])),
    bias: param(`${name}.bias`, tf.zeros([embd])),
  });
  const hs = embd / heads;
  const tok = normal("token_embedding_table.weight", [vocab, embd]);
  const pos = normal("position_embedding_table.weight", [block, embd]);
  const blocks = [];
  for (let l = 0; l < layers; l++) {
    const p = `blocks.${l}`;
    const sa = Array.from({ length: heads }, (_, h) => ({
      key: linear(`${p}.sa.heads.${h}.key`, embd, hs, false),
      query: linear(`${p}.sa.heads.${h}.query`, embd, hs, false),
      value: linear(`${p}.sa.heads.${h}.value`, embd, hs, false),
    }));
    const proj = linear(`${p}.sa.proj`, embd, embd);
    const ff1 = linear(`${p}.ffwd.net.0`, embd, 4 * embd);
    const ff2 = linear(`${p}.ffwd.net.2`, 4 * embd, embd);
    blocks.push({ sa, proj, ff1, ff2, ln1: layerNorm(`${p}.ln1`), ln2: layerNorm(`${p}.ln2`) });
  }
  const lnF = layerNorm("ln_f");
  const head = linear("lm_head", embd, vocab);
  const causal = tf.linalg.bandPart(tf.ones([block, block]), -1, 0).equal(0); // true above the diagonal
  const negInf = tf.scalar(-Infinity);
  const dense = (x, { weight, bias }) => {
    const shape = x.shape;
    const y = tf.matMul(x.reshape([-1, shape[shape.length - 1]]), weight, false, true);
    return (bias ? y.add(bias) : y).reshape([...shape.slice(0, -1), weight.shape[0]]);
  };
  const norm = (x, { weight, bias }) => {
    const { mean, variance } = tf.moments(x, -1, true);
    return x.sub(mean).div(variance.add(1e-5).sqrt()).mul(weight).add(bias);
  };
  const gelu = (x) => x.mul(0.5).mul(tf.erf(x.mul(Math.SQRT1_2)).add(1));
  const attend = (x, h) => {
    const k = dense(x, h.key);
    const q = dense(x, h.query);
    const wei = tf.softmax(tf.where(causal, negInf, tf.matMul(q, k, false, true).mul(hs ** -0.5)), -1);
    return tf.matMul(wei, dense(x, h.value));
  };
  return {
    trainableWeights: weights,
    apply: (idx) =>
      tf.tidy(() => {
        let x = tf.gather(tok, idx).add(pos); // (B, T, C) + (T, C): T is the whole block
        for (const b of blocks) {
          const y = norm(x, b.ln1);
          x = x.add(dense(tf.concat(b.sa.map((h) => attend(y, h)), -1), b.proj));
          x = x.add(dense(gelu(dense(norm(x, b.ln2), b.ff1)), b.ff2));
        }
        return dense(norm(x, lnF), head).reshape([-1, vocab]);
      }),
    dispose: () => {
      for (const w of weights) w.read().dispose();
      tf.dispose([causal, negInf]);
    },
  };
}

/** torch.optim.AdamW (betas 0.9, 0.999, eps 1e-8, decoupled weight decay), which tfjs lacks:
 *  tfjs's Adam (the same bias-corrected update as torch's) after p *= 1 - lr * weight_decay on
 *  every variable updated (torch's AdamW(model.parameters()) decays all of them, biases and
 *  LayerNorm included). `minimize` as a tfjs optimizer's: gradients at the current weights, then
 *  the decay, then Adam's step. */
function adamW(tf, lr, weightDecay) {
  const adamOpt = tf.train.adam(lr, 0.9, 0.999, 1e-8);
  return {
    minimize(f, returnCost, varList) {
      const { value, grads } = tf.variableGrads(f, varList);
      tf.tidy(() => {
        for (const v of varList) v.assign(v.mul(1 - lr * weightDecay));
      });
      adamOpt.applyGradients(grads);
      tf.dispose(grads);
      if (returnCost) return value;
      value.dispose();
      return null;
    },
    dispose: () => adamOpt.dispose(),
  };
}

const GPT = { vocab: 58, block: 32, embd: 64, heads: 4, layers: 2 };
// realistic.py's gpt_small and gpt_medium (bench.py's GPT_CONFIGS), for a browser on a GPU.
const GPT_SMALL = { ...GPT, block: 64, embd: 128 };
const GPT_MEDIUM = { ...GPT, block: 128, embd: 256, layers: 4 };

/** bench.py's char-GPT workload at `config`, batch `batch`, `params` trainable parameters. */
const gptWorkload = (batch, config, params) => ({
  torchShape: [batch, config.block], xShape: [batch, config.block], xDtype: "int32", perToken: true,
  classes: config.vocab, params, model: (tf) => gptModel(tf, config), optimizer: (tf) => adamW(tf, 3e-3, 0.01),
});

// `params`: the trainable parameter count of the glcomp (and torch) model, which `bench` checks the
// tfjs model against. The LSTMs have none: tfjs's LSTM has one bias per gate where torch's has two
// (4 * units fewer parameters, the same FLOPs up to those additions). `yShape` (NHWC, batch first):
// the target is heat maps of that shape, the loss the mean squared error (bench.py's target_shape);
// without it, class labels in [0, classes) and softmax cross-entropy.
const WORKLOADS = {
  // Linear 64-128-64-10, ReLU; batch 64; SGD lr 0.1
  mlp: {
    torchShape: [64, 64],
    xShape: [64, 64],
    classes: 10,
    params: 17226,
    model: (tf) =>
      tf.sequential({
        layers: [
          tf.layers.dense({ inputShape: [64], units: 128, activation: "relu" }),
          tf.layers.dense({ units: 64, activation: "relu" }),
          tf.layers.dense({ units: 10 }),
        ],
      }),
    optimizer: (tf) => tf.train.sgd(0.1),
  },
  // 1x8x8; 2x (Conv 3x3 pad 1, ReLU, MaxPool 2), Linear 128-10; batch 64; Adam 1e-3
  cnn: {
    torchShape: [64, 1, 8, 8],
    xShape: [64, 8, 8, 1],
    classes: 10,
    params: 6090,
    model: (tf) =>
      tf.sequential({
        layers: [
          tf.layers.conv2d({ inputShape: [8, 8, 1], filters: 16, kernelSize: 3, padding: "same", activation: "relu" }),
          tf.layers.maxPooling2d({ poolSize: 2 }),
          tf.layers.conv2d({ filters: 32, kernelSize: 3, padding: "same", activation: "relu" }),
          tf.layers.maxPooling2d({ poolSize: 2 }),
          tf.layers.flatten(),
          tf.layers.dense({ units: 10 }),
        ],
      }),
    optimizer: (tf) => tf.train.adam(1e-3, 0.9, 0.999, 1e-8),
  },
  // 3x32x32; Conv 3-16 5x5 stride 2 pad 2, ReLU, Linear 4096-10; batch 16; SGD lr 0.01.
  // tfjs's "same" padding for stride 2 pads 1 before and 2 after (torch: 2 and 2): same shapes.
  conv_seed: {
    torchShape: [16, 3, 32, 32],
    xShape: [16, 32, 32, 3],
    classes: 10,
    params: 42186,
    model: (tf) =>
      tf.sequential({
        layers: [
          tf.layers.conv2d({
            inputShape: [32, 32, 3], filters: 16, kernelSize: 5, strides: 2, padding: "same", activation: "relu",
          }),
          tf.layers.flatten(),
          tf.layers.dense({ units: 10 }),
        ],
      }),
    optimizer: (tf) => tf.train.sgd(0.01),
  },
  // LSTM(32, 128) over 10 steps, last output, Linear 128-10; batch 32; Adam 1e-3.
  lstm: lstmWorkload(32, 10, 32, 128),
  // LSTM(64, 256) over 32 steps, last output, Linear 256-10; batch 32; Adam 1e-3.
  lstm256: lstmWorkload(32, 32, 64, 256),
  // Realistic CNNs (issue 25).
  vgg: {
    torchShape: [32, 3, 32, 32], xShape: [32, 32, 32, 3], classes: 10, params: 148442, model: vggModel, optimizer: adam,
  },
  mobilenet: {
    torchShape: [32, 3, 32, 32], xShape: [32, 32, 32, 3], classes: 10, params: 9322, model: mobilenetModel,
    optimizer: adam,
  },
  // A residual CNN and an encoder-decoder.
  resnet: {
    torchShape: [16, 3, 32, 32], xShape: [16, 32, 32, 3], classes: 10, params: 43226, model: resnetModel,
    optimizer: adam,
  },
  hourglass: {
    torchShape: [8, 3, 64, 64], xShape: [8, 64, 64, 3], yShape: [8, 64, 64, 16], params: 106256,
    model: hourglassModel, optimizer: adam,
  },
  // examples/char_gpt.py (bench.py's gpt): int32 token ids [16, 32] in, a next-token label per
  // token (`perToken`), softmax cross-entropy averaged over the 512 tokens, AdamW lr 3e-3 and
  // weight decay 0.01 (the example's optimizer; torch's default decay).
  gpt: gptWorkload(16, GPT, 109242),
  // The same at realistic.py's sizes: batch 32, block 64, n_embd 128, 2 layers; block 128,
  // n_embd 256, 4 layers.
  gpt_small: gptWorkload(32, GPT_SMALL, 419130),
  gpt_medium: gptWorkload(32, GPT_MEDIUM, 3219002),
};

export const NAMES = Object.keys(WORKLOADS);

const product = (shape) => shape.reduce((a, b) => a * b, 1);

const count = (weights) => weights.reduce((n, v) => n + product(v.shape), 0);

/** The trainable parameter count of workload `name`'s tfjs `model`; throws when it differs from
 *  the workload's `params` (bench.py's model). */
function checkParams(name, model) {
  const expected = WORKLOADS[name].params;
  const params = count(model.trainableWeights);
  if (expected !== undefined && params !== expected) {
    throw new Error(`tfjs peer: ${name} has ${params} trainable parameters, bench.py's model ${expected}`);
  }
  return params;
}

/** Workload `name`'s tfjs model, layer by layer: {params (trainable), layers: [{className,
 *  outputShape (NHWC, no batch), params (trainable), kernel (the kernel's weight count)}]}, for
 *  tests/benchmarks/test_bench_workloads.py, which compares it with the torch twin's. Throws when
 *  the trainable count differs from the workload's `params`. */
export function describe(tf, name) {
  const w = WORKLOADS[name];
  if (!w) throw new Error(`tfjs peer: unknown workload ${name}; known: ${NAMES.join(", ")}`);
  const model = w.model(tf);
  try {
    const params = checkParams(name, model);
    if (!model.layers) {
      // A model on tf.variable weights (gpt): its weights by name, in torch's order.
      return { params, weights: model.trainableWeights.map((v) => ({ name: v.originalName, shape: v.shape })) };
    }
    const layers = model.layers.map((layer) => ({
      className: layer.getClassName(),
      outputShape: layer.outputShape.slice(1),
      params: count(layer.trainableWeights),
      kernel: count(layer.trainableWeights.filter((v) => /kernel/.test(v.originalName))),
    }));
    return { params, layers };
  } finally {
    model.dispose();
  }
}

/** Train workload `arg.name` on one fixed batch and time it.
 *  arg: {name, shape (bench.py's torch shape), x: number[] (int32 token ids for a workload with
 *  xDtype "int32"), y: number[] (class labels, one per example or, with `perToken`, per token; or
 *  the heat maps of a workload with `yShape`: bench.py's NCHW values read as NHWC, as x's are),
 *  warmup, steps, readback}.
 *  firstMs runs from model creation (after the backend is up) to the end of the first step.
 *  Returns {backendMs, firstMs, times, draws, programs, links, loss, backend, renderer}. */
export async function bench(tf, arg) {
  const w = WORKLOADS[arg.name];
  if (!w) throw new Error(`tfjs peer: unknown workload ${arg.name}; known: ${NAMES.join(", ")}`);
  if (JSON.stringify(arg.shape) !== JSON.stringify(w.torchShape)) {
    throw new Error(`tfjs peer: ${arg.name} input shape is [${arg.shape}] in bench.py, [${w.torchShape}] here`);
  }
  if (arg.x.length !== product(w.xShape)) throw new Error(`tfjs peer: ${arg.name}: batch has ${arg.x.length} values`);
  const labels = w.perToken ? product(w.xShape) : w.xShape[0];
  if (arg.y.length !== (w.yShape ? product(w.yShape) : labels)) {
    throw new Error(`tfjs peer: ${arg.name}: target has ${arg.y.length} values`);
  }
  const counts = globalThis.__glCounts;
  const xData = w.xDtype === "int32" ? Int32Array.from(arg.x) : Float32Array.from(arg.x);
  const yData = w.yShape ? Float32Array.from(arg.y) : Int32Array.from(arg.y);
  const sync = arg.readback === "sync";

  // The WebGL backend creates its context here (SwiftShader counts as a software renderer, which
  // tfjs refuses unless told otherwise).
  let t0 = performance.now();
  tf.env().set("SOFTWARE_WEBGL_ENABLED", true);
  if (!(await tf.setBackend("webgl"))) throw new Error("tfjs peer: the webgl backend did not initialise");
  await tf.ready();
  if (tf.getBackend() !== "webgl") throw new Error(`tfjs peer: backend is ${tf.getBackend()}, not webgl`);
  const backendMs = performance.now() - t0;
  const gl = tf.backend().gpgpu.gl;
  const dbg = gl.getExtension("WEBGL_debug_renderer_info");
  const renderer = gl.getParameter(dbg ? dbg.UNMASKED_RENDERER_WEBGL : gl.RENDERER);

  t0 = performance.now();
  const model = w.model(tf);
  checkParams(arg.name, model);
  const optimizer = w.optimizer(tf);
  const vars = model.trainableWeights.map((v) => v.read());
  // The target tensor and those to dispose with it: heat maps as they are, or labels one-hot.
  const target = () => {
    if (w.yShape) return [tf.tensor(yData, w.yShape)];
    const labels = tf.tensor1d(yData, "int32");
    return [tf.oneHot(labels, w.classes), labels];
  };
  const lossOf = w.yShape ? tf.losses.meanSquaredError : tf.losses.softmaxCrossEntropy;
  const step = async () => {
    const xs = tf.tensor(xData, w.xShape, w.xDtype ?? "float32");
    const [ys, ...rest] = target();
    const loss = optimizer.minimize(() => lossOf(ys, model.apply(xs, { training: true })), true, vars);
    const value = sync ? loss.dataSync()[0] : (await loss.data())[0];
    tf.dispose([xs, ys, ...rest, loss]);
    return value;
  };

  await step();
  const firstMs = performance.now() - t0;
  for (let i = 1; i < arg.warmup; i++) await step();
  const times = [];
  const before = counts.draws;
  const tensorsBefore = tf.memory().numTensors;
  let loss = 0;
  for (let i = 0; i < arg.steps; i++) {
    const t = performance.now();
    loss = await step();
    times.push(performance.now() - t);
  }
  const draws = (counts.draws - before) / arg.steps;
  const leaked = tf.memory().numTensors - tensorsBefore;
  if (leaked !== 0) throw new Error(`tfjs peer: ${arg.name} leaks ${leaked} tensors per ${arg.steps} steps`);
  const result = {
    backendMs, firstMs, times, draws, programs: counts.programs, links: counts.links, loss,
    backend: tf.getBackend(), renderer, tfjs: tf.version.tfjs,
  };
  optimizer.dispose();
  model.dispose();
  return result;
}
