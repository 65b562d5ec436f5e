// Strict parsing of a bundle's untrusted bytes, as glcomp/format/parse.py: JSON (parse_json's
// limits) and safetensors (parse_safetensors' checks), and writing safetensors. Both accept and
// refuse the same files with the same messages (tests/format/test_format_parse.py).
import { GlcompError, fmtShape, isInt, isObj, prod, repr } from "../util.js";

export const MAX_JSON_BYTES = 64 * 2 ** 20;
const MAX_JSON_DEPTH = 64;
const MAX_DIMS = 32;

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
  // Escapes removed first, then strings, then the brackets give the depth (schema.py parse_json:
  // no pattern repeats a group, which took memory in proportion to one long string).
  const bare = text.replace(/\\[\s\S]/g, "").replace(/"[^"]*"/g, "");
  let depth = 0;
  for (const mt of bare.matchAll(/[[\]{}]/g)) {
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

const DTYPES = {
  F32: { size: 4, get: (v, o) => v.getFloat32(o, true), make: (n) => new Float32Array(n) },
  F64: { size: 8, get: (v, o) => v.getFloat64(o, true), make: (n) => new Float64Array(n) },
  I32: { size: 4, get: (v, o) => v.getInt32(o, true), make: (n) => new Int32Array(n) },
  I64: { size: 8, get: (v, o) => v.getBigInt64(o, true), make: (n) => new BigInt64Array(n) },
};

export function toArrayBuffer(data) {
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
  const out = Object.create(null); // tensor names are keys ("__proto__" is a name)
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
  const header = Object.create(null); // names from a bundle are keys (not "__proto__"-safe in {})
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
