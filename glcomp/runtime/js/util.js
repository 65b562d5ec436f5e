// Small helpers shared by the browser runtime's modules: the error type, value checks, and
// scheduling (next task, next frame).

/** The one error type: a mistake in a bundle, an input, or a missing browser capability. */
export class GlcompError extends Error {
  constructor(message) {
    super(message);
    this.name = "GlcompError";
  }
}

export const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !ArrayBuffer.isView(v)
  && !(v instanceof ArrayBuffer);
export const isInt = (v) => typeof v === "number" && Number.isInteger(v);
export const prod = (a) => a.reduce((x, y) => x * y, 1);
export const maxOf = (a, init) => a.reduce((x, y) => (y > x ? y : x), init);
export const repr = (v) => {
  if (v === undefined) return "None";
  if (typeof v === "string") return `'${v}'`;
  try { return JSON.stringify(v); } catch { return String(v); }
};
export const fmtShape = (s) => (s.length === 1 ? `(${s[0]},)` : `(${s.join(", ")})`);
export const fmtList = (a) => `[${a.map((x) => `'${x}'`).join(", ")}]`;
export const sortedKeys = (o) => Object.keys(o).sort();
export const sameList = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

let channel = null;
const channelQueue = [];
/** Resolve on the next event-loop task (like setTimeout 0, without the 4 ms nesting clamp). */
export function nextTask() {
  if (typeof MessageChannel === "undefined") return new Promise((r) => setTimeout(r, 0));
  if (!channel) {
    channel = new MessageChannel();
    channel.port1.onmessage = () => channelQueue.shift()();
  }
  return new Promise((r) => {
    channelQueue.push(r);
    channel.port2.postMessage(0);
  });
}
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
export const nextFrame = () => (typeof requestAnimationFrame === "function"
  ? new Promise((r) => requestAnimationFrame(() => r())) : nextTask());

