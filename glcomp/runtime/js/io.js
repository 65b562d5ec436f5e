// Bundle I/O for the browser runtime: sha256, checking inputs, and loading a bundle (from URLs or
// files) with the same checks as glcomp/format/store.py's reading. The format itself (manifest,
// schema, shaders, parsing, packing) is in format/, one module per glcomp/format module.
import { SHADERS_FILE, packedShaders, storedName, validateManifest } from "./format/manifest.js";
import { MAX_JSON_BYTES, parseJson, parseSafetensors, toArrayBuffer } from "./format/parse.js";
import { checkShaders, unpackShaders } from "./format/shaders.js";
import { GlcompError, fmtList, fmtShape, isObj, prod, repr, sameList, sortedKeys } from "./util.js";

const PROGRAM_FILE = "program.json";
const WEIGHTS_FILE = "weights.safetensors";
// The stored names of format 4 (manifest.js storedName): files of a picked bundle folder.
const STORED_RE = /^(?:weights\.[0-9a-f]{16}\.safetensors|(?:shaders|program)\.[0-9a-f]{16}\.json)$/;
const READ_ATTEMPTS = 5; // loads from a URL whose manifest.json a save replaced meanwhile
const SHADER_RE = /^[A-Za-z0-9_]{1,64}\.(frag|vert)$/;
const MAX_PROGRAMS = 4096;
const STATE_DTYPES = ["F32", "F64"];
const COUNTER_DTYPES = ["I32", "I64"];


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

// -- inputs (glcomp/runtime/feeds.py) ----------------------------------------------------------
export function nestedShape(v, name) {
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
    let hint = "";
    if (given.length === shape.length && given.length && sameList(given.slice(1), shape.slice(1)) && given[0] < shape[0]) {
      hint = `: a batch of ${given[0]} where the program was compiled for ${shape[0]} (the last, ` +
        "partial batch of a DataLoader?); programs have fixed shapes, so pass drop_last=True " +
        "to the DataLoader, or compile a second program for the remainder's batch size";
    }
    throw new GlcompError(`input ${repr(name)} expected shape ${fmtShape(shape)} but got ${fmtShape(given)}${hint}`);
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
  const out = Object.create(null);
  for (const [name, spec] of Object.entries(specs)) out[name] = checkInput(name, spec, given[name]);
  return out;
}

// -- loading a bundle --------------------------------------------------------------------------
/** The most bytes the weights file of the validated `manifest` may hold (schema.py weights_limit). */
export function weightsLimit(manifest) {
  let elements = Object.keys(manifest.counters).length;
  for (const st of Object.values(manifest.states)) elements += prod(st.layout.shape);
  return 8 + MAX_JSON_BYTES + 8 * elements;
}

/** The weights cap of a manifest not yet validated (the weights are fetched while it is): the
 *  validated manifest's weightsLimit, the same number; where it cannot be computed the manifest
 *  is refused anyway, and the weights are held to the size of a bare header. */
function weightsCap(manifest) {
  let limit = NaN;
  try {
    limit = weightsLimit(manifest);
  } catch {
    // a malformed manifest: validateManifest reports it
  }
  return Number.isSafeInteger(limit) ? limit : 8 + MAX_JSON_BYTES;
}

/** A fetched file's bytes, refused (GlcompError naming `what`, as read_bundle words it) once they
 *  exceed `limit`: by its Content-Length before any byte is read, else while it streams, so a
 *  file far beyond the manifest's states is never held whole (nor waited for to its end). */
async function readCapped(res, limit, what) {
  const tooBig = () => new GlcompError(`bundle ${what}: larger than ${limit} bytes`);
  const declared = Number(res.headers.get("content-length") ?? NaN);
  if (Number.isFinite(declared) && declared > limit) {
    res.body?.cancel().catch(() => {});
    throw tooBig();
  }
  if (!res.body) {
    const buf = await res.arrayBuffer();
    if (buf.byteLength > limit) throw tooBig();
    return buf;
  }
  const reader = res.body.getReader();
  const chunks = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > limit) {
      reader.cancel().catch(() => {});
      throw tooBig();
    }
    chunks.push(value);
  }
  const out = new Uint8Array(size);
  let at = 0;
  for (const chunk of chunks) {
    out.set(chunk, at);
    at += chunk.byteLength;
  }
  return out.buffer;
}

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

/** Files given directly: {"manifest.json": File|ArrayBuffer|string|object, "weights.0123456789abcdef.safetensors":
 *  ..., "shaders.0123456789abcdef.json": ...} (format 4, the names its manifest gives them;
 *  "weights.safetensors", "shaders.json" for format 3, "shaders/p0.frag": ... for formats 1 and 2)
 *  or an array / FileList of File objects (a picked bundle folder). */
function fileMap(source) {
  const map = new Map();
  const add = (path, value) => {
    const parts = String(path).split(/[\\/]/).filter((p) => p);
    const base = parts[parts.length - 1];
    if (!base) return;
    if (base === "manifest.json" || base === WEIGHTS_FILE || base === PROGRAM_FILE || base === SHADERS_FILE
      || STORED_RE.test(base)) {
      map.set(base, value);
    }
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

/** Fetch `url` (`what` names it in errors) from one of `origins` (null: any); null for a missing
 *  `optional` file, GlcompError otherwise. */
export async function fetchFile(url, what, optional, origins, revalidate = false) {
  let res;
  try {
    // `revalidate`: not from the HTTP cache unchecked (a manifest.json read again after a save).
    res = await fetch(url, revalidate ? { credentials: "same-origin", cache: "no-cache" } : { credentials: "same-origin" });
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
export function allowedOrigins(allow) {
  if (allow === true) return null;
  const own = typeof location !== "undefined" && location.origin && location.origin !== "null" ? [location.origin] : [];
  if (allow !== undefined && !(Array.isArray(allow) && allow.every((o) => typeof o === "string"))) {
    throw new GlcompError("allowOrigins must be an array of origins (\"https://host:port\") or true");
  }
  return [...own, ...(allow || []).map((o) => new URL(o).origin)];
}

/** Load and validate a bundle: {manifest, shaders, weights, counters}. Nothing is run.
 *  Accepts and rejects exactly what glcomp/codegen/schema.py read_bundle does. Options:
 *  `textureBudgetBytes` (default 2 GiB), `loopBudget` (loop iterations per draw, default
 *  2**32) and `entryBudget` (fragments x loop iterations summed over an entry's draws, default
 *  2**36) bound what the bundle may ask of the GPU; a URL must be of this page's origin unless
 *  `allowOrigins` lists its origin (or is true). Files are checked against the manifest's sha256.
 *  A load from a URL that fails because a save replaced the bundle meanwhile (a file its
 *  manifest.json names is gone or another save's, and manifest.json has changed since) loads
 *  again, from the new manifest.json. */
export async function loadBundle(source, options = {}) {
  const url = typeof source === "string" || (typeof URL !== "undefined" && source instanceof URL);
  let fresh = null; // the manifest.json read again after a failed attempt
  for (let attempt = 0; ; attempt++) {
    const seen = {};
    try {
      return await loadOnce(source, options, seen, fresh);
    } catch (err) {
      if (!url || !(err instanceof GlcompError) || seen.manifest === undefined || attempt + 1 >= READ_ATTEMPTS) throw err;
      try {
        const res = await fetchFile(seen.manifestUrl, "manifest.json", false, seen.origins, true);
        fresh = await res.arrayBuffer();
      } catch {
        throw err;
      }
      const [now, before] = [new Uint8Array(fresh), new Uint8Array(seen.manifest)];
      if (now.length === before.length && now.every((v, i) => v === before[i])) throw err; // not a save's doing
    }
  }
}

async function loadOnce(source, options, seen, fresh) {
  let manifestBytes;
  let weightsBuf;
  const shaders = {};
  let getShader;
  let packedBuf;
  let programBuf;
  // Where a file the manifest names is stored (format 4: under a name carrying its sha256),
  // and how errors name it; null where the manifest names none (it is refused for that).
  let manifest;
  const stored = (path) => storedName(isObj(manifest) ? manifest.version : undefined, path,
    isObj(manifest) && isObj(manifest.files) ? manifest.files[path] : undefined);
  const label = (path) => (stored(path) === path ? path : `${path} (${stored(path)})`);
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
    seen.manifestUrl = new URL("manifest.json", base);
    seen.origins = origins;
    manifestBytes = fresh ?? await (await fetchFile(seen.manifestUrl, "manifest.json", false, origins)).arrayBuffer();
    seen.manifest = manifestBytes;
    getShader = async (name) => {
      const res = await fetchFile(new URL(`shaders/${name}`, base), `shaders/${name}`, true, origins);
      return res ? decodeUtf8(await res.arrayBuffer(), `shaders/${name}`) : null;
    };
    const fetchStored = async (path, optional, limit = null) => {
      const res = await fetchFile(new URL(stored(path), base), label(path), optional, origins);
      if (!res) return null;
      return limit === null ? res.arrayBuffer() : readCapped(res, limit, path);
    };
    packedBuf = () => fetchStored(SHADERS_FILE, false);
    // The weights are capped by the manifest's states as they arrive (see readCapped).
    weightsBuf = () => fetchStored(WEIGHTS_FILE, false, weightsCap(manifest));
    programBuf = () => fetchStored(PROGRAM_FILE, true);
  } else if (source && typeof source === "object") {
    const map = fileMap(source);
    if (!map.has("manifest.json")) throw new GlcompError("bundle: manifest.json is missing");
    const mv = map.get("manifest.json");
    manifestBytes = isObj(mv) && !(typeof Blob !== "undefined" && mv instanceof Blob)
      ? new TextEncoder().encode(JSON.stringify(mv)) : await readAsBuffer(mv);
    getShader = async (name) => (map.has(`shaders/${name}`) ? readAsText(map.get(`shaders/${name}`), `shaders/${name}`) : null);
    packedBuf = async () => {
      if (!map.has(stored(SHADERS_FILE))) throw new GlcompError(`bundle: ${label(SHADERS_FILE)} is missing`);
      return readAsBuffer(map.get(stored(SHADERS_FILE)));
    };
    weightsBuf = async () => readAsBuffer(map.get(stored(WEIGHTS_FILE)));
    programBuf = async () => (map.has(stored(PROGRAM_FILE)) ? readAsBuffer(map.get(stored(PROGRAM_FILE))) : null);
    manifest = parseJson(manifestBytes, "manifest.json");
    // The weights must be there (read once the manifest bounds their size), if it names them.
    if (stored(WEIGHTS_FILE) !== null && !map.has(stored(WEIGHTS_FILE))) {
      throw new GlcompError(`bundle: ${label(WEIGHTS_FILE)} is missing`);
    }
  } else {
    throw new GlcompError("Runtime.load: pass a bundle base URL, or an object / array of its files");
  }
  if (manifest === undefined) manifest = parseJson(manifestBytes, "manifest.json");
  let packedBytes = null; // format 3 on: the bytes of shaders.json
  // The weights and the IR graphs are fetched while the shaders are (and checked in the order
  // below): a load waits for the slowest file, not for their sum. A settled early fetch whose
  // result is never awaited (a bad manifest) is not reported as an unhandled rejection.
  const early = (get) => {
    const promise = get();
    promise.catch(() => {});
    return () => promise;
  };
  weightsBuf = stored(WEIGHTS_FILE) === null ? null : early(weightsBuf);
  if (isObj(manifest) && isObj(manifest.files) && Object.hasOwn(manifest.files, PROGRAM_FILE) && stored(PROGRAM_FILE) !== null) {
    programBuf = early(programBuf);
  }
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
    if (packedShaders(manifest.version)) {
      // Judged once the manifest is known to be valid (which it is not without a digest for it).
      if (stored(SHADERS_FILE) !== null) packedBytes = await packedBuf();
      for (const name of unique) shaders[name] = null;
    } else {
      const texts = await Promise.all(unique.map(getShader));
      unique.forEach((name, i) => { if (texts[i] !== null) shaders[name] = texts[i]; });
    }
  }
  validateManifest(manifest, Object.keys(shaders), options);
  if (packedShaders(manifest.version) && packedBytes === null) throw new GlcompError(`bundle: ${label(SHADERS_FILE)} is missing`);
  if (packedBytes !== null) {
    const wanted = [manifest.vertex_shader, ...Object.values(manifest.programs).map((p) => p.fragment)];
    Object.assign(shaders, unpackShaders(packedBytes, wanted));
  }
  checkShaders(manifest, shaders);
  if (weightsBuf === null) throw new GlcompError(`bundle: ${WEIGHTS_FILE} is missing`);
  const weightsBytes = await weightsBuf();
  const limit = weightsLimit(manifest);
  if (toArrayBuffer(weightsBytes).byteLength > limit) throw new GlcompError(`bundle weights.safetensors: larger than ${limit} bytes`);
  const tensors = parseSafetensors(weightsBytes);
  // Names from the bundle are keys: Maps and null-prototype objects only ("__proto__" is a name).
  const expected = new Map();
  for (const [k, st] of Object.entries(manifest.states)) expected.set(k, st.layout.shape);
  for (const k of Object.keys(manifest.counters)) expected.set(k, []);
  const missing = [...expected.keys()].filter((k) => !Object.hasOwn(tensors, k)).sort();
  const extra = Object.keys(tensors).filter((k) => !expected.has(k)).sort();
  if (missing.length || extra.length) {
    throw new GlcompError(`bundle weights.safetensors: missing ${fmtList(missing)}, unexpected ${fmtList(extra)}`);
  }
  const weights = Object.create(null);
  const counters = Object.create(null);
  for (const [k, shape] of expected) {
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
    // Plain loops and a native conversion: mapping every element through Number (and an Array
    // of them) took tens of ms per MB of weights at load.
    const data = t.data;
    const values = data instanceof BigInt64Array ? Float32Array.from(data, Number) : new Float32Array(data);
    let finite = true;
    for (let i = 0; i < data.length && finite; i++) finite = Number.isFinite(Number(data[i]));
    if (!finite) {
      throw new GlcompError(`bundle weights.safetensors: ${repr(k)} holds NaN or infinite values`);
    }
    // The runtimes compute in float32: a float64 beyond its range would be infinite there.
    for (let i = 0; i < values.length && finite && !isCounter; i++) finite = Number.isFinite(values[i]);
    if (!finite) throw new GlcompError(`bundle weights.safetensors: ${repr(k)} holds values beyond float32's range`);
    if (isCounter) counters[k] = Number(t.data[0]);
    else weights[k] = values;
  }
  let carried = []; // the inputs carried across batches (program.json's options.carry)
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
      if (bytes === null) throw new GlcompError(`bundle: ${label(PROGRAM_FILE)} is missing`);
      await check(PROGRAM_FILE, bytes);
      const program = parseJson(bytes, PROGRAM_FILE);
      if (!isObj(program)) throw new GlcompError(`bundle ${PROGRAM_FILE}: must be an object`);
      carried = carriedNames(program, manifest);
    }
    await check("weights.safetensors", weightsBytes);
    if (packedBytes !== null) await check(SHADERS_FILE, packedBytes);
    else for (const [name, text] of Object.entries(shaders)) await check(`shaders/${name}`, new TextEncoder().encode(text));
    delete manifest.files;
  }
  return { manifest, shaders, weights, counters, carried };
}


/** The inputs a bundle carries across batches (glcomp.compile's `carry=`): the keys of
 *  program.json's `options.carry`, as glcomp/runtime/feeds.py carried_names reads them, each a
 *  float buffer of the manifest (train_step, and predict with carry_predict, write it). */
function carriedNames(program, manifest) {
  const options = isObj(program.options) ? program.options : null;
  const carry = options && Object.hasOwn(options, "carry") ? options.carry : null;
  if (carry === null || carry === undefined) return [];
  if (!isObj(carry)) throw new GlcompError(`bundle ${PROGRAM_FILE}: options.carry must be an object of input name -> result`);
  const names = Object.keys(carry);
  for (const name of names) {
    const st = Object.hasOwn(manifest.states, name) ? manifest.states[name] : null;
    if (st === null || st.role !== "buffer") {
      throw new GlcompError(`bundle ${PROGRAM_FILE}: options.carry names ${repr(name)}, which is not a buffer of manifest.json`);
    }
  }
  return names;
}

/** Offer `bytes` to the user as a file named `filename` (a browser download). */
export function downloadBytes(bytes, filename) {
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([bytes], { type: "application/octet-stream" }));
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}
