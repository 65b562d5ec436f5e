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
    if target not in TARGETS:
        raise GlcompError(f"unknown target {target!r}; use one of {TARGETS}")
    if not isinstance(inputs, dict) or not inputs:
        raise GlcompError("inputs must be a dict of input name -> shape, e.g. {'x': (64, 784)}")
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
        step = None
        if optimizer.uses_step():
            step = Tensor(train, train.add_input("opt.step", (), "state")) + 1.0
            train.outputs["state:opt.step"] = step.node
            program.opt_state["opt.step"] = np.zeros((), np.float32)
        for name in trainable:
            p = Tensor(train, train.inputs[name])
            g = Tensor(train, train.outputs[f"grad:{name}"])
            slots = {}
            for slot in optimizer.slots():
                key = f"opt.{name}.{slot}"
                slots[slot] = Tensor(train, train.add_input(key, p.shape, "state"))
                program.opt_state[key] = np.zeros(p.shape, np.float32)
            new_p, new_slots = optimizer.update(p, g, slots, lr, step)
            train.outputs[f"param:{name}"] = new_p.node
            for slot, t in new_slots.items():
                train.outputs[f"state:opt.{name}.{slot}"] = t.node
    keep = ["loss"] + [k for k in train.outputs if k.split(":")[0] in ("param", "state", "buffer")]
    graphs["train_step"] = _finish(_only(train, keep))
    return program


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
