"""Untrusted shaders: what a bundle's GLSL may contain, and the loop iterations it may run.

`shader_loop_bound` admits only the constant-bounded loops the compiler emits and bounds the
iterations of ``main`` and the size of every function with its calls inlined (calls multiply);
`check_shaders` holds every program's fragment shader to the ``loop_iterations`` its manifest
declares; `unpack_shaders` reads shaders.json. glcomp.js (glcomp/runtime/js/format/shaders.js
shaderLoopBound and unpackShaders) accepts and refuses the same shaders with the same numbers.
Any fault is a GlcompError naming the shader as `shader_path` does.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_left
from itertools import accumulate
from typing import Any

from glcomp.errors import GlcompError
from glcomp.format.jsonschema import short as _short
from glcomp.format.manifest import SHADERS_FILE, shader_path
from glcomp.format.parse import parse_json

# A shader's file name in a bundle (a key of shaders.json).
SHADER_NAME = re.compile(r"[A-Za-z0-9_]{1,64}\.(frag|vert)")
_SHADER = SHADER_NAME

# -- loops in shaders: every one constant-bounded, with an upper bound of iterations ---------------
_COMMENT = re.compile(r"//[^\n]*|/\*(?:.|\n)*?\*/")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^ \t\r\n]")
_TOKEN_SPLIT = re.compile(f"({_TOKEN.pattern})")
# Tokens that act whatever follows them ("(" and ")" count parentheses, and the token before a
# "(" acts too).
_EVENTS = frozenset({"{", "}", "for", "while", "do", "(", ")"})
_FOR = re.compile(
    r"for[ \t\r\n]*\([ \t\r\n]*int[ \t\r\n]+([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*=[ \t\r\n]*0[ \t\r\n]*;"
    r"[ \t\r\n]*\1[ \t\r\n]*<[ \t\r\n]*([0-9]{1,9})[ \t\r\n]*;[ \t\r\n]*\1[ \t\r\n]*\+\+[ \t\r\n]*\)"
    r"[ \t\r\n]*\{"
)
_WRITE_AFTER = re.compile(r"[ \t\r\n]*(?:[-+*/%&|^]?=(?!=)|<<=|>>=|\+\+|--)")
_WRITE_BEFORE = re.compile(r"(?:\+\+|--)[ \t\r\n]*$")
_DIRECTIVE = re.compile(
    r"#[ \t]*(?:version[ \t]+(?:100|300[ \t]+es)|extension[ \t]+[A-Za-z0-9_]+[ \t]*:[ \t]*[a-z]+)"
)
_CODE_CHARS = re.compile(r"[ -~\t\r\n]*")
_WRITING_QUALIFIERS = frozenset({"out", "inout"})
MAX_SHADER_CHARS = 1 << 20
MAX_ARRAY_ELEMENTS = 4096  # the integer literals in a shader's brackets, added up
MAX_INLINED_TOKENS = 1 << 18  # of one function with every call inlined (a shader of 1 MiB has ~300k)


def shader_loop_bound(source: str, where: str) -> int:
    """An upper bound of the loop iterations one invocation of `source`'s ``main`` runs.

    Refuses (GlcompError naming `where`) any loop that is not of the constant-bounded form the
    compiler emits, ``for (int v = 0; v < N; v++) {``, or that writes ``v`` in its body; any
    ``while`` or ``do``; any preprocessor directive but ``#version`` and ``#extension``;
    backslashes (line continuations could hide code from this analysis); characters other than
    printable ASCII outside comments; and any call of a function not defined above the caller
    (so no recursion). Nested loops multiply; a call adds the callee's bound times the
    iterations around it. The browser runtime's shaderLoopBound computes the same numbers.

    Calls are inlined by every GLSL compiler, so calls multiply a function's size: a function's
    inlined size is its own tokens (from its "{" to its "}") plus the inlined size of every call
    it makes, and none may exceed MAX_INLINED_TOKENS (functions calling each other twice, 30
    deep, are 2^30 copies: that once took tens of GB to compile). Overloads share a name, and
    which one a call means is not known here: a call counts the costliest overload of its name,
    and every overload must be defined before the first call of its name (an overload defined
    later could be the one called). A loop variable may not be passed to a function with ``out``
    or ``inout`` parameters (which could write it)."""

    def fail(msg: str, pos: int | None = None) -> GlcompError:
        at = "" if pos is None else f"line {text.count(chr(10), 0, pos) + 1}: "
        return GlcompError(f"bundle {where}: {at}{msg}")

    text = source
    if len(source) > MAX_SHADER_CHARS:
        raise fail(f"the shader is longer than {MAX_SHADER_CHARS} characters")
    if "\\" in source:
        raise fail("backslashes (line continuations) are not allowed in shaders")
    text = _COMMENT.sub(lambda mt: re.sub(r"[^\n]", " ", mt[0]), source)
    if "/*" in text:
        raise fail("unterminated comment")
    if not _CODE_CHARS.fullmatch(text):
        raise fail("characters other than printable ASCII outside comments")
    for line in text.split("\n"):
        line = line.strip(" \t\r")
        if line.startswith("#") and not _DIRECTIVE.fullmatch(line.rstrip(" \t")):
            raise fail(f"preprocessor directive {line[:60]!r} is not allowed")
    # Tokens and where each starts: split keeps the tokens at odd indices, the whitespace
    # between them at even ones, so the running sum of lengths gives every start at C speed.
    parts = _TOKEN_SPLIT.split(text)
    toks = parts[1::2]
    ends = list(accumulate(map(len, parts)))
    starts = ends[0::2][: len(toks)]  # token k (parts[2k + 1]) starts after parts[0 .. 2k]
    count = len(toks)
    _check_brackets(toks, starts, fail)
    # Only some tokens do anything below: braces, loop keywords, the token before each "(" and
    # the names of loop variables; the scans visit those alone, in order (every other token
    # leaves every variable as it was).
    marks = [k for k, t in enumerate(toks) if t in _EVENTS]
    loop_vars = {found[1] for k in marks if toks[k] == "for" and (found := _FOR.match(text, starts[k]))}
    events = set(marks)
    events.update(k - 1 for k in marks if toks[k] == "(")
    if loop_vars:
        events.update(k for k, t in enumerate(toks) if t in loop_vars)
        events.update(k for k, t in enumerate(toks) if t in _WRITING_QUALIFIERS)
    events.discard(-1)  # a "(" that opens the shader follows no token
    events = sorted(events)
    # A function's name is the identifier before the "(" that opens its parameters: the last one
    # followed by "(" outside every brace and parenthesis (a call in an array size of a parameter,
    # `int k(int a[abs(2)])`, must not take the name's place).
    defined: set[str] = set()  # functions: NAME ( ... ) { at the top level
    writers: set[str] = set()  # those of them with an out or inout parameter
    depth = paren = 0
    last_name = ""
    writes = False  # an out or inout qualifier in the parameters after last_name
    for i in events:
        tok = toks[i]
        if tok == "{":
            if depth == 0 and i > 0 and toks[i - 1] == ")":
                defined.add(last_name)
                if writes:
                    writers.add(last_name)
            depth += 1
        elif tok == "}":
            depth -= 1
        elif depth == 0 and tok in "()":
            paren += 1 if tok == "(" else -1
        elif depth == 0 and paren > 0 and tok in _WRITING_QUALIFIERS:
            writes = True
        elif depth == 0 and paren == 0 and i + 1 < count and toks[i + 1] == "(":
            if tok[0].isalpha() or tok[0] == "_":
                last_name = tok
                writes = False
    bounds: dict[str, int] = {}
    sizes: dict[str, int] = {}  # inlined size in tokens of each function defined
    called: set[str] = set()  # the functions called so far
    depth = paren = 0
    func: str | None = None
    last_name = ""
    total = 0
    opened = inlined = 0  # the token opening the function being read; its callees' sizes
    calls: list[str | None] = []  # the functions whose parentheses are open (None: no name)
    loops: list[tuple[str, int, int]] = []  # (variable, iterations including this loop's, depth)
    skip_to = 0  # tokens before this one belong to a loop header already read
    for i in events:
        if i < skip_to:
            continue
        tok, pos = toks[i], starts[i]
        mult = loops[-1][1] if loops else 1
        nxt = toks[i + 1] if i + 1 < count else ""
        if tok in ("while", "do"):
            raise fail(f"{tok} loops are not allowed", pos)
        if tok == "for":
            found = _FOR.match(text, pos)
            if func is None or found is None:
                raise fail("a loop not of the form 'for (int v = 0; v < N; v++) {'", pos)
            n = int(found[2])
            total += mult * n
            depth += 1
            loops.append((found[1], mult * n, depth))
            skip_to = bisect_left(starts, found.end(), i)
            continue
        if tok == "{":
            depth += 1
            if depth == 1:
                func = last_name if i > 0 and toks[i - 1] == ")" else None
                if func is not None and func in called:
                    raise fail(
                        f"function {func} is defined after a call of {func} (every overload must come "
                        "before the calls of its name)",
                        pos,
                    )
                total = inlined = 0
                opened = i
                calls.clear()
        elif tok == "}":
            if loops and loops[-1][2] == depth:
                loops.pop()
            depth -= 1
            if depth < 0:
                raise fail("unbalanced braces", pos)
            if depth == 0 and func is not None:
                size = i - opened + 1 + inlined
                if size > MAX_INLINED_TOKENS:
                    raise fail(
                        f"function {func} inlined would hold {size} tokens, more than the "
                        f"{MAX_INLINED_TOKENS} allowed (every call inlines its callee)",
                        pos,
                    )
                # Overloads share a name and a call's overload is not known here: each call of
                # the name counts the costliest (all are defined before the first call).
                bounds[func] = max(total, bounds.get(func, 0))
                sizes[func] = max(size, sizes.get(func, 0))
                func = None
        elif tok in "()":
            if depth == 0:
                paren += 1 if tok == "(" else -1
            elif tok == "(":
                before = toks[i - 1] if i > 0 else ""
                calls.append(before if before[:1].isalpha() or before[:1] == "_" else None)
            elif calls:
                calls.pop()
        elif tok[0].isalpha() or tok[0] == "_":
            if depth == 0 and nxt == "(":
                if paren == 0:
                    last_name = tok
            elif depth > 0 and nxt == "(" and tok in defined:
                if tok not in bounds:
                    raise fail(f"{tok} is called before its definition ends (recursion is not allowed)", pos)
                called.add(tok)
                total += mult * bounds[tok]
                inlined += sizes[tok]
                if inlined > MAX_INLINED_TOKENS:
                    raise fail(
                        f"function {func} inlined would hold more than the {MAX_INLINED_TOKENS} tokens "
                        "allowed (every call inlines its callee)",
                        pos,
                    )
            for var, _, _ in loops:
                if tok == var and (
                    _WRITE_AFTER.match(text, pos + len(tok))
                    or _WRITE_BEFORE.search(text[max(0, pos - 16) : pos])
                ):
                    raise fail(f"the loop variable {var} is written in its loop", pos)
                if tok == var:
                    callee = next((c for c in reversed(calls) if c is not None), None)
                    if callee in writers:
                        raise fail(
                            f"the loop variable {var} is passed to {callee}, which has out or inout "
                            "parameters (it could write it)",
                            pos,
                        )
    if depth != 0:
        raise fail("unbalanced braces")
    return bounds.get("main", 0)


def _check_brackets(toks: list[str], starts: list[int], fail: Any) -> None:
    """Arrays: the compiler declares none (it indexes gl_FragData[N] alone), so a bracket must
    hold one integer literal, and those literals add up to at most MAX_ARRAY_ELEMENTS (an array
    of 2^31 floats once loaded, and ran at 16 GB)."""
    total = 0
    for k in (k for k, t in enumerate(toks) if t == "["):
        size = toks[k + 1] if k + 1 < len(toks) else ""
        if not size.isdigit() or k + 2 >= len(toks) or toks[k + 2] != "]":
            raise fail(
                "a bracket must hold one integer literal, as in gl_FragData[1] (no other arrays)", starts[k]
            )
        total += int(size[:12])
        if total > MAX_ARRAY_ELEMENTS:
            raise fail(f"arrays of more than {MAX_ARRAY_ELEMENTS} elements in all", starts[k])


def check_shaders(manifest: dict[str, Any], shaders: dict[str, str]) -> None:
    """Check every shader against the validated `manifest`: it begins with the ``#version`` of
    the manifest's target, and its loops (see `shader_loop_bound`) are bounded:
    the vertex shader runs no loop, and each program's fragment shader at most the
    ``loop_iterations`` its program declares (per fragment). Errors name a shader as
    `shader_path` does for the manifest's format version."""
    version = manifest["version"]
    vert = manifest["vertex_shader"]
    head = f"#version {manifest['target']['glsl_version']}\n"
    for name in [vert, *(prog["fragment"] for prog in manifest["programs"].values())]:
        if not shaders[name].startswith(head):
            raise GlcompError(
                f"bundle {shader_path(version, name)}: must begin with {head.strip()} (the manifest's target)"
            )
    if shader_loop_bound(shaders[vert], shader_path(version, vert)) != 0:
        raise GlcompError(f"bundle {shader_path(version, vert)}: the vertex shader must not loop")
    for pid, prog in manifest["programs"].items():
        where = shader_path(version, prog["fragment"])
        bound = shader_loop_bound(shaders[prog["fragment"]], where)
        if bound > prog["loop_iterations"]:
            raise GlcompError(
                f"bundle {where}: its loops may run {bound} iterations per fragment, "
                f"more than the {prog['loop_iterations']} manifest.json declares for program {pid}"
            )


def _unicode_ok(text: str) -> bool:
    """Whether `text` is Unicode text (no lone surrogate, which JSON's \\u escapes can spell)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unpack_shaders(data: bytes, wanted: list[str]) -> dict[str, str]:
    """The shaders of a shaders.json file's bytes (format 3): a JSON object of exactly the shader
    file names `wanted` (the manifest's vertex shader and fragments, already checked to be plain
    file names) -> GLSL source (strings of Unicode text). Any other name, or a name missing, or
    a value not a string: GlcompError naming shaders.json and the shader. The browser runtime's
    unpackShaders refuses the same files with the same messages."""
    packed = parse_json(data, SHADERS_FILE)
    if not isinstance(packed, dict):
        raise GlcompError(f"bundle {SHADERS_FILE}: must be an object of shader file name -> GLSL source")
    known = set(wanted)
    extra = sorted(name for name in packed if name not in known)
    if extra:
        raise GlcompError(
            f"bundle {SHADERS_FILE}: holds shader {_short(extra[0])}, which manifest.json does not name"
        )
    shaders: dict[str, str] = {}
    for name in dict.fromkeys(wanted):
        if name not in packed:
            raise GlcompError(f"bundle {SHADERS_FILE}: shader {name!r} is missing (manifest.json names it)")
        source = packed[name]
        if not isinstance(source, str):
            raise GlcompError(f"bundle {shader_path(3, name)}: must be a string (the shader's GLSL source)")
        if not _unicode_ok(source):
            raise GlcompError(f"bundle {shader_path(3, name)}: not Unicode text (a lone surrogate)")
        shaders[name] = source
    return shaders


# -- constants in shaders --------------------------------------------------------------------------
_NUMBER = re.compile(r"(?<![\w.])-?[0-9][0-9.]*(?:e[-+]?[0-9]+)?(?![\w.])")


def float_literal(value: float) -> str:
    """How the code generator spells the constant `value` in GLSL (glcomp.codegen.families.glsl
    glsl_float: Python's repr, ".0" added to integers, infinities clamped to +-3.0e38)."""
    if math.isinf(value):
        return "3.0e38" if value > 0 else "-3.0e38"
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


def shader_literals(shaders: dict[str, str]) -> set[str]:
    """Every number literal the shaders hold (a negative one also without its sign): a constant
    of the bundle's graphs appears here as `float_literal` spells it."""
    found: set[str] = set()
    for source in shaders.values():
        for token in _NUMBER.findall(source):
            found.add(token)
            if token.startswith("-"):
                found.add(token[1:])
    return found
