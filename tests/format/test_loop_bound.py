"""shader_loop_bound (the bundle loaders' loop analysis) visits only the tokens that act: it
must give every source exactly what the plain scan over every token gives, bound or error. A
function's name is the identifier before the "(" that opens its parameters, never one inside them
(a call in a parameter's array size once hid a function's loops from its callers)."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

import glcomp
from glcomp import GlcompError, nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.format.shaders import (
    _CODE_CHARS,
    _COMMENT,
    _DIRECTIVE,
    _FOR,
    _TOKEN,
    _WRITE_AFTER,
    _WRITE_BEFORE,
    MAX_ARRAY_ELEMENTS,
    MAX_INLINED_TOKENS,
    MAX_SHADER_CHARS,
    shader_loop_bound,
)


def reference_loop_bound(source: str, where: str) -> int:
    """The plain scan: every token in order (what shader_loop_bound computed before it skipped
    the tokens that change nothing)."""

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
    tokens = [(mt[0], mt.start()) for mt in _TOKEN.finditer(text)]
    total = 0
    for k, (tok, pos) in enumerate(tokens):
        if tok == "[":
            size = tokens[k + 1][0] if k + 1 < len(tokens) else ""
            if not size.isdigit() or k + 2 >= len(tokens) or tokens[k + 2][0] != "]":
                raise fail(
                    "a bracket must hold one integer literal, as in gl_FragData[1] (no other arrays)", pos
                )
            total += int(size[:12])
            if total > MAX_ARRAY_ELEMENTS:
                raise fail(f"arrays of more than {MAX_ARRAY_ELEMENTS} elements in all", pos)
    defined: set[str] = set()  # functions: NAME ( ... ) { at the top level
    writers: set[str] = set()  # functions with an out or inout parameter
    depth = paren = 0  # paren: parentheses open outside every brace
    last_name = ""
    writes = False
    for i, (tok, _) in enumerate(tokens):
        if tok == "{":
            if depth == 0 and i > 0 and tokens[i - 1][0] == ")":
                defined.add(last_name)
                if writes:
                    writers.add(last_name)
            depth += 1
        elif tok == "}":
            depth -= 1
        elif depth == 0 and tok in ("(", ")"):
            paren += 1 if tok == "(" else -1
        elif depth == 0 and paren > 0 and tok in ("out", "inout"):
            writes = True
        elif depth == paren == 0 and i + 1 < len(tokens) and tokens[i + 1][0] == "(":
            if tok[0].isalpha() or tok[0] == "_":
                last_name = tok
                writes = False
    bounds: dict[str, int] = {}
    sizes: dict[str, int] = {}
    called: set[str] = set()
    depth = paren = 0
    func: str | None = None
    last_name = ""
    total = opened = inlined = 0
    calls: list[str | None] = []
    loops: list[tuple[str, int, int]] = []  # (variable, iterations including this loop's, depth)
    i = 0
    while i < len(tokens):
        tok, pos = tokens[i]
        mult = loops[-1][1] if loops else 1
        nxt = tokens[i + 1][0] if i + 1 < len(tokens) else ""
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
            while i < len(tokens) and tokens[i][1] < found.end():
                i += 1
            continue
        if tok == "{":
            depth += 1
            if depth == 1:
                func = last_name if i > 0 and tokens[i - 1][0] == ")" else None
                if func is not None and func in called:
                    raise fail(
                        f"function {func} is defined after a call of {func} (every overload must come "
                        "before the calls of its name)",
                        pos,
                    )
                total = inlined = 0
                opened = i
                calls = []
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
        elif tok in ("(", ")"):
            if depth == 0:
                paren += 1 if tok == "(" else -1
            elif tok == "(":
                before = tokens[i - 1][0]
                calls.append(before if before[0].isalpha() or before[0] == "_" else None)
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
                named = [c for c in calls if c is not None]
                if tok == var and named and named[-1] in writers:
                    raise fail(
                        f"the loop variable {var} is passed to {named[-1]}, which has out or inout "
                        "parameters (it could write it)",
                        pos,
                    )
        i += 1
    if depth != 0:
        raise fail("unbalanced braces")
    return bounds.get("main", 0)


def _outcome(bound, source: str) -> int | str:
    try:
        return bound(source, "shaders/t.frag")
    except GlcompError as err:
        return str(err)


# Pieces of shaders, good and bad: loops (nested, malformed, writing their variable), calls before
# and after definitions, stray braces and parentheses, names that contain keywords or loop
# variables, numbers glued to names, comments, directives.
HEADERS = [
    *("void main() {", "float f(int a) {", "int g() {", "vec4 h(vec4 (a)) {", "int k(int a[(2)]) {"),
    *("void w(inout int a) {", "void o(int b, out int a) {", "int q(int a[2]) {"),
]
GOOD_LOOPS = ["for (int i = 0; i < 3; i++) {", "for (int j = 0; j < 70; j++) {", "for(int i=0;i<5;i++){"]
BAD_LOOPS = [
    "2for (int i = 0; i < 3; i++) {",
    "x.for\t(int j=0;j<2;j++)\r\n{",
    "3for(int kk = 0; kk < 9; kk++) {",
    "for (int i = 0; i < n; i++) {",
    "for (int for = 0; for < 2; for++) {",
    "for (int i = 0; i < 4; i += 1) {",
]
GOOD = [
    *("f(1);", "g();", "h(vec4(0.0));", "k(x);", "fori(1);", "int(i);", "x = i;", "int format = i;"),
    *("w(x);", "o(i, x);", "w(x[1]);", "f(g());", "w((i));", "o(int(i), x);", "w(f(i));"),
    *("float a[4096];", "int b[3];", "gl_FragData[0] = v;"),
    *("i == 2;", "return 1;", "/* c */", "// note\n", "float y = 0.5;", "{ x = 1; }", "2i + 1;"),
]
BAD = [
    *("main();", "i++;", "++i;", "i = 2;", "j += 1;", "i--;", "j <<= 1;", "2i = 1;", "while (true) { }"),
    *("do { } while (false);", "{", "}", "(", ")", ") {", "for", "#define X 1\n", "x = y\\\n;"),
    *(
        "3(x);",
        "((1));",
        "f(a)(b);",
        "a+(b);",
        "3 (x);",
        "f)(;",
        "){",
        ")\r\n{",
        "kk++;",
        "x.i = 1;",
        "1i++;",
    ),
]
SEPARATORS = st.sampled_from(["", " ", "\n", "\t", "\r\n"])


def _program(statements: list[str], loops: list[str]) -> st.SearchStrategy[str]:
    statement = st.recursive(
        st.sampled_from(statements),
        lambda inner: st.builds(
            lambda head, body, sep: head + sep + sep.join(body) + sep + "}",
            st.sampled_from(loops),
            st.lists(inner, max_size=4),
            SEPARATORS,
        ),
        max_leaves=8,
    )
    function = st.builds(
        lambda head, body, sep: head + sep + sep.join(body) + sep + "}\n",
        st.sampled_from(HEADERS),
        st.lists(statement, max_size=5),
        SEPARATORS,
    )
    return st.builds("\n".join, st.lists(function, max_size=5))


@settings(max_examples=200, deadline=None)
@given(st.one_of(_program(GOOD, GOOD_LOOPS), _program(GOOD * 4 + BAD, GOOD_LOOPS * 4 + BAD_LOOPS)))
def test_same_bounds_and_errors_as_the_plain_scan(source: str) -> None:
    assert _outcome(shader_loop_bound, source) == _outcome(reference_loop_bound, source)


def test_same_bounds_on_compiled_shaders() -> None:
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))
    prog = glcomp.compile(model, {"x": (8, 1, 8, 8)}, nn.CrossEntropyLoss(), optim.Adam(lr=1e-3))
    bundle = build_bundle(prog)
    shaders = list(bundle.shaders.values())
    assert max(shader_loop_bound(s, "t") for s in shaders) > 0
    for source in shaders:
        assert shader_loop_bound(source, "t") == reference_loop_bound(source, "t")


PARAMETER_CALLS = [
    "int k(int a[(2)]) { for (int i = 0; i < 1000; i++) {} return 0; }\nvoid main() { int x[2]; k(x); }",
    "int k(int a[abs(2)]) { for (int i = 0; i < 1000; i++) {} return 0; }\nvoid main() { int x[2]; k(x); }",
    "int k(int a[abs(-2)]) { for (int i = 0; i < 10; i++) {} return 0; }\n"
    "void main() { int x[2]; for (int j = 0; j < 100; j++) { k(x); } }",
]


def test_calls_in_a_parameter_list_do_not_hide_a_function() -> None:
    """The loops of a function whose parameters hold parentheses or a call once counted 0 at its
    calls (the name inside the parameters was taken for the function's); brackets may hold only
    an integer literal now, so such parameters are refused, by both scans alike."""
    for source in PARAMETER_CALLS:
        text = "#version 300 es\n" + source
        for scan in (shader_loop_bound, reference_loop_bound):
            try:
                scan(text, "t")
            except GlcompError as err:
                assert "a bracket must hold one integer literal" in str(err)
            else:
                raise AssertionError(f"{scan.__name__} accepted {source!r}")


def test_arrays_are_bounded() -> None:
    """`float big[2147483647]` once loaded and ran at 16.5 GB: brackets hold integer literals
    adding up to at most MAX_ARRAY_ELEMENTS."""
    ok = "void main() { float a[4000]; int b[96]; a[0] = 1.0; }"
    assert shader_loop_bound(ok, "t") == reference_loop_bound(ok, "t") == 0
    for bad in (
        "void main() { float big[2147483647]; }",
        "void main() { float a[4000]; int b[97]; }",
        "const int N = 2147483647;\nvoid main() { float big[N]; }",
        "void main() { float big[46341 * 46341]; }",
        "void main() { float[99999999] big; }",
        "void main() { float a[2]; int i = 0; a[i] = 1.0; }",
    ):
        for scan in (shader_loop_bound, reference_loop_bound):
            try:
                scan(bad, "t")
            except GlcompError:
                continue
            raise AssertionError(f"{scan.__name__} accepted {bad!r}")
