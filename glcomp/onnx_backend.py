"""An ONNX backend (``onnx.backend.base.Backend``) that runs ONNX models with glcomp.

``GlcompBackend.prepare(model)`` imports the model with `glcomp.onnx.load` and compiles it for
predict; ``rep.run(inputs)`` runs it on the numpy reference runtime (device ``"CPU"``, the default)
or on OpenGL shaders (device ``"GL"``, or ``runtime="gl"``) and returns the outputs in the graph's
order, as ONNX declares their types::

    import onnx
    from glcomp.onnx_backend import GlcompBackend

    rep = GlcompBackend.prepare(onnx.load("model.onnx"), "GL")
    (y,) = rep.run([x])

A glcomp program has static shapes, so the backend compiles one program per set of input shapes
(and keeps it for further runs with those shapes). Graph inputs that decide a shape or another
compile-time value (Reshape's shape, Slice's starts, Unsqueeze's axes, Pad's pads, Clip's bounds:
the inputs `glcomp.onnx` needs as constants, and inputs only Shape reads) are bound to the
values of each run, so a run with new values compiles again; a graph left with no computed input
returns its outputs folded at import. glcomp computes in float32: float64 inputs are computed in float32 and
results cast back to each output's declared type (integer outputs rounded, boolean ones compared
with zero). Anything glcomp does not support raises `GlcompError` naming the node, op or input,
from `prepare` when the model's input shapes are all known and from `run` otherwise.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

try:
    import onnx
    from onnx.backend.base import Backend, BackendRep, namedtupledict
except ImportError as err:  # pragma: no cover - the optional extra is missing
    raise ImportError("glcomp.onnx_backend needs the onnx package: pip install glcomp[onnx]") from err

import glcomp
import glcomp.onnx as gonnx

__all__ = ["GlcompBackend", "GlcompBackendRep", "prepare", "run_model", "run_node", "supports_device"]

RUNTIMES = ("reference", "gl")
_DEVICES = {"CPU": "reference", "GL": "gl"}
_EXACT_INT = 2**24  # float32 holds every integer up to this magnitude exactly
_shared_ctx: list[Any] = []


def _gl_context() -> Any:
    """One headless OpenGL context shared by every GL BackendRep that was given none."""
    if not _shared_ctx:
        from glcomp.runtime.gl import create_context

        _shared_ctx.append(create_context())
    return _shared_ctx[0]


def _runtime_of(device: str, runtime: str | None) -> str:
    if runtime is not None:
        if runtime not in RUNTIMES:
            raise GlcompError(f"ONNX backend: runtime {runtime!r} is not one of {list(RUNTIMES)}")
        return runtime
    kind = str(device).split(":")[0].upper()
    if kind not in _DEVICES:
        raise GlcompError(f"ONNX backend: device {device!r} is not one of {sorted(_DEVICES)}")
    return _DEVICES[kind]


def _static_graph_inputs(model: Any) -> list[str]:
    """Graph inputs glcomp.onnx needs as compile-time values: those some node reads as one (a
    shape, axes, pads), and those only Shape reads (their shape is all the graph uses; an input
    that is also computed with stays an input, Shape folding from its static shape)."""
    graph = model.graph
    initializers = {t.name for t in graph.initializer}
    names = [v.name for v in graph.input if v.name not in initializers]
    value_uses: dict[str, set[str]] = {n: set() for n in names}
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name in value_uses:
                static = i in gonnx._STATIC_INPUTS.get(node.op_type, ())
                value_uses[name].add("shape" if node.op_type == "Shape" else "static" if static else "data")
    return [n for n in names if "static" in value_uses[n] or value_uses[n] == {"shape"}]


def _np_dtype(elem_type: int, what: str) -> np.dtype:
    try:
        dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        dtype = np.dtype(object)
    if dtype.kind not in "biuf":
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "unknown"
        raise GlcompError(f"{what} has ONNX type {name}; glcomp computes numbers (float, int, bool) only")
    return dtype


class GlcompBackendRep(BackendRep):
    """A prepared ONNX model: ``run(inputs)`` computes its outputs with glcomp (see the module
    docstring). `runtime` is "reference" or "gl"; `ctx` an OpenGL context for "gl" (default: one
    shared context)."""

    def __init__(self, model: Any, runtime: str = "reference", ctx: Any = None, **options: Any) -> None:
        self._model = model
        self.runtime = runtime
        self._ctx = ctx
        self._options = options
        graph = model.graph
        initializers = {t.name for t in graph.initializer}
        self._graph_inputs = [v for v in graph.input if v.name not in initializers]
        self.input_names = [v.name for v in self._graph_inputs]
        self.output_names = [v.name for v in graph.output]
        self._static = _static_graph_inputs(model)
        self._input_types = {
            v.name: _np_dtype(v.type.tensor_type.elem_type, f"graph input {v.name!r}")
            for v in self._graph_inputs
        }
        self._output_types = [
            _np_dtype(v.type.tensor_type.elem_type, f"graph output {v.name!r}") for v in graph.output
        ]
        # Per input shapes and bound values: the module and its program (or its constant outputs).
        self._programs: dict[Any, tuple[gonnx.OnnxModule, Any]] = {}
        shapes = {}
        for v in self._graph_inputs:
            dims = v.type.tensor_type.shape.dim
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if not self._static and all(None not in s for s in shapes.values()):
            self._program({n: tuple(s) for n, s in shapes.items()}, {})  # refuse early

    def _program(
        self, shapes: Mapping[str, tuple[int, ...]], bound: Mapping[str, np.ndarray]
    ) -> tuple[gonnx.OnnxModule, Any]:
        key = (
            tuple(sorted(shapes.items())),
            tuple((n, v.dtype.str, v.shape, v.tobytes()) for n, v in sorted(bound.items())),
        )
        if key not in self._programs:
            module = gonnx.load(self._model, constants=bound)
            if not shapes:
                # Every input is a compile-time value: the outputs fold to constants, or need a
                # computed tensor and are refused.
                try:
                    self._programs[key] = module, module.constant_outputs()
                except GlcompError as err:
                    raise GlcompError(
                        f"{err}; no graph input is computed (none is declared, or all of "
                        f"{sorted(bound)} are compile-time values), so there is nothing to compile"
                    ) from None
                return self._programs[key]
            args = module.onnx_inputs
            feeds = {args[n]: s for n, s in shapes.items()}
            self._programs[key] = module, glcomp.compile(module, feeds, **self._options)
        return self._programs[key]

    def _check_dropout(self, bound: Mapping[str, np.ndarray]) -> None:
        """ONNX's Dropout with training_mode true drops in every run, with ONNX's random mask;
        glcomp's predict is eval mode, where Dropout is the identity (the importer's choice, for
        models exported in training mode): refused rather than returning other numbers."""
        from onnx import numpy_helper

        known = {t.name: numpy_helper.to_array(t) for t in self._model.graph.initializer} | dict(bound)
        for index, node in enumerate(self._model.graph.node):
            if node.op_type != "Dropout" or len(node.input) < 3 or node.input[2] not in known:
                continue
            ratio = next((a.f for a in node.attribute if a.name == "ratio"), 0.5)
            if len(node.input) > 1 and node.input[1] in known:
                ratio = float(known[node.input[1]])
            if bool(known[node.input[2]]) and ratio > 0:
                raise GlcompError(
                    f"ONNX node {node.name or f'Dropout_{index}'!r} (Dropout): training_mode=True "
                    "outside a train step: ONNX drops with its own random mask in every run; glcomp "
                    "drops only in train_step and its predict is the identity"
                )

    def _arrays(self, inputs: Any) -> dict[str, np.ndarray]:
        if isinstance(inputs, Mapping):
            unknown = sorted(set(inputs) - set(self.input_names))
            if unknown:
                raise GlcompError(
                    f"ONNX backend: unknown inputs {unknown}; the model takes {self.input_names}"
                )
            named = dict(inputs)
        else:
            values = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            if len(values) > len(self.input_names):
                raise GlcompError(
                    f"ONNX backend: {len(values)} inputs given; the model takes {len(self.input_names)} "
                    f"({self.input_names})"
                )
            named = dict(zip(self.input_names, values))
        missing = [n for n in self.input_names if n not in named]
        if missing:
            raise GlcompError(
                f"ONNX backend: inputs {missing} are missing; the model takes {self.input_names}"
            )
        arrays = {}
        for name, value in named.items():
            array = np.asarray(value)
            if array.dtype.kind not in "biuf":
                raise GlcompError(
                    f"ONNX model {self._model.graph.name!r}: input {name!r} holds {array.dtype}, not numbers"
                )
            if name not in self._static and array.dtype.kind in "iu" and array.size:
                if np.abs(array).max() > _EXACT_INT:
                    raise GlcompError(
                        f"ONNX backend: integer input {name!r} holds values beyond 2**24, "
                        "which float32 does not represent exactly"
                    )
            arrays[name] = array
        return arrays

    def run(self, inputs: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """The graph's outputs for `inputs` (a list in graph-input order, or a dict by name), each
        of its declared ONNX type and shape, as a namedtuple by output name."""
        arrays = self._arrays(inputs)
        bound = {n: arrays.pop(n) for n in self._static}
        self._check_dropout(bound)
        shapes = {n: tuple(a.shape) for n, a in arrays.items()}
        module, program = self._program(shapes, bound)
        args = module.onnx_inputs
        feeds = {}
        for name, array in arrays.items():
            feeds[args[name]] = array.astype(np.float32) if array.dtype.kind in "biu" else array
        if isinstance(program, tuple):  # constant outputs, folded at import
            got = {f"output.{i}": v for i, v in enumerate(program)} if len(program) > 1 else program[0]
        elif self.runtime == "gl":
            rt = program.runtime("gl", ctx=self._ctx if self._ctx is not None else _gl_context())
            try:
                got = rt.predict(**feeds)
            finally:
                rt.release()
        else:
            got = program.runtime("reference").predict(**feeds)
        n = len(self.output_names)
        outs = [got] if n == 1 else [got[f"output.{i}"] for i in range(n)]
        typed = []
        for out, dtype in zip(outs, self._output_types):
            out = np.asarray(out)
            if dtype.kind == "b":
                out = out != 0
            elif dtype.kind in "iu":
                out = np.rint(out)
            typed.append(out.astype(dtype))
        return namedtupledict("Outputs", self.output_names)(*typed)


class GlcompBackend(Backend):
    """ONNX's backend interface over glcomp: `prepare` imports and compiles, the rep's `run`
    predicts on the reference runtime (device "CPU") or on GL (device "GL" or ``runtime="gl"``).
    Extra keyword arguments of `prepare` go to `glcomp.compile` (``target=``, ``storage=``...)
    except ``ctx`` (the OpenGL context for GL) and ONNX's runner's ``rtol``/``atol``."""

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> GlcompBackendRep:
        """Import `model` (a ModelProto) and compile it; GlcompError when glcomp cannot run it."""
        runtime = _runtime_of(device, kwargs.pop("runtime", None))
        ctx = kwargs.pop("ctx", None)
        for key in ("rtol", "atol"):
            kwargs.pop(key, None)
        if not isinstance(model, onnx.ModelProto):
            raise GlcompError(f"ONNX backend: prepare takes an onnx.ModelProto, not {type(model).__name__}")
        return GlcompBackendRep(model, runtime, ctx, **kwargs)

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(
        cls,
        node: Any,
        inputs: Any,
        device: str = "CPU",
        outputs_info: Sequence[tuple[Any, tuple[int, ...]]] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run one NodeProto on `inputs` (arrays in the node's input order): the node becomes a
        one-node model whose output types come from `outputs_info` or ONNX's shape inference."""
        from onnx import helper

        arrays = [np.asarray(v) for v in inputs]
        names = [n for n in node.input if n]
        graph_inputs = [
            helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for n, a in zip(names, arrays)
        ]
        if outputs_info is not None:
            outputs = [
                helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(np.dtype(t)), s)
                for n, (t, s) in zip(node.output, outputs_info)
            ]
        else:
            outputs = [helper.make_empty_tensor_value_info(n) for n in node.output]
        opset = kwargs.pop("opset_version", None)
        imports = [helper.make_opsetid("", opset)] if opset else None
        model = helper.make_model(
            helper.make_graph([node], "node", graph_inputs, outputs), opset_imports=imports
        )
        if outputs_info is None:
            inferred = onnx.shape_inference.infer_shapes(model)
            del model.graph.output[:]
            model.graph.output.extend(inferred.graph.output)
        return cls.run_model(model, arrays, device, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        return str(device).split(":")[0].upper() in _DEVICES


prepare = GlcompBackend.prepare
run_model = GlcompBackend.run_model
run_node = GlcompBackend.run_node
supports_device = GlcompBackend.supports_device
