// A small interpreter of the JSON Schema keywords glcomp's manifest schema uses: the same as
// glcomp/format/jsonschema.py, keyword for keyword, so both accept the same values and report the
// first fault they meet in the same order. Supported: type (object, array, string, integer,
// number = a finite number, boolean, null; or a list of them), const, enum, pattern (anchored),
// format "state-name", minLength/maxLength (code points), minimum/maximum, items,
// minItems/maxItems, properties, required, additionalProperties (false or a schema),
// propertyNames, minProperties/maxProperties, anyOf and local $ref (#/$defs/NAME). Any other
// keyword is refused when a Validator is made.
import { GlcompError, isObj } from "../util.js";

const KEYWORDS = new Set(["type", "const", "enum", "pattern", "format", "minLength", "maxLength", "minimum",
  "maximum", "items", "minItems", "maxItems", "properties", "required", "additionalProperties", "propertyNames",
  "minProperties", "maxProperties", "anyOf", "$ref"]);
const ANNOTATIONS = new Set(["$schema", "$id", "$defs", "$comment", "title", "description"]);
const TYPE_NAMES = {
  object: "an object", array: "a list", string: "a string", integer: "an integer", number: "a number",
  boolean: "a boolean", null: "null",
};
// State names are torch names: any printable character, spaces, tabs and newlines (Python's
// str.isprintable plus those), 1 to 500 of them. They never reach GLSL or file paths.
const STATE_NAME_RE = /^(?:[^\p{C}\p{Z}]|[ \t\n\r]){1,500}$/u;

/** Whether `name` is a valid state name (schema format "state-name"). */
export const stateNameOk = (name) => typeof name === "string" && STATE_NAME_RE.test(name);

// JSON as Python's json.dumps writes it (", " and ": " between items), for messages alike in both.
function pyJson(v) {
  if (Array.isArray(v)) return `[${v.map(pyJson).join(", ")}]`;
  if (isObj(v)) return `{${Object.entries(v).map(([k, x]) => `${JSON.stringify(k)}: ${pyJson(x)}`).join(", ")}}`;
  return JSON.stringify(v) ?? "null";
}

/** `v` for a message, cut short: strings quoted as 'x', anything else as JSON (a missing value
 *  is null). */
export function short(v) {
  let text;
  if (typeof v === "string") text = `'${v}'`;
  else {
    try { text = pyJson(v); } catch { text = typeof v; }
  }
  return text.length <= 80 ? text : `${text.slice(0, 77)}...`;
}

/** A list for a message (['a', 'b']), cut short. */
export function fmtList(items) {
  const text = `[${items.map((x) => (typeof x === "string" ? `'${x}'` : short(x))).join(", ")}]`;
  return text.length <= 300 ? text : `${text.slice(0, 297)}...`;
}

/** The JSON type of `v` ("integer" for integral numbers), null for anything JSON lacks. */
export function typeOf(v) {
  if (v === null) return "null";
  if (typeof v === "boolean") return "boolean";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : Number.isFinite(v) ? "number" : null;
  if (typeof v === "string") return "string";
  if (Array.isArray(v)) return "array";
  if (isObj(v)) return "object";
  return null;
}

const hasType = (v, wanted) => {
  const t = typeOf(v);
  return t === wanted || (wanted === "number" && t === "integer");
};
// Equality of JSON scalars (the schema's const and enum values are scalars).
const jsonEqual = (a, b) => typeof a === typeof b && a === b;

const patterns = new Map();
function pattern(p) {
  if (!patterns.has(p)) {
    if (!p.startsWith("^") || !p.endsWith("$")) throw new Error(`schema pattern ${p} must be anchored (^...$)`);
    patterns.set(p, new RegExp(p, "u"));
  }
  return patterns.get(p);
}

/** Throw Error if `schema` uses a keyword or format this interpreter does not know. */
export function checkKeywords(schema, where = "#") {
  if (!isObj(schema)) throw new Error(`${where}: a schema must be an object`);
  for (const [key, sub] of Object.entries(schema)) {
    if (!KEYWORDS.has(key) && !ANNOTATIONS.has(key)) throw new Error(`${where}: unsupported keyword ${key}`);
    if (key === "items" || key === "propertyNames" || (key === "additionalProperties" && sub !== false)) {
      checkKeywords(sub, `${where}/${key}`);
    } else if (key === "properties" || key === "$defs") {
      for (const [name, s] of Object.entries(sub)) checkKeywords(s, `${where}/${key}/${name}`);
    } else if (key === "anyOf") {
      sub.forEach((s, i) => checkKeywords(s, `${where}/anyOf/${i}`));
    } else if (key === "format" && sub !== "state-name") {
      throw new Error(`${where}: unsupported format ${sub}`);
    } else if (key === "pattern") {
      pattern(sub);
    }
  }
}

/** Validates JSON values against `schema` (whose $defs resolve $ref); a fault throws GlcompError
 *  `bundle ${where}: ${path} ...`, `path` dotted (states.w.layout, draws[3]), the root `root`. */
export class Validator {
  constructor(schema, where, root = "manifest") {
    checkKeywords(schema);
    this.schema = schema;
    this.where = where;
    this.root = root;
  }

  fail(path, msg) { return new GlcompError(`bundle ${this.where}: ${path || this.root} ${msg}`); }

  resolve(s) { return "$ref" in s ? this.schema.$defs[s.$ref.replace(/^#\/\$defs\//, "")] : s; }

  validate(value, schema = this.schema, path = "") {
    const s = this.resolve(schema);
    if ("anyOf" in s) this.anyOf(value, s.anyOf, path);
    if ("type" in s) {
      const types = Array.isArray(s.type) ? s.type : [s.type];
      if (!types.some((t) => hasType(value, t))) {
        throw this.fail(path, `must be ${types.map((t) => TYPE_NAMES[t]).join(" or ")}, got ${short(value)}`);
      }
    }
    if ("const" in s && !jsonEqual(value, s.const)) throw this.fail(path, `must be ${short(s.const)}, got ${short(value)}`);
    if ("enum" in s && !s.enum.some((e) => jsonEqual(value, e))) {
      throw this.fail(path, `must be one of ${fmtList(s.enum)}, got ${short(value)}`);
    }
    const t = typeOf(value);
    if (t === "string") {
      this.size([...value].length, s, "minLength", "maxLength", "characters", path);
      if ("pattern" in s && !pattern(s.pattern).test(value)) throw this.fail(path, `must match ${s.pattern}, got ${short(value)}`);
      if (s.format === "state-name" && !stateNameOk(value)) {
        throw this.fail(path, `is not a name of 1 to 500 printable characters, got ${short(value)}`);
      }
    } else if (t === "integer" || t === "number") {
      const lo = s.minimum, hi = s.maximum;
      if ((lo !== undefined && value < lo) || (hi !== undefined && value > hi)) {
        throw this.fail(path, `must be in [${short(lo ?? null)}, ${short(hi ?? null)}], got ${short(value)}`);
      }
    } else if (t === "array") {
      this.size(value.length, s, "minItems", "maxItems", "items", path);
      if ("items" in s) value.forEach((item, i) => this.validate(item, s.items, `${path}[${i}]`));
    } else if (t === "object") {
      this.object(value, s, path);
    }
  }

  anyOf(value, branches, path) {
    let first = null;
    for (const branch of branches) {
      // A branch of another type fails at its type check without recording an error (below):
      // skipped without building the error (an Error's stack trace) it would throw.
      const type = this.resolve(branch).type;
      if (type !== undefined && !(Array.isArray(type) ? type : [type]).some((t) => hasType(value, t))) continue;
      try {
        this.validate(value, branch, path);
        return;
      } catch (err) {
        if (!(err instanceof GlcompError)) throw err;
        if (first === null && hasType(value, this.resolve(branch).type ?? "")) first = err;
      }
    }
    if (first !== null) throw first;
    const kinds = branches.map((b) => this.resolve(b).type ?? "");
    throw this.fail(path, `must be ${kinds.map((k) => TYPE_NAMES[k] ?? k).join(" or ")}, got ${short(value)}`);
  }

  size(n, s, loKey, hiKey, what, path) {
    if (n < (s[loKey] ?? 0)) throw this.fail(path, `must have at least ${s[loKey]} ${what}, got ${n}`);
    if (hiKey in s && n > s[hiKey]) throw this.fail(path, `must have at most ${s[hiKey]} ${what}, got ${n}`);
  }

  object(value, s, path) {
    const prefix = path ? `${path}: ` : "";
    const missing = (s.required ?? []).filter((k) => !Object.hasOwn(value, k));
    if (missing.length) throw new GlcompError(`bundle ${this.where}: ${prefix}missing fields ${fmtList(missing)}`);
    const props = s.properties ?? {};
    const extra = s.additionalProperties ?? true;
    if (extra === false) {
      const unknown = Object.keys(value).filter((k) => !Object.hasOwn(props, k)).sort();
      if (unknown.length) {
        throw new GlcompError(`bundle ${this.where}: ${prefix}unknown fields ${fmtList(unknown)} `
          + `(known: ${fmtList(Object.keys(props))})`);
      }
    }
    if ("propertyNames" in s) {
      for (const k of Object.keys(value)) {
        try {
          this.validate(k, s.propertyNames, path);
        } catch (err) {
          if (!(err instanceof GlcompError)) throw err;
          throw this.fail(path, `has an invalid name ${short(k)}`);
        }
      }
    }
    this.size(Object.keys(value).length, s, "minProperties", "maxProperties", "fields", path);
    for (const [k, sub] of Object.entries(props)) {
      if (Object.hasOwn(value, k)) this.validate(value[k], sub, path ? `${path}.${k}` : k);
    }
    if (isObj(extra)) {
      for (const [k, v] of Object.entries(value)) {
        if (!Object.hasOwn(props, k)) this.validate(v, extra, path ? `${path}.${k}` : k);
      }
    }
  }
}
