// The texture inspector of the browser runtime: rt.inspect(name) reads a named tensor back
// without changing the computation, as glcomp/runtime/gl.py's GLRuntime.inspect does (the same
// names, the same errors; docs/inspect.md). A bundle keeps a tensor the compile option
// inspect=[names] named as an extra entry output "inspect:<name>"; the entry's own outputs
// (loss, output, grad:<param>) and every state are readable as they are.
import { GlcompError } from "./util.js";

export const INSPECT_PREFIX = "inspect:";

/** The outputs of a manifest entry that predict/gradients return (not the inspector's). */
export function visibleOutputs(entry) {
  return Object.keys(entry.outputs).filter((k) => !k.startsWith(INSPECT_PREFIX));
}

function outputKey(entry, name) {
  if (Object.hasOwn(entry.outputs, INSPECT_PREFIX + name)) return INSPECT_PREFIX + name;
  if (Object.hasOwn(entry.outputs, name) && ["loss", "output", "grad"].includes(name.split(":")[0])) return name;
  return null;
}

/** Every name the inspector can read from a manifest -> the entries that compute it (states and
 *  counters: [], always readable). */
export function inspectable(m) {
  const names = new Map([...Object.keys(m.states), ...Object.keys(m.counters)].map((k) => [k, []]));
  for (const [entry, e] of Object.entries(m.entries)) {
    for (const key of Object.keys(e.outputs)) {
      const name = key.startsWith(INSPECT_PREFIX) ? key.slice(INSPECT_PREFIX.length) : key;
      if (outputKey(e, name) === null) continue;
      if (!names.has(name)) names.set(name, []);
      names.get(name).push(entry);
    }
  }
  return names;
}

function distance(a, b) {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) row.push(Math.min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] === b[j - 1] ? 0 : 1)));
    prev = row;
  }
  return prev[b.length];
}

/** The hint of an unknown-name error: the known names closest to `name`, else some of them. */
export function nearNames(name, known) {
  const all = [...new Set(known)];
  const close = all.map((k) => [distance(name, k), k]).filter(([d, k]) => d <= Math.max(2, Math.floor(Math.max(name.length, k.length) / 3)))
    .sort((a, b) => a[0] - b[0] || (a[1] < b[1] ? -1 : 1)).slice(0, 6).map(([, k]) => k);
  const shown = close.length ? close : all.filter((k) => !k.startsWith("%")).slice(0, 12);
  if (!shown.length) return "no names are known";
  return `${close.length ? "near matches" : "known names include"}: ${shown.map((k) => `'${k}'`).join(", ")}`;
}

/** `rt.inspect(name)`: {shape, dtype, data} of a state (as it is now), a counter, or a tensor
 *  of the entry point run last. Rejects with a GlcompError naming near matches, or the entries
 *  that compute the tensor when the last one run does not. */
export async function inspectTensor(rt, name) {
  if (typeof name !== "string") throw new GlcompError(`inspect: expected a tensor name, got ${typeof name}`);
  rt._alive();
  const m = rt.manifest;
  if (Object.hasOwn(m.states, name)) {
    const layout = m.states[name].layout;
    const [data] = await rt._readMany([{ refs: rt._stateRefs(name), layout }]);
    return { shape: [...layout.shape], dtype: "float32", data };
  }
  if (Object.hasOwn(rt.counters, name)) return { shape: [], dtype: "int64", data: BigInt64Array.of(BigInt(rt.counters[name])) };
  const last = rt._lastEntry ?? null;
  const key = last === null ? null : outputKey(m.entries[last], name);
  if (key === null) {
    const names = inspectable(m);
    if (names.get(name)?.length) {
      const ran = last ? `the last entry run was ${last}` : "no entry has run yet";
      throw new GlcompError(`inspect: '${name}' is computed by ${names.get(name).join(", ")}; ${ran}: run one of them first`);
    }
    throw new GlcompError(`inspect: no tensor named '${name}' (a tensor this bundle did not keep: compile with `
      + `inspect=['${name}']); ${nearNames(name, names.keys())}`);
  }
  const e = m.entries[last];
  const out = e.outputs[key];
  // a state the entry wrote was flipped after it: its "next" texture is "cur" now
  const updated = new Set(e.updates ?? []);
  const refs = out.textures.map((r) => (typeof r === "object" && r.version === "next" && updated.has(r.state) ? { ...r, version: "cur" } : r));
  const [data] = await rt._readMany([{ refs, layout: out.layout }]);
  return { shape: [...out.layout.shape], dtype: "float32", data };
}
