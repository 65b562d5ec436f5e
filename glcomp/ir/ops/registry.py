"""The op registry: every primitive is one frozen `Op` record holding all of its rules.

An op is defined once: its shape rule, its numpy reference, its gradient rule (written in IR ops,
so backward graphs use the same registry) and how the GL code generator renders it. Composite
operations (softmax, linear, sub-modules) are lowered to these primitives by the tracer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

# Kernel families understood by the code generator. A template exists per family.
KINDS = ("source", "elementwise", "reduce", "movement", "matmul", "conv", "pool", "index")
# Families whose ops run a loop per output element and root a kernel of their own.
LOOP_KINDS = ("reduce", "matmul", "conv", "pool")

Shapes = list[tuple[int, ...]]


class Emitter(Protocol):
    """What the GL renderer hands an op's kernel hooks (`spec`, `spec4`, `spec4t`, `emit`): the
    graph being rendered and accessors for the GLSL names of its nodes. Hooks are pure functions
    of these; the IR never imports the code generator."""

    graph: Any  # glcomp.ir.graph.Graph: op, attrs, shape and operands of every node
    unroll: int  # loop body repetition of the kernel being rendered
    webgl1: bool  # GLSL ES 1.00: no texture read under a divergent branch

    def fn(self, n: int) -> str:
        """The GLSL function computing node `n` element by element."""
        ...

    def call(self, n: int, args: list[str]) -> str:
        """A call of node `n`'s function at the index expressions `args`."""
        ...

    def fn4(self, n: int) -> str:
        """The name of node `n`'s vec4 function `vec4 f(int i0, ..., int j0)`, the elements
        (i0, ..., j0 + c) for c = 0..3, `j0` a multiple of 4; the kernel then defines it."""
        ...

    def call4(self, n: int, lead: list[str], j0: str) -> str:
        """A call of node `n`'s vec4 function: its elements (lead..., j0 + c) for c = 0..3, `j0` a
        multiple of 4 (components past the row end unspecified)."""
        ...

    def texel4t(self, src: int, col: str, j0: str) -> str | None:
        """A read of (src[j0 + c, col])_c for c = 0..3 (a column of a transposed operand) when
        `src` is a stored 2-D texture of the kernel on one page, else None."""
        ...

    def texture(self, n: int, textures: set[int]) -> dict[str, Any] | None:
        """Sampler and geometry of `n` when it is one of `textures` (the kernel's stored leaves)
        on a single page, or a row-preserving view of one; None otherwise."""
        ...

    def root4_head(self, n: int) -> dict[str, Any]:
        """The signature part of a `root4` spec for node `n` (params4, args4, last, row_len)."""
        ...


@dataclass(frozen=True)
class Op:
    """All the rules of one primitive.

    shape:     (*input_shapes, **attrs) -> output shape; raises GlcompError on bad input.
    reference: (*arrays, **attrs) -> ndarray; the numpy oracle (dtype follows the inputs).
    grad:      (g, out, *inputs, **attrs) -> one Tensor or None per input, None meaning
               "not differentiable in this input". None for ops with no gradient at all.
    kind:      kernel family (see KINDS); decides which template renders the op.
    glsl:      elementwise ops only: a GLSL expression over a, b, c (the operand values).
    glsl4:     elementwise ops whose `glsl` is not valid GLSL on vec4 operands (a ternary, a
               float literal where a vec4 is needed): the same expression over vec4 a, b, c,
               computing each component exactly as `glsl` computes it (j0: the index of the
               first component along the last axis). None: `glsl` is valid on vec4 as written.
    arity:     number of inputs, None for variadic ops.
    sample:    test-data hook: (draw) -> (input shapes, attrs) for property tests; None means
               the op is covered through the ops that build it (sources, for example).
    domain:    input domain for tests: "real", "positive" (log, sqrt) or "nonzero" (div).
    smooth:    False where finite differences are unreliable (kinks, comparisons).
    template:  the kernel template (templates/<template>.frag.j2) for ops that root a kernel
               of their own; elementwise, movement and index ops are fused into their readers.
    glsl_init: reductions and pooling: the accumulator's initial value (glsl combines it);
    glsl_final: the kernel's result from the accumulator (the template defines its constants).

    Kernel facts, read by the GL code generator (which holds no per-op table):
    cost:        work of computing one element once its operands are at hand, in simple
                 arithmetic ops (1: an add; transcendentals 2; 0 for ops that only move elements).
                 The planner stores a fused operand of a `rereads` op whose recomputation costs more
                 than a couple of ops.
    loop_extent: loop ops: (input shapes, attrs) -> the index count of the template's loop per
                 output element (the unit of the loop budget and of the MRT cost model).
    loop_reads:  loop ops whose loop body is not "read each operand once": (input shapes, attrs)
                 -> (iterations of an inner loop per outer iteration, evaluations of each operand
                 per outer iteration). None means (0, one read of each operand).
    spec:        loop ops: (emitter, node) -> the template parameters of the template's `root`
                 macro (besides params and unroll, which the renderer adds).
    spec4:       (emitter, node, textures) -> the parameters of the template's `root4` macro (a
                 whole output texel per call), or None where the node keeps the scalar path.
    spec4t:      like spec4, for the `root4t` macro (the texel of the transposed result).
    emit:        fused movement, index and constant ops: (emitter, node, index names) -> the
                 lines of the GLSL function body computing the element at those indices.
    emit4:       fused movement ops: (emitter, node, leading index names) -> the vec4 form of the
                 node, the texel (lead..., j0 + c)_c: (body lines, operands called through
                 `call4`, operands called through `call`), or None where the texel is no texel of
                 an operand (the renderer then gathers four scalar calls).
    view:        movement ops: attrs -> "flat" when the op keeps the elements in row-major order
                 (a reshape), "transpose" when it swaps the two axes of a matrix, else None.
    broadcast:   movement ops that read one operand element for several output elements.
    rereads:     loop ops that read every operand element for many output elements.
    feed:        sources whose value the runtime feeds (a texture or a uniform); other sources
                 are constants written into the shader.
    blend_add:   the value is the sum of its two operands, so draws may add terms by blending.
    """

    name: str
    kind: str
    shape: Callable[..., tuple[int, ...]]
    reference: Callable[..., Any]
    grad: Callable[..., tuple[Any, ...]] | None
    arity: int | None = 1
    glsl: str | None = None
    sample: Callable[..., tuple[list[tuple[int, ...]], dict[str, Any]]] | None = None
    domain: str = "real"
    smooth: bool = True
    attrs: tuple[str, ...] = field(default=())
    template: str | None = None
    glsl_init: str | None = None
    glsl_final: str = "acc"
    cost: int = 1
    loop_extent: Callable[[Shapes, dict[str, Any]], int] | None = None
    loop_reads: Callable[[Shapes, dict[str, Any]], tuple[int, tuple[int, ...]]] | None = None
    spec: Callable[[Emitter, int], dict[str, Any]] | None = None
    spec4: Callable[[Emitter, int, set[int]], dict[str, Any] | None] | None = None
    spec4t: Callable[[Emitter, int, set[int]], dict[str, Any] | None] | None = None
    emit: Callable[[Emitter, int, list[str]], list[str]] | None = None
    emit4: Callable[[Emitter, int, list[str]], tuple[list[str], list[int], list[int]] | None] | None = None
    view: Callable[[dict[str, Any]], str | None] | None = None
    broadcast: bool = False
    rereads: bool = False
    feed: bool = False
    blend_add: bool = False
    glsl4: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name!r}: unknown kind {self.kind!r}")
        if self.kind == "elementwise" and not self.glsl:
            raise ValueError(f"op {self.name!r}: elementwise ops need a glsl expression")
        if self.kind == "elementwise" and "?" in str(self.glsl) and not self.glsl4:
            raise ValueError(f"op {self.name!r}: a ternary is not valid on vec4 operands; give a glsl4 form")
        if self.kind in LOOP_KINDS and not (self.template and self.loop_extent and self.spec):
            raise ValueError(f"op {self.name!r}: {self.kind} ops need a template, a loop extent and a spec")


REGISTRY: dict[str, Op] = {}


def register(op: Op) -> Op:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name!r} registered twice")
    REGISTRY[op.name] = op
    return op


def get_op(name: str) -> Op:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None
