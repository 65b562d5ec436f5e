"""`glcomp.compile`: trace a model and build the predict, gradients and train-step graphs;
`glcomp.trace`: trace a model into one graph."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.gcpause import gc_paused
from glcomp.ir.graph import Graph, origin
from glcomp.ir.passes import autodiff
from glcomp.ir.tensor import Tensor, maximum
from glcomp.ir.trace import _TRACE, is_counter, set_outputs, trace_module
from glcomp.nn.functional import RNG_STEP
from glcomp.nn.module import Module
from glcomp.optim import Optimizer
from glcomp.program import InputSpec, Program
from glcomp.transforms.preprocess import ImageInput, declared_images


def compile(  # noqa: A001 - the public name mirrors torch.compile
    model: Module,
    inputs: dict[str, Any],
    loss: Module | Callable[..., Any] | str | None = None,
    optimizer: Optimizer | None = None,
    *,
    target: str = "webgl2",
    target_name: str = "y",
    target_spec: Any = None,
    clip_grad_value: float | None = None,
    clip_grad_norm: float | None = None,
    dump_after: str | None = None,
    transforms: Any = None,
    carry: dict[str, str] | None = None,
    carry_predict: bool = False,
    **options: Any,
) -> Program:
    """Compile `model` for the given input shapes.

    Without `loss` only `predict` exists. With `loss`, `gradients` (loss and parameter
    gradients, train mode, no update) exists too, and with `optimizer` also `train_step`
    (loss, then new parameters, optimizer state and running statistics), all as graphs.

    `loss` is a loss module (``nn.CrossEntropyLoss()``), a function of (output, target) such as
    ``F.cross_entropy`` or your own (one taking more required arguments is called as
    ``loss(output[0], target, *output[1:])`` when forward returns a tuple, as the VAE example's
    ``loss_function(recon_x, x, mu, logvar)``), or ``"forward"``: then forward() takes the target as its
    argument named `target_name` and returns the loss itself, alone or in a tuple (the one 0-d
    tensor in it, else the last element), as minGPT's ``forward(idx, targets)`` does; predict
    calls forward without the target, and None entries of its result are dropped. When forward
    returns a tuple and the loss is separate, the loss applies to the first element.
    The target's shape and dtype come from the loss (class labels for cross_entropy/nll_loss,
    else a float tensor shaped like the output) unless `target_spec` gives them: a shape (float
    target) or ``{"shape": ..., "dtype": "int32", "num_classes": C}`` (required for "forward").
    `clip_grad_value` clamps each gradient element to [-v, v] and `clip_grad_norm` rescales
    all gradients so their global L2 norm is at most the value (torch's clip_grad_norm_), both
    inside the train step. Extra `options` are kept for the code generator: target limits
    (max_texture_size, max_draw_buffers, max_texture_units, max_loop_iterations) and
    ``passes={"fusion": ..., "mrt": ..., "memplan": ...}`` to switch passes off, and
    ``storage="f32"|"f16"|"rgba8"``: the texel format of textures (see
    glcomp.codegen.options.STORAGE; parameters and optimizer state always hold float32: RGBA32F,
    or their exact bytes in RGBA8 texels with "rgba8"), and ``inspect=[names]``: tensors kept
    readable by ``rt.inspect(name)`` at any step (docs/inspect.md).
    Unknown options and ill-typed values raise GlcompError listing the valid ones
    (glcomp.codegen.options.CompileOptions). `dump_after` names a code-generation pass
    (glcomp.codegen.pipeline.PASS_NAMES): the program is then lowered at once and the kernel plan
    of each entry point printed after that pass. `transforms` (glcomp.transforms modules) augments
    inputs in the train-mode graphs (gradients, train_step) and is the identity in predict: a
    module or a list of them for the one input, or a dict input name -> module or list
    (see docs/transforms.md).

    `carry` makes inputs recurrent state carried across batches, as torch's word-language-model
    loop does with ``hidden = repackage_hidden(hidden)``: a dict input name -> the name of the
    forward result holding that input's next value, named as predict names its outputs
    (``{"h0": "output.1.0", "c0": "output.1.1"}`` for a forward returning ``(out, (h, c))``).
    Each carried input becomes a buffer named like the input (zeros at start, not fed by the
    caller): every entry point reads it, train_step writes the forward's final state into it
    (detached: no gradient flows into the previous batch), and with ``carry_predict=True`` predict
    writes it too (generation carrying the state). It is in ``rt.state_dict()`` and saved bundles,
    set by ``load_state_dict`` and zeroed by ``rt.reset_state()`` (docs/porting.md).
    """
    _check_arguments(model, inputs, loss, optimizer, target, target_name, clip_grad_value, clip_grad_norm)
    _check_carry(carry, carry_predict, inputs)
    compile_options = _check_options(options, target)  # the one parse of the options
    if dump_after is not None:
        from glcomp.codegen.pipeline import check_pass_name

        check_pass_name(dump_after)
    clip = (clip_grad_value, clip_grad_norm)
    if transforms is not None:
        from glcomp.transforms.compose import input_transforms

        options["transforms"] = input_transforms(transforms, inputs)
    with gc_paused():  # see glcomp.ir.gcpause
        program = _compile(
            model,
            inputs,
            loss,
            optimizer,
            target,
            target_name,
            target_spec,
            *clip,
            options,
            carry,
            carry_predict,
        )
    program = dataclasses.replace(program, typed_options=compile_options)
    if dump_after is not None:
        program._lowered(dump_after=dump_after)  # lowered now, printing the plans
    return program


def _compile(
    model: Module,
    inputs: dict[str, Any],
    loss: Any,
    optimizer: Optimizer | None,
    target: str,
    target_name: str,
    target_spec: Any,
    clip_grad_value: float | None,
    clip_grad_norm: float | None,
    options: dict[str, Any],
    carry: dict[str, str] | None = None,
    carry_predict: bool = False,
) -> Program:
    """`compile` after its arguments are checked: trace and differentiate."""
    carry = dict(carry or {})
    graphs: dict[str, Graph] = {}
    in_forward = _is_forward(loss)
    traced: Any = model
    if "transforms" in options:
        from glcomp.transforms.compose import Augmented

        traced = Augmented(model, options.pop("transforms"))

    with declared_images(inputs):  # inputs declared with glcomp.transforms.image_input
        predict, _, result = trace_module(model, inputs, training=False)
    set_outputs(predict, _without_none(result), type(model).__name__)
    _carried(predict, carry, "predict", write=carry_predict)
    graphs["predict"] = _finish(predict)
    data = {
        n: InputSpec(n, predict.shape(predict.inputs[n]), image=_image_of(inputs[n], n, options))
        for n in inputs
        if n not in carry
    }
    params = {k: p.data.copy() for k, p in model.named_parameters()}
    buffers = {k: np.asarray(b, np.float32).copy() for k, b in model.named_buffers() if not is_counter(b)}
    if carry:
        taken = sorted(set(carry) & (set(params) | set(buffers)))
        if taken:
            raise GlcompError(f"carry: {taken} also name a parameter or buffer of the model; rename them")
        buffers |= {n: np.zeros(predict.shape(predict.inputs[n]), np.float32) for n in carry}
        options["carry"] = carry
        if carry_predict:
            options["carry_predict"] = True
    counters = {k: np.array(b).copy() for k, b in model.named_buffers() if is_counter(b)}
    trainable = _trainable(model, optimizer)
    program = Program(graphs, data, None, params, trainable, buffers, counters, {}, 0.0, dict(options))
    program.options["target"] = target
    if RNG_STEP in predict.inputs:  # random ops in eval mode (F.dropout's default training=True)
        program.opt_state[RNG_STEP] = np.zeros((), np.float32)
    if loss is None:
        if optimizer is not None:
            raise GlcompError("an optimizer needs a loss: pass loss=nn.CrossEntropyLoss() or similar")
        return program

    if target_name in inputs:
        raise GlcompError(f"target name {target_name!r} is also a model input; pass target_name=")
    owner = type(model).__name__
    if in_forward:
        if target_spec is None:
            raise GlcompError(
                'loss="forward" needs target_spec=, the shape (and dtype) of the target forward() '
                'takes, e.g. target_spec={"shape": (8, 16), "dtype": "int32", "num_classes": 65}'
            )
        spec = _given_spec(target_spec)
        program.target = _target_input(target_name, spec)
        targets = {target_name: (program.target.shape, program.target.dtype)}
        with declared_images(inputs):
            graph, state, result = trace_module(traced, inputs, training=True, targets=targets)
        value = _loss_in_result(result, owner)
    else:
        with declared_images(inputs):
            graph, state, result = trace_module(traced, inputs, training=True)
        output = _first_tensor(result, owner)
        extra = _loss_extras(loss, result, owner)
        spec = _given_spec(target_spec) if target_spec is not None else _loss_spec(loss, output.shape)
        program.target = _target_input(target_name, spec)
        y = Tensor(graph, graph.add_input(target_name, program.target.shape, "target", program.target.dtype))
        token = _TRACE.set(state)  # a loss module is called like any module
        try:
            state.paths.setdefault(id(loss), "loss")
            with origin(f"loss ({_loss_name(loss)})"):
                value = loss(output, y, *extra)
        finally:
            _TRACE.reset(token)
    if not isinstance(value, Tensor) or value.shape != ():
        raise GlcompError(f"loss ({_loss_name(loss)}) must return a scalar; use reduction='mean'")
    graph.outputs["loss"] = value.node
    carried_next = _carried(graph, carry, "train", result=result, owner=owner)
    if RNG_STEP in graph.inputs:
        program.opt_state[RNG_STEP] = np.zeros((), np.float32)
    if not trainable:
        raise GlcompError("no parameter has requires_grad=True: nothing to train")
    grads = autodiff(graph, "loss", trainable)
    graphs["gradients"] = _only(grads, ["loss"] + [f"grad:{n}" for n in trainable])
    if optimizer is None:
        return program

    program.lr = optimizer.lr
    program.optimizer = optimizer
    train = grads
    _clip(train, trainable, clip_grad_value, clip_grad_norm)
    for name, tensor in state.buffer_updates.items():
        train.outputs[f"buffer:{name}"] = tensor.node
    for name, node in carried_next.items():  # the forward's final state, detached
        train.outputs[f"buffer:{name}"] = node
    if RNG_STEP in train.inputs:  # random ops draw new numbers in each train step
        train.outputs[f"state:{RNG_STEP}"] = (Tensor(train, train.inputs[RNG_STEP]) + 1.0).node
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
    graphs["train_step"] = _only(train, keep)
    return program


def _check_carry(carry: Any, carry_predict: Any, inputs: dict[str, Any]) -> None:
    """`carry` is None or a dict input name -> forward result name; `carry_predict` a bool."""
    if not isinstance(carry_predict, bool):
        raise GlcompError(f"carry_predict must be True or False, got {carry_predict!r}")
    if carry is None:
        if carry_predict:
            raise GlcompError("carry_predict=True needs carry=, the inputs carried across batches")
        return
    if not isinstance(carry, dict) or not carry:
        raise GlcompError(
            "carry must be a non-empty dict input name -> forward result name, e.g. "
            f'carry={{"h0": "output.1.0", "c0": "output.1.1"}}; got {_what(carry)} {carry!r:.60}'
        )
    for name, result in carry.items():
        if name not in inputs:
            raise GlcompError(
                f"carry: {name!r} is not an input (the inputs are {list(inputs)}); carry names inputs "
                "whose next value a forward result gives"
            )
        if not isinstance(result, str) or not (result == "output" or result.startswith("output.")):
            raise GlcompError(
                f"carry[{name!r}] must name a forward result as predict names its outputs "
                f'("output", "output.1", "output.1.0", ...), got {result!r}'
            )
    if len(carry) == len(inputs):
        raise GlcompError("carry: every input is carried; at least one input must be fed each batch")


def _carried(
    graph: Graph,
    carry: dict[str, str],
    mode: str,
    *,
    write: bool = True,
    result: Any = None,
    owner: str = "",
) -> dict[str, int]:
    """Make the carried inputs of `graph` buffers (read from state, never fed) and return, for
    each, the node of the forward result holding its next value (in `mode`'s trace; `result`
    given: named from it, else from the graph's outputs); with `write`, predict's graph also
    writes it (``buffer:<name>`` outputs)."""
    if not carry:
        return {}
    if result is not None:
        named = type("Named", (), {"outputs": {}})()
        set_outputs(named, _without_none(result), owner)
        results = named.outputs
    else:
        results = {k: n for k, n in graph.outputs.items() if k == "output" or k.startswith("output.")}
    nodes = {}
    for name, key in carry.items():
        n = graph.inputs[name]
        if key not in results:
            raise GlcompError(
                f"carry[{name!r}]: forward returns no {key!r} in {mode} mode; its results are "
                f"{sorted(results)}"
            )
        node, shape = results[key], graph.shape(n)
        if graph.shape(node) != shape:
            raise GlcompError(
                f"carry[{name!r}]: {key!r} has shape {graph.shape(node)}, the input {name!r} {shape}; "
                "the carried result must have the input's shape"
            )
        if node == n:
            raise GlcompError(f"carry[{name!r}]: {key!r} is the input {name!r} itself; nothing would change")
        graph.attrs(n)["role"] = "buffer"
        nodes[name] = node
    if write and result is None:
        for name, node in nodes.items():
            graph.outputs[f"buffer:{name}"] = node
    return nodes


def _image_of(shape: Any, name: str, options: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest's image record of an input declared with glcomp.transforms.image_input."""
    if not isinstance(shape, ImageInput):
        return None
    if options.get("storage") == "rgba8":
        raise GlcompError(
            f"input {name!r}: image inputs need float input textures (frames upload as floats); "
            "storage='rgba8' keeps every texture as bytes: use storage='f32' or 'f16'"
        )
    return shape.manifest()


def trace(model: Module, training: bool = False, **input_shapes: Any) -> Graph:
    """Trace a model into a Graph whose output ``output`` is the forward's result.

    ``glcomp.trace(model, x=(64, 1, 8, 8))`` traces in eval mode; pass ``training=True`` for
    train-mode behaviour (batch statistics). The graph is validated before it is returned.
    """
    if not isinstance(model, Module):
        raise GlcompError(f"expected a glcomp.nn.Module, got {type(model).__name__}")
    graph, _, result = trace_module(model, input_shapes, training)
    set_outputs(graph, result, type(model).__name__)
    graph = graph.prune()
    graph.validate()
    return graph


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
        if isinstance(dims, tuple | list) and dims and all(isinstance(d, tuple | list) for d in dims):
            raise GlcompError(
                f"inputs[{name!r}]: got several shapes {shape!r}; every input is one tensor, so a "
                "forward() argument holding a tuple of tensors (an LSTM's (h0, c0)) has to become one "
                "argument per tensor"
            )
        if not isinstance(dims, tuple | list) or not all(
            isinstance(d, int | np.integer) and not isinstance(d, bool) for d in dims
        ):
            raise GlcompError(
                f"inputs[{name!r}] must be a shape (a tuple of ints, batch first), got {shape!r}"
            )
    if (
        loss is not None
        and not isinstance(loss, type)
        and not _is_forward(loss)
        and not _takes_two(loss)
        and not _takes_more(loss)
    ):
        raise GlcompError(
            "loss must be a glcomp.nn loss module such as nn.CrossEntropyLoss(), a function of "
            "(output, target) (or of (output, target, *more outputs) when forward returns a tuple) "
            f'or "forward" (forward() computes the loss), got {_what(loss)} {loss!r:.60}'
        )
    for what, value, base, example in (
        ("loss", loss if isinstance(loss, type) else None, _Loss, "nn.CrossEntropyLoss()"),
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
    if not isinstance(target_name, str) or not target_name.isidentifier():
        raise GlcompError(f"target_name must be a name such as 'y', got {target_name!r}")
    for what, value in (("clip_grad_value", clip_value), ("clip_grad_norm", clip_norm)):
        if value is not None and (not isinstance(value, int | float) or isinstance(value, bool)):
            raise GlcompError(f"{what} must be a positive number or None, got {value!r}")
        if value is not None and optimizer is None:
            raise GlcompError(f"{what} applies to the train step: it needs an optimizer")


def _check_options(options: dict[str, Any], target: Any) -> Any:
    """The target, its limits, ``passes`` and ``storage`` as the code generator understands them,
    parsed once here (not when a GL runtime is first built) into the typed options the Program
    keeps: glcomp.codegen.options.CompileOptions is the one list of the options, their types and
    defaults."""
    from glcomp.codegen.options import CompileOptions

    if "target" in options:  # a named argument of compile: never among the extra options
        raise GlcompError("target is given twice")
    return CompileOptions.parse({**options, "target": target})


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


def _is_forward(loss: Any) -> bool:
    return isinstance(loss, str) and loss == "forward"


def _takes_two(loss: Any) -> bool:
    """Whether `loss` can be called as loss(output, target)."""
    if isinstance(loss, str) or not callable(loss):
        return False
    fn = loss.forward if isinstance(loss, Module) else loss
    try:
        inspect.signature(fn).bind(None, None)
    except TypeError:
        return False
    except ValueError:  # builtins without a signature
        return True
    return True


def _takes_more(loss: Any) -> bool:
    """Whether `loss` is a plain function with more than two required positional parameters,
    as the VAE example's ``loss_function(recon_x, x, mu, logvar)``."""
    if isinstance(loss, str | Module | type) or not callable(loss):
        return False
    try:
        params = inspect.signature(loss).parameters.values()
    except ValueError:
        return False
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in positional and p.default is inspect.Parameter.empty for p in params) > 2


def _loss_extras(loss: Any, result: Any, owner: str) -> tuple[Any, ...]:
    """The further arguments of a loss function that takes more than (output, target): forward's
    other results, so ``loss(output[0], target, *output[1:])`` as torch scripts call it."""
    if _takes_two(loss):
        return ()
    rest = tuple(result[1:]) if isinstance(result, tuple | list) else ()
    try:
        inspect.signature(loss).bind(None, None, *rest)
    except TypeError:
        raise GlcompError(
            f"loss {_loss_name(loss)}{inspect.signature(loss)} is called as loss(output, target, "
            f"*more) with forward's further results as `more`, but ({owner}).forward returned "
            f"{len(rest)} further value(s)"
        ) from None
    return rest


def _without_none(result: Any) -> Any:
    """forward()'s result without None entries (minGPT returns (logits, None) without targets)."""
    if isinstance(result, tuple | list):
        kept = [r for r in result if r is not None]
        return kept[0] if len(kept) == 1 else tuple(kept)
    return result


def _first_tensor(result: Any, owner: str) -> Tensor:
    """The tensor a separate loss applies to: the result, or the first element of a tuple."""
    if isinstance(result, tuple | list) and result:
        result = result[0]
    if not isinstance(result, Tensor):
        raise GlcompError(
            f"({owner}): a loss needs forward() to return a tensor (or a tuple whose first element "
            f"is the one the loss takes), got {type(result).__name__}"
        )
    return result


def _loss_in_result(result: Any, owner: str) -> Any:
    """With loss="forward": the 0-d tensor forward() returned, alone or in a tuple."""
    if isinstance(result, Tensor):
        return result
    if isinstance(result, tuple | list) and result:
        scalars = [r for r in result if isinstance(r, Tensor) and r.shape == ()]
        if len(scalars) == 1:
            return scalars[0]
        return result[-1]
    raise GlcompError(
        f'({owner}): with loss="forward", forward() must return the loss (a 0-d tensor), alone or '
        f"as in (output, loss); got {type(result).__name__}"
    )


def _loss_name(loss: Any) -> str:
    if isinstance(loss, str):
        return "forward"
    return getattr(loss, "__name__", None) or type(loss).__name__


_CLASS_LOSSES = ("cross_entropy", "nll_loss")


def _loss_spec(loss: Any, output_shape: tuple[int, ...]) -> dict[str, Any]:
    """The target a loss takes: its own `target_spec`, class labels for the class losses of
    glcomp.nn.functional, else a float tensor shaped like the output."""
    from glcomp.nn import functional

    spec = getattr(loss, "target_spec", None)
    if callable(spec):
        return spec(output_shape)
    if getattr(functional, getattr(loss, "__name__", ""), None) is loss and loss.__name__ in _CLASS_LOSSES:
        if len(output_shape) != 2:
            raise GlcompError(f"{loss.__name__} expects model output (N, C), got {output_shape}")
        return {"shape": output_shape[:1], "dtype": "int32", "num_classes": output_shape[1]}
    return {"shape": output_shape, "dtype": "float32"}


def _given_spec(spec: Any) -> dict[str, Any]:
    if isinstance(spec, tuple | list):
        spec = {"shape": tuple(spec)}
    if not isinstance(spec, dict) or "shape" not in spec:
        raise GlcompError(f"target_spec must be a shape or a dict with 'shape', got {spec!r}")
    unknown = set(spec) - {"shape", "dtype", "num_classes"}
    if unknown:
        raise GlcompError(f"target_spec: unknown keys {sorted(unknown)} (shape, dtype, num_classes)")
    out = {"shape": tuple(int(d) for d in spec["shape"]), "dtype": spec.get("dtype", "float32")}
    if out["dtype"] not in ("float32", "int32"):
        raise GlcompError(f"target_spec: dtype must be 'float32' or 'int32', got {out['dtype']!r}")
    if out["dtype"] == "int32":
        if not isinstance(spec.get("num_classes"), int) or spec["num_classes"] < 1:
            raise GlcompError(
                "target_spec: integer targets need num_classes (labels lie in [0, num_classes))"
            )
        out["num_classes"] = spec["num_classes"]
    return out


def _target_input(name: str, spec: dict[str, Any]) -> InputSpec:
    return InputSpec(name, tuple(spec["shape"]), spec["dtype"], spec.get("num_classes"))


def _trainable(model: Module, optimizer: Optimizer | None) -> list[str]:
    chosen = None
    if optimizer is not None and optimizer.params is not None:
        chosen = {id(p) for p in optimizer.params}
    return [k for k, p in model.named_parameters() if p.requires_grad and (chosen is None or id(p) in chosen)]


def _only(graph: Graph, names: list[str]) -> Graph:
    """A new graph computing only the outputs `names` of `graph`, pruned and validated."""
    g = graph.copy()
    g.outputs = {k: graph.outputs[k] for k in names}
    g.prune_in_place()  # the copy is ours: no second copy to prune
    g.validate()
    return g


def _finish(graph: Graph) -> Graph:
    graph = graph.prune()
    graph.validate()
    return graph
