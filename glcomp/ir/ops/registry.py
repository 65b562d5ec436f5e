"""The op registry: every primitive is one frozen `Op` record holding its maths.

An op is defined once: its shape rule, its numpy reference, its gradient rule (written in IR ops,
so backward graphs use the same registry), its cost and view facts and, for elementwise ops, its
one-line GLSL expression. How the GL code generator renders an op lives in the code generator
(glcomp.codegen.families), never here. Composite operations (softmax, linear, sub-modules) are
lowered to these primitives by the tracer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Kinds of op: how an op computes an element from its operands.
KINDS = ("source", "elementwise", "reduce", "movement", "matmul", "conv", "pool", "index")
# Kinds whose ops combine many operand elements per output element (a loop over them).
LOOP_KINDS = ("reduce", "matmul", "conv", "pool")


@dataclass(frozen=True)
class Op:
    """All the rules of one primitive.

    shape:     (*input_shapes, **attrs) -> output shape; raises GlcompError on bad input.
    reference: (*arrays, **attrs) -> ndarray; the numpy oracle (dtype follows the inputs).
    grad:      (g, out, *inputs, **attrs) -> one Tensor or None per input, None meaning
               "not differentiable in this input". None for ops with no gradient at all.
    kind:      how the op computes an element (see KINDS).
    glsl:      elementwise ops only: a GLSL expression over a, b, c (the operand values).
    glsl4:     elementwise ops whose `glsl` is not valid GLSL on vec4 operands (a ternary, a
               float literal where a vec4 is needed): the same expression over vec4 a, b, c,
               computing each component exactly as `glsl` computes it (j0: the index of the
               first component along the last axis). None: `glsl` is valid on vec4 as written.
    arity:     number of inputs, None for variadic ops.
    sample:    test-data hook: (draw) -> (input shapes, attrs) for property tests; None means
               the op is covered through the ops that build it (sources, for example).
    domain:    input domain for tests: "real", "positive" (log, sqrt), "nonzero" (div) or
               "bytes" (k / 255: what an RGBA8 frame holds, for `preprocess`).
    smooth:    False where finite differences are unreliable (kinks, comparisons).
    cost:      work of computing one element once its operands are at hand, in simple
               arithmetic ops (1: an add; transcendentals 2; 0 for ops that only move elements).
               The planner stores a fused operand of a `rereads` op whose recomputation costs more
               than a couple of ops.
    view:      movement ops: attrs -> "flat" when the op keeps the elements in row-major order
               (a reshape), "transpose" when it swaps the two axes of a matrix,
               "batch_transpose" when it swaps the last two of a batch of matrices, else None.
    broadcast: movement ops that read one operand element for several output elements.
    rereads:   loop ops that read every operand element for many output elements.
    feed:      sources whose value the runtime feeds (a texture or a uniform); other sources
               are constants written into the shader.
    blend_add: the value is the sum of its two operands, so draws may add terms by blending.
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
    cost: int = 1
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
        if self.glsl is not None and self.kind != "elementwise":
            raise ValueError(f"op {self.name!r}: only elementwise ops carry a glsl expression")


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
