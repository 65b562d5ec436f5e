// The bundle manifest: its validation (the schema in manifest_schema.js, generated from
// glcomp/format/manifest.schema.json, plus the cross-checks a schema cannot express), exactly as
// glcomp/format/manifest.py: both loaders accept and reject the same bundles
// (tests/format/test_manifest_schema.py). Shaders' loops: shaders.js.
import SCHEMA from "./manifest_schema.js";
import { Validator, short } from "./jsonschema.js";
import { GlcompError, prod } from "../util.js";

export const FORMAT = "glcomp-bundle";
// 2 adds `files` (sha256 of each file) and program.json; 3 keeps every shader in one file,
// shaders.json ({shader file name: GLSL source}), where 1 and 2 have one file each under shaders/;
// 4 is 3 with every file but manifest.json stored under a name carrying its sha256 (storedName).
export const VERSIONS = [1, 2, 3, 4];
export const MAX_SIDE = 1 << 16;
// Resource limits, the same as glcomp/format/manifest.py's (both loaders accept the same bundles).
export const DEFAULT_TEXTURE_BUDGET = 2 * 2 ** 30; // bytes of textures a bundle may declare
// Texel formats a manifest texture may name in "format" (absent: "f32"), and their sizes in bytes.
// "rgba8": a logical texel (4 floats) is 4 RGBA8 texels side by side holding the float32s' bytes
// (little-endian): the GL texture is 4x the record's width (see texelSpan).
export const TEXEL_BYTES = { f32: 16, f16: 8, rgba8: 16 };
export const EXACT_FORMATS = ["f32", "rgba8"]; // formats holding float32 exactly (states, entry inputs)
/** A (validated) texture record's texel format: "f32" (RGBA32F), "f16" (RGBA16F) or "rgba8"
 *  (float32 bytes in RGBA8 texels, 4 GL texels per logical texel). */
export function textureFormat(tex) {
  return tex.format === undefined ? "f32" : tex.format;
}
/** GL texels per logical texel along x: 4 for an "rgba8" texture record, else 1. */
export function texelSpan(tex) {
  return textureFormat(tex) === "rgba8" ? 4 : 1;
}
export const DEFAULT_LOOP_BUDGET = 2 ** 32; // loop iterations one draw may run
export const DEFAULT_ENTRY_BUDGET = 2 ** 36; // fragments x max(1, loop iterations), summed over an entry's draws
const WEIGHTS_FILE = "weights.safetensors";
export const SHADERS_FILE = "shaders.json";

const STORED_DIGITS = 16; // hex digits of a file's sha256 in its stored name (format 4)

/** The name under which the file `path` (a key of the manifest's `files`) is stored in a bundle
 *  of format `version` whose manifest records the sha256 `digest` for it (manifest.py
 *  stored_name): from version 4 on, `weights.0123456789abcdef.safetensors` (the digest's first 16
 *  hex digits before the extension), for other versions `path` itself; null where a name of
 *  version 4 cannot be formed (the manifest is refused for that digest). */
export function storedName(version, path, digest) {
  if (version !== 4) return path; // a version this module knows
  if (typeof digest !== "string" || !/^[0-9a-f]{64}$/.test(digest)) return null;
  const dot = path.lastIndexOf(".");
  return `${path.slice(0, dot)}.${digest.slice(0, STORED_DIGITS)}${path.slice(dot)}`;
}

/** Whether a bundle of format `version` keeps its shaders in shaders.json (version 3 on). */
export function packedShaders(version) {
  return Number.isInteger(version) && version >= 3;
}

/** Where the shader `name` of a bundle of format `version` is, as errors name it (manifest.py
 *  shader_path): `shaders.json[name]` from version 3 on, the file `shaders/name` before. */
export function shaderPath(version, name) {
  return packedShaders(version) ? `${SHADERS_FILE}[${name}]` : `shaders/${name}`;
}

let validator = null;
const pow2 = (v) => v >= 1 && (v & (v - 1)) === 0;
const sameList = (a, b) => a.length === b.length && a.every((x, i) => x === b[i]);

class Check {
  need(cond, msg) { if (!cond) throw new GlcompError(`bundle manifest.json: ${msg}`); }
}

/** Cross-checks of a layout the schema has validated (manifest.py check_layout). */
function checkLayout(c, lay, field, shape) {
  if (shape !== undefined) c.need(sameList(shape, lay.shape), `${field}.shape ${short(lay.shape)} != ${short(shape)}`);
  const s = lay.shape;
  const rows = s.length ? prod(s.slice(0, -1)) : 1;
  const rowLen = s.length ? s[s.length - 1] : 1;
  c.need(lay.rows === rows && lay.row_len === rowLen, `${field} rows/row_len disagree with shape`);
  c.need(lay.row_texels === Math.max(1, Math.ceil(rowLen / 4)), `${field}.row_texels is wrong`);
  c.need(lay.texels === Math.max(1, rows * lay.row_texels), `${field}.texels is wrong`);
  for (const side of ["width", "height"]) c.need(pow2(lay[side]), `${field}.${side} must be a power of two <= ${MAX_SIDE}`);
  c.need(lay.width * lay.height * lay.pages >= lay.texels, `${field} pages too small`);
}

/** Throw GlcompError for anything in a manifest that does not fit the schema (manifest.py
 *  validate_manifest: the format and version, the structure by manifest.schema.json, then
 *  references, layouts, formats and the texture and loop budgets). `shaderNames`: the shader
 *  files present; `options`: {textureBudgetBytes, loopBudget, entryBudget}. */
export function validateManifest(m, shaderNames, options = {}) {
  const names = new Set(shaderNames);
  const textureBudget = options.textureBudgetBytes ?? DEFAULT_TEXTURE_BUDGET;
  const loopBudget = options.loopBudget ?? DEFAULT_LOOP_BUDGET;
  const entryBudget = options.entryBudget ?? DEFAULT_ENTRY_BUDGET;
  const c = new Check();
  c.need(m !== null && typeof m === "object" && !Array.isArray(m), "manifest must be an object");
  c.need(m.format === FORMAT, `format must be '${FORMAT}', got ${short(m.format)}`);
  c.need(VERSIONS.includes(m.version), `unknown format version ${short(m.version)} (supported: (${VERSIONS.join(", ")}))`);
  validator ??= new Validator(SCHEMA, "manifest.json");
  validator.validate(m);

  const maxSize = m.target.max_texture_size;
  const textures = m.textures;
  let total = 0;
  for (const [name, tex] of Object.entries(textures)) {
    for (const side of ["width", "height"]) {
      const v = tex[side];
      c.need(pow2(v), `textures.${name}.${side} must be a power of two`);
      c.need(v <= maxSize, `textures.${name}.${side} ${v} exceeds target.max_texture_size ${maxSize}`);
    }
    c.need(texelSpan(tex) * tex.width <= maxSize, `textures.${name}: an rgba8 texture is 4x its width wide, more than ${maxSize}`);
    total += TEXEL_BYTES[textureFormat(tex)] * tex.width * tex.height;
  }
  // rgba8 storage is all or nothing: its shaders decode every texture they read from bytes.
  const stateFormat = Object.values(textures).some((t) => textureFormat(t) === "rgba8") ? "rgba8" : "f32";
  c.need(stateFormat === "f32" || Object.values(textures).every((t) => textureFormat(t) === "rgba8"),
    "textures: either every texture is rgba8 or none is");
  c.need(total <= textureBudget, `the textures take ${total} bytes, more than the budget of ${textureBudget} bytes`);
  const used = new Set();

  const states = m.states;
  const owner = new Map(); // texture -> state owning it
  for (const [name, st] of Object.entries(states)) {
    const lay = st.layout;
    checkLayout(c, lay, `states.${name}.layout`);
    for (const group of st.textures) {
      c.need(group.length === lay.pages, `states.${name}.textures: one texture per page expected`);
      for (const t of group) {
        c.need(Object.hasOwn(textures, t), `states.${name} refers to unknown texture ${short(t)}`);
        const tex = textures[t];
        c.need(tex.width === lay.width && tex.height === lay.height, `states.${name}: texture ${short(t)} has the wrong size`);
        c.need(EXACT_FORMATS.includes(textureFormat(tex)),
          `states.${name}: texture ${short(t)} must be f32 or rgba8 (states are kept in float32)`);
        c.need(!owner.has(t), `states.${name}: texture ${short(t)} is used twice by the state texture sets`);
        owner.set(t, name);
      }
    }
  }
  for (const t of owner.keys()) used.add(t);
  const inputs = m.inputs;
  for (const [name, spec] of Object.entries(inputs)) checkLayout(c, spec.layout, `inputs.${name}.layout`, spec.shape);
  const hyper = m.hyper;
  for (const name of Object.keys(m.counters)) c.need(!Object.hasOwn(states, name), `counters.${name} has the name of a state`);
  c.need(names.has(m.vertex_shader), `vertex shader ${short(m.vertex_shader)} is missing`);
  const programs = m.programs;
  for (const [pid, prog] of Object.entries(programs)) {
    c.need(names.has(prog.fragment), `programs.${pid}: shader ${short(prog.fragment)} is missing`);
    const all = [...prog.samplers, ...prog.uniforms];
    c.need(new Set(all).size === all.length, `programs.${pid}: a uniform name appears twice`);
  }

  const checkRef = (ref, field) => {
    if (typeof ref === "string") {
      c.need(Object.hasOwn(textures, ref), `${field} refers to unknown texture ${short(ref)}`);
      // Which set of a state is current flips every update: only a state reference says.
      c.need(!owner.has(ref), `${field} names state texture ${short(ref)} directly`);
      used.add(ref);
      return [textures[ref].width, textures[ref].height];
    }
    c.need(Object.hasOwn(states, ref.state), `${field} refers to unknown state ${short(ref.state)}`);
    const lay = states[ref.state].layout;
    c.need(ref.page < lay.pages, `${field}.page ${ref.page} is beyond the state's ${lay.pages} pages`);
    return [lay.width, lay.height];
  };
  const refKey = (r) => (typeof r === "string" ? JSON.stringify(r) : JSON.stringify([r.page, r.state, r.version]));

  for (const [entry, e] of Object.entries(m.entries)) {
    for (const [name, refs] of Object.entries(e.inputs)) {
      c.need(Object.hasOwn(inputs, name), `entries.${entry}: unknown input ${short(name)}`);
      const lay = inputs[name].layout;
      c.need(refs.length === lay.pages, `entries.${entry}.inputs.${name}: one texture per page expected`);
      for (const r of refs) {
        const [w, h] = checkRef(r, `entries.${entry}.inputs.${name}`);
        c.need(w === lay.width && h === lay.height, `entries.${entry}.inputs.${name}: a texture's size is not (${lay.width}, ${lay.height})`);
        c.need(typeof r !== "string" || EXACT_FORMATS.includes(textureFormat(textures[r])),
          `entries.${entry}.inputs.${name}: input texture ${short(r)} must be f32 or rgba8`);
      }
    }
    for (const [name, out] of Object.entries(e.outputs)) {
      const lay = out.layout;
      checkLayout(c, lay, `entries.${entry}.outputs.${name}.layout`);
      c.need(out.textures.length === lay.pages, `entries.${entry}.outputs.${name}: one texture per page expected`);
      for (const r of out.textures) {
        const [w, h] = checkRef(r, `entries.${entry}.outputs.${name}`);
        c.need(w === lay.width && h === lay.height, `entries.${entry}.outputs.${name}: a texture's size is not (${lay.width}, ${lay.height})`);
      }
    }
    for (const name of e.updates ?? []) {
      c.need(Object.hasOwn(states, name), `entries.${entry}.updates: unknown state ${short(name)}`);
    }
    let entryWork = 0;
    e.draws.forEach((d, i) => {
      const field = `entries.${entry}.draws[${i}]`;
      c.need(Object.hasOwn(programs, d.program), `${field} refers to unknown program ${short(d.program)}`);
      const prog = programs[d.program];
      const { samplers, uniforms, targets, viewport: vp } = d;
      c.need(sameList(Object.keys(samplers).sort(), [...prog.samplers].sort()), `${field}: samplers do not match the program`);
      for (const [s, r] of Object.entries(samplers)) checkRef(r, `${field}.samplers.${s}`);
      c.need(sameList(Object.keys(uniforms).sort(), [...prog.uniforms].sort()), `${field}: uniforms do not match the program`);
      for (const [u, src] of Object.entries(uniforms)) {
        c.need(src.hyper === undefined || Object.hasOwn(hyper, src.hyper),
          `${field}.uniforms.${u} must name a hyper-parameter, got ${short(src.hyper ?? null)}`);
      }
      c.need(targets.length === prog.outputs, `${field}: one target per program output expected`);
      const sizes = new Set(targets.map((r) => checkRef(r, `${field}.targets`).join("x")));
      const formats = new Set(targets.map((r) => (typeof r === "string" ? textureFormat(textures[r]) : stateFormat)));
      c.need(formats.size === 1, `${field}: render targets must all have one format, got ${short([...formats].sort())}`);
      c.need(sizes.size === 1 && sizes.has(vp.join("x")), `${field}: render targets must all match the viewport size`);
      const read = new Set(Object.values(samplers).map(refKey));
      c.need(!targets.some((r) => read.has(refKey(r))), `${field} samples a texture it renders to`);
      c.need(new Set(targets.map(refKey)).size === targets.length, `${field} renders to one texture twice`);
      const rgba8 = formats.size === 1 && formats.has("rgba8");
      c.need(!((d.blend ?? false) && rgba8), `${field}: rgba8 render targets cannot be blended`);
      const work = prog.loop_iterations * vp[0] * (rgba8 ? 4 : 1) * vp[1]; // rgba8: 4 fragments a texel
      c.need(work <= loopBudget, `${field} may run ${work} loop iterations (${prog.loop_iterations} per fragment), `
        + `more than the budget of ${loopBudget} per draw`);
      entryWork += Math.max(1, prog.loop_iterations) * vp[0] * (rgba8 ? 4 : 1) * vp[1];
    });
    c.need(entryWork <= entryBudget, `entries.${entry}: its ${e.draws.length} draws may run ${entryWork} fragments and loop `
      + `iterations, more than the budget of ${entryBudget} per entry`);
  }
  const unused = Object.keys(textures).filter((t) => !used.has(t)).sort();
  c.need(!unused.length, `textures ${short(unused)} are used by no state, input, output or draw`);
  if (m.version >= 2 || "files" in m) {
    c.need("files" in m, "files must be an object of sha256 digests (format version 2 has one per file)");
    const files = m.files;
    let paths;
    if (packedShaders(m.version)) {
      paths = [WEIGHTS_FILE, SHADERS_FILE];
      for (const path of Object.keys(files).sort()) {
        c.need(!path.startsWith("shaders/"),
          `files: ${path} is not a file of format version 3 (${SHADERS_FILE} holds every shader)`);
      }
    } else {
      const wanted = new Set([m.vertex_shader, ...Object.values(programs).map((p) => p.fragment)]);
      paths = [WEIGHTS_FILE, ...[...wanted].sort().map((n) => `shaders/${n}`)];
      c.need(!Object.hasOwn(files, SHADERS_FILE), `files: ${SHADERS_FILE} is a file of format version 3, not ${m.version}`);
    }
    for (const path of paths) c.need(Object.hasOwn(files, path), `files: no sha256 for ${path}`);
  }
}
