"""Program sharing: kernels that differ only in the node ids they were rendered from (every time
step of a recurrence, repeated layers) get one GLSL source, so the bundle lists one program and
the runtime compiles it once.

Rendered shaders name their functions, samplers and locals after IR node ids (``v123``,
``glc_fetch_123``, ``s123_0``, ``e123``) and open with a comment listing the kernel's nodes. `canonical`
renumbers those identifiers by first appearance and drops the node list; draws keep their
kernel name. Origin comments (``// from blocks.1.attn (Head)``) do not keep kernels apart:
`sharing_key` ignores them and `merge_origins` lists every sharing kernel's origins in the one
shader (each head of an attention layer, each layer of a stack, share their programs).
The constant offsets of index expressions that views pass to their operand
(``return v5(i0, (i1 + 95), i2);``, a slice at one time step) become integer uniforms set per
draw, so the steps of a recurrence share a program.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache

_NODE_LIST = re.compile(r"^// [^\n]*: nodes %[^\n]*\n", re.MULTILINE)
ORIGIN = "// from "  # an origin comment line starts so
# The identifiers the renderer generates from node ids (what `canonical` renumbers).
# Shaders are ASCII (generated names, filtered comments): ASCII classes scan them twice as fast.
NODE_NAME = re.compile(r"\b(v|e|glc_fetch_|glc_fetcht_|s|glc_c_v|glc_j0_v|glc_t_v)(\d+)(_\d+)?\b", re.ASCII)
# A view's call of its operand: `return v<k>(<index args>);`, an offset written `(i<d> + <c>)`.
_VIEW_CALL = re.compile(r"^(\s*return v\d+(?:_4)?\()(.*)(\);)$", re.MULTILINE)  # v<k>_4: a texel
_OFFSET = re.compile(r"\((i\d+|j0) ([+-]) (\d+)\)")
_DECLARATIONS = "uniform int u_page_offset;\n"
MAX_OFFSET = 1 << 24  # integer uniforms must stay exact in highp int and in JSON numbers
# Helper functions of the shared prelude (glc_*, imod, iclamp): kept only where called.
_HELPER = re.compile(
    r"^(?:void|float|int|uint|bool|bvec4|vec2|vec4) (glc_[a-z][a-z0-9]*|imod|iclamp)\(",
    re.MULTILINE | re.ASCII,
)
_CALL = re.compile(r"\b(\w++)\(", re.ASCII)  # a call (or a definition) of any function: its whole name


@lru_cache(maxsize=1024)
def _called(text: str) -> frozenset[str]:
    """The names of the functions `text` calls (or defines); helper texts repeat in every shader."""
    return frozenset(_CALL.findall(text))


def drop_unused_helpers(source: str) -> str:
    """The source without the prelude helper functions (and their comment lines) that nothing
    calls, so every shader compiles only what it uses.

    Guarantee: a helper (all overloads of its name together) stays exactly when code outside
    the helpers calls it, directly or through other helpers (GLSL has no recursion). Linear in
    the shader's length."""
    lines = source.split("\n")
    spans: list[tuple[str, int, int]] = []  # (helper, first line incl. its comments, last line)
    i, at = 0, 0  # line number of character offset `at`
    for m in _HELPER.finditer(source):  # helper definitions start lines
        i += source.count("\n", at, m.start())
        at = m.start()
        line = lines[i]
        end = i
        if line.count("{") != line.count("}"):
            while end + 1 < len(lines) and lines[end] != "}":
                end += 1
        start = i
        while start > 0 and lines[start - 1].startswith("//") and not lines[start - 1].startswith("// from"):
            start -= 1
        spans.append((m.group(1), start, end))
    if not spans:
        return source
    names = {n for n, _, _ in spans}
    # Helpers reachable from the rest of the shader through calls, helper to helper (a name
    # followed by "(" is a call of that helper exactly when the whole word is the name).
    outside = "\n".join(_without(lines, [(a, b) for _, a, b in spans]))
    callees: dict[str, set[str]] = {}
    for name, a, b in spans:
        own = "\n".join(lines[a : b + 1])
        callees.setdefault(name, set()).update(c for c in _called(own) & names if c != name)
    reached, todo = set(), sorted(set(_CALL.findall(outside)) & names)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(callees.get(name, ()))
    removed = names - reached
    if not removed:
        return source
    return "\n".join(_without(lines, [(a, b) for n, a, b in spans if n in removed]))


def _without(lines: list[str], spans: list[tuple[int, int]]) -> list[str]:
    """`lines` without those in the inclusive ranges `spans` (in increasing order of start)."""
    kept: list[str] = []
    at = 0
    for a, b in spans:
        if a > at:
            kept += lines[at:a]
        at = max(at, b + 1)
    kept += lines[at:]
    return kept


def canonical(source: str) -> tuple[str, dict[str, str], dict[str, int]]:
    """The source with node-id identifiers renumbered 0, 1, ... in order of first appearance
    (one number per node, whatever the prefix), without the node-list comment and with view
    offsets lifted into uniforms; the renaming applied (old sampler name -> new) and the value of
    each offset uniform (``u_o<k>``), which a draw of this program must set.

    Guarantee: a bijective renaming of identifiers the renderer generates from node ids, and
    offsets replaced by uniforms holding the same integers, so the shader computes the same
    values; two kernels whose sources differ only in those ids and offsets get the same text."""
    source = drop_unused_helpers(_NODE_LIST.sub("", source, count=1))
    local: dict[str, int] = {}
    renamed: dict[str, str] = {}

    done: dict[str, str] = {}  # each name renamed: a name keeps its new name once it has one

    def rename(m: re.Match[str]) -> str:
        name = m[0]
        new = done.get(name)
        if new is not None:
            return new
        prefix, node, page = m.group(1), m.group(2), m.group(3)
        if prefix == "s" and page is None:
            new = name  # s<digits> without a page is not a sampler the renderer names
        else:
            index = local.setdefault(node, len(local))
            new = renamed[name] = f"{prefix}{index}{page or ''}"
        done[name] = new
        return new

    source = NODE_NAME.sub(rename, source)
    offsets: dict[str, int] = {}

    def lift(m: re.Match[str]) -> str:
        value = int(m.group(3))
        if value > MAX_OFFSET:
            return m.group(0)
        name = f"u_o{len(offsets)}"
        offsets[name] = value
        return f"({m.group(1)} {m.group(2)} {name})"

    def lift_call(m: re.Match[str]) -> str:
        return m.group(1) + _OFFSET.sub(lift, m.group(2)) + m.group(3)

    lifted = _VIEW_CALL.sub(lift_call, source)
    if not offsets or _DECLARATIONS not in lifted:  # nothing to lift, or nowhere to declare it
        return source, renamed, {}
    decl = "".join(f"uniform int {name};\n" for name in offsets)
    return lifted.replace(_DECLARATIONS, _DECLARATIONS + decl, 1), renamed, offsets


def sharing_key(source: str) -> str:
    """What makes two canonical sources one program: the text without its origin comments (which
    name the model parts a kernel came from and change nothing the GPU computes)."""
    return "\n".join(line for line in source.split("\n") if not line.startswith(ORIGIN))


def sharing_digest(source: str) -> str:
    """A short hash of `sharing_key(source)`: equal for canonical sources that make one program."""
    return key_digest(sharing_key(source))


def key_digest(key: str) -> str:
    """The short hash `sharing_digest` gives a source whose `sharing_key` is `key`."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def merge_origins(shared: str, source: str) -> str:
    """`shared` (a program's source) with the origin comments of `source` (another kernel with
    the same `sharing_key`) added after its own, each origin once, in order of first appearance.

    Guarantee: only comment lines change, never before the preprocessor lines that open the
    source; `sharing_key` of the result is that of both inputs."""
    have = _origin_lines(shared)
    known = {shared[a:b] for a, b in have}
    new = [line for line in dict.fromkeys(source[a:b] for a, b in _origin_lines(source)) if line not in known]
    if not new:
        return shared
    if not have:  # after the #version (and #extension) lines, which must come first
        lines = shared.split("\n")
        at = next((i for i, line in enumerate(lines) if not line.startswith("#")), len(lines))
        return "\n".join(lines[:at] + new + lines[at:])
    end = have[-1][1]  # the new lines go after the last origin line
    return shared[:end] + "\n" + "\n".join(new) + shared[end:]


def _origin_lines(text: str) -> list[tuple[int, int]]:
    """Where the origin comment lines of `text` are: (start, end) of each, without its newline."""
    spans = []
    at = 0 if text.startswith(ORIGIN) else text.find("\n" + ORIGIN) + 1
    while at > 0 or (at == 0 and not spans and text.startswith(ORIGIN)):
        end = text.find("\n", at)
        end = len(text) if end < 0 else end
        spans.append((at, end))
        at = text.find("\n" + ORIGIN, end) + 1
    return spans
