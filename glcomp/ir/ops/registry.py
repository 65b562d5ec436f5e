"""The op registry: every primitive is one frozen `Op` record holding all of its rules.

An op is defined once: its shape rule, its numpy reference, its gradient rule (written in IR ops,
so backward graphs use the same registry) and how the GL code generator renders it. Composite
operations (softmax, linear, sub-modules) are lowered to these primitives by the tracer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# Kernel families understood by the code generator. A template exists per family.
KINDS = ("source", "elementwise", "reduce", "movement", "matmul", "conv", "pool", "index")


@dataclass(frozen=True)
class Op:
    """All the rules of one primitive.

    shape:     (*input_shapes, **attrs) -> output shape; raises GlcompError on bad input.
    reference: (*arrays, **attrs) -> ndarray; the numpy oracle (dtype follows the inputs).
    grad:      (g, out, *inputs, **attrs) -> one Tensor or None per input, None meaning
               "not differentiable in this input". None for ops with no gradient at all.
    kind:      kernel family (see KINDS); decides which template renders the op.
    glsl:      elementwise ops only: a GLSL expression over a, b, c (the operand values).
    arity:     number of inputs, None for variadic ops.
    sample:    test-data hook: (draw) -> (input shapes, attrs) for property tests; None means
               the op is covered through the ops that build it (sources, for example).
    domain:    input domain for tests: "real", "positive" (log, sqrt) or "nonzero" (div).
    smooth:    False where finite differences are unreliable (kinks, comparisons).
    template:  the kernel template (templates/<template>.frag.j2) for ops that root a kernel
               of their own; elementwise, movement and index ops are fused into their readers.
    glsl_init: reductions and pooling: the accumulator's initial value (glsl combines it);
    glsl_final: the kernel's result from the accumulator (the template defines its constants).
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

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name!r}: unknown kind {self.kind!r}")
        if self.kind == "elementwise" and not self.glsl:
            raise ValueError(f"op {self.name!r}: elementwise ops need a glsl expression")
        if self.kind in ("reduce", "matmul", "conv", "pool") and not self.template:
            raise ValueError(f"op {self.name!r}: {self.kind} ops need a kernel template")


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
