// The demo pages' training chart: losses per step (raw and smoothed) on the left axis, test
// accuracy per epoch on the right, epochs along the bottom and the legend in a row above the plot,
// where it cannot meet the axis labels. The loss axis has "nice" ticks (1, 2 or 5 times a power of
// ten) labelled with as many decimals as their spacing needs, so small losses get distinct labels.
// drawChart returns what it drew (tick labels and the boxes of the label rows) for tests.

/** Ticks from 0 to at least `top`: about `count` steps of 1, 2 or 5 times a power of ten. */
export function niceTicks(top, count = 4) {
  if (!(top > 0) || !Number.isFinite(top)) return [0, 0.25, 0.5, 0.75, 1];
  const raw = top / count;
  const power = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw * (1 - 1e-9));
  const n = Math.ceil(top / step - 1e-9);
  return Array.from({ length: n + 1 }, (_, k) => k * step);
}

/** Labels for evenly spaced `ticks`: fixed-point with the decimals their spacing needs (more
 *  until they are distinct), or exponent notation for very small or large values. */
export function tickLabels(ticks) {
  const step = ticks.length > 1 ? ticks[1] - ticks[0] : 1;
  const biggest = Math.max(...ticks.map(Math.abs));
  if (biggest >= 1e6 || (step > 0 && step < 1e-4)) {
    for (let digits = 1; digits <= 8; digits++) {
      const labels = ticks.map((v) => (v === 0 ? "0" : v.toExponential(digits - 1)));
      if (new Set(labels).size === ticks.length) return labels;
    }
  }
  let decimals = step > 0 ? Math.max(0, -Math.floor(Math.log10(step) + 1e-9)) : 0;
  for (; decimals < 12; decimals++) {
    const labels = ticks.map((v) => v.toFixed(decimals));
    if (new Set(labels).size === ticks.length) return labels;
  }
  return ticks.map(String);
}

const LOSS = "rgb(30, 100, 200)";
const ACCURACY = "rgb(0, 140, 70)";

/** Draw `losses` (per step) and `accuracies` (per epoch, 0 to 1) on `canvas` for a run of
 *  `epochs` epochs of `stepsPerEpoch` steps. Returns {yTicks: [label], xTicks: [label],
 *  legend: box, xAxis: box, plot: box}, boxes as {x, y, w, h} in canvas pixels. */
export function drawChart(canvas, { losses, accuracies = [], epochs, stepsPerEpoch }) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  const line = 16; // a row of 12px text
  const pad = { l: 56, r: 44, t: 8 + line + 6, b: 8 + line };
  ctx.clearRect(0, 0, w, h);
  ctx.font = "12px system-ui, sans-serif";
  ctx.lineWidth = 1;
  const total = Math.max(epochs * stepsPerEpoch, losses.length, 2);
  const finite = losses.filter(Number.isFinite);
  const ticks = niceTicks(finite.length ? Math.max(...finite) : 1);
  const top = ticks[ticks.length - 1];
  const labels = tickLabels(ticks);
  const plot = { x: pad.l, y: pad.t, w: w - pad.l - pad.r, h: h - pad.t - pad.b };
  const x = (i) => plot.x + (i / (total - 1)) * plot.w;
  const y = (v) => plot.y + plot.h - (Math.min(v, top) / top) * plot.h;
  const yAcc = (a) => plot.y + plot.h - a * plot.h;
  const box = (left, baseline, text) => ({ x: left, y: baseline - 11, w: ctx.measureText(text).width, h: 14 });
  const union = (boxes) => {
    if (!boxes.length) return null;
    const x0 = Math.min(...boxes.map((b) => b.x));
    const y0 = Math.min(...boxes.map((b) => b.y));
    const x1 = Math.max(...boxes.map((b) => b.x + b.w));
    const y1 = Math.max(...boxes.map((b) => b.y + b.h));
    return { x: x0, y: y0, w: x1 - x0, h: y1 - y0 };
  };
  // grid and loss ticks, right-aligned left of the plot
  ctx.strokeStyle = "#ddd";
  ctx.fillStyle = "#666";
  ticks.forEach((v, k) => {
    ctx.beginPath();
    ctx.moveTo(plot.x, y(v));
    ctx.lineTo(plot.x + plot.w, y(v));
    ctx.stroke();
    ctx.fillText(labels[k], plot.x - 6 - ctx.measureText(labels[k]).width, y(v) + 4);
  });
  // epochs along the bottom
  const axisBoxes = [];
  const xTicks = [];
  const bottom = h - 8;
  ctx.fillText("epoch", plot.x, bottom);
  axisBoxes.push(box(plot.x, bottom, "epoch"));
  let free = plot.x + ctx.measureText("epoch").width + 6; // labels never overlap one another
  for (let e = 1; e < epochs; e++) {
    const text = `${e}`;
    const left = x(e * stepsPerEpoch) - ctx.measureText(text).width / 2;
    if (left < free) continue;
    ctx.fillText(text, left, bottom);
    axisBoxes.push(box(left, bottom, text));
    xTicks.push(text);
    free = left + ctx.measureText(text).width + 6;
  }
  if (accuracies.length) {
    ctx.fillStyle = ACCURACY;
    for (const a of [0, 0.5, 1]) ctx.fillText(`${100 * a}%`, plot.x + plot.w + 6, yAcc(a) + 4);
  }
  // the legend, in its own row above the plot
  const legendBoxes = [];
  let left = plot.x;
  const baseline = 8 + 12;
  for (const [text, color] of [["— loss", LOSS], ...(accuracies.length ? [["● test accuracy (right axis)", ACCURACY]] : [])]) {
    ctx.fillStyle = color;
    ctx.fillText(text, left, baseline);
    legendBoxes.push(box(left, baseline, text));
    left += ctx.measureText(text).width + 16;
  }
  // raw losses, then an exponential moving average on top
  ctx.strokeStyle = "rgba(30, 100, 200, 0.35)";
  ctx.beginPath();
  losses.forEach((v, i) => (i ? ctx.lineTo(x(i), y(v)) : ctx.moveTo(x(i), y(v))));
  ctx.stroke();
  ctx.strokeStyle = LOSS;
  ctx.lineWidth = 2;
  ctx.beginPath();
  let ema = losses[0];
  losses.forEach((v, i) => {
    ema = 0.9 * ema + 0.1 * v;
    if (i) ctx.lineTo(x(i), y(ema));
    else ctx.moveTo(x(i), y(ema));
  });
  ctx.stroke();
  ctx.fillStyle = ACCURACY;
  accuracies.forEach((a, e) => {
    ctx.beginPath();
    ctx.arc(x((e + 1) * stepsPerEpoch - 1), yAcc(a), 3.5, 0, 2 * Math.PI);
    ctx.fill();
  });
  return { yTicks: labels, xTicks, legend: union(legendBoxes), xAxis: union(axisBoxes), plot };
}
