// Variant sets: one model compiled several ways (storage f32 / f16 / rgba8, other targets), saved
// as variants.json plus one bundle per variant (see glcomp/variants.py). loadVariants probes the
// device, skips the variants whose requirements it does not meet, loads the first that fits and
// records on the runtime which variant it chose and why (rt.info().variant).
import { allowedOrigins, fetchFile } from "./io.js";
import { Runtime } from "./runtime.js";
import { GlcompError } from "./util.js";

const NAME_RE = /^[a-z0-9][a-z0-9_-]{0,31}$/;
const REQUIREMENT_KEYS = ["draw_buffers", "float_blend", "float_textures", "half_float_textures", "highp", "webgl"];

/** What a WebGL context offers, in the terms of a variant's `requires`. */
export function probeCapabilities(gl) {
  const webgl2 = typeof WebGL2RenderingContext !== "undefined" && gl instanceof WebGL2RenderingContext;
  const has = (name) => !!gl.getExtension(name);
  const high = gl.getShaderPrecisionFormat(gl.FRAGMENT_SHADER, gl.HIGH_FLOAT);
  const caps = { webgl: webgl2 ? 2 : 1, highp: !!high && high.precision >= 23, float_blend: has("EXT_float_blend") };
  if (webgl2) {
    caps.float_textures = caps.half_float_textures = has("EXT_color_buffer_float");
    caps.draw_buffers = Math.min(gl.getParameter(gl.MAX_DRAW_BUFFERS), gl.getParameter(gl.MAX_COLOR_ATTACHMENTS));
  } else {
    caps.float_textures = has("OES_texture_float") && (has("WEBGL_color_buffer_float") || has("EXT_color_buffer_float"));
    caps.half_float_textures = has("OES_texture_half_float") && has("EXT_color_buffer_half_float");
    const db = gl.getExtension("WEBGL_draw_buffers");
    caps.draw_buffers = db ? Math.min(gl.getParameter(db.MAX_DRAW_BUFFERS_WEBGL), gl.getParameter(db.MAX_COLOR_ATTACHMENTS_WEBGL)) : 1;
  }
  return caps;
}

/** The requirements in `requires` that `caps` (of a context of WebGL `caps.webgl`) does not meet. */
export function unmet(requires, caps) {
  const out = [];
  if (requires.highp && !caps.highp) out.push("32-bit highp floats in fragment shaders");
  if (requires.float_textures && !caps.float_textures) {
    out.push(caps.webgl === 2 ? "EXT_color_buffer_float (float render targets)"
      : "OES_texture_float and WEBGL_color_buffer_float (float render targets)");
  }
  if (requires.half_float_textures && !caps.half_float_textures) {
    out.push(caps.webgl === 2 ? "EXT_color_buffer_float (half-float render targets)"
      : "OES_texture_half_float and EXT_color_buffer_half_float (half-float render targets)");
  }
  if (requires.float_blend && !caps.float_blend) out.push("EXT_float_blend (blending into float textures)");
  if (requires.draw_buffers > caps.draw_buffers) {
    out.push(`${requires.draw_buffers} draw buffers per draw (this device has ${caps.draw_buffers})`);
  }
  return out;
}

/** Validate a parsed variants.json; returns its list of variants. */
export function validateIndex(index, where = "variants.json") {
  const fail = (msg) => { throw new GlcompError(`${where}: ${msg}`); };
  if (!index || typeof index !== "object" || index.format !== "glcomp-variants") fail("format must be 'glcomp-variants'");
  if (index.version !== 1) fail(`unknown version ${JSON.stringify(index.version)} (supported: 1)`);
  if (!Array.isArray(index.variants) || !index.variants.length) fail("variants must be a non-empty list");
  const seen = new Set();
  index.variants.forEach((v, i) => {
    if (!v || typeof v.name !== "string" || !NAME_RE.test(v.name) || seen.has(v.name)) {
      fail(`variants[${i}].name must be a new name matching ${NAME_RE.source}`);
    }
    seen.add(v.name);
    if (v.path !== v.name) fail(`variants[${i}].path must be the variant's name ${JSON.stringify(v.name)}`);
    const r = v.requires;
    const keys = r && typeof r === "object" ? Object.keys(r).sort() : [];
    if (keys.join() !== REQUIREMENT_KEYS.join()) fail(`variants[${i}].requires must have the keys ${REQUIREMENT_KEYS.join(", ")}`);
    if (r.webgl !== 1 && r.webgl !== 2) fail(`variants[${i}].requires.webgl must be 1 or 2`);
    if (!Number.isInteger(r.draw_buffers) || r.draw_buffers < 1) fail(`variants[${i}].requires.draw_buffers must be a positive integer`);
  });
  return index.variants;
}

function probeContext(webgl) {
  const canvas = typeof document !== "undefined" ? document.createElement("canvas") : new OffscreenCanvas(1, 1);
  return canvas.getContext(webgl === 2 ? "webgl2" : "webgl") || null;
}

/** Load the first variant of the variant set at `base` (a URL of this page's origin unless
 *  `allowOrigins` says otherwise) that this device supports, with `Runtime.load`'s options.
 *  `options.variant` forces one by name. The runtime's info().variant is
 *  `{name, storage, reason, skipped: [{name, reason}]}`. Throws GlcompError listing every
 *  variant and what the device lacks for it when none fits. */
export async function loadVariants(base, options = {}) {
  const here = typeof location !== "undefined" ? location.href : undefined;
  let root = String(base);
  if (!root.endsWith("/")) root += "/";
  root = new URL(root, here).href;
  const origins = allowedOrigins(options.allowOrigins);
  if (origins !== null && !origins.includes(new URL(root).origin)) {
    throw new GlcompError(`variants ${root}: refusing to load from ${new URL(root).origin}, another origin than this page's`);
  }
  const res = await fetchFile(new URL("variants.json", root), "variants.json", false, origins);
  let index;
  try {
    index = JSON.parse(await res.text());
  } catch (err) {
    throw new GlcompError(`variants.json: not JSON (${err.message})`);
  }
  const variants = validateIndex(index);
  const want = options.variant ?? null; // a variant forced by name, or null
  if (want !== null && !variants.some((v) => v.name === want)) {
    throw new GlcompError(`variants.json: no variant ${JSON.stringify(want)}; `
      + `there are ${variants.map((v) => v.name).join(", ")}`);
  }
  const caps = {};
  const skipped = [];
  for (const v of variants) {
    if (want !== null && v.name !== want) continue;
    const gl = caps[v.requires.webgl] === undefined ? probeContext(v.requires.webgl) : null;
    if (caps[v.requires.webgl] === undefined) {
      caps[v.requires.webgl] = gl ? probeCapabilities(gl) : null;
      gl?.getExtension("WEBGL_lose_context")?.loseContext();
    }
    const c = caps[v.requires.webgl];
    const lacks = c ? unmet(v.requires, c) : [`a WebGL ${v.requires.webgl} context`];
    if (lacks.length) {
      skipped.push({ name: v.name, reason: `lacks ${lacks.join("; ")}` });
      continue;
    }
    let rt;
    try {
      rt = await Runtime.load(new URL(`${v.path}/`, root), options);
    } catch (err) {
      if (err instanceof GlcompError && err.message.startsWith("this browser cannot run the bundle")) {
        skipped.push({ name: v.name, reason: err.message });
        continue;
      }
      throw err;
    }
    const reason = want !== null ? "forced by options.variant"
      : skipped.length ? `the first variant this device supports (${skipped.map((s) => s.name).join(", ")} not)`
        : "the first (preferred) variant, and this device supports it";
    rt.variant = { name: v.name, storage: v.storage, reason, skipped };
    return rt;
  }
  throw new GlcompError(`this browser can run none of the bundle's variants: ${skipped.map((s) => `${s.name}: ${s.reason}`).join("; ")}`);
}
