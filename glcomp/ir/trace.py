"""Tracing: run a model's forward on symbolic tensors and record the IR graph.

The tracer knows no model classes: it takes any `Traceable` (glcomp.nn.Module is one; its
callers check the model's type) and binds the model's parameters and buffers through the
`TraceState` of the running trace, which modules read while they are called.
"""

from __future__ import annotations

import contextvars
import inspect
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.tensor import Tensor


@dataclass
class TraceState:
    """What a running trace binds: module paths, symbolic values of parameters and buffers,
    and the buffer updates (running statistics) that train-mode forwards produce."""

    paths: dict[int, str] = field(default_factory=dict)
    values: dict[tuple[int, str], Tensor] = field(default_factory=dict)
    buffer_updates: dict[str, Tensor] = field(default_factory=dict)
    graph: Any = None  # the graph being built (set by the first module call)
    random_calls: int = 0  # random ops traced so far: each gets a seed of its own


_TRACE: contextvars.ContextVar[TraceState | None] = contextvars.ContextVar("glcomp_trace", default=None)


def active_trace() -> TraceState | None:
    return _TRACE.get()


class Traceable(Protocol):
    """What the tracer needs of a model: its modules by path (each with ``_parameters``, name ->
    object with ``.data``, and ``_buffers``, name -> array), a train/eval switch, and a call
    running ``forward`` (whose signature names the inputs)."""

    training: bool

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Any]]: ...

    def train(self, mode: bool = True) -> Any: ...

    def forward(self, *args: Any, **kwargs: Any) -> Any: ...

    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...


def is_counter(value: np.ndarray) -> bool:
    """Integer buffers (BatchNorm's num_batches_tracked) are host-side counters, not tensors."""
    return np.issubdtype(np.asarray(value).dtype, np.integer)


def check_input_names(model: Traceable, shapes: dict[str, Any]) -> None:
    params = inspect.signature(model.forward).parameters
    names = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_kwargs = any(p.kind == p.VAR_KEYWORD for p in params.values())
    unknown = [n for n in shapes if n not in names and not takes_kwargs]
    if unknown:
        raise GlcompError(f"({type(model).__name__}): unknown input names {unknown}; forward() takes {names}")
    required = [
        n
        for n, p in params.items()
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    missing = [n for n in required if n not in shapes]
    if missing:
        raise GlcompError(f"({type(model).__name__}): no shape given for forward() inputs {missing}")


def _shape(name: str, value: Any) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in value)
    except TypeError:
        raise GlcompError(f"input {name!r}: shape must be a tuple of ints, got {value!r}") from None
    if any(s < 1 for s in shape):
        raise GlcompError(f"input {name!r}: every dimension must be positive, got {shape}")
    return shape


def trace_module(
    model: Traceable,
    input_shapes: dict[str, Any],
    training: bool = False,
    targets: dict[str, tuple[tuple[int, ...], str]] | None = None,
) -> tuple[Graph, TraceState, Any]:
    """Trace `model.forward` in train or eval mode.

    Returns the graph (inputs: data inputs, every float parameter as role ``param`` and every
    float buffer as role ``buffer``), the trace state (with any running-statistics updates) and
    the forward's raw result (Tensors in the graph). `targets` (name -> (shape, dtype)) are
    further forward() arguments bound to inputs of role ``target`` (a loss computed in forward).
    The caller checks that `model` is a model (a glcomp.nn.Module).
    """
    check_input_names(model, {**input_shapes, **(targets or {})})
    graph = Graph()
    state = TraceState()
    was_training = model.training
    model.train(training)
    try:
        for path, m in model.named_modules():
            state.paths[id(m)] = path
        args = {n: Tensor(graph, graph.add_input(n, _shape(n, s), "data")) for n, s in input_shapes.items()}
        for n, (shape, dtype) in (targets or {}).items():
            args[n] = Tensor(graph, graph.add_input(n, _shape(n, shape), "target", dtype))
        for path, m in model.named_modules():
            prefix = f"{path}." if path else ""
            for name, p in m._parameters.items():
                node = graph.add_input(prefix + name, p.data.shape, "param")
                state.values[(id(m), name)] = Tensor(graph, node)
            for name, b in m._buffers.items():
                if not is_counter(b):
                    node = graph.add_input(prefix + name, np.shape(b), "buffer")
                    state.values[(id(m), name)] = Tensor(graph, node)
        token = _TRACE.set(state)
        try:
            result = model(**args)
        finally:
            _TRACE.reset(token)
    finally:
        model.train(was_training)
    return graph, state, result


def set_outputs(graph: Graph, result: Any, owner: str) -> None:
    """Name the forward's result: ``output`` for a tensor, ``output.i`` for nested tuples."""

    def walk(value: Any, name: str) -> None:
        if isinstance(value, Tensor):
            graph.outputs[name] = value.node
        elif isinstance(value, tuple | list):
            for i, v in enumerate(value):
                walk(v, f"{name}.{i}")
        else:
            raise GlcompError(f"({owner}): forward() returned {type(value).__name__}, expected tensors")

    walk(result, "output")
