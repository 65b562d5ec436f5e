// The pages' training chart (demo, fine-tuning, camera): losses per step (raw and smoothed) on the
// left axis, labelled "loss"; along the bottom either epochs (the demo, with test accuracy per epoch
// on the right axis) or steps (the fine-tuning pages); the legend in a row above the plot, where it
// cannot meet the axis labels. The loss axis has "nice" ticks (1, 2 or 5 times a power of ten)
// labelled with as many decimals as their spacing needs, so small losses get distinct labels; the
// left margin is as wide as the widest of them, so they never meet the axis label. drawChart
// returns what it drew (points, tick labels and the boxes of every label) for tests.

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

/** Whether a bundle was trained before it was saved: its optimizer state is not zero. The moments
 *  of a parameter (opt.<parameter>.<slot>: momentum, Adam's averages) start at zero and change with
 *  every step, so a bundle saved after training holds non-zero ones (and its loss curve starts
 *  low). `rt` is a loaded Runtime; its kept state is the bundle's own, before any step here. */
export function alreadyTrained(rt) {
  const { weights } = rt.keptState();
  const names = Object.keys(weights);
  const params = names.filter((n) => !n.startsWith("opt."));
  return names.some((n) => params.some((p) => n.startsWith(`opt.${p}.`)) && weights[n].some((v) => v !== 0));
}

/** Draw `losses` (one per step) on `canvas`. With `epochs` (a run of `epochs` epochs of
 *  `stepsPerEpoch` steps) the bottom axis counts epochs and `accuracies` (per epoch, 0 to 1) are
 *  drawn against a right axis; without, it counts steps, up to `steps` (the run's length, so the
 *  axis stays put while the run fills it) or the losses drawn. Non-finite losses are left out.
 *  Returns {points, yTicks: [label], xTicks: [label], xLabel, yLabel, labels: [box], legend: box,
 *  xAxis: box, yAxis: box, plot: box}: `points` the losses plotted, `labels` the box of every text
 *  drawn, boxes as {x, y, w, h} in canvas pixels. */
export function drawChart(canvas, { losses, accuracies = [], epochs, stepsPerEpoch = 1, steps = 0 }) {
  const ctx = canvas.getContext("2d");
  const w = canvas.width;
  const h = canvas.height;
  const line = 16; // a row of 12px text
  ctx.clearRect(0, 0, w, h);
  ctx.font = "12px system-ui, sans-serif";
  ctx.lineWidth = 1;
  const byEpoch = epochs !== undefined;
  if (!byEpoch) accuracies = [];
  const total = Math.max(byEpoch ? epochs * stepsPerEpoch : steps, losses.length, 2);
  const finite = losses.filter(Number.isFinite);
  const ticks = niceTicks(finite.length ? Math.max(...finite) : 1);
  const top = ticks[ticks.length - 1];
  const labels = tickLabels(ticks);
  const widest = Math.max(...labels.map((t) => ctx.measureText(t).width));
  const yLabel = "loss";
  const pad = { l: 4 + line + 6 + widest + 6, r: accuracies.length ? 44 : 12, t: 8 + line + 6, b: 8 + line };
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
  const all = [];
  // the loss axis's label, turned a quarter left, in its own column at the left edge
  const yLabelWidth = ctx.measureText(yLabel).width;
  ctx.fillStyle = "#444";
  ctx.save();
  ctx.translate(4 + 12, plot.y + plot.h / 2 + yLabelWidth / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText(yLabel, 0, 0);
  ctx.restore();
  const yAxisBoxes = [{ x: 4, y: plot.y + plot.h / 2 - yLabelWidth / 2, w: 14, h: yLabelWidth }];
  // grid and loss ticks, right-aligned left of the plot
  ctx.strokeStyle = "#ddd";
  ctx.fillStyle = "#666";
  ticks.forEach((v, k) => {
    ctx.beginPath();
    ctx.moveTo(plot.x, y(v));
    ctx.lineTo(plot.x + plot.w, y(v));
    ctx.stroke();
    const left = plot.x - 6 - ctx.measureText(labels[k]).width;
    ctx.fillText(labels[k], left, y(v) + 4);
    yAxisBoxes.push(box(left, y(v) + 4, labels[k]));
  });
  all.push(...yAxisBoxes);
  // epochs or steps along the bottom: the axis's name, then the ticks that fit
  const axisBoxes = [];
  const xTicks = [];
  const bottom = h - 8;
  const xLabel = byEpoch ? "epoch" : "step";
  ctx.fillStyle = "#444";
  ctx.fillText(xLabel, plot.x, bottom);
  axisBoxes.push(box(plot.x, bottom, xLabel));
  ctx.fillStyle = "#666";
  let free = plot.x + ctx.measureText(xLabel).width + 6; // labels never overlap one another
  // [text, x]: an epoch's label where it ends, a step's under that step's loss
  const marks = byEpoch
    ? Array.from({ length: Math.max(0, epochs - 1) }, (_, k) => [`${k + 1}`, x((k + 1) * stepsPerEpoch)])
    : niceTicks(total, 6).filter((t) => t >= 1 && Number.isInteger(t)).map((t) => [`${t}`, x(t - 1)]);
  for (const [text, at] of marks) {
    const width = ctx.measureText(text).width;
    const left = at - width / 2;
    if (left < free || left + width > w) continue;
    ctx.fillText(text, left, bottom);
    axisBoxes.push(box(left, bottom, text));
    xTicks.push(text);
    free = left + width + 6;
  }
  all.push(...axisBoxes);
  if (accuracies.length) {
    ctx.fillStyle = ACCURACY;
    for (const a of [0, 0.5, 1]) {
      ctx.fillText(`${100 * a}%`, plot.x + plot.w + 6, yAcc(a) + 4);
      all.push(box(plot.x + plot.w + 6, yAcc(a) + 4, `${100 * a}%`));
    }
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
  all.push(...legendBoxes);
  // raw losses, then an exponential moving average on top; a non-finite loss breaks the line
  const trace = (values) => {
    let points = 0;
    let pen = false;
    ctx.beginPath();
    values.forEach((v, i) => {
      if (!Number.isFinite(v)) {
        pen = false;
        return;
      }
      if (pen) ctx.lineTo(x(i), y(v));
      else ctx.moveTo(x(i), y(v));
      pen = true;
      points++;
    });
    ctx.stroke();
    return points;
  };
  ctx.strokeStyle = "rgba(30, 100, 200, 0.35)";
  const points = trace(losses);
  ctx.strokeStyle = LOSS;
  ctx.lineWidth = 2;
  let ema = finite[0];
  trace(losses.map((v) => (Number.isFinite(v) ? (ema = 0.9 * ema + 0.1 * v) : v)));
  ctx.fillStyle = ACCURACY;
  accuracies.forEach((a, e) => {
    ctx.beginPath();
    ctx.arc(x((e + 1) * stepsPerEpoch - 1), yAcc(a), 3.5, 0, 2 * Math.PI);
    ctx.fill();
  });
  return {
    points,
    yTicks: labels,
    xTicks,
    xLabel,
    yLabel,
    labels: all,
    legend: union(legendBoxes),
    xAxis: union(axisBoxes),
    yAxis: union(yAxisBoxes),
    plot,
  };
}
