"""`glcomp.compile`: trace a model and build the predict, gradients and train-step graphs."""

from __future__ import annotations

from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph, origin
from glcomp.ir.passes import autodiff
from glcomp.ir.tensor import Tensor, maximum
from glcomp.ir.trace import is_counter, set_outputs, trace_module
from glcomp.nn.module import _TRACE, Module
from glcomp.optim import Optimizer
from glcomp.program import InputSpec, Program

TARGETS = ("webgl2", "webgl1")


def compile(  # noqa: A001 - the public name mirrors torch.compile
    model: Module,
    inputs: dict[str, Any],
    loss: Module | None = None,
    optimizer: Optimizer | None = None,
    *,
    target: str = "webgl2",
    target_name: str = "y",
    clip_grad_value: float | None = None,
    clip_grad_norm: float | None = None,
    **options: Any,
) -> Program:
    """Compile `model` for the given input shapes.

    Without `loss` only `predict` exists. With `loss`, `gradients` (loss and parameter
    gradients, train mode, no update) exists too, and with `optimizer` also `train_step`
    (loss, then new parameters, optimizer state and running statistics), all as graphs.
    `clip_grad_value` clamps each gradient element to [-v, v] and `clip_grad_norm` rescales
    all gradients so their global L2 norm is at most the value (torch's clip_grad_norm_), both
    inside the train step. Extra `options` are kept for the code generator: target limits
    (max_texture_size, max_draw_buffers, max_texture_units, max_loop_iterations) and
    ``passes={"fusion": ..., "mrt": ..., "memplan": ...}`` to switch passes off.
    """
    _check_arguments(model, inputs, loss, optimizer, target, target_name, clip_grad_value, clip_grad_norm)
    _check_options(options)
    graphs: dict[str, Graph] = {}

    predict, _, result = trace_module(model, inputs, training=False)
    set_outputs(predict, result, type(model).__name__)
    graphs["predict"] = _finish(predict)
    data = {n: InputSpec(n, predict.shape(predict.inputs[n])) for n in inputs}
    params = {k: p.data.copy() for k, p in model.named_parameters()}
    buffers = {k: np.asarray(b, np.float32).copy() for k, b in model.named_buffers() if not is_counter(b)}
    counters = {k: np.array(b).copy() for k, b in model.named_buffers() if is_counter(b)}
    trainable = _trainable(model, optimizer)
    program = Program(graphs, data, None, params, trainable, buffers, counters, {}, 0.0, dict(options))
    program.options["target"] = target
    if loss is None:
        if optimizer is not None:
            raise GlcompError("an optimizer needs a loss: pass loss=nn.CrossEntropyLoss() or similar")
        return program

    graph, state, result = trace_module(model, inputs, training=True)
    if not isinstance(result, Tensor):
        raise GlcompError(f"({type(model).__name__}): a loss needs forward() to return one tensor")
    spec = loss.target_spec(result.shape)
    if target_name in inputs:
        raise GlcompError(f"target name {target_name!r} is also a model input; pass target_name=")
    program.target = InputSpec(target_name, tuple(spec["shape"]), spec["dtype"], spec.get("num_classes"))
    y = Tensor(graph, graph.add_input(target_name, program.target.shape, "target", spec["dtype"]))
    token = _TRACE.set(state)  # a loss module is called like any module
    try:
        state.paths.setdefault(id(loss), "loss")
        value = loss(result, y)
    finally:
        _TRACE.reset(token)
    if not isinstance(value, Tensor) or value.shape != ():
        raise GlcompError(f"loss ({type(loss).__name__}) must return a scalar; use reduction='mean'")
    graph.outputs["loss"] = value.node
    if not trainable:
        raise GlcompError("no parameter has requires_grad=True: nothing to train")
    grads = autodiff(graph, "loss", trainable)
    graphs["gradients"] = _finish(_only(grads, ["loss"] + [f"grad:{n}" for n in trainable]))
    if optimizer is None:
        return program

    program.lr = optimizer.lr
    train = grads
    _clip(train, trainable, clip_grad_value, clip_grad_norm)
    for name, tensor in state.buffer_updates.items():
        train.outputs[f"buffer:{name}"] = tensor.node
    with origin(f"optimizer ({type(optimizer).__name__})"):
        lr = Tensor(train, train.add_input("lr", (), "hyper"))
        scalars = {}
        for key, initial in optimizer.scalars().items():
            scalars[key] = Tensor(train, train.add_input(f"opt.{key}", (), "state"))
            program.opt_state[f"opt.{key}"] = np.full((), initial, np.float32)
        shared = optimizer.advance(scalars)
        for key in scalars:
            train.outputs[f"state:opt.{key}"] = shared[key].node
        for name in trainable:
            p = Tensor(train, train.inputs[name])
            g = Tensor(train, train.outputs[f"grad:{name}"])
            slots = {}
            for slot in optimizer.slots():
                key = f"opt.{name}.{slot}"
                slots[slot] = Tensor(train, train.add_input(key, p.shape, "state"))
                program.opt_state[key] = np.zeros(p.shape, np.float32)
            new_p, new_slots = optimizer.update(p, g, slots, lr, shared)
            train.outputs[f"param:{name}"] = new_p.node
            for slot, t in new_slots.items():
                train.outputs[f"state:opt.{name}.{slot}"] = t.node
    keep = ["loss"] + [k for k in train.outputs if k.split(":")[0] in ("param", "state", "buffer")]
    graphs["train_step"] = _finish(_only(train, keep))
    return program


def _what(value: Any) -> str:
    return f"the class {value.__name__}" if isinstance(value, type) else f"a {type(value).__name__}"


def _check_arguments(
    model: Any,
    inputs: Any,
    loss: Any,
    optimizer: Any,
    target: Any,
    target_name: Any,
    clip_value: Any,
    clip_norm: Any,
) -> None:
    """Every argument of `compile` checked up front, each mistake named (GlcompError)."""
    from glcomp.nn.layers import _Loss

    if isinstance(model, type) and issubclass(model, Module):
        raise GlcompError(f"model: got the class {model.__name__}; pass an instance, e.g. {model.__name__}()")
    if not isinstance(model, Module):
        raise GlcompError(f"model must be a glcomp.nn.Module instance, got {_what(model)}")
    if not isinstance(inputs, dict) or not inputs:
        raise GlcompError(
            "inputs must be a non-empty dict of input name -> shape, e.g. {'x': (64, 784)}; "
            f"got {_what(inputs)}"
        )
    for name, shape in inputs.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise GlcompError(f"inputs: name {name!r} must be a string naming a forward() argument")
        dims = shape.shape if isinstance(shape, np.ndarray) else shape
        if not isinstance(dims, tuple | list) or not all(
            isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims
        ):
            raise GlcompError(
                f"inputs[{name!r}] must be a shape (a tuple of ints, batch first), got {shape!r}"
            )
    for what, value, base, example in (
        ("loss", loss, _Loss, "nn.CrossEntropyLoss()"),
        ("optimizer", optimizer, Optimizer, "optim.Adam(lr=1e-3)"),
    ):
        if value is None:
            continue
        if isinstance(value, type):
            hint = f"{value.__name__}()" if issubclass(value, base) else example
            raise GlcompError(f"{what}: got the class {value.__name__}; pass an instance, e.g. {what}={hint}")
        if not isinstance(value, base):
            kind = "glcomp.nn loss module" if what == "loss" else "glcomp.optim optimizer"
            raise GlcompError(f"{what} must be a {kind} such as {example}, got {_what(value)} {value!r:.60}")
    if not isinstance(target, str) or target not in TARGETS:
        raise GlcompError(f"unknown target {target!r}; use one of {TARGETS}")
    if not isinstance(target_name, str) or not target_name.isidentifier():
        raise GlcompError(f"target_name must be a name such as 'y', got {target_name!r}")
    for what, value in (("clip_grad_value", clip_value), ("clip_grad_norm", clip_norm)):
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise GlcompError(f"{what} must be a positive number or None, got {value!r}")
        if value is not None and optimizer is None:
            raise GlcompError(f"{what} applies to the train step: it needs an optimizer")


def _check_options(options: dict[str, Any]) -> None:
    """Target limits and ``passes`` as the code generator understands them (checked now, not
    when a GL runtime is first built)."""
    from glcomp.codegen.bundle import PASSES
    from glcomp.codegen.target import Target

    limits = set(Target.__dataclass_fields__) - {"name", "glsl_version"}
    unknown = sorted(set(options) - limits - {"passes"})
    if unknown:
        raise GlcompError(f"unknown compile options {unknown}; known: {sorted(limits | {'passes'})}")
    for key in set(options) & limits:
        value, kind = options[key], Target.__dataclass_fields__[key].type
        if kind in (bool, "bool"):
            if not isinstance(value, bool | np.bool_):
                raise GlcompError(f"{key} must be True or False, got {value!r}")
        elif not isinstance(value, int | np.integer) or isinstance(value, bool) or value < 1:
            raise GlcompError(f"{key} must be a positive int, got {value!r}")
    passes = options.get("passes")
    if passes is not None:
        if not isinstance(passes, dict):
            raise GlcompError(f"passes must be a dict such as {{'fusion': False}}, got {_what(passes)}")
        bad = sorted(set(passes) - set(PASSES))
        if bad:
            raise GlcompError(f"unknown passes {bad}; known: {sorted(PASSES)}")


def _clip(graph: Graph, names: list[str], value: float | None, norm: float | None) -> None:
    """Rewrite the ``grad:`` outputs of `graph` with gradient clipping applied."""
    keys = [f"grad:{n}" for n in names]
    with origin("gradient clipping"):
        grads = {k: Tensor(graph, graph.outputs[k]) for k in keys}
        if value is not None:
            if value <= 0:
                raise GlcompError(f"clip_grad_value must be positive, got {value}")
            # clamp(g, -v, v) = -max(-max(g, -v), -v): built from the maximum primitive.
            grads = {k: -maximum(-maximum(g, -value), -value) for k, g in grads.items()}
        if norm is not None:
            if norm <= 0:
                raise GlcompError(f"clip_grad_norm must be positive, got {norm}")
            total = sum((g * g).sum() for g in grads.values()).sqrt()
            coef = -maximum(-(norm / (total + 1e-6)), -1.0)  # min(max_norm / (norm + eps), 1)
            grads = {k: g * coef for k, g in grads.items()}
        for k, g in grads.items():
            graph.outputs[k] = g.node


def _trainable(model: Module, optimizer: Optimizer | None) -> list[str]:
    chosen = None
    if optimizer is not None and optimizer.params is not None:
        chosen = {id(p) for p in optimizer.params}
    return [k for k, p in model.named_parameters() if p.requires_grad and (chosen is None or id(p) in chosen)]


def _only(graph: Graph, names: list[str]) -> Graph:
    g = graph.copy()
    g.outputs = {k: graph.outputs[k] for k in names}
    return g


def _finish(graph: Graph) -> Graph:
    graph = graph.prune()
    graph.validate()
    return graph
