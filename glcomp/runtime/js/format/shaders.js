// Shaders in a bundle, as glcomp/format/shaders.py: the bound of their loops (shaderLoopBound, a
// port of shader_loop_bound: the same forms, the same bounds), their check against the manifest
// (checkShaders) and reading shaders.json (unpackShaders). Both accept and refuse the same shaders
// with the same messages (tests/test_format_shaders.py).
import { SHADERS_FILE, shaderPath } from "./manifest.js";
import { short } from "./jsonschema.js";
import { parseJson } from "./parse.js";
import { GlcompError, isObj, repr } from "../util.js";

const MAX_SHADER_CHARS = 2 ** 20;
const MAX_ARRAY_ELEMENTS = 4096; // the integer literals in a shader's brackets, added up
const MAX_INLINED_TOKENS = 2 ** 18; // of one function with every call inlined (schema.py MAX_INLINED_TOKENS)

// -- loops in shaders (a port of schema.py shader_loop_bound: the same forms, the same bounds) ---
const COMMENT_RE = /\/\/[^\n]*|\/\*(?:.|\n)*?\*\//g;
const TOKEN_RE = /[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^ \t\r\n]/g;
const FOR_RE = /for[ \t\r\n]*\([ \t\r\n]*int[ \t\r\n]+([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*=[ \t\r\n]*0[ \t\r\n]*;[ \t\r\n]*\1[ \t\r\n]*<[ \t\r\n]*([0-9]{1,9})[ \t\r\n]*;[ \t\r\n]*\1[ \t\r\n]*\+\+[ \t\r\n]*\)[ \t\r\n]*\{/y;
const WRITE_AFTER_RE = /[ \t\r\n]*(?:[-+*/%&|^]?=(?!=)|<<=|>>=|\+\+|--)/y;
const WRITE_BEFORE_RE = /(?:\+\+|--)[ \t\r\n]*$/;
const DIRECTIVE_RE = /^#[ \t]*(?:version[ \t]+(?:100|300[ \t]+es)|extension[ \t]+[A-Za-z0-9_]+[ \t]*:[ \t]*[a-z]+)$/;
const CODE_CHARS_RE = /^[ -~\t\r\n]*$/;
const DIRECTIVE_LINE_RE = /^[ \t\r]*#[^\n]*/gm; // lines whose first non-blank character is #

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
  // (Plain loops over parallel arrays: this runs on every shader of a bundle at load.)
  for (const mt of text.matchAll(DIRECTIVE_LINE_RE)) {
    const line = mt[0].replace(/^[ \t\r]+|[ \t\r]+$/g, "");
    if (!DIRECTIVE_RE.test(line)) throw fail(`preprocessor directive ${repr(line.slice(0, 60))} is not allowed`);
  }
  const toks = [];
  const poss = [];
  TOKEN_RE.lastIndex = 0;
  for (let mt = TOKEN_RE.exec(text); mt !== null; mt = TOKEN_RE.exec(text)) {
    toks.push(mt[0]);
    poss.push(mt.index);
  }
  // Arrays (schema.py _check_brackets): a bracket holds one integer literal, all of them adding up
  // to at most MAX_ARRAY_ELEMENTS (the compiler declares no arrays; it indexes gl_FragData[N]).
  let arrayTotal = 0;
  for (let k = 0; k < toks.length; k++) {
    if (toks[k] !== "[") continue;
    const size = k + 1 < toks.length ? toks[k + 1] : "";
    if (!/^[0-9]+$/.test(size) || k + 2 >= toks.length || toks[k + 2] !== "]") {
      throw fail("a bracket must hold one integer literal, as in gl_FragData[1] (no other arrays)", poss[k]);
    }
    arrayTotal += Number(size.slice(0, 12));
    if (arrayTotal > MAX_ARRAY_ELEMENTS) throw fail(`arrays of more than ${MAX_ARRAY_ELEMENTS} elements in all`, poss[k]);
  }
  const isName = (tok) => {
    const c = tok.charCodeAt(0);
    return c === 95 || (c >= 65 && c <= 90) || (c >= 97 && c <= 122);
  };
  // A function's name: the identifier before the "(" that opens its parameters, outside every
  // brace and parenthesis (never a call in a parameter's array size).
  const defined = new Set();
  const writers = new Set(); // functions with an out or inout parameter
  let depth = 0;
  let paren = 0;
  let lastName = "";
  let writes = false;
  for (let i = 0; i < toks.length; i++) {
    const tok = toks[i];
    if (tok === "{") {
      if (depth === 0 && i > 0 && toks[i - 1] === ")") {
        defined.add(lastName);
        if (writes) writers.add(lastName);
      }
      depth += 1;
    } else if (tok === "}") depth -= 1;
    else if (depth === 0 && (tok === "(" || tok === ")")) paren += tok === "(" ? 1 : -1;
    else if (depth === 0 && paren > 0 && (tok === "out" || tok === "inout")) writes = true;
    else if (depth === 0 && paren === 0 && i + 1 < toks.length && toks[i + 1] === "(") {
      if (isName(tok)) {
        lastName = tok;
        writes = false;
      }
    }
  }
  const bounds = new Map();
  const sizes = new Map(); // inlined size in tokens of each function defined
  const called = new Set(); // the functions called so far
  depth = 0;
  paren = 0;
  let func = null;
  lastName = "";
  let total = 0;
  let opened = 0;
  let inlined = 0;
  const calls = []; // the functions whose parentheses are open (null: no name)
  const loops = []; // [variable, iterations including this loop's, depth]
  let i = 0;
  while (i < toks.length) {
    const tok = toks[i];
    const pos = poss[i];
    const mult = loops.length ? loops[loops.length - 1][1] : 1;
    const nxt = i + 1 < toks.length ? toks[i + 1] : "";
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
      while (i < toks.length && poss[i] < end) i += 1;
      continue;
    }
    if (tok === "{") {
      depth += 1;
      if (depth === 1) {
        func = i > 0 && toks[i - 1] === ")" ? lastName : null;
        if (func !== null && called.has(func)) {
          throw fail(`function ${func} is defined after a call of ${func} (every overload must come before the calls of its name)`, pos);
        }
        total = 0;
        inlined = 0;
        opened = i;
        calls.length = 0;
      }
    } else if (tok === "}") {
      if (loops.length && loops[loops.length - 1][2] === depth) loops.pop();
      depth -= 1;
      if (depth < 0) throw fail("unbalanced braces", pos);
      if (depth === 0 && func !== null) {
        const size = i - opened + 1 + inlined;
        if (size > MAX_INLINED_TOKENS) {
          throw fail(`function ${func} inlined would hold ${size} tokens, more than the ${MAX_INLINED_TOKENS} allowed `
            + "(every call inlines its callee)", pos);
        }
        // Overloads share a name and a call's overload is not known: each call counts the costliest.
        bounds.set(func, Math.max(total, bounds.has(func) ? bounds.get(func) : 0));
        sizes.set(func, Math.max(size, sizes.has(func) ? sizes.get(func) : 0));
        func = null;
      }
    } else if (tok === "(" || tok === ")") {
      if (depth === 0) paren += tok === "(" ? 1 : -1;
      else if (tok === "(") calls.push(i > 0 && isName(toks[i - 1]) ? toks[i - 1] : null);
      else if (calls.length) calls.pop();
    } else if (isName(tok)) {
      if (depth === 0 && nxt === "(") {
        if (paren === 0) lastName = tok;
      } else if (depth > 0 && nxt === "(" && defined.has(tok)) {
        if (!bounds.has(tok)) throw fail(`${tok} is called before its definition ends (recursion is not allowed)`, pos);
        called.add(tok);
        total += mult * bounds.get(tok);
        inlined += sizes.get(tok);
        if (inlined > MAX_INLINED_TOKENS) {
          throw fail(`function ${func} inlined would hold more than the ${MAX_INLINED_TOKENS} tokens allowed `
            + "(every call inlines its callee)", pos);
        }
      }
      for (const [v] of loops) {
        if (tok !== v) continue;
        WRITE_AFTER_RE.lastIndex = pos + tok.length;
        if (WRITE_AFTER_RE.test(text) || WRITE_BEFORE_RE.test(text.slice(Math.max(0, pos - 16), pos))) {
          throw fail(`the loop variable ${v} is written in its loop`, pos);
        }
        let callee = null;
        for (let c = calls.length - 1; c >= 0 && callee === null; c--) callee = calls[c];
        if (callee !== null && writers.has(callee)) {
          throw fail(`the loop variable ${v} is passed to ${callee}, which has out or inout parameters (it could write it)`, pos);
        }
      }
    }
    i += 1;
  }
  if (depth !== 0) throw fail("unbalanced braces");
  return bounds.has("main") ? bounds.get("main") : 0;
}

/** Check every shader against the validated manifest (schema.py check_shaders): it begins
 *  with the #version of the manifest's target; the vertex shader runs no loop, each fragment shader at most its program's loop_iterations. Errors
 *  name a shader as shaderPath does for the manifest's format version. */
export function checkShaders(manifest, shaders) {
  const version = manifest.version;
  const vert = manifest.vertex_shader;
  const head = `#version ${manifest.target.glsl_version}\n`;
  for (const name of [vert, ...Object.values(manifest.programs).map((prog) => prog.fragment)]) {
    if (!shaders[name].startsWith(head)) {
      throw new GlcompError(`bundle ${shaderPath(version, name)}: must begin with ${head.trim()} (the manifest's target)`);
    }
  }
  if (shaderLoopBound(shaders[vert], shaderPath(version, vert)) !== 0) {
    throw new GlcompError(`bundle ${shaderPath(version, vert)}: the vertex shader must not loop`);
  }
  for (const [pid, prog] of Object.entries(manifest.programs)) {
    const where = shaderPath(version, prog.fragment);
    const bound = shaderLoopBound(shaders[prog.fragment], where);
    if (bound > prog.loop_iterations) {
      throw new GlcompError(`bundle ${where}: its loops may run ${bound} iterations per fragment, `
        + `more than the ${prog.loop_iterations} manifest.json declares for program ${pid}`);
    }
  }
}

// Orders strings by code points, as Python's sorted() does (a plain sort compares UTF-16 units).
const byCodePoints = (a, b) => {
  const x = Array.from(a, (ch) => ch.codePointAt(0));
  const y = Array.from(b, (ch) => ch.codePointAt(0));
  for (let i = 0; i < x.length && i < y.length; i++) if (x[i] !== y[i]) return x[i] - y[i];
  return x.length - y.length;
};

/** The shaders of a shaders.json file's bytes (format 3), as schema.py unpack_shaders: a JSON
 *  object of exactly the shader file names `wanted` (plain file names, checked before) -> GLSL
 *  source strings of Unicode text; GlcompError naming shaders.json and the shader otherwise, with
 *  Python's messages. */
export function unpackShaders(bytes, wanted) {
  const packed = parseJson(bytes, SHADERS_FILE);
  if (!isObj(packed)) throw new GlcompError(`bundle ${SHADERS_FILE}: must be an object of shader file name -> GLSL source`);
  const known = new Set(wanted);
  const extra = Object.keys(packed).filter((name) => !known.has(name)).sort(byCodePoints);
  if (extra.length) {
    throw new GlcompError(`bundle ${SHADERS_FILE}: holds shader ${short(extra[0])}, which manifest.json does not name`);
  }
  const out = {};
  for (const name of known) {
    if (!Object.hasOwn(packed, name)) {
      throw new GlcompError(`bundle ${SHADERS_FILE}: shader '${name}' is missing (manifest.json names it)`);
    }
    const source = packed[name];
    if (typeof source !== "string") {
      throw new GlcompError(`bundle ${shaderPath(3, name)}: must be a string (the shader's GLSL source)`);
    }
    if (/\p{Cs}/u.test(source)) throw new GlcompError(`bundle ${shaderPath(3, name)}: not Unicode text (a lone surrogate)`);
    out[name] = source;
  }
  return out;
}
