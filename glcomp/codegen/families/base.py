"""What every kernel family shares: the lowering record, the frozen render context its hooks
receive, the typed values they return, and the Jinja environment of the family templates.

An op's maths (shape, reference, gradient, cost, view facts) lives in its `glcomp.ir.ops` record;
how the GL code generator renders it lives here, in one `Lowering` per op, registered by the
module of its kernel family beside that family's template. Hooks are pure functions of a
`RenderContext`: what they read as vec4 functions or transposed texels they say in what they
return (`Fn4`, `Call4`, `Fetch4t`, `Vec4Body`), and the renderer collects it (`reads_of`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import jinja2

from glcomp.codegen.layout import Layout
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import REGISTRY, get_op
from glcomp.ir.ops.registry import LOOP_KINDS

Shapes = list[tuple[int, ...]]

# Op kinds computed inside the kernels that read them (one GLSL function per node) rather than
# as a loop of their own; a kernel rooted at one of them is a "map" kernel.
FUSED_KINDS = ("elementwise", "movement", "index", "source")

TEMPLATES = Path(__file__).resolve().parent  # each family's template beside its module


@dataclass
class Rendered:
    """A rendered shader and what a draw of it binds."""

    source: str
    samplers: list[tuple[str, int, int]]  # (uniform name, node, page)
    uniforms: list[tuple[str, str]]  # (uniform name, hyper-parameter name)
    ints: dict[str, int] = dataclasses.field(default_factory=dict)  # integer uniforms: their values


_SAFE = re.compile(r"[^A-Za-z0-9_.() \[\]-]")


def safe_comment(text: str) -> str:
    """`text` (a model part's name) reduced to characters that cannot end a GLSL comment."""
    return _SAFE.sub("_", text)[:120]


# -- typed values the hooks return ----------------------------------------------------------------
class Fn4(str):
    """The name of node `node`'s vec4 function (``v<node>_4``), which the kernel then defines."""

    node: int

    def __new__(cls, node: int) -> Fn4:
        obj = super().__new__(cls, f"v{node}_4")
        obj.node = node
        return obj


class Call4(str):
    """A call of node `node`'s vec4 function: its elements (lead..., j0 + c)_c."""

    node: int

    def __new__(cls, node: int, args: list[str]) -> Call4:
        obj = super().__new__(cls, f"v{node}_4({', '.join(args)})")
        obj.node = node
        return obj


class Fetch4t(str):
    """A read of (src[j0 + c, col])_c from the stored 2-D texture of `node` (``glc_fetcht_<node>``)."""

    node: int

    def __new__(cls, node: int, col: str, j0: str) -> Fetch4t:
        obj = super().__new__(cls, f"glc_fetcht_{node}({col}, {j0})")
        obj.node = node
        return obj


@dataclass(frozen=True)
class Texture:
    """A stored single-page texture a template reads directly: sampler `s`, its size `w` x `h`,
    `rt` texels per tensor row and `shift` = log2(w) where addresses may shift (else None)."""

    s: str
    w: int
    h: int
    rt: int
    shift: int | None


@dataclass(frozen=True)
class Vec4Body:
    """A fused node's vec4 function body (the texel (lead..., j0 + c)_c) and what it calls: nodes
    through their vec4 functions, nodes through their scalar functions; its `Fetch4t` reads are
    found in the lines' values (`reads_of`)."""

    lines: list[str]
    vec4: list[int]
    scalar: list[int]
    transposed: list[int] = dataclasses.field(default_factory=list)


def reads_of(value: Any) -> tuple[set[int], set[int]]:
    """The nodes a hook's result reads through vec4 functions and through transposed texel reads:
    every `Fn4`/`Call4` and `Fetch4t` in it, in dataclass fields, dicts, lists and tuples."""
    vec4: set[int] = set()
    trans: set[int] = set()
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, (Fn4, Call4)):
            vec4.add(v.node)
        elif isinstance(v, Fetch4t):
            trans.add(v.node)
        elif isinstance(v, Vec4Body):
            trans.update(v.transposed)
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            todo.extend(getattr(v, f.name) for f in dataclasses.fields(v))
        elif isinstance(v, dict):
            todo.extend(v.values())
        elif isinstance(v, (list, tuple)):
            todo.extend(v)
    return vec4, trans


def template_params(value: Any) -> dict[str, Any]:
    """A hook's result as the mapping the family template reads (fields by name, shallowly: nested
    typed values such as `Texture` stay objects the template reads by attribute)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    return dict(value)


# -- the render context -----------------------------------------------------------------------------
@dataclass(frozen=True)
class RenderContext:
    """What a family hook may know of the kernel being rendered: the graph, the layout of every
    stored node, the kernel's stored leaves read as textures, its loop body repetition and the
    dialect. Hooks read it and return values; they never change it."""

    graph: Graph
    layouts: dict[int, Layout]
    textures: frozenset[int]
    unroll: int
    webgl1: bool

    def fn(self, n: int) -> str:
        """The GLSL function computing node `n` element by element."""
        return f"v{n}"

    def call(self, n: int, args: list[str]) -> str:
        """A call of node `n`'s scalar function at the index expressions `args`."""
        return f"v{n}({', '.join(args)})"

    def fn4(self, n: int) -> Fn4:
        """Node `n`'s vec4 function `vec4 v<n>_4(int i0, ..., int j0)` (the elements (i0, ..., j0 + c)_c,
        `j0` a multiple of 4); returning it asks the kernel to define it."""
        return Fn4(n)

    def call4(self, n: int, lead: list[str], j0: str) -> Call4:
        """A call of node `n`'s vec4 function: its elements (lead..., j0 + c)_c."""
        return Call4(n, [*lead, j0])

    def shift(self, width: int) -> int | None:
        """log2 of a power-of-two texture `width` on GLSL ES 3.00 targets (addresses then divide
        with a shift and a mask), None otherwise (GLSL ES 1.00 has no integer bit operations)."""
        return None if self.webgl1 or width & (width - 1) else width.bit_length() - 1

    def view(self, n: int) -> str | None:
        """How node `n` views its operand ("flat", "transpose"; see Op.view), None for other ops."""
        rule = get_op(self.graph.op(n))
        return None if rule.view is None else rule.view(self.graph.attrs(n))

    def texture(self, n: int) -> Texture | None:
        """The texture of `n` when it is a stored single-page leaf of the kernel, or a fused reshape
        of one that keeps the last axis (the same rows, so the same texels); None otherwise."""
        g = self.graph
        while (
            n not in self.textures
            and self.view(n) == "flat"
            and g.shape(g.operands(n)[0])[-1:] == g.shape(n)[-1:]
        ):
            n = g.operands(n)[0]
        if n not in self.textures or self.layouts[n].pages != 1:
            return None
        lay = self.layouts[n]
        return Texture(f"s{n}_0", lay.width, lay.height, lay.row_texels, self.shift(lay.width))

    def texel4t(self, src: int, col: str, j0: str) -> Fetch4t | None:
        """The elements (src[j0 + c, col])_c of the kernel's stored 2-D leaf `src` (on one page):
        four texel reads, one per row (rows past the last clamped), and one component select for
        all four (`col` mod 4); None when `src` is no such leaf. A transposed operand then costs
        four reads, not four scalar fetches with an address computation and a select each."""
        if src not in self.textures or len(self.graph.shape(src)) != 2 or self.layouts[src].pages != 1:
            return None
        return Fetch4t(src, col, j0)

    def root4_head(self, n: int) -> dict[str, Any]:
        """The signature part of a vec4 root of node `n`: params4, args4, last, row_len."""
        rank = len(self.graph.shape(n))
        lead = [f"i{k}" for k in range(rank - 1)]
        return {
            "params4": ", ".join([f"int {a}" for a in lead] + ["int j0"]),
            "args4": ", ".join([*lead, "j0"]),
            "last": f"i{rank - 1}",
            "row_len": self.graph.shape(n)[-1],
        }


# -- the lowering record ----------------------------------------------------------------------------
RootHook = Callable[[RenderContext, int], Any]
Root4Hook = Callable[[RenderContext, int], Any | None]


@dataclass(frozen=True)
class Lowering:
    """How the GL code generator renders one op.

    template:    the family template (`<template>.frag.j2` beside the family module) whose `root`
                 macro computes a node of the op as a render target; "map" for fused ops.
    loop_extent: loop ops: (input shapes, attrs) -> the index count of the template's loop per
                 output element (the unit of the loop budget and of the MRT cost model).
    loop_reads:  loop ops whose loop body is not "read each operand once": (input shapes, attrs)
                 -> (iterations of an inner loop per outer iteration, evaluations of each operand
                 per outer iteration). None means (0, one read of each operand).
    root:        loop ops: (context, node) -> the parameters of the template's `root` macro
                 (besides params and unroll, which the renderer adds).
    root4:       (context, node) -> the parameters of the template's `root4` macro (a whole output
                 texel per call), or None where the node keeps the scalar path.
    root4t:      like root4, for the `root4t` macro (the texel of the transposed 2-D result).
    emit:        fused ops: (context, node, index names) -> the lines of the GLSL function body
                 computing the element at those indices.
    emit4:       fused ops: (context, node, leading index names) -> the vec4 form of the node, or
                 None where the texel is no texel of an operand (the renderer then gathers four
                 scalar calls).
    tiled:       loop ops with a register-blocked form: (graph, kernel, layouts, target, extra
                 draws) -> its tiling (an object with the Tiling interface: tiles, tile_layout,
                 render, R, C, S) where the cost model says it pays, else None.
    tiled_template: the template of that form (beside the family module).
    """

    op: str
    template: str
    loop_extent: Callable[[Shapes, dict[str, Any]], int] | None = None
    loop_reads: Callable[[Shapes, dict[str, Any]], tuple[int, tuple[int, ...]]] | None = None
    root: RootHook | None = None
    root4: Root4Hook | None = None
    root4t: Root4Hook | None = None
    emit: Callable[[RenderContext, int, list[str]], list[str]] | None = None
    emit4: Callable[[RenderContext, int, list[str]], Vec4Body | None] | None = None
    tiled: Callable[..., Any] | None = None
    tiled_template: str | None = None

    def __post_init__(self) -> None:
        kind = get_op(self.op).kind
        if kind in LOOP_KINDS and not (self.loop_extent and self.root and self.template != "map"):
            raise ValueError(f"op {self.op!r}: a {kind} lowering needs a template, a loop extent and a root")
        if kind in FUSED_KINDS and (self.template != "map" or self.loop_extent or self.root or self.root4):
            raise ValueError(
                f"op {self.op!r}: {kind} ops are fused into their readers (template map, no loop)"
            )


def texel_params(lay: Any) -> dict[str, Any]:
    """A single-page texture as the tiled templates address it: width, log2 width, texels a row."""
    return {"w": lay.width, "shift": lay.width.bit_length() - 1, "rt": lay.row_texels}


LOWERINGS: dict[str, Lowering] = {}


def register(lowering: Lowering) -> Lowering:
    """Register the lowering of one op; an op has at most one."""
    if lowering.op not in REGISTRY:
        raise ValueError(f"lowering of unknown op {lowering.op!r}")
    if lowering.op in LOWERINGS:
        raise ValueError(f"op {lowering.op!r} lowered twice")
    LOWERINGS[lowering.op] = lowering
    return lowering


def lowering(op: str) -> Lowering | None:
    """The lowering of `op`, None for ops without one (elementwise ops render from their record's
    GLSL expression, fed sources from their texture)."""
    return LOWERINGS.get(op)


def is_fused(graph: Graph, n: int) -> bool:
    """Whether node `n` is computed inside the kernels that read it (no loop of its own)."""
    return get_op(graph.op(n)).kind in FUSED_KINDS


def template_of(op: str) -> str:
    """The family template whose `root` macro computes a node of `op` as a render target."""
    low = LOWERINGS.get(op)
    if low is None:
        if get_op(op).kind in FUSED_KINDS:
            return "map"
        raise GlcompError(f"no kernel template for op {op!r}")
    return low.template


def loop_extent(graph: Graph, n: int) -> int:
    """The index count of loop node `n`'s template loop (its lowering's `loop_extent`)."""
    low = LOWERINGS.get(graph.op(n))
    if low is None or low.loop_extent is None:
        raise GlcompError(f"no loop model for op {graph.op(n)!r} (node %{n})")
    return low.loop_extent([graph.shape(i) for i in graph.operands(n)], graph.attrs(n))


# -- templates ---------------------------------------------------------------------------------------
_DICT_ATTRIBUTES = frozenset(dir(dict))


class _Environment(jinja2.Environment):
    """Jinja's environment, reading ``x.name`` of a dict (every context value the renderer
    builds) as ``x["name"]`` at once where ``name`` is no attribute of dicts: what Jinja's own
    lookup returns after a failed attribute lookup, without raising AttributeError first."""

    def getattr(self, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                pass
        return super().getattr(obj, attribute)


@cache
def environment() -> jinja2.Environment:
    """The Jinja environment of the family templates (strict: a missing value is a bug)."""
    return _Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,  # a template asking for a missing value is a bug
        trim_blocks=False,
        keep_trailing_newline=True,
        auto_reload=False,  # templates do not change while a process runs: no stat per render
    )
