// glcomp browser runtime: loads a glcomp bundle (manifest.json, shaders/, weights.safetensors),
// validates it as strictly as glcomp/codegen/schema.py and runs its entry points with WebGL
// exactly like glcomp/runtime/gl.py does with moderngl. No dependencies; an ES module.
//
//   import { Runtime } from "./glcomp.js";
//   const rt = await Runtime.load("bundle/");           // or {"manifest.json": File, ...}
//   const loss = await rt.trainStep({ x: Float32Array, y: Int32Array });
//   const out = await rt.predict({ x });                 // {shape, dtype, data}
//   rt.dispose();

export const FORMAT = "glcomp-bundle";
export const VERSIONS = [1, 2]; // 2 adds `files` (sha256 of each file) and program.json
export const MAX_SIDE = 1 << 16;
const NAME_RE = /^[A-Za-z0-9_.#-]{1,200}$/;
// State names (torch names) may hold any printable character, spaces, tabs and newlines, as in
// schema.py state_name_ok: they live only in JSON and the weights file, never in GLSL or paths.
const STATE_NAME_RE = /^(?:[^\p{C}\p{Z}]|[ \t\n\r]){1,500}$/u;
const HEX_RE = /^[0-9a-f]{64}$/;
const PROGRAM_FILE = "program.json";
const SHADER_RE = /^[A-Za-z0-9_]{1,64}\.(frag|vert)$/;
const UNIFORM_RE = /^[a-z][a-z0-9_]{0,40}$/;
const ENTRY_POINTS = ["predict", "gradients", "train_step"];
const QUAD = new Float32Array([-1, -1, 3, -1, -1, 3]); // one triangle covers the viewport
const SOFTWARE_RE = /swiftshader|llvmpipe|softpipe|software|basic render|lavapipe|swrast/i;
// Resource limits, the same as glcomp/codegen/schema.py's (both loaders accept the same bundles).
export const DEFAULT_TEXTURE_BUDGET = 2 * 2 ** 30; // bytes of textures a bundle may declare
// Texel formats a manifest texture may name in "format" (absent: "f32"), and their sizes in bytes.
export const TEXEL_BYTES = { f32: 16, f16: 8 };
const TEXTURE_KEYS = ["format", "height", "width"];
/** A (validated) texture record's texel format: "f32" (RGBA32F) or "f16" (RGBA16F). */
export function textureFormat(tex) {
  return tex.format === undefined ? "f32" : tex.format;
}
export const DEFAULT_LOOP_BUDGET = 2 ** 32; // loop iterations one draw may run
const MAX_INT = 2 ** 40;
const MAX_OFFSET = 2 ** 24; // integer uniforms (view offsets): exact in highp int
const MAX_DIMS = 32;
const MAX_PROGRAMS = 4096;
const MAX_JSON_BYTES = 64 * 2 ** 20;
const MAX_JSON_DEPTH = 64;
const MAX_SHADER_CHARS = 2 ** 20;
const STATE_DTYPES = ["F32", "F64"];
const COUNTER_DTYPES = ["I32", "I64"];

/** The one error type: a mistake in a bundle, an input, or a missing browser capability. */
export class GlcompError extends Error {
  constructor(message) {
    super(message);
    this.name = "GlcompError";
  }
}

// -- small helpers -----------------------------------------------------------------------------
const isObj = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && !ArrayBuffer.isView(v)
  && !(v instanceof ArrayBuffer);
const isInt = (v) => typeof v === "number" && Number.isInteger(v);
const isPow2 = (v) => isInt(v) && v >= 1 && v <= MAX_SIDE && (v & (v - 1)) === 0;
const prod = (a) => a.reduce((x, y) => x * y, 1);
const maxOf = (a, init) => a.reduce((x, y) => (y > x ? y : x), init);
const repr = (v) => {
  if (v === undefined) return "None";
  if (typeof v === "string") return `'${v}'`;
  try { return JSON.stringify(v); } catch { return String(v); }
};
const fmtShape = (s) => (s.length === 1 ? `(${s[0]},)` : `(${s.join(", ")})`);
const fmtList = (a) => `[${a.map((x) => `'${x}'`).join(", ")}]`;
const sortedKeys = (o) => Object.keys(o).sort();
const sameList = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

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
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const nextFrame = () => (typeof requestAnimationFrame === "function"
  ? new Promise((r) => requestAnimationFrame(() => r())) : nextTask());

// -- manifest validation (a port of glcomp/codegen/schema.py validate_manifest) -----------------
class Check {
  constructor(where) { this.where = where; }
  fail(msg) { return new GlcompError(`bundle ${this.where}: ${msg}`); }
  need(cond, msg) { if (!cond) throw this.fail(msg); }
  dict(obj, field) { this.need(isObj(obj), `${field} must be an object`); return obj; }
  list(obj, field) { this.need(Array.isArray(obj), `${field} must be a list`); return obj; }
  int(obj, field, lo = 0, hi = MAX_INT) {
    this.need(isInt(obj) && obj >= lo && obj <= hi, `${field} must be an integer in [${lo}, ${hi}], got ${repr(obj)}`);
    return obj;
  }
  name(obj, field) {
    this.need(typeof obj === "string" && NAME_RE.test(obj), `${field} has an invalid name ${repr(obj)}`);
    return obj;
  }
  stateName(obj, field) {
    this.need(typeof obj === "string" && STATE_NAME_RE.test(obj), `${field} has an invalid name ${repr(obj)}`);
    return obj;
  }
}

const LAYOUT_KEYS = ["height", "pages", "row_len", "row_texels", "rows", "shape", "texels", "width"];

function checkLayout(c, lay, field, shape) {
  lay = c.dict(lay, field);
  c.need(sameList(sortedKeys(lay), LAYOUT_KEYS), `${field} must have exactly the keys ${fmtList(LAYOUT_KEYS)}`);
  c.need(Array.isArray(lay.shape) && lay.shape.length <= MAX_DIMS && lay.shape.every((s) => isInt(s) && s >= 0),
    `${field}.shape must be a list of at most ${MAX_DIMS} sizes`);
  if (shape !== undefined) {
    c.need(Array.isArray(shape) && sameList(shape, lay.shape), `${field}.shape ${repr(lay.shape)} != ${repr(shape)}`);
  }
  for (const k of LAYOUT_KEYS) {
    if (k !== "shape") c.int(lay[k], `${field}.${k}`, k === "rows" || k === "row_len" ? 0 : 1, MAX_INT);
  }
  const s = lay.shape;
  const rows = s.length ? prod(s.slice(0, -1)) : 1;
  const rowLen = s.length ? s[s.length - 1] : 1;
  c.need(lay.rows === rows && lay.row_len === rowLen, `${field} rows/row_len disagree with shape`);
  c.need(lay.row_texels === Math.max(1, Math.ceil(rowLen / 4)), `${field}.row_texels is wrong`);
  c.need(lay.texels === Math.max(1, rows * lay.row_texels), `${field}.texels is wrong`);
  for (const side of ["width", "height"]) {
    c.need(isPow2(lay[side]), `${field}.${side} must be a power of two <= ${MAX_SIDE}`);
  }
  c.need(lay.width * lay.height * lay.pages >= lay.texels, `${field} pages too small`);
  return lay;
}

/** Throw GlcompError for anything in a manifest that does not fit the schema. `shaderNames`: the
 *  shader files present. Stricter than schema.py in a few places the compiler never exercises
 *  (refs have exactly their keys, state texture sets are disjoint and owned by one state,
 *  entry input/output textures have their layout's size). */
export function validateManifest(m, shaderNames, options = {}) {
  const names = new Set(shaderNames);
  const textureBudget = options.textureBudgetBytes ?? DEFAULT_TEXTURE_BUDGET;
  const loopBudget = options.loopBudget ?? DEFAULT_LOOP_BUDGET;
  const c = new Check("manifest.json");
  m = c.dict(m, "manifest");
  c.need(m.format === FORMAT, `format must be '${FORMAT}', got ${repr(m.format)}`);
  c.need(VERSIONS.includes(m.version), `unknown format version ${repr(m.version)} (supported: (${VERSIONS.join(", ")},))`);
  const required = ["counters", "entries", "hyper", "inputs", "memory", "programs", "states", "target", "textures",
    "vertex_shader"];
  const missing = required.filter((k) => !(k in m));
  c.need(!missing.length, `missing fields ${fmtList(missing)}`);
  const target = c.dict(m.target, "target");
  c.need(target.glsl_version === "300 es" || target.glsl_version === "100", "target.glsl_version must be '300 es' or '100'");
  const maxSize = c.int(target.max_texture_size, "target.max_texture_size", 1, MAX_SIDE);

  const textures = c.dict(m.textures, "textures");
  let total = 0;
  for (const [name, tex] of Object.entries(textures)) {
    c.name(name, "texture");
    c.dict(tex, `textures.${name}`);
    const extra = Object.keys(tex).filter((k) => !TEXTURE_KEYS.includes(k)).sort();
    c.need(!extra.length, `textures.${name}: unknown fields ${fmtList(extra)} (known: ${fmtList(TEXTURE_KEYS)})`);
    for (const side of ["width", "height"]) {
      const v = c.int(tex[side], `textures.${name}.${side}`, 1, maxSize);
      c.need((v & (v - 1)) === 0, `textures.${name}.${side} must be a power of two`);
    }
    c.need(tex.format === undefined || (typeof tex.format === "string" && Object.hasOwn(TEXEL_BYTES, tex.format)),
      `textures.${name}.format must be one of ${fmtList(Object.keys(TEXEL_BYTES))}, got ${repr(tex.format)}`);
    total += TEXEL_BYTES[textureFormat(tex)] * tex.width * tex.height;
  }
  c.need(total <= textureBudget, `the textures take ${total} bytes, more than the budget of ${textureBudget} bytes`);
  const used = new Set();

  const states = c.dict(m.states, "states");
  const owner = new Map(); // texture -> state owning it
  for (const [name, st] of Object.entries(states)) {
    c.stateName(name, "state");
    c.dict(st, `states.${name}`);
    const lay = checkLayout(c, st.layout, `states.${name}.layout`);
    c.need(["param", "buffer", "state"].includes(st.role), `states.${name}.role must be 'param', 'buffer' or 'state'`);
    const sets = st.textures;
    c.need(Array.isArray(sets) && sets.length === 2, `states.${name}.textures must hold two sets`);
    for (const group of sets) {
      c.need(Array.isArray(group) && group.length === lay.pages, `states.${name}.textures: one texture per page expected`);
      for (const t of group) {
        c.need(typeof t === "string" && Object.hasOwn(textures, t), `states.${name} refers to unknown texture ${repr(t)}`);
        const tex = textures[t];
        c.need(tex.width === lay.width && tex.height === lay.height, `states.${name}: texture ${repr(t)} has the wrong size`);
        c.need(textureFormat(tex) === "f32", `states.${name}: texture ${repr(t)} must be f32 (states are kept in float32)`);
        c.need(!owner.has(t), `states.${name}: texture ${repr(t)} is used twice by the state texture sets`);
        owner.set(t, name);
      }
    }
  }
  const inputs = c.dict(m.inputs, "inputs");
  for (const [name, spec] of Object.entries(inputs)) {
    c.name(name, "input");
    c.dict(spec, `inputs.${name}`);
    c.need(Array.isArray(spec.shape), `inputs.${name}.shape must be a list of sizes`);
    checkLayout(c, spec.layout, `inputs.${name}.layout`, spec.shape);
    if (spec.num_classes !== undefined && spec.num_classes !== null) {
      c.int(spec.num_classes, `inputs.${name}.num_classes`, 1);
    }
  }
  const hyper = c.dict(m.hyper, "hyper");
  for (const [name, value] of Object.entries(hyper)) {
    c.name(name, "hyper");
    c.need(typeof value === "number" && Number.isFinite(value), `hyper.${name} must be a number`);
  }
  const counters = c.dict(m.counters, "counters");
  for (const [name, value] of Object.entries(counters)) {
    c.stateName(name, "counter");
    c.int(value, `counters.${name}`, 0);
    c.need(!Object.hasOwn(states, name), `counters.${name} has the name of a state`);
  }
  c.need(typeof m.vertex_shader === "string" && names.has(m.vertex_shader), `vertex shader ${repr(m.vertex_shader)} is missing`);

  const programs = c.dict(m.programs, "programs");
  for (const [pid, prog] of Object.entries(programs)) {
    c.name(pid, "program");
    c.dict(prog, `programs.${pid}`);
    c.need(typeof prog.fragment === "string" && names.has(prog.fragment), `programs.${pid}: shader ${repr(prog.fragment)} is missing`);
    for (const key of ["samplers", "uniforms"]) {
      c.need(Array.isArray(prog[key]), `programs.${pid}.${key} must be a list`);
    }
    for (const s of [...prog.samplers, ...prog.uniforms]) {
      c.need(typeof s === "string" && UNIFORM_RE.test(s), `programs.${pid}: bad uniform name ${repr(s)}`);
    }
    c.need(new Set([...prog.samplers, ...prog.uniforms]).size === prog.samplers.length + prog.uniforms.length,
      `programs.${pid}: a uniform name appears twice`);
    c.int(prog.outputs, `programs.${pid}.outputs`, 1, 16);
    c.int(prog.loop_iterations, `programs.${pid}.loop_iterations`, 0, MAX_INT);
  }
  for (const t of owner.keys()) used.add(t);

  const checkRef = (ref, field) => {
    if (typeof ref === "string") {
      c.need(Object.hasOwn(textures, ref), `${field} refers to unknown texture ${repr(ref)}`);
      c.need(!owner.has(ref), `${field} names state texture ${repr(ref)} directly`);
      used.add(ref);
      return [textures[ref].width, textures[ref].height];
    }
    c.dict(ref, field);
    c.need(typeof ref.state === "string" && Object.hasOwn(states, ref.state), `${field} refers to unknown state ${repr(ref.state)}`);
    c.need(ref.version === "cur" || ref.version === "next", `${field}.version must be 'cur' or 'next'`);
    const lay = states[ref.state].layout;
    c.int(ref.page, `${field}.page`, 0, lay.pages - 1);
    c.need(sameList(sortedKeys(ref), ["page", "state", "version"]), `${field} must have exactly the keys ['page', 'state', 'version']`);
    return [lay.width, lay.height];
  };
  const refKey = (r) => (typeof r === "string" ? JSON.stringify(r) : JSON.stringify([r.page, r.state, r.version]));

  const entries = c.dict(m.entries, "entries");
  const unknownEntries = Object.keys(entries).filter((k) => !ENTRY_POINTS.includes(k));
  c.need(!unknownEntries.length, `unknown entry points ${fmtList(sortedKeys(entries))}`);
  for (const [entry, e] of Object.entries(entries)) {
    c.dict(e, `entries.${entry}`);
    for (const [name, refs] of Object.entries(c.dict(e.inputs, `entries.${entry}.inputs`))) {
      c.need(Object.hasOwn(inputs, name), `entries.${entry}: unknown input ${repr(name)}`);
      const lay = inputs[name].layout;
      c.need(Array.isArray(refs) && refs.length === lay.pages, `entries.${entry}.inputs.${name}: one texture per page expected`);
      for (const r of refs) {
        const [w, h] = checkRef(r, `entries.${entry}.inputs.${name}`);
        c.need(w === lay.width && h === lay.height, `entries.${entry}.inputs.${name}: texture size differs from the layout`);
        c.need(typeof r !== "string" || textureFormat(textures[r]) === "f32",
          `entries.${entry}.inputs.${name}: input texture ${repr(r)} must be f32`);
      }
    }
    for (const [name, out] of Object.entries(c.dict(e.outputs, `entries.${entry}.outputs`))) {
      c.stateName(name, `entries.${entry}.outputs`);
      c.dict(out, `entries.${entry}.outputs.${name}`);
      const lay = checkLayout(c, out.layout, `entries.${entry}.outputs.${name}.layout`);
      c.need(Array.isArray(out.textures) && out.textures.length === lay.pages,
        `entries.${entry}.outputs.${name}: one texture per page expected`);
      for (const r of out.textures) {
        const [w, h] = checkRef(r, `entries.${entry}.outputs.${name}`);
        c.need(w === lay.width && h === lay.height, `entries.${entry}.outputs.${name}: texture size differs from the layout`);
      }
    }
    const updates = e.updates === undefined ? [] : e.updates;
    c.need(Array.isArray(updates), `entries.${entry}.updates must be a list`);
    for (const name of updates) {
      c.need(typeof name === "string" && Object.hasOwn(states, name), `entries.${entry}.updates: unknown state ${repr(name)}`);
    }
    const draws = e.draws;
    c.need(Array.isArray(draws), `entries.${entry}.draws must be a list`);
    draws.forEach((d, i) => {
      const field = `entries.${entry}.draws[${i}]`;
      c.dict(d, field);
      const prog = typeof d.program === "string" && Object.hasOwn(programs, d.program) ? programs[d.program] : undefined;
      c.need(prog !== undefined, `${field} refers to unknown program ${repr(d.program)}`);
      const samplers = c.dict(d.samplers, `${field}.samplers`);
      c.need(sameList(sortedKeys(samplers), [...prog.samplers].sort()), `${field}: samplers do not match the program`);
      for (const [s, r] of Object.entries(samplers)) checkRef(r, `${field}.samplers.${s}`);
      const uniforms = c.dict(d.uniforms, `${field}.uniforms`);
      c.need(sameList(sortedKeys(uniforms), [...prog.uniforms].sort()), `${field}: uniforms do not match the program`);
      for (const [u, src] of Object.entries(uniforms)) {
        const keys = isObj(src) ? Object.keys(src) : [];
        c.need(keys.length === 1 && ((keys[0] === "hyper" && typeof src.hyper === "string" && Object.hasOwn(hyper, src.hyper))
          || (keys[0] === "int" && isInt(src.int) && Math.abs(src.int) <= MAX_OFFSET)),
          `${field}.uniforms.${u} must name a hyper-parameter or hold an integer offset`);
      }
      const targets = d.targets;
      c.need(Array.isArray(targets) && targets.length === prog.outputs, `${field}: one target per program output expected`);
      const sizes = new Set(targets.map((r) => checkRef(r, `${field}.targets`).join("x")));
      const formats = new Set(targets.map((r) => (typeof r === "string" ? textureFormat(textures[r]) : "f32")));
      c.need(formats.size === 1, `${field}: render targets must all have one format, got ${fmtList([...formats].sort())}`);
      const vp = d.viewport;
      c.need(Array.isArray(vp) && vp.length === 2 && vp.every(isInt), `${field}.viewport must be [width, height]`);
      c.need(sizes.size === 1 && sizes.has(vp.join("x")), `${field}: render targets must all match the viewport size`);
      const read = new Set(Object.values(samplers).map(refKey));
      c.need(!targets.some((r) => read.has(refKey(r))), `${field} samples a texture it renders to`);
      c.need(new Set(targets.map(refKey)).size === targets.length, `${field} renders to one texture twice`);
      c.int(d.page_offset, `${field}.page_offset`, 0);
      const blend = d.blend === undefined ? false : d.blend;
      c.need(blend === true || blend === false, `${field}.blend must be a boolean`);
      c.need(d.kernel === undefined || typeof d.kernel === "string", `${field}.kernel must be a string`);
      const work = prog.loop_iterations * vp[0] * vp[1];
      c.need(work <= loopBudget, `${field} may run ${work} loop iterations (${prog.loop_iterations} per fragment), `
        + `more than the budget of ${loopBudget} per draw`);
    });
  }
  const unused = Object.keys(textures).filter((t) => !used.has(t)).sort();
  c.need(!unused.length, `textures ${repr(unused.length > 8 ? [...unused.slice(0, 8), "..."] : unused)} are used by no state, input, output or draw`);
  if (m.version >= 2 || "files" in m) {
    const hashes = c.dict(m.files, "files");
    for (const [path, digest] of Object.entries(hashes)) {
      const parts = path.split("/");
      const ok = path === "weights.safetensors" || path === PROGRAM_FILE
        || (parts.length === 2 && parts[0] === "shaders" && SHADER_RE.test(parts[1]));
      c.need(ok, `files: unexpected file ${repr(path)}`);
      c.need(typeof digest === "string" && HEX_RE.test(digest), `files.${path}: not a sha256 hex digest`);
    }
    const wanted = new Set([m.vertex_shader, ...Object.values(programs).map((p) => p.fragment)]);
    for (const path of ["weights.safetensors", ...[...wanted].sort().map((n) => `shaders/${n}`)]) {
      c.need(Object.hasOwn(hashes, path), `files: no sha256 for ${path}`);
    }
  }
}

// -- loops in shaders (a port of schema.py shader_loop_bound: the same forms, the same bounds) ---
const COMMENT_RE = /\/\/[^\n]*|\/\*(?:.|\n)*?\*\//g;
const TOKEN_RE = /[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^ \t\r\n]/g;
const FOR_RE = /for[ \t\r\n]*\([ \t\r\n]*int[ \t\r\n]+([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*=[ \t\r\n]*0[ \t\r\n]*;[ \t\r\n]*\1[ \t\r\n]*<[ \t\r\n]*([0-9]{1,9})[ \t\r\n]*;[ \t\r\n]*\1[ \t\r\n]*\+\+[ \t\r\n]*\)[ \t\r\n]*\{/y;
const WRITE_AFTER_RE = /[ \t\r\n]*(?:[-+*/%&|^]?=(?!=)|<<=|>>=|\+\+|--)/y;
const WRITE_BEFORE_RE = /(?:\+\+|--)[ \t\r\n]*$/;
const DIRECTIVE_RE = /^#[ \t]*(?:version[ \t]+(?:100|300[ \t]+es)|extension[ \t]+[A-Za-z0-9_]+[ \t]*:[ \t]*[a-z]+)$/;
const CODE_CHARS_RE = /^[ -~\t\r\n]*$/;

/** An upper bound of the loop iterations one invocation of `source`'s main() runs; throws
 *  GlcompError naming `where` for any loop not of the form `for (int v = 0; v < N; v++) {` (or
 *  writing v in its body), while/do, preprocessor directives but #version/#extension,
 *  backslashes, non-ASCII outside comments, and calls of functions not defined above. */
export function shaderLoopBound(source, where) {
  let text = source;
  const fail = (msg, pos) => {
    const at = pos === undefined ? "" : `line ${text.slice(0, pos).split("\n").length}: `;
    return new GlcompError(`bundle ${where}: ${at}${msg}`);
  };
  if (source.length > MAX_SHADER_CHARS) throw fail(`the shader is longer than ${MAX_SHADER_CHARS} characters`);
  if (source.includes("\\")) throw fail("backslashes (line continuations) are not allowed in shaders");
  text = source.replace(COMMENT_RE, (c) => c.replace(/[^\n]/g, " "));
  if (text.includes("/*")) throw fail("unterminated comment");
  if (!CODE_CHARS_RE.test(text)) throw fail("characters other than printable ASCII outside comments");
  for (const raw of text.split("\n")) {
    const line = raw.replace(/^[ \t\r]+|[ \t\r]+$/g, "");
    if (line.startsWith("#") && !DIRECTIVE_RE.test(line)) {
      throw fail(`preprocessor directive ${repr(line.slice(0, 60))} is not allowed`);
    }
  }
  const tokens = [];
  for (const mt of text.matchAll(TOKEN_RE)) tokens.push([mt[0], mt.index]);
  const defined = new Set();
  let depth = 0;
  let lastName = "";
  tokens.forEach(([tok], i) => {
    if (tok === "{") {
      if (depth === 0 && i > 0 && tokens[i - 1][0] === ")") defined.add(lastName);
      depth += 1;
    } else if (tok === "}") depth -= 1;
    else if (depth === 0 && i + 1 < tokens.length && tokens[i + 1][0] === "(") lastName = tok;
  });
  const bounds = new Map();
  depth = 0;
  let func = null;
  lastName = "";
  let total = 0;
  const loops = []; // [variable, iterations including this loop's, depth]
  let i = 0;
  while (i < tokens.length) {
    const [tok, pos] = tokens[i];
    const mult = loops.length ? loops[loops.length - 1][1] : 1;
    const nxt = i + 1 < tokens.length ? tokens[i + 1][0] : "";
    if (tok === "while" || tok === "do") throw fail(`${tok} loops are not allowed`, pos);
    if (tok === "for") {
      FOR_RE.lastIndex = pos;
      const found = FOR_RE.exec(text);
      if (func === null || found === null) throw fail("a loop not of the form 'for (int v = 0; v < N; v++) {'", pos);
      const n = Number(found[2]);
      total += mult * n;
      depth += 1;
      loops.push([found[1], mult * n, depth]);
      const end = found.index + found[0].length;
      while (i < tokens.length && tokens[i][1] < end) i += 1;
      continue;
    }
    if (tok === "{") {
      depth += 1;
      if (depth === 1) {
        func = i > 0 && tokens[i - 1][0] === ")" ? lastName : null;
        total = 0;
      }
    } else if (tok === "}") {
      if (loops.length && loops[loops.length - 1][2] === depth) loops.pop();
      depth -= 1;
      if (depth < 0) throw fail("unbalanced braces", pos);
      if (depth === 0 && func !== null) {
        bounds.set(func, total);
        func = null;
      }
    } else if (/^[A-Za-z_]/.test(tok)) {
      if (depth === 0 && nxt === "(") lastName = tok;
      else if (depth > 0 && nxt === "(" && defined.has(tok)) {
        if (!bounds.has(tok)) throw fail(`${tok} is called before its definition ends (recursion is not allowed)`, pos);
        total += mult * bounds.get(tok);
      }
      for (const [v] of loops) {
        if (tok !== v) continue;
        WRITE_AFTER_RE.lastIndex = pos + tok.length;
        if (WRITE_AFTER_RE.test(text) || WRITE_BEFORE_RE.test(text.slice(Math.max(0, pos - 16), pos))) {
          throw fail(`the loop variable ${v} is written in its loop`, pos);
        }
      }
    }
    i += 1;
  }
  if (depth !== 0) throw fail("unbalanced braces");
  return bounds.has("main") ? bounds.get("main") : 0;
}

/** Check every shader's loops against the validated manifest (schema.py check_shaders): the
 *  vertex shader runs none, each fragment shader at most its program's loop_iterations. */
export function checkShaders(manifest, shaders) {
  const vert = manifest.vertex_shader;
  if (shaderLoopBound(shaders[vert], `shaders/${vert}`) !== 0) {
    throw new GlcompError(`bundle shaders/${vert}: the vertex shader must not loop`);
  }
  for (const [pid, prog] of Object.entries(manifest.programs)) {
    const bound = shaderLoopBound(shaders[prog.fragment], `shaders/${prog.fragment}`);
    if (bound > prog.loop_iterations) {
      throw new GlcompError(`bundle shaders/${prog.fragment}: its loops may run ${bound} iterations per fragment, `
        + `more than the ${prog.loop_iterations} manifest.json declares for program ${pid}`);
    }
  }
}

/** JSON.parse for untrusted bytes, with schema.py parse_json's limits: UTF-8 (a byte order mark
 *  is not skipped), at most MAX_JSON_BYTES and MAX_JSON_DEPTH levels of nesting. */
export function parseJson(bytes, where) {
  const buf = toArrayBuffer(bytes);
  if (buf.byteLength > MAX_JSON_BYTES) throw new GlcompError(`bundle ${where}: larger than ${MAX_JSON_BYTES} bytes`);
  let text;
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(buf);
  } catch (err) {
    throw new GlcompError(`bundle ${where}: not valid JSON (${err.message})`);
  }
  let depth = 0;
  for (const mt of text.matchAll(/"(?:[^"\\]|\\.)*"|[[\]{}]/g)) {
    const t = mt[0];
    if (t === "[" || t === "{") {
      depth += 1;
      if (depth > MAX_JSON_DEPTH) throw new GlcompError(`bundle ${where}: nested deeper than ${MAX_JSON_DEPTH} levels`);
    } else if (t === "]" || t === "}") depth -= 1;
  }
  try {
    return JSON.parse(text);
  } catch (err) {
    throw new GlcompError(`bundle ${where}: not valid JSON (${err.message})`);
  }
}

// -- sha256 (crypto.subtle where offered: it is missing outside secure contexts) ------------------
const K256 = new Uint32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2]);

/** SHA-256 of the bytes, in JavaScript (FIPS 180-4). */
export function sha256Sync(bytes) {
  const n = bytes.length;
  const padded = new Uint8Array(Math.ceil((n + 9) / 64) * 64);
  padded.set(bytes);
  padded[n] = 0x80;
  const view = new DataView(padded.buffer);
  view.setUint32(padded.length - 8, Math.floor(n / 2 ** 29));
  view.setUint32(padded.length - 4, (n * 8) >>> 0);
  const h = new Uint32Array([0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19]);
  const w = new Uint32Array(64);
  const rotr = (x, r) => (x >>> r) | (x << (32 - r));
  for (let off = 0; off < padded.length; off += 64) {
    for (let i = 0; i < 16; i++) w[i] = view.getUint32(off + 4 * i);
    for (let i = 16; i < 64; i++) {
      const s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >>> 3);
      const s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >>> 10);
      w[i] = (w[i - 16] + s0 + w[i - 7] + s1) >>> 0;
    }
    let [a, b, c, d, e, f, g, hh] = h;
    for (let i = 0; i < 64; i++) {
      const t1 = (hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i]) >>> 0;
      const t2 = ((rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) >>> 0;
      hh = g; g = f; f = e; e = (d + t1) >>> 0; d = c; c = b; b = a; a = (t1 + t2) >>> 0;
    }
    [a, b, c, d, e, f, g, hh].forEach((v, i) => { h[i] = (h[i] + v) >>> 0; });
  }
  return Array.from(h, (v) => v.toString(16).padStart(8, "0")).join("");
}

/** SHA-256 hex digest of an ArrayBuffer / typed array. */
export async function sha256(data) {
  const bytes = data instanceof Uint8Array ? data : new Uint8Array(toArrayBuffer(data));
  if (typeof crypto !== "undefined" && crypto.subtle) {
    const digest = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
    return Array.from(digest, (v) => v.toString(16).padStart(2, "0")).join("");
  }
  return sha256Sync(bytes);
}

// -- safetensors ------------------------------------------------------------------------------
const DTYPES = {
  F32: { size: 4, get: (v, o) => v.getFloat32(o, true), make: (n) => new Float32Array(n) },
  F64: { size: 8, get: (v, o) => v.getFloat64(o, true), make: (n) => new Float64Array(n) },
  I32: { size: 4, get: (v, o) => v.getInt32(o, true), make: (n) => new Int32Array(n) },
  I64: { size: 8, get: (v, o) => v.getBigInt64(o, true), make: (n) => new BigInt64Array(n) },
};

function toArrayBuffer(data) {
  if (data instanceof ArrayBuffer) return data;
  if (ArrayBuffer.isView(data)) return data.buffer.slice(data.byteOffset, data.byteOffset + data.byteLength);
  throw new GlcompError("expected an ArrayBuffer or a typed array");
}

/** Parse a safetensors file: {name: {dtype, shape, data}}. Checks the header strictly (offsets
 *  in range, no overlap or gaps, sizes matching the shapes). `where` names the file in errors. */
export function parseSafetensors(buffer, where = "weights.safetensors") {
  const fail = (msg) => new GlcompError(`bundle ${where}: unreadable (${msg})`);
  const buf = toArrayBuffer(buffer);
  if (buf.byteLength < 8) throw fail("file shorter than its 8-byte header length");
  const view = new DataView(buf);
  const lenLo = view.getUint32(0, true);
  const lenHi = view.getUint32(4, true);
  if (lenHi !== 0 || lenLo > buf.byteLength - 8 || lenLo > 100_000_000) {
    throw fail(`header length ${lenHi * 2 ** 32 + lenLo} exceeds the file size ${buf.byteLength}`);
  }
  const header = parseJson(new Uint8Array(buf, 8, lenLo), `${where} header`);
  if (!isObj(header)) throw fail("header is not a JSON object");
  const start = 8 + lenLo;
  const dataLen = buf.byteLength - start;
  const spans = [];
  const out = {};
  for (const [name, info] of Object.entries(header)) {
    if (name === "__metadata__") {
      if (!isObj(info) || !Object.values(info).every((v) => typeof v === "string")) throw fail("bad __metadata__");
      continue;
    }
    if (!isObj(info)) throw fail(`entry ${repr(name)} is not an object`);
    const dt = typeof info.dtype === "string" && Object.hasOwn(DTYPES, info.dtype) ? DTYPES[info.dtype] : null;
    if (!dt) throw fail(`tensor ${repr(name)} has unsupported dtype ${repr(info.dtype)} (F32, F64, I32 or I64 expected)`);
    const { shape, data_offsets: offs } = info;
    if (!Array.isArray(shape) || shape.length > MAX_DIMS || !shape.every((s) => isInt(s) && s >= 0)) {
      throw fail(`tensor ${repr(name)} has a bad shape`);
    }
    if (!Array.isArray(offs) || offs.length !== 2 || !offs.every((o) => isInt(o) && o >= 0) || offs[1] < offs[0]
      || offs[1] > dataLen) {
      throw fail(`tensor ${repr(name)} has data offsets outside the file`);
    }
    const n = prod(shape);
    if (offs[1] - offs[0] !== n * dt.size) throw fail(`tensor ${repr(name)}: ${offs[1] - offs[0]} bytes for shape ${fmtShape(shape)}`);
    spans.push(offs);
    const data = dt.make(n);
    for (let i = 0, o = start + offs[0]; i < n; i++, o += dt.size) data[i] = dt.get(view, o);
    out[name] = { dtype: info.dtype, shape: [...shape], data };
  }
  spans.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let end = 0;
  for (const [b, e] of spans) {
    if (b !== end) throw fail("tensor data overlaps or leaves gaps");
    end = e;
  }
  if (end !== dataLen) throw fail("the file holds bytes no tensor covers");
  return out;
}

/** Write tensors {name: {dtype: "F32"|"I64"|..., shape, data}} as a safetensors ArrayBuffer. */
export function writeSafetensors(tensors) {
  const header = {};
  let offset = 0;
  const names = Object.keys(tensors).sort();
  for (const name of names) {
    const t = tensors[name];
    const dt = DTYPES[t.dtype];
    if (!dt) throw new GlcompError(`cannot write dtype ${repr(t.dtype)}`);
    const bytes = prod(t.shape) * dt.size;
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  let json = new TextEncoder().encode(JSON.stringify(header));
  const pad = (8 - (json.length % 8)) % 8;
  if (pad) json = new TextEncoder().encode(JSON.stringify(header) + " ".repeat(pad));
  const buf = new ArrayBuffer(8 + json.length + offset);
  const view = new DataView(buf);
  view.setUint32(0, json.length, true);
  view.setUint32(4, 0, true);
  new Uint8Array(buf, 8, json.length).set(json);
  let o = 8 + json.length;
  for (const name of names) {
    const t = tensors[name];
    const n = prod(t.shape);
    for (let i = 0; i < n; i++, o += DTYPES[t.dtype].size) {
      const v = t.data[i];
      if (t.dtype === "F32") view.setFloat32(o, Number(v), true);
      else if (t.dtype === "F64") view.setFloat64(o, Number(v), true);
      else if (t.dtype === "I32") view.setInt32(o, Number(v), true);
      else view.setBigInt64(o, BigInt(v), true);
    }
  }
  return buf;
}

// -- packing (glcomp/runtime/packing.py) -------------------------------------------------------
/** Pack a flat row-major Float32Array of the layout's shape into pages of width*height RGBA texels. */
export function pack(flat, lay) {
  const { rows, row_len: rowLen, row_texels: rowTexels, width, height, pages } = lay;
  const pageSize = width * height * 4;
  const texels = new Float32Array(pages * pageSize);
  if (rowLen === rowTexels * 4) texels.set(flat.subarray(0, rows * rowLen));
  else for (let r = 0; r < rows; r++) texels.set(flat.subarray(r * rowLen, (r + 1) * rowLen), r * rowTexels * 4);
  const out = [];
  for (let p = 0; p < pages; p++) out.push(texels.subarray(p * pageSize, (p + 1) * pageSize));
  return out;
}

/** Inverse of `pack`: pages of RGBA floats -> a flat row-major Float32Array. */
export function unpack(pages, lay) {
  const { rows, row_len: rowLen, row_texels: rowTexels } = lay;
  let all = pages[0];
  if (pages.length > 1) {
    all = new Float32Array(pages.reduce((n, p) => n + p.length, 0));
    let o = 0;
    for (const p of pages) { all.set(p, o); o += p.length; }
  }
  const out = new Float32Array(rows * rowLen);
  if (rowLen === rowTexels * 4) out.set(all.subarray(0, rows * rowLen));
  else for (let r = 0; r < rows; r++) out.set(all.subarray(r * rowTexels * 4, r * rowTexels * 4 + rowLen), r * rowLen);
  return out;
}

// -- inputs (glcomp/runtime/feeds.py) ----------------------------------------------------------
function nestedShape(v, name) {
  const shape = [];
  let cur = v;
  while (Array.isArray(cur)) { shape.push(cur.length); cur = cur[0]; }
  const flat = [];
  const walk = (x, depth) => {
    if (depth === shape.length) {
      if (Array.isArray(x)) throw new GlcompError(`input ${repr(name)}: not an array (ragged nested lists)`);
      flat.push(x);
      return;
    }
    if (!Array.isArray(x) || x.length !== shape[depth]) {
      throw new GlcompError(`input ${repr(name)}: not an array (ragged nested lists)`);
    }
    for (const y of x) walk(y, depth + 1);
  };
  walk(v, 0);
  return [shape, flat];
}

/** Turn `value` (typed array, plain or nested array, number, or {shape, data}) into a flat array
 *  of the spec's shape; raise GlcompError naming the tensor like feeds.py check_input. */
export function checkInput(name, spec, value) {
  const shape = spec.shape;
  const n = prod(shape);
  let data;
  let given;
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) {
    data = value;
    given = value.length === n ? shape : [value.length];
  } else if (isObj(value) && "data" in value) {
    given = Array.isArray(value.shape) ? value.shape : [value.data?.length ?? 0];
    data = ArrayBuffer.isView(value.data) ? value.data : nestedShape(value.data, name)[1];
  } else if (Array.isArray(value)) {
    const [s, flat] = nestedShape(value, name);
    data = flat;
    given = s.length === 1 && flat.length === n ? shape : s; // a flat list of the right length is fine
  } else if (typeof value === "number" || typeof value === "boolean" || typeof value === "bigint") {
    data = [value];
    given = [];
  } else {
    throw new GlcompError(`input ${repr(name)}: not an array (got ${value === null ? "null" : typeof value})`);
  }
  if (!sameList(given, shape) || data.length !== n) {
    throw new GlcompError(`input ${repr(name)} expected shape ${fmtShape(shape)} but got ${fmtShape(given)}`);
  }
  const out = new Float32Array(n);
  const classes = spec.num_classes;
  let lo = Infinity;
  let hi = -Infinity;
  for (let i = 0; i < n; i++) {
    let v = data[i];
    if (typeof v === "bigint") v = Number(v);
    else if (typeof v === "boolean") v = v ? 1 : 0;
    if (typeof v !== "number") throw new GlcompError(`input ${repr(name)} must hold numbers, got ${typeof v}`);
    if (classes !== undefined && classes !== null) {
      if (!Number.isInteger(v)) throw new GlcompError(`input ${repr(name)}: class labels must be integers`);
      if (v < lo) lo = v;
      if (v > hi) hi = v;
    } else if (!Number.isFinite(v)) {
      throw new GlcompError(`input ${repr(name)} holds NaN or infinite values`);
    }
    out[i] = v;
  }
  if (classes !== undefined && classes !== null && n && (lo < 0 || hi >= classes)) {
    throw new GlcompError(`input ${repr(name)}: class labels must lie in [0, ${classes}), got values from ${lo} to ${hi}`);
  }
  return out;
}

/** Every name known, none missing, each one checked by `checkInput`. */
export function checkFeeds(entry, specs, given) {
  if (!isObj(given)) throw new GlcompError(`${entry}: inputs must be an object of name -> array`);
  const unknown = Object.keys(given).filter((k) => !Object.hasOwn(specs, k)).sort();
  if (unknown.length) throw new GlcompError(`${entry}: unknown input names ${fmtList(unknown)}; expected ${fmtList(sortedKeys(specs))}`);
  const missing = Object.keys(specs).filter((k) => !Object.hasOwn(given, k)).sort();
  if (missing.length) throw new GlcompError(`${entry}: missing inputs ${fmtList(missing)}`);
  const out = {};
  for (const [name, spec] of Object.entries(specs)) out[name] = checkInput(name, spec, given[name]);
  return out;
}

// -- loading a bundle --------------------------------------------------------------------------
const decodeUtf8 = (buf, where) => {
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(buf);
  } catch {
    throw new GlcompError(`bundle ${where}: not UTF-8 text`);
  }
};
async function readAsText(v, where) {
  if (typeof v === "string") return v;
  if (typeof Blob !== "undefined" && v instanceof Blob) return decodeUtf8(await v.arrayBuffer(), where);
  return decodeUtf8(toArrayBuffer(v), where);
}
async function readAsBuffer(v) {
  if (typeof Blob !== "undefined" && v instanceof Blob) return v.arrayBuffer();
  if (typeof v === "string") return new TextEncoder().encode(v).buffer;
  return toArrayBuffer(v);
}

/** Files given directly: {"manifest.json": File|ArrayBuffer|string|object, "weights.safetensors":
 *  ..., "shaders/p0.frag": ...} or an array / FileList of File objects (a picked bundle folder). */
function fileMap(source) {
  const map = new Map();
  const add = (path, value) => {
    const parts = String(path).split(/[\\/]/).filter((p) => p);
    const base = parts[parts.length - 1];
    if (!base) return;
    if (base === "manifest.json" || base === "weights.safetensors" || base === PROGRAM_FILE) map.set(base, value);
    else if (SHADER_RE.test(base) && (parts.length === 1 || parts[parts.length - 2] === "shaders")) map.set(`shaders/${base}`, value);
  };
  const isList = Array.isArray(source) || (typeof FileList !== "undefined" && source instanceof FileList);
  if (isList) {
    for (const f of source) add(f.webkitRelativePath || f.name, f);
  } else {
    for (const [k, v] of Object.entries(source)) add(k, v);
  }
  return map;
}

async function fetchFile(url, what, optional, origins) {
  let res;
  try {
    res = await fetch(url, { credentials: "same-origin" });
  } catch (err) {
    throw new GlcompError(`bundle ${what}: could not fetch ${url} (${err.message})`);
  }
  if (res.url && origins !== null && !origins.includes(new URL(res.url).origin)) {
    throw new GlcompError(`bundle ${what}: ${url} was redirected to ${new URL(res.url).origin}, an origin not allowed`);
  }
  if (!res.ok) {
    if (optional) return null;
    throw new GlcompError(`bundle ${what} is missing (HTTP ${res.status} for ${url})`);
  }
  return res;
}

/** The origins a bundle may be fetched from: this page's own, and those `allowOrigins` names
 *  (an array of origins such as "https://models.example.org", or true for any: null). */
function allowedOrigins(allow) {
  if (allow === true) return null;
  const own = typeof location !== "undefined" && location.origin && location.origin !== "null" ? [location.origin] : [];
  if (allow !== undefined && !(Array.isArray(allow) && allow.every((o) => typeof o === "string"))) {
    throw new GlcompError("allowOrigins must be an array of origins (\"https://host:port\") or true");
  }
  return [...own, ...(allow || []).map((o) => new URL(o).origin)];
}

/** Load and validate a bundle: {manifest, shaders, weights, counters}. Nothing is run.
 *  Accepts and rejects exactly what glcomp/codegen/schema.py read_bundle does. Options:
 *  `textureBudgetBytes` (default 2 GiB) and `loopBudget` (loop iterations per draw, default
 *  2**32) bound what the bundle may ask of the GPU; a URL must be of this page's origin unless
 *  `allowOrigins` lists its origin (or is true). Files are checked against the manifest's sha256. */
export async function loadBundle(source, options = {}) {
  let manifestBytes;
  let weightsBuf;
  const shaders = {};
  let getShader;
  let programBuf;
  if (typeof source === "string" || (typeof URL !== "undefined" && source instanceof URL)) {
    const here = typeof location !== "undefined" ? location.href : undefined;
    let base = String(source);
    if (!base.endsWith("/")) base += "/";
    base = new URL(base, here).href;
    const origins = allowedOrigins(options.allowOrigins);
    if (origins !== null && !origins.includes(new URL(base).origin)) {
      throw new GlcompError(`bundle ${base}: refusing to load a bundle from ${new URL(base).origin}, another origin `
        + "than this page's (pass allowOrigins: [origin] to trust it)");
    }
    manifestBytes = await (await fetchFile(new URL("manifest.json", base), "manifest.json", false, origins)).arrayBuffer();
    getShader = async (name) => {
      const res = await fetchFile(new URL(`shaders/${name}`, base), `shaders/${name}`, true, origins);
      return res ? decodeUtf8(await res.arrayBuffer(), `shaders/${name}`) : null;
    };
    weightsBuf = async () => (await fetchFile(new URL("weights.safetensors", base), "weights.safetensors", false, origins))
      .arrayBuffer();
    programBuf = async () => {
      const res = await fetchFile(new URL(PROGRAM_FILE, base), PROGRAM_FILE, true, origins);
      return res ? res.arrayBuffer() : null;
    };
  } else if (source && typeof source === "object") {
    const map = fileMap(source);
    for (const f of ["manifest.json", "weights.safetensors"]) {
      if (!map.has(f)) throw new GlcompError(`bundle: ${f} is missing`);
    }
    const mv = map.get("manifest.json");
    manifestBytes = isObj(mv) && !(typeof Blob !== "undefined" && mv instanceof Blob)
      ? new TextEncoder().encode(JSON.stringify(mv)) : await readAsBuffer(mv);
    getShader = async (name) => (map.has(`shaders/${name}`) ? readAsText(map.get(`shaders/${name}`), `shaders/${name}`) : null);
    weightsBuf = async () => readAsBuffer(map.get("weights.safetensors"));
    programBuf = async () => (map.has(PROGRAM_FILE) ? readAsBuffer(map.get(PROGRAM_FILE)) : null);
  } else {
    throw new GlcompError("Runtime.load: pass a bundle base URL, or an object / array of its files");
  }
  const manifest = parseJson(manifestBytes, "manifest.json");
  if (isObj(manifest)) {
    const wanted = [manifest.vertex_shader];
    for (const p of Object.values(isObj(manifest.programs) ? manifest.programs : {})) {
      if (isObj(p)) wanted.push(p.fragment);
    }
    if (wanted.length > MAX_PROGRAMS + 1) throw new GlcompError(`bundle manifest.json: more than ${MAX_PROGRAMS} programs`);
    for (const name of wanted) {
      if (typeof name !== "string" || !SHADER_RE.test(name)) {
        throw new GlcompError(`bundle manifest.json: shader name ${repr(name)} is not a plain file name`);
      }
    }
    const unique = [...new Set(wanted)];
    const texts = await Promise.all(unique.map(getShader));
    unique.forEach((name, i) => { if (texts[i] !== null) shaders[name] = texts[i]; });
  }
  validateManifest(manifest, Object.keys(shaders), options);
  checkShaders(manifest, shaders);
  const weightsBytes = await weightsBuf();
  const tensors = parseSafetensors(weightsBytes);
  const expected = {};
  for (const [k, st] of Object.entries(manifest.states)) expected[k] = st.layout.shape;
  for (const k of Object.keys(manifest.counters)) expected[k] = [];
  const missing = Object.keys(expected).filter((k) => !Object.hasOwn(tensors, k)).sort();
  const extra = Object.keys(tensors).filter((k) => !Object.hasOwn(expected, k)).sort();
  if (missing.length || extra.length) {
    throw new GlcompError(`bundle weights.safetensors: missing ${fmtList(missing)}, unexpected ${fmtList(extra)}`);
  }
  const weights = {};
  const counters = {};
  for (const [k, shape] of Object.entries(expected)) {
    const t = tensors[k];
    if (!sameList(t.shape, shape)) {
      throw new GlcompError(`bundle weights.safetensors: ${repr(k)} has shape ${fmtShape(t.shape)}, expected ${fmtShape(shape)}`);
    }
    const isCounter = Object.hasOwn(manifest.counters, k);
    const allowed = isCounter ? COUNTER_DTYPES : STATE_DTYPES;
    if (!allowed.includes(t.dtype)) {
      throw new GlcompError(`bundle weights.safetensors: tensor ${repr(k)} is ${t.dtype}; a ${isCounter ? "counter" : "state"} `
        + `must be ${allowed.join(" or ")}`);
    }
    const values = Float32Array.from(t.data, Number);
    if (!Array.from(t.data, Number).every(Number.isFinite)) {
      throw new GlcompError(`bundle weights.safetensors: ${repr(k)} holds NaN or infinite values`);
    }
    if (isCounter) counters[k] = Number(t.data[0]);
    else weights[k] = values;
  }
  if (isObj(manifest.files)) {
    // Checked last, so a damaged file is reported by what is wrong with it where that is known.
    const check = async (path, bytes) => {
      if (await sha256(bytes) !== manifest.files[path]) {
        throw new GlcompError(`bundle ${path}: its sha256 does not match the one manifest.json records `
          + "(the file was changed, or comes from another save)");
      }
    };
    if (Object.hasOwn(manifest.files, PROGRAM_FILE)) {
      // The IR graphs: only Python runs them, but a bundle Python refuses is refused here too.
      const bytes = await programBuf();
      if (bytes === null) throw new GlcompError(`bundle: ${PROGRAM_FILE} is missing`);
      await check(PROGRAM_FILE, bytes);
      if (!isObj(parseJson(bytes, PROGRAM_FILE))) throw new GlcompError(`bundle ${PROGRAM_FILE}: must be an object`);
    }
    await check("weights.safetensors", weightsBytes);
    for (const [name, text] of Object.entries(shaders)) await check(`shaders/${name}`, new TextEncoder().encode(text));
    delete manifest.files;
  }
  return { manifest, shaders, weights, counters };
}

// -- the runtime -------------------------------------------------------------------------------
/** WebGL wants #version on the very first line; drop blank lines in front of it. Returns the
 *  source and how many lines were dropped (to map driver line numbers back to the file). */
function versionFirst(source) {
  const lead = /^\s*/.exec(source)[0];
  if (!lead || !source.startsWith("#version", lead.length)) return [source, 0];
  return [source.slice(lead.length), lead.split("\n").length - 1];
}

function compileError(kernel, source, log) {
  const header = source.split("\n").slice(0, 12).filter((l) => l.startsWith("//")).join("\n");
  const found = /0:(\d+)/.exec(log || "");
  let line = "";
  if (found) {
    const n = Number(found[1]) + versionFirst(source)[1];
    const lines = source.split("\n");
    if (n > 0 && n <= lines.length) line = `\nGLSL line ${n}: ${lines[n - 1].trim()}`;
  }
  return new GlcompError(`shader for kernel ${kernel} failed to compile or link:\n${header}${line}\ndriver: ${log}`);
}

// The mobile target presets of glcomp/codegen/target.py (suggested when a bundle does not fit).
export const PRESETS = {
  "webgl1-mobile": { max_texture_size: 2048, max_draw_buffers: 1, max_texture_units: 8 },
  "webgl2-mobile": { max_texture_size: 4096, max_draw_buffers: 4, max_texture_units: 16 },
};

const KINDS = ["textures", "framebuffers", "programs", "shaders", "buffers", "syncs"];

/** Runs a glcomp bundle with WebGL 2 (GLSL ES 3.00 bundles) or WebGL 1 (GLSL ES 1.00 bundles). */
export class Runtime {
  /** `source`: a base URL ("bundle/") or the bundle's files. Options: `canvas` (a canvas to take
   *  the context from), `readback` ("async" (default on WebGL 2) or "sync"), `contextAttributes`. */
  static async load(source, options = {}) {
    const bundle = await loadBundle(source, options);
    const rt = new Runtime(bundle, options);
    try {
      await rt._init();
    } catch (err) {
      rt.dispose();
      throw err;
    }
    return rt;
  }

  constructor(bundle, options = {}) {
    this.bundle = bundle;
    this.manifest = bundle.manifest;
    this.options = options;
    this.hyper = { ...this.manifest.hyper };
    this.counters = { ...bundle.counters };
    this.parity = Object.fromEntries(Object.keys(this.manifest.states).map((k) => [k, 0]));
    this.textures = new Map();
    this.programs = new Map();
    this._fbos = new Map();
    this._readFbos = new Map();
    this._live = new Set(); // every GL object this runtime created and has not deleted
    this._liveCount = Object.fromEntries(KINDS.map((k) => [k, 0]));
    this._checkedEntries = new Set();
    this._disposed = false;
    this._lost = false;
    this.drawCalls = 0;
    /** Train steps run since load (trainStep and train), including those lost with the context. */
    this.steps = 0;
    /** Called as onContextLost({steps, kept}) when the WebGL context is lost: `kept` is the step
     *  of the weights restore() will bring back. Set it here or with the load option. */
    this.onContextLost = options.onContextLost ?? null;
    this._keepEvery = options.keepWeightsEvery ?? 100;
    if (!isInt(this._keepEvery) || this._keepEvery < 0) {
      throw new GlcompError(`keepWeightsEvery must be a non-negative integer, got ${repr(this._keepEvery)}`);
    }
    // The weights restore() re-uploads after a context loss: the bundle's until something newer
    // is read back (see snapshot()).
    this._kept = { steps: 0, weights: bundle.weights, counters: { ...bundle.counters } };
  }

  // -- setup ------------------------------------------------------------------------------------
  _track(kind, obj) {
    if (!obj) throw this._lostOr(new GlcompError(`WebGL could not create a ${kind.slice(0, -1)}`));
    this._live.add(obj);
    obj.__glcompKind = kind;
    this._liveCount[kind]++;
    return obj;
  }
  _untrack(obj) {
    if (obj && this._live.delete(obj)) this._liveCount[obj.__glcompKind]--;
  }
  _lostOr(err) {
    return this.gl && (this._lost || this.gl.isContextLost()) ? this._lostError() : err;
  }
  _lostError() {
    const err = new GlcompError(`the WebGL context was lost (after ${this.steps} train steps; the weights of step `
      + `${this._kept.steps} are kept: call restore() once the canvas fires webglcontextrestored)`);
    err.reason = "context-lost";
    return err;
  }

  _createContext() {
    const m = this.manifest;
    const webgl1 = m.target.glsl_version === "100";
    let canvas = this.options.canvas;
    if (!canvas) {
      canvas = typeof document !== "undefined" ? document.createElement("canvas") : new OffscreenCanvas(1, 1);
      canvas.width = canvas.height = 1;
      this._ownCanvas = true;
    }
    this.canvas = canvas;
    const attrs = { alpha: true, antialias: false, depth: false, stencil: false, premultipliedAlpha: false,
      preserveDrawingBuffer: false, powerPreference: "high-performance", ...this.options.contextAttributes };
    const gl = canvas.getContext(webgl1 ? "webgl" : "webgl2", attrs)
      || (webgl1 ? canvas.getContext("experimental-webgl", attrs) : null);
    if (!gl) {
      throw new GlcompError(webgl1
        ? "this browser offers no WebGL context (WebGL is disabled or unsupported)"
        : "this browser offers no WebGL 2 context; compile the model with target='webgl1' for WebGL 1");
    }
    this.gl = gl;
    this.webgl2 = !webgl1;
    this._onLost = (ev) => {
      ev.preventDefault(); // without this the browser never restores the context
      if (this._disposed || this._lost) return;
      this._lost = true;
      if (this.onContextLost) {
        try {
          this.onContextLost({ steps: this.steps, kept: this._kept.steps });
        } catch (err) {
          if (typeof console !== "undefined") console.error(err);
        }
      }
    };
    canvas.addEventListener?.("webglcontextlost", this._onLost);
    this._checkDevice();
  }

  /** Query the context's extensions and limits and refuse a bundle that needs more, naming each
   *  limit, what the bundle needs and what the device has. Run again after a context restore
   *  (extension objects do not survive a loss). */
  _checkDevice() {
    const gl = this.gl;
    const m = this.manifest;
    const dbg = gl.getExtension("WEBGL_debug_renderer_info");
    const renderer = dbg ? gl.getParameter(dbg.UNMASKED_RENDERER_WEBGL) : gl.getParameter(gl.RENDERER);
    const vendor = dbg ? gl.getParameter(dbg.UNMASKED_VENDOR_WEBGL) : gl.getParameter(gl.VENDOR);
    const software = SOFTWARE_RE.test(`${renderer} ${vendor}`);
    const lacks = [];
    const ext = {};
    const progs = Object.entries(m.programs);
    const outputs = maxOf(progs.map(([, p]) => p.outputs), 1);
    const samplers = maxOf(progs.map(([, p]) => p.samplers.length), 0);
    const kernelOf = {};
    for (const e of Object.values(m.entries)) for (const d of e.draws) kernelOf[d.program] ??= d.kernel;
    const which = (pid) => `program ${pid}${kernelOf[pid] ? ` (kernel ${kernelOf[pid]})` : ""}`;
    // Additive blending into RGBA32F needs EXT_float_blend; into RGBA16F it comes with the
    // extensions that make RGBA16F renderable.
    const isF32 = (r) => typeof r !== "string" || textureFormat(m.textures[r]) === "f32";
    const blend = Object.values(m.entries).some((e) => e.draws.some((d) => d.blend === true && d.targets.some(isF32)));
    const half = Object.values(m.textures).some((t) => textureFormat(t) === "f16");
    if (this.webgl2) {
      ext.colorBufferFloat = gl.getExtension("EXT_color_buffer_float");
      if (!ext.colorBufferFloat) lacks.push("EXT_color_buffer_float (rendering into RGBA32F float textures)");
    } else {
      ext.textureFloat = gl.getExtension("OES_texture_float");
      if (!ext.textureFloat) lacks.push("OES_texture_float (float textures)");
      ext.colorBufferFloat = gl.getExtension("WEBGL_color_buffer_float") || gl.getExtension("EXT_color_buffer_float");
      if (!ext.colorBufferFloat) lacks.push("WEBGL_color_buffer_float (rendering into float textures)");
      if (half) {
        // A bundle compiled with storage="f16": RGBA16F temporaries (WebGL 2 has them in core,
        // rendering into them comes with EXT_color_buffer_float).
        ext.textureHalfFloat = gl.getExtension("OES_texture_half_float");
        if (!ext.textureHalfFloat) {
          lacks.push("OES_texture_half_float (half-float textures; compile with storage='f32' for this device)");
        }
        ext.colorBufferHalfFloat = gl.getExtension("EXT_color_buffer_half_float");
        if (!ext.colorBufferHalfFloat) {
          lacks.push("EXT_color_buffer_half_float (rendering into half-float textures; compile with storage='f32' "
            + "for this device)");
        }
      }
      if (outputs > 1) {
        ext.drawBuffers = gl.getExtension("WEBGL_draw_buffers");
        if (!ext.drawBuffers) lacks.push(`WEBGL_draw_buffers (programs write ${outputs} outputs per draw)`);
      }
    }
    if (blend) {
      ext.floatBlend = gl.getExtension("EXT_float_blend");
      if (!ext.floatBlend) lacks.push("EXT_float_blend (additive blending into float textures)");
    }
    ext.parallel = gl.getExtension("KHR_parallel_shader_compile");
    const maxTex = gl.getParameter(gl.MAX_TEXTURE_SIZE);
    let maxDraw = 1;
    let drawLimits = "";
    if (this.webgl2 || ext.drawBuffers) {
      const [db, ca] = this.webgl2 ? [gl.MAX_DRAW_BUFFERS, gl.MAX_COLOR_ATTACHMENTS]
        : [ext.drawBuffers.MAX_DRAW_BUFFERS_WEBGL, ext.drawBuffers.MAX_COLOR_ATTACHMENTS_WEBGL];
      const [nd, nc] = [gl.getParameter(db), gl.getParameter(ca)];
      maxDraw = Math.min(nd, nc);
      drawLimits = `MAX_DRAW_BUFFERS ${nd}, MAX_COLOR_ATTACHMENTS ${nc}`;
    }
    const maxUnits = gl.getParameter(gl.MAX_TEXTURE_IMAGE_UNITS);
    const viewport = gl.getParameter(gl.MAX_VIEWPORT_DIMS);
    const hint = {}; // target limits that would fit this device
    const [bigName, big] = Object.entries(m.textures).reduce((a, [k, t]) => (Math.max(t.width, t.height) > a[1]
      ? [k, Math.max(t.width, t.height)] : a), ["", 1]);
    if (big > maxTex) {
      const t = m.textures[bigName];
      lacks.push(`MAX_TEXTURE_SIZE: textures of ${big} texels per side (the limit here is ${maxTex}), `
        + `texture ${repr(bigName)} is ${t.width}x${t.height}`);
      hint.max_texture_size = maxTex;
    } else if (viewport && big > Math.min(viewport[0], viewport[1])) {
      lacks.push(`MAX_VIEWPORT_DIMS: viewports of ${big} pixels per side (the limit here is ${viewport[0]}x${viewport[1]})`);
      hint.max_texture_size = 2 ** Math.floor(Math.log2(Math.min(viewport[0], viewport[1])));
    }
    if (outputs > maxDraw && (this.webgl2 || ext.drawBuffers)) {
      const [pid] = progs.find(([, p]) => p.outputs === outputs);
      lacks.push(`MAX_DRAW_BUFFERS: ${outputs} draw buffers per draw call (this GPU has ${maxDraw}), `
        + `${which(pid)} writes ${outputs} outputs (${drawLimits})`);
      hint.max_draw_buffers = maxDraw;
    } else if (outputs > 1 && !this.webgl2 && !ext.drawBuffers) {
      hint.max_draw_buffers = 1;
    }
    if (samplers > maxUnits) {
      const [pid] = progs.find(([, p]) => p.samplers.length === samplers);
      lacks.push(`MAX_TEXTURE_IMAGE_UNITS: ${samplers} texture units per shader (this GPU has ${maxUnits}), `
        + `${which(pid)} samples ${samplers} textures`);
      hint.max_texture_units = maxUnits;
    }
    if (blend && !ext.floatBlend) hint.float_blend = false;
    const high = gl.getShaderPrecisionFormat(gl.FRAGMENT_SHADER, gl.HIGH_FLOAT);
    if (high && high.precision < 23) {
      lacks.push(`highp float in fragment shaders (32-bit floats; this GPU offers ${high.precision} bits of `
        + "precision: HIGH_FLOAT of getShaderPrecisionFormat)");
    }
    this._info = { webgl: this.webgl2 ? 2 : 1, renderer, vendor, software, maxTextureSize: maxTex,
      maxDrawBuffers: maxDraw, maxTextureUnits: maxUnits, parallelShaderCompile: !!ext.parallel,
      readback: this._asyncReadback() ? "async" : "sync", warnings: [] };
    if (software) {
      this._info.warnings.push(`${renderer} is a software renderer (no GPU acceleration): `
        + "training works but is slow; enable hardware acceleration in the browser settings");
    }
    if (lacks.length) {
      const sw = software ? ` It renders with ${renderer}, a software renderer: hardware acceleration may be off.` : "";
      const limits = Object.entries(hint).map(([k, v]) => `, ${k}=${v === false ? "False" : v}`).join("");
      const preset = `${this.webgl2 ? "webgl2" : "webgl1"}-mobile`;
      const p = PRESETS[preset];
      const fits = preset !== m.target.name && p.max_texture_size <= maxTex && p.max_texture_units <= maxUnits
        && (p.max_draw_buffers <= maxDraw || p.max_draw_buffers === 1);
      const fix = limits ? ` Compile the model for this device: glcomp.compile(..., target='${m.target.name ?? "webgl2"}'`
        + `${limits})${fits ? ` or target='${preset}'` : ""}.` : "";
      throw new GlcompError(`this browser cannot run the bundle (WebGL ${this.webgl2 ? 2 : 1}, renderer `
        + `${renderer}); it lacks: ${lacks.join("; ")}.${fix}${sw}`);
    }
    this.ext = ext;
  }

  _asyncReadback() {
    return this.webgl2 && (this.options.readback || "async") === "async";
  }

  async _init() {
    this._createContext();
    await this._setup(this.bundle.weights);
    const sw = this._info.warnings[0];
    if (sw && !this.options.quiet && typeof console !== "undefined") console.warn(`glcomp: ${sw}`);
  }

  /** Create every GL object (textures, buffers, programs) and upload `weights` (all states). */
  async _setup(weights) {
    const gl = this.gl;
    const m = this.manifest;
    gl.disable(gl.DITHER);
    gl.disable(gl.DEPTH_TEST);
    gl.disable(gl.SCISSOR_TEST);
    gl.disable(gl.CULL_FACE);
    gl.disable(gl.BLEND);
    gl.pixelStorei(gl.UNPACK_ALIGNMENT, 4);
    gl.pixelStorei(gl.PACK_ALIGNMENT, 4);
    gl.activeTexture(gl.TEXTURE0);
    while (gl.getError() !== gl.NO_ERROR && !gl.isContextLost()) { /* start from a clean error state */ }
    const totalBytes = Object.values(m.textures).reduce((a, t) => a + TEXEL_BYTES[textureFormat(t)] * t.width * t.height, 0);
    for (const [name, t] of Object.entries(m.textures)) {
      const tex = this._track("textures", gl.createTexture());
      tex.__name = name;
      tex.__w = t.width;
      tex.__h = t.height;
      gl.bindTexture(gl.TEXTURE_2D, tex);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_S, gl.CLAMP_TO_EDGE);
      gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_WRAP_T, gl.CLAMP_TO_EDGE);
      const half = textureFormat(t) === "f16";
      tex.__format = textureFormat(t);
      if (this.webgl2) gl.texStorage2D(gl.TEXTURE_2D, 1, half ? gl.RGBA16F : gl.RGBA32F, t.width, t.height);
      else {
        const type = half ? this.ext.textureHalfFloat.HALF_FLOAT_OES : gl.FLOAT;
        gl.texImage2D(gl.TEXTURE_2D, 0, gl.RGBA, t.width, t.height, 0, gl.RGBA, type, null);
      }
      const err = gl.getError();
      if (err !== gl.NO_ERROR || gl.isContextLost()) {
        const why = gl.isContextLost() ? "the WebGL context was lost"
          : err === gl.OUT_OF_MEMORY ? "out of GPU memory" : `WebGL error 0x${err.toString(16)}`;
        const bytes = TEXEL_BYTES[textureFormat(t)] * t.width * t.height;
        throw new GlcompError(`texture ${repr(name)} (${t.width}x${t.height} ${half ? "RGBA16F" : "RGBA32F"}, ${bytes} bytes) `
          + `could not be allocated: ${why} (the bundle needs ${totalBytes} bytes of textures)`);
      }
      this.textures.set(name, tex);
    }
    gl.bindTexture(gl.TEXTURE_2D, null);
    this._vbo = this._track("buffers", gl.createBuffer());
    gl.bindBuffer(gl.ARRAY_BUFFER, this._vbo);
    gl.bufferData(gl.ARRAY_BUFFER, QUAD, gl.STATIC_DRAW);
    await this._compilePrograms();
    for (const [name, value] of Object.entries(weights)) this._uploadState(name, value);
    const err = gl.getError();
    if (err !== gl.NO_ERROR) throw this._lostOr(new GlcompError(`WebGL error 0x${err.toString(16)} while setting up the bundle`));
  }

  async _compilePrograms() {
    const gl = this.gl;
    const m = this.manifest;
    const shaders = this.bundle.shaders;
    const kernelOf = {};
    for (const e of Object.values(m.entries)) for (const d of e.draws) kernelOf[d.program] ??= d.kernel ?? d.program;
    const compile = (type, source) => {
      const sh = this._track("shaders", gl.createShader(type));
      gl.shaderSource(sh, versionFirst(source)[0]);
      gl.compileShader(sh);
      return sh;
    };
    const vert = compile(gl.VERTEX_SHADER, shaders[m.vertex_shader]);
    const pending = [];
    for (const [pid, p] of Object.entries(m.programs)) {
      const frag = compile(gl.FRAGMENT_SHADER, shaders[p.fragment]);
      const prog = this._track("programs", gl.createProgram());
      gl.attachShader(prog, vert);
      gl.attachShader(prog, frag);
      gl.bindAttribLocation(prog, 0, "a_position");
      gl.linkProgram(prog);
      pending.push({ pid, p, prog, frag });
    }
    if (this.ext.parallel) {
      const done = this.ext.parallel.COMPLETION_STATUS_KHR;
      while (!pending.every(({ prog }) => gl.getProgramParameter(prog, done))) {
        if (gl.isContextLost()) break;
        await sleep(2);
      }
    }
    try {
      if (gl.isContextLost()) throw new GlcompError("the WebGL context was lost while compiling the shaders");
      if (!gl.getShaderParameter(vert, gl.COMPILE_STATUS)) {
        throw compileError("quad (vertex shader)", shaders[m.vertex_shader], gl.getShaderInfoLog(vert));
      }
      for (const { pid, p, prog, frag } of pending) {
        if (!gl.getProgramParameter(prog, gl.LINK_STATUS)) {
          const log = gl.getShaderParameter(frag, gl.COMPILE_STATUS) ? gl.getProgramInfoLog(prog) : gl.getShaderInfoLog(frag);
          throw this._lostOr(compileError(kernelOf[pid] || pid, shaders[p.fragment], log));
        }
        const loc = {};
        for (const u of [...p.samplers, ...p.uniforms, "u_page_offset"]) loc[u] = gl.getUniformLocation(prog, u);
        this.programs.set(pid, { prog, loc });
      }
    } finally {
      for (const { prog, frag } of pending) {
        gl.detachShader(prog, vert);
        gl.detachShader(prog, frag);
        gl.deleteShader(frag);
        this._untrack(frag);
      }
      gl.deleteShader(vert);
      this._untrack(vert);
    }
  }

  /** What the WebGL context offers: renderer, limits, whether it is a software renderer. */
  info() {
    return { ...this._info, warnings: [...this._info.warnings] };
  }

  /** Live GL objects this runtime owns, by kind (all zero after dispose()). */
  liveObjects() {
    return { ...this._liveCount };
  }

  // -- textures --------------------------------------------------------------------------------
  _texture(ref) {
    if (typeof ref === "string") return this.textures.get(ref);
    const st = this.manifest.states[ref.state];
    const which = this.parity[ref.state] ^ (ref.version === "next" ? 1 : 0);
    return this.textures.get(st.textures[which][ref.page]);
  }

  _write(refs, flat, layout) {
    // Only states and entry inputs are written, and the validator holds both to RGBA32F ("f32").
    const gl = this.gl;
    const pages = pack(flat, layout);
    gl.activeTexture(gl.TEXTURE0);
    refs.forEach((ref, i) => {
      const tex = this._texture(ref);
      gl.bindTexture(gl.TEXTURE_2D, tex);
      gl.texSubImage2D(gl.TEXTURE_2D, 0, 0, 0, tex.__w, tex.__h, gl.RGBA, gl.FLOAT, pages[i]);
    });
    gl.bindTexture(gl.TEXTURE_2D, null);
  }

  _stateRefs(name, version = "cur") {
    const pages = this.manifest.states[name].layout.pages;
    return Array.from({ length: pages }, (_, page) => ({ state: name, version, page }));
  }

  _uploadState(name, flat) {
    this._write(this._stateRefs(name), flat, this.manifest.states[name].layout);
  }

  _framebuffer(targets) {
    const gl = this.gl;
    const texs = targets.map((r) => this._texture(r));
    const key = texs.map((t) => t.__name).join("|");
    let fbo = this._fbos.get(key);
    if (fbo) return fbo;
    fbo = this._track("framebuffers", gl.createFramebuffer());
    gl.bindFramebuffer(gl.FRAMEBUFFER, fbo);
    const db = this.ext.drawBuffers;
    const attach = (i) => (this.webgl2 ? gl.COLOR_ATTACHMENT0 + i : db ? db.COLOR_ATTACHMENT0_WEBGL + i : gl.COLOR_ATTACHMENT0);
    texs.forEach((t, i) => gl.framebufferTexture2D(gl.FRAMEBUFFER, attach(i), gl.TEXTURE_2D, t, 0));
    if (texs.length > 1 || db) {
      const bufs = texs.map((_, i) => attach(i));
      if (this.webgl2) gl.drawBuffers(bufs);
      else db.drawBuffersWEBGL(bufs);
    }
    const status = gl.checkFramebufferStatus(gl.FRAMEBUFFER);
    if (status !== gl.FRAMEBUFFER_COMPLETE) {
      throw this._lostOr(new GlcompError(`float render targets are not supported here (framebuffer status 0x${status.toString(16)}, `
        + `renderer ${this._info.renderer})`));
    }
    this._fbos.set(key, fbo);
    return fbo;
  }

  _readFramebuffer(tex) {
    let fbo = this._readFbos.get(tex);
    if (fbo) return fbo;
    const gl = this.gl;
    fbo = this._track("framebuffers", gl.createFramebuffer());
    gl.bindFramebuffer(gl.FRAMEBUFFER, fbo);
    gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0, gl.TEXTURE_2D, tex, 0);
    this._readFbos.set(tex, fbo);
    return fbo;
  }

  /** Read textures synchronously (readPixels into client memory). */
  _readSync(refs, layout) {
    const gl = this.gl;
    const pages = refs.map((ref) => {
      const tex = this._texture(ref);
      gl.bindFramebuffer(gl.FRAMEBUFFER, this._readFramebuffer(tex));
      const data = new Float32Array(tex.__w * tex.__h * 4);
      gl.readPixels(0, 0, tex.__w, tex.__h, gl.RGBA, gl.FLOAT, data);
      return data;
    });
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    // a lost context reads nothing (zeros), never pass that off as data
    if (gl.isContextLost()) throw this._lostError();
    return unpack(pages, layout);
  }

  /** A fresh pixel-pack buffer per readback: Chrome drops its readback shadow copy (with a
   *  performance warning) when a READ buffer is written again after a fence. */
  _createPbo(bytes) {
    const gl = this.gl;
    const pbo = this._track("buffers", gl.createBuffer());
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
    gl.bufferData(gl.PIXEL_PACK_BUFFER, bytes, gl.STREAM_READ);
    pbo.__bytes = bytes;
    return pbo;
  }

  /** Read several outputs: [{refs, layout}] -> Promise<[Float32Array]>. On WebGL 2 the pixels are
   *  copied into pixel-pack buffers, a fence is polled between event-loop tasks, and only then
   *  read with getBufferSubData, so the page never blocks on the GPU. */
  async _readMany(items) {
    if (!this._asyncReadback()) return items.map(({ refs, layout }) => this._readSync(refs, layout));
    const gl = this.gl;
    const reads = items.map(({ refs, layout }) => ({
      layout,
      pages: refs.map((ref) => {
        const tex = this._texture(ref);
        const bytes = tex.__w * tex.__h * 16;
        const pbo = this._createPbo(bytes);
        gl.bindFramebuffer(gl.FRAMEBUFFER, this._readFramebuffer(tex));
        gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
        gl.readPixels(0, 0, tex.__w, tex.__h, gl.RGBA, gl.FLOAT, 0);
        return pbo;
      }),
    }));
    gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    const sync = this._track("syncs", gl.fenceSync(gl.SYNC_GPU_COMMANDS_COMPLETE, 0));
    gl.flush();
    try {
      await this._waitSync(sync);
    } finally {
      if (!this._disposed) {
        gl.deleteSync(sync);
        this._untrack(sync);
      }
    }
    if (gl.isContextLost()) throw this._lostError();
    return reads.map(({ layout, pages }) => unpack(pages.map((pbo) => {
      const data = new Float32Array(pbo.__bytes / 4);
      gl.bindBuffer(gl.PIXEL_PACK_BUFFER, pbo);
      gl.getBufferSubData(gl.PIXEL_PACK_BUFFER, 0, data);
      gl.bindBuffer(gl.PIXEL_PACK_BUFFER, null);
      gl.deleteBuffer(pbo);
      this._untrack(pbo);
      return data;
    }), layout));
  }

  async _waitSync(sync) {
    const gl = this.gl;
    for (let polls = 0; ; polls++) {
      if (this._disposed) throw new GlcompError("the runtime was disposed while reading back");
      if (this._lost || gl.isContextLost()) throw this._lostError();
      const s = gl.clientWaitSync(sync, 0, 0);
      if (s === gl.ALREADY_SIGNALED || s === gl.CONDITION_SATISFIED) return;
      if (s === gl.WAIT_FAILED) throw this._lostOr(new GlcompError("waiting for the GPU failed"));
      await (polls < 50 ? nextTask() : sleep(1));
    }
  }

  // -- execution -------------------------------------------------------------------------------
  _alive() {
    if (this._disposed) throw new GlcompError("the runtime was disposed");
    if (this._lost || this.gl.isContextLost()) throw this._lostError();
  }

  /** Upload `inputs`, run the entry point's draws, flip updated states. Returns the readback
   *  (a Promise of {name: Float32Array}) for the outputs named in `read` (all by default). */
  _run(entry, inputs, read) {
    this._alive();
    const m = this.manifest;
    if (!Object.hasOwn(m.entries, entry)) {
      throw new GlcompError(`${entry}: not in this bundle (compile with a loss and an optimizer)`);
    }
    const e = m.entries[entry];
    const specs = Object.fromEntries(Object.keys(e.inputs).map((k) => [k, m.inputs[k]]));
    const feeds = checkFeeds(entry, specs, inputs);
    const names = read ?? Object.keys(e.outputs);
    for (const n of names) if (!Object.hasOwn(e.outputs, n)) throw new GlcompError(`${entry} has no output ${repr(n)}`);
    const gl = this.gl;
    for (const [name, value] of Object.entries(feeds)) this._write(e.inputs[name], value, m.inputs[name].layout);
    gl.bindBuffer(gl.ARRAY_BUFFER, this._vbo);
    gl.vertexAttribPointer(0, 2, gl.FLOAT, false, 0, 0);
    gl.enableVertexAttribArray(0);
    for (const d of e.draws) this._draw(d);
    gl.disable(gl.BLEND);
    gl.bindFramebuffer(gl.FRAMEBUFFER, null);
    const result = this._readMany(names.map((n) => ({ refs: e.outputs[n].textures, layout: e.outputs[n].layout })));
    for (const name of e.updates ?? []) this.parity[name] ^= 1;
    if (!this._checkedEntries.has(entry)) {
      this._checkedEntries.add(entry);
      const err = gl.getError();
      if (err !== gl.NO_ERROR) throw this._lostOr(new GlcompError(`WebGL error 0x${err.toString(16)} while running ${entry}`));
    }
    return result.then((arrays) => Object.fromEntries(names.map((n, i) => [n, arrays[i]])));
  }

  _draw(d) {
    const gl = this.gl;
    const { prog, loc } = this.programs.get(d.program);
    gl.useProgram(prog);
    let unit = 0;
    for (const [sampler, ref] of Object.entries(d.samplers)) {
      gl.activeTexture(gl.TEXTURE0 + unit);
      gl.bindTexture(gl.TEXTURE_2D, this._texture(ref));
      if (loc[sampler]) gl.uniform1i(loc[sampler], unit);
      unit++;
    }
    for (const [uniform, src] of Object.entries(d.uniforms)) {
      if (!loc[uniform]) continue;
      if ("int" in src) gl.uniform1i(loc[uniform], src.int);
      else gl.uniform1f(loc[uniform], this.hyper[src.hyper]);
    }
    if (loc.u_page_offset) gl.uniform1i(loc.u_page_offset, d.page_offset);
    gl.bindFramebuffer(gl.FRAMEBUFFER, this._framebuffer(d.targets));
    gl.viewport(0, 0, d.viewport[0], d.viewport[1]);
    if (d.blend) {
      gl.enable(gl.BLEND);
      gl.blendFunc(gl.ONE, gl.ONE);
    } else {
      gl.disable(gl.BLEND);
    }
    gl.drawArrays(gl.TRIANGLES, 0, 3);
    this.drawCalls++;
  }

  _tensor(entry, name, data) {
    return { shape: [...this.manifest.entries[entry].outputs[name].layout.shape], dtype: "float32", data };
  }

  // -- the runtime interface -------------------------------------------------------------------
  /** Run `predict`: the model's output as {shape, dtype, data} (or {name: tensor} for several). */
  async predict(inputs) {
    const out = await this._run("predict", inputs);
    const names = Object.keys(out);
    if (names.length === 1 && names[0] === "output") return this._tensor("predict", "output", out.output);
    return Object.fromEntries(names.map((n) => [n, this._tensor("predict", n, out[n])]));
  }

  /** Loss and parameter gradients (train mode, no update): {loss, "<param>": tensor, ...}. */
  async gradients(inputs) {
    const out = await this._run("gradients", inputs);
    const res = {};
    for (const [k, v] of Object.entries(out)) {
      if (k.startsWith("grad:")) res[k.slice(5)] = this._tensor("gradients", k, v);
      else if (k === "loss") res.loss = v[0];
    }
    return res;
  }

  /** One optimizer step; resolves to the loss (read back asynchronously on WebGL 2). */
  trainStep(inputs) {
    if (!Object.hasOwn(this.manifest.entries.train_step?.outputs ?? {}, "loss")) {
      return Promise.reject(new GlcompError("train_step: not in this bundle (compile with a loss and an optimizer)"));
    }
    let result;
    try {
      result = this._run("train_step", inputs, ["loss"]);
    } catch (err) {
      return Promise.reject(err);
    }
    for (const name of Object.keys(this.counters)) this.counters[name] += 1;
    this.steps++;
    return result.then((out) => out.loss[0]);
  }

  /** Train `steps` steps on `batches` (an array of input objects, used in turn, or a function
   *  step -> inputs). Yields to the event loop between steps; keeps up to `inflight` steps
   *  queued on the GPU before waiting for a loss. `onStep(step, loss)` may return false to
   *  stop. `yieldTo`: "task" (default; a zero-delay task) or "frame" (requestAnimationFrame).
   *  `keepEvery` (default: the `keepWeightsEvery` load option, 100): read the whole state back
   *  (snapshot()) whenever that many steps have run since the last one, and when training ends.
   *  When the WebGL context is lost, train stops and rejects with a GlcompError whose `reason` is
   *  "context-lost" and whose `losses` are the losses read before the loss. */
  async train({ steps, batches, onStep, inflight = 2, yieldTo = "task", keepEvery = this._keepEvery } = {}) {
    const get = typeof batches === "function" ? batches : (i) => batches[i % batches.length];
    if (steps === undefined && Array.isArray(batches)) steps = batches.length;
    if (!isInt(steps) || steps < 0) throw new GlcompError("train: steps must be a non-negative integer");
    if (typeof batches !== "function" && (!Array.isArray(batches) || !batches.length)) {
      throw new GlcompError("train: batches must be a non-empty array of inputs or a function step -> inputs");
    }
    const depth = Math.max(1, inflight | 0);
    const losses = [];
    const queue = [];
    let stop = false;
    const settle = async () => {
      const loss = await queue.shift();
      losses.push(loss);
      if (onStep && (await onStep(losses.length - 1, loss)) === false) stop = true;
    };
    const keep = async (force) => {
      if (keepEvery > 0 && this.steps - this._kept.steps >= (force ? 1 : keepEvery)) await this.snapshot();
    };
    try {
      for (let i = 0; i < steps && !stop; i++) {
        const step = this.trainStep(get(i));
        step.catch(() => {}); // settle() sees the failure; the page must not report it as unhandled
        queue.push(step);
        if (queue.length >= depth) await settle();
        await keep(false);
        await (yieldTo === "frame" ? nextFrame() : nextTask());
      }
      while (queue.length) await settle();
      await keep(true);
    } catch (err) {
      if (!this._lost && !this.gl?.isContextLost()) throw err;
      const lost = this._lostError();
      lost.message = `training stopped: ${lost.message}`;
      lost.losses = losses;
      throw lost;
    } finally {
      for (const p of queue) p.catch(() => {});
    }
    return losses;
  }

  // -- context loss ----------------------------------------------------------------------------
  /** Whether the WebGL context is lost (until restore()). */
  get contextLost() {
    return this._lost || !!this.gl?.isContextLost();
  }

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
    const weights = {};
    for (const [n, st] of Object.entries(this.manifest.states)) weights[n] = this._readSync(this._stateRefs(n), st.layout);
    this._kept = { steps: this.steps, counters: { ...this.counters }, weights };
  }

  /** After the canvas fired `webglcontextrestored`: check the device again, rebuild every GL
   *  object (textures, framebuffers, programs, buffers) and upload the kept state (see
   *  snapshot()): weights, optimizer state and counters as they were at step `keptSteps`; the
   *  steps run after it are lost (`steps` goes back to `keptSteps`). The learning rate and the
   *  other hyper-parameters live in JavaScript and stay as they are. */
  async restore() {
    if (this._disposed) throw new GlcompError("the runtime was disposed");
    const gl = this.gl;
    if (gl.isContextLost()) {
      throw new GlcompError("restore: the WebGL context is still lost; call restore() after webglcontextrestored");
    }
    if (!this._lost) return; // nothing was lost
    // the old objects died with the context: forget them without deleting
    this._live.clear();
    for (const k of KINDS) this._liveCount[k] = 0;
    this.textures.clear();
    this.programs.clear();
    this._fbos.clear();
    this._readFbos.clear();
    this._checkedEntries.clear();
    for (const k of Object.keys(this.parity)) this.parity[k] = 0;
    this._checkDevice();
    const kept = this._kept;
    try {
      await this._setup(kept.weights);
    } catch (err) {
      throw this._lostOr(err);
    }
    if (gl.isContextLost()) throw this._lostError();
    this.counters = { ...kept.counters };
    this.steps = kept.steps;
    this._lost = false;
  }

  setLr(lr) {
    if (typeof lr !== "number" || !Number.isFinite(lr)) throw new GlcompError(`setLr: expected a finite number, got ${repr(lr)}`);
    this.hyper.lr = lr;
  }

  /** Parameters, float buffers and counters, read back now: {name: {shape, dtype, data}}. */
  getWeights({ optimizer = false } = {}) {
    this._alive();
    const out = {};
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
    const shapes = {};
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
    const values = {};
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

  /** The weights as a safetensors file (float32 tensors, int64 counters). With `optimizer`,
   *  optimizer state too: a complete weights.safetensors for the bundle. */
  exportSafetensors({ optimizer = false } = {}) {
    const w = this.getWeights({ optimizer });
    const tensors = {};
    for (const [k, t] of Object.entries(w)) tensors[k] = { dtype: t.dtype === "int64" ? "I64" : "F32", shape: t.shape, data: t.data };
    return writeSafetensors(tensors);
  }

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

  /** Delete every GL object this runtime created. Pending readbacks reject. */
  dispose() {
    if (this._disposed) return;
    this._disposed = true;
    const gl = this.gl;
    if (gl) {
      for (const obj of [...this._live]) {
        const kind = obj.__glcompKind;
        if (kind === "textures") gl.deleteTexture(obj);
        else if (kind === "framebuffers") gl.deleteFramebuffer(obj);
        else if (kind === "programs") gl.deleteProgram(obj);
        else if (kind === "shaders") gl.deleteShader(obj);
        else if (kind === "buffers") gl.deleteBuffer(obj);
        else if (kind === "syncs") gl.deleteSync(obj);
        this._untrack(obj);
      }
      this.canvas?.removeEventListener?.("webglcontextlost", this._onLost);
      if (this._ownCanvas && this.options.loseContext !== false) gl.getExtension("WEBGL_lose_context")?.loseContext();
    }
    this.textures.clear();
    this.programs.clear();
    this._fbos.clear();
    this._readFbos.clear();
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
