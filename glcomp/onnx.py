"""ONNX import: ``glcomp.onnx.load("model.onnx")`` turns an ONNX file into a glcomp `Module`.

The module trains like any other (``glcomp.compile(model, {"x": shape}, loss, optimizer)``):

- Float initializers of rank >= 1 that feed computations become Parameters under their ONNX names
  (``fc1.weight``, ``onnx::MatMul_21``; a name is changed only when it is empty, not printable or
  taken: then a suffix or replacement characters make it unique and printable), in
  ``state_dict()`` and in the compiled program. BatchNormalization's mean and variance
  initializers become buffers (running statistics). Integer initializers, 0-d float ones
  (exporters' literal scalars) and initializers used only as static arguments (shapes, axes,
  indices, exponents) stay constants.
- ``forward`` executes the ONNX graph node by node with glcomp tensor ops while the model is
  traced. Values known at trace time (constants, ``Shape`` of a tensor: shapes are static at
  compile time) are numpy arrays, so Shape/Gather/Concat/Reshape chains fold into constants and
  never reach the compiled program.
- BatchNormalization normalises with batch statistics in train mode and updates its running
  statistics as torch does (momentum average with ONNX's ``momentum`` attribute, i.e. 1 - torch's
  momentum, unbiased variance); in eval mode (``predict``) it uses the running statistics.
  Dropout is the identity in eval mode and drops in train mode (glcomp's dropout masks).
- LSTM and GRU nodes unroll over time like ``glcomp.nn.LSTM`` / ``GRU``; their W, R and B
  initializers stay parameters in ONNX layout (gate blocks i o f c and z r h), regrouped into
  torch's gate order by slices inside the traced graph. GRU's linear_before_reset=0 (ONNX's
  default: the reset gate applied to the state before its recurrent product) and =1 (torch's)
  are both supported.
- Ops with no primitive of their own are compositions of primitives: Pad (reflect, edge, wrap) of
  slices and concatenation, strided and reversed Slice of single-element slices, Split and
  Tile of slices and broadcasts, LRN of shifted channel slices, InstanceNormalization of
  reductions; 1-D Conv, ConvTranspose, MaxPool and AveragePool
  run as 2-D ones over a unit height; ``auto_pad=SAME_UPPER|SAME_LOWER`` of Conv and the pools
  becomes explicit pads, as does ``ceil_mode=1``'s end padding for a last partial window (not
  counted by AveragePool's divisor); asymmetric pooling pads are explicit padding (edge values
  for MaxPool), dilated MaxPool samples every d-th element (strides a multiple of the dilation).
- glcomp computes in float32. Float64 (and float16) inputs and initializers are cast to float32:
  results agree with float64 references to about 1e-6 relative per operation, and an input value
  beyond float32's range is refused by the runtimes. Integer inputs (Gather's indices) are fed
  as numbers.

The ``onnx`` package is optional (``pip install glcomp[onnx]``): importing glcomp never imports it;
`load` imports it and raises GlcompError when it is missing. The file is checked with
``onnx.checker`` and external-data paths must stay inside the model's directory.
"""

from __future__ import annotations

import copy
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops import get_op
from glcomp.ir.tensor import (
    Tensor,
    broadcast_shapes,
    broadcast_to,
    cat,
    const,
    getitem,
    maximum,
    minimum,
    permute,
    reshape,
    slice_axis,
    where,
)
from glcomp.ir.trace import active_trace
from glcomp.nn import functional as F
from glcomp.nn.module import Module, Parameter

__all__ = ["SUPPORTED_OPS", "OnnxModule", "load"]

_INSTALL_HINT = "the onnx package is needed to import ONNX models: pip install glcomp[onnx]"
_FLOAT_TYPES = (1, 10, 11, 16)  # FLOAT, FLOAT16, DOUBLE, BFLOAT16
_INT64_MAX = 2**63 - 1

# Inputs (by position) that must be known at trace time: they never make an initializer trainable.
_STATIC_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    "Unsqueeze": frozenset({1}),
    "Squeeze": frozenset({1}),
    "ReduceMean": frozenset({1}),
    "ReduceSum": frozenset({1}),
    "ReduceMax": frozenset({1}),
    "ReduceMin": frozenset({1}),
    "ReduceLogSumExp": frozenset({1}),
    "Pow": frozenset({1}),
    "Dropout": frozenset({1, 2}),
    "Gather": frozenset({1}),
    "Expand": frozenset({1}),
    "ConstantOfShape": frozenset({0}),
    "Clip": frozenset({1, 2}),
    "Shape": frozenset({0}),
    "Resize": frozenset({1, 2, 3}),
    "Upsample": frozenset({1}),
    "LSTM": frozenset({4}),
    "GRU": frozenset({4}),
    "Pad": frozenset({1, 2, 3}),
    "Split": frozenset({1}),
    "Tile": frozenset({1}),
}
_BATCHNORM_STATS = frozenset({3, 4})


class _Unsupported:
    """An output glcomp does not compute (Dropout's mask, MaxPool's indices): an error if used."""

    def __init__(self, what: str) -> None:
        self.what = what


class _Node:
    """One ONNX node, reduced to what the executor needs."""

    def __init__(self, proto: Any, index: int) -> None:
        from onnx import helper

        self.op = proto.op_type
        self.domain = proto.domain
        self.name = proto.name or f"{proto.op_type}_{index}"
        self.inputs = list(proto.input)
        self.outputs = list(proto.output)
        self.attrs = {a.name: helper.get_attribute_value(a) for a in proto.attribute}

    def attr(self, key: str, default: Any = None) -> Any:
        value = self.attrs.get(key, default)
        if isinstance(value, bytes):
            return value.decode()
        if isinstance(value, list):
            return [v.decode() if isinstance(v, bytes) else v for v in value]
        return value

    def fail(self, message: str) -> GlcompError:
        return GlcompError(f"ONNX node {self.name!r} ({self.op}): {message}")


class OnnxModule(Module):
    """A glcomp Module that runs an ONNX graph; built by `load`.

    ``input_names`` lists forward()'s inputs (ONNX graph input names, made identifiers) and
    ``input_shapes`` their shapes as the file declares them (None where a dimension is symbolic).
    ``forward(**inputs)`` returns one tensor for a one-output graph, else a tuple in the graph's
    output order."""

    def __init__(self, model: Any, source: str, constants: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        from onnx import numpy_helper

        graph = model.graph
        self._source = source
        self._opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
        self._nodes = [_Node(n, i) for i, n in enumerate(graph.node)]
        for node in self._nodes:
            if node.domain not in ("", "ai.onnx") or node.op not in _HANDLERS:
                raise GlcompError(
                    f"{source}: ONNX node {node.name!r} has op type {node.op!r}"
                    + (f" of domain {node.domain!r}" if node.domain not in ("", "ai.onnx") else "")
                    + f", which glcomp does not support; supported ops: {', '.join(SUPPORTED_OPS)}"
                )
        initializers = {t.name: t for t in graph.initializer}
        # Exporters deduplicate equal initializers through Identity nodes (torch turns a fresh
        # BatchNorm's running_var into Identity(weight)): each such output is a state of its own.
        for node in list(self._nodes):
            if node.op == "Identity" and node.inputs[0] in initializers and node.outputs[0]:
                if node.outputs[0] not in initializers:
                    initializers[node.outputs[0]] = initializers[node.inputs[0]]
                    self._nodes.remove(node)
        slots = _initializer_slots(self._nodes, set(initializers))
        taken: set[str] = set()
        self._inputs: dict[str, str] = {}  # ONNX input name -> forward() argument name
        self.input_shapes: dict[str, tuple[int | None, ...]] = {}
        bound = _bound_inputs(graph, initializers, constants or {}, source)
        for value in graph.input:
            if value.name in initializers or value.name in bound:
                continue
            arg = _identifier(value.name, taken)
            taken.add(arg)
            self._inputs[value.name] = arg
            dims = value.type.tensor_type.shape.dim
            self.input_shapes[arg] = tuple(d.dim_value if d.HasField("dim_value") else None for d in dims)
        self.input_names = list(self._inputs.values())
        self._state: dict[str, str] = {}  # ONNX initializer name -> parameter or buffer name
        self._constants: dict[str, np.ndarray] = dict(bound)
        for name, proto in initializers.items():
            array = numpy_helper.to_array(proto)
            is_float = proto.data_type in _FLOAT_TYPES
            kinds = slots.get(name, set())
            if is_float and array.ndim > 0 and "data" in kinds:
                key = _state_name(name, taken)
                self._parameters[key] = Parameter(array.astype(np.float32))
            elif is_float and array.ndim > 0 and "stats" in kinds:
                key = _state_name(name, taken)
                self._buffers[key] = array.astype(np.float32)
            else:
                self._constants[name] = array.astype(np.float32) if is_float else array
                continue
            taken.add(key)
            self._state[name] = key
        self._outputs = [v.name for v in graph.output]
        self._types = _value_types(model)

    def _integer(self, name: str) -> bool:
        """Whether ONNX types value `name` as an integer (its arithmetic then rounds as ONNX's)."""
        return self._types.get(name, 1) in _INTEGER_TYPES

    def forward(self, **inputs: Any) -> Any:
        unknown = sorted(set(inputs) - set(self.input_names))
        missing = [n for n in self.input_names if n not in inputs]
        if unknown or missing:
            raise GlcompError(
                f"{self._source}: the ONNX model takes inputs {self.input_names}"
                + (f"; unknown {unknown}" if unknown else "")
                + (f"; missing {missing}" if missing else "")
            )
        trace = active_trace()
        env: dict[str, Any] = dict(self._constants)
        for onnx_name, key in self._state.items():
            if trace is None or (id(self), key) not in trace.values:
                raise GlcompError(f"{self._source}: the ONNX model runs only while traced (glcomp.compile)")
            env[onnx_name] = trace.values[(id(self), key)]
        for onnx_name, arg in self._inputs.items():
            value = inputs[arg]
            if not isinstance(value, Tensor):
                raise GlcompError(f"{self._source}: input {arg!r} must be a traced tensor")
            declared = self.input_shapes[arg]
            fixed = zip(declared, value.shape)
            if len(declared) != value.ndim or any(d is not None and d != s for d, s in fixed):
                raise GlcompError(
                    f"{self._source}: input {arg!r} has shape {value.shape} but the ONNX model declares "
                    f"{tuple('?' if d is None else d for d in declared)}"
                )
            env[onnx_name] = value
        self._run_nodes(env)
        outs = []
        for name in self._outputs:
            value = env.get(name)
            if not isinstance(value, Tensor):
                raise GlcompError(
                    f"{self._source}: graph output {name!r} is not a tensor computed from the inputs"
                )
            outs.append(value)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def constant_outputs(self) -> tuple[np.ndarray, ...]:
        """The graph's outputs when the graph computes from constants alone (no graph input left
        once `load`'s constants are bound; Shape of a bound input, ConstantOfShape...): folded at
        import as glcomp folds constants while tracing. GlcompError when an output needs a
        computed tensor."""
        if self.input_names:
            raise GlcompError(f"{self._source}: the graph computes from the inputs {self.input_names}")
        env: dict[str, Any] = dict(self._constants)
        for onnx_name, key in self._state.items():
            store = self._parameters if key in self._parameters else self._buffers
            value = store[key]
            env[onnx_name] = np.asarray(getattr(value, "data", value))
        self._run_nodes(env)
        outs = []
        for name in self._outputs:
            value = env.get(name)
            if value is None or isinstance(value, Tensor | _Unsupported):
                raise GlcompError(f"{self._source}: graph output {name!r} is not a constant")
            outs.append(np.asarray(value))
        return tuple(outs)

    def _run_nodes(self, env: dict[str, Any]) -> None:
        """Execute the nodes in order over `env` (ONNX name -> tensor or constant), in place."""
        env[""] = None  # an omitted optional input
        for node in self._nodes:
            args = []
            for name in node.inputs:
                if name not in env:
                    raise node.fail(f"input {name!r} is not computed by any earlier node")
                if isinstance(env[name], _Unsupported):
                    raise node.fail(f"input {name!r} is {env[name].what}, which glcomp does not compute")
                args.append(env[name])
            try:
                results = _HANDLERS[node.op](self, node, args)
            except GlcompError as err:
                message = str(err)
                if message.startswith("ONNX node "):
                    raise
                raise node.fail(message) from None
            for name, value in zip(node.outputs, results):
                if name:
                    env[name] = value

    @property
    def onnx_inputs(self) -> dict[str, str]:
        """Each graph input's ONNX name -> its forward() argument name (constants excluded)."""
        return dict(self._inputs)

    def extra_repr(self) -> str:
        return f"{self._source!r}, {len(self._nodes)} nodes, inputs {self.input_names}"


# -- loading ---------------------------------------------------------------------------------------
def load(path: str | os.PathLike[str] | Any, constants: Mapping[str, Any] | None = None) -> OnnxModule:
    """Load an ONNX file (or an in-memory ``onnx.ModelProto``) as a trainable glcomp Module (see
    the module docstring for the mapping).

    `constants` binds graph inputs (by ONNX name) to fixed values: they become compile-time
    constants and leave ``input_names``. Shapes are static in a glcomp program, so an input that
    decides a shape (Expand's or Reshape's shape fed as a graph input, as ONNX's
    ``test_expand_shape_model*``) must be bound this way.

    The file is validated with ``onnx.checker``; tensors stored as external data must lie inside
    the model's directory (no absolute paths, no ``..``, no symbolic link out). Every node's op
    must be supported (`SUPPORTED_OPS`); otherwise GlcompError names the node, its op type and the
    supported ops. Raises GlcompError (``pip install glcomp[onnx]``) when onnx is not installed."""
    try:
        import onnx
    except ImportError:
        raise GlcompError(_INSTALL_HINT) from None
    from onnx import external_data_helper

    if isinstance(path, onnx.ModelProto):
        return _load_proto(path, constants)
    source = os.fspath(path)
    file = Path(source)
    if not file.is_file():
        raise GlcompError(f"{source}: no such ONNX file")
    try:
        model = onnx.load(source, load_external_data=False)
    except Exception as err:
        raise GlcompError(f"{source}: not a readable ONNX model ({type(err).__name__}: {err})") from None
    base = file.resolve().parent
    external = [t for t in external_data_helper._get_all_tensors(model) if t.data_location == 1]
    for tensor in external:
        info = {e.key: e.value for e in tensor.external_data}
        location = info.get("location", "")
        target = (base / location).resolve()
        if (
            not location
            or os.path.isabs(location)
            or ".." in Path(location).parts
            or not target.is_relative_to(base)
        ):
            raise GlcompError(
                f"{source}: initializer {tensor.name!r} stores its data at {location!r}, outside the "
                "model's directory; external data must be a relative path inside it"
            )
        if not target.is_file():
            raise GlcompError(f"{source}: external data file {location!r} of {tensor.name!r} is missing")
    try:
        onnx.checker.check_model(source)  # a path: external data resolves beside the model
    except Exception as err:
        raise GlcompError(f"{source}: invalid ONNX model: {err}") from None
    if external:
        try:
            external_data_helper.load_external_data_for_model(model, str(base))
        except Exception as err:
            raise GlcompError(f"{source}: cannot read external data ({err})") from None
    if len(model.graph.output) == 0:
        raise GlcompError(f"{source}: the ONNX graph has no outputs")
    return OnnxModule(model, source, constants)


def _load_proto(model: Any, constants: Mapping[str, Any] | None) -> OnnxModule:
    """`load` for a ModelProto held in memory (no external data: its tensors must be inline)."""
    import onnx
    from onnx import external_data_helper

    source = f"ONNX model {model.graph.name or '(unnamed)'!r}"
    if any(t.data_location == 1 for t in external_data_helper._get_all_tensors(model)):
        raise GlcompError(f"{source}: tensors stored as external data need load(path) of the file")
    try:
        onnx.checker.check_model(model)
    except Exception as err:
        raise GlcompError(f"{source}: invalid ONNX model: {err}") from None
    if len(model.graph.output) == 0:
        raise GlcompError(f"{source}: the ONNX graph has no outputs")
    return OnnxModule(model, source, constants)


_NUMPY_TYPES = {
    1: np.float32,
    2: np.uint8,
    3: np.int8,
    4: np.uint16,
    5: np.int16,
    6: np.int32,
    7: np.int64,
    9: np.bool_,
    10: np.float16,
    11: np.float64,
    12: np.uint32,
    13: np.uint64,
}


def _bound_inputs(
    graph: Any, initializers: Mapping[str, Any], constants: Mapping[str, Any], source: str
) -> dict[str, np.ndarray]:
    """The graph inputs `constants` binds, as arrays of the declared type and shape."""
    declared = {v.name: v for v in graph.input if v.name not in initializers}
    unknown = sorted(set(constants) - set(declared))
    if unknown:
        raise GlcompError(
            f"{source}: constants names {unknown}, which are not graph inputs; inputs: {sorted(declared)}"
        )
    out: dict[str, np.ndarray] = {}
    for name, value in constants.items():
        tensor_type = declared[name].type.tensor_type
        dtype = _NUMPY_TYPES.get(tensor_type.elem_type)
        if dtype is None:
            raise GlcompError(f"{source}: input {name!r} has ONNX type {tensor_type.elem_type}, not a number")
        array = np.asarray(value)
        if (
            array.dtype.kind in "fc"
            and np.dtype(dtype).kind in "iub"
            and not np.all(array == np.round(array))
        ):
            raise GlcompError(f"{source}: constant for the integer input {name!r} holds non-integers")
        array = array.astype(dtype)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        fixed = zip(dims, array.shape)
        if len(dims) != array.ndim or any(d is not None and d != s for d, s in fixed):
            raise GlcompError(
                f"{source}: constant for input {name!r} has shape {array.shape} but the model declares "
                f"{tuple('?' if d is None else d for d in dims)}"
            )
        out[name] = array.astype(np.float32) if np.dtype(dtype).kind == "f" else array
    return out


_INTEGER_TYPES = frozenset({2, 3, 4, 5, 6, 7, 12, 13})  # UINT8 INT8 UINT16 INT16 INT32 INT64 UINT32 UINT64


def _value_types(model: Any) -> dict[str, int]:
    """Each value's ONNX element type, as declared or inferred (values ONNX cannot infer are left
    out, i.e. computed as floats)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        inferred = model.graph
    types = {t.name: t.data_type for t in inferred.initializer}
    for value in (*inferred.input, *inferred.value_info, *inferred.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
            types[value.name] = value.type.tensor_type.elem_type
    return types


def _initializer_slots(nodes: Sequence[_Node], initializers: set[str]) -> dict[str, set[str]]:
    """For each initializer, how nodes use it: "data" (a computed operand), "stats"
    (BatchNormalization's mean/variance) or "static" (shapes, axes, indices, exponents)."""
    slots: dict[str, set[str]] = {}
    for node in nodes:
        for i, name in enumerate(node.inputs):
            if name not in initializers:
                continue
            if i in _STATIC_INPUTS.get(node.op, ()):
                kind = "static"
            elif node.op == "BatchNormalization" and i in _BATCHNORM_STATS:
                kind = "stats"
            else:
                kind = "data"
            slots.setdefault(name, set()).add(kind)
    return slots


_RESERVED = {"lr", "loss", "rng.step", "output"}


def _state_name(name: str, taken: set[str]) -> str:
    """The ONNX name, changed only where needed: printable, non-empty, unique."""
    clean = "".join(c if c.isprintable() else "_" for c in name) or "initializer"
    key, n = clean, 1
    while key in taken or key in _RESERVED:
        key, n = f"{clean}_{n}", n + 1
    return key


def _identifier(name: str, taken: set[str]) -> str:
    clean = re.sub(r"\W", "_", name) or "input"
    if clean[0].isdigit():
        clean = "_" + clean
    key, n = clean, 1
    while key in taken or key in _RESERVED:
        key, n = f"{clean}_{n}", n + 1
    return key


# -- value helpers ---------------------------------------------------------------------------------
def _graph_of(values: Sequence[Any]) -> Any:
    for v in values:
        if isinstance(v, Tensor):
            return v.graph
    return None


def _tensor(value: Any, graph: Any) -> Tensor:
    """A traced tensor for `value` (a constant array becomes graph constants)."""
    if isinstance(value, Tensor):
        return value
    array = np.asarray(value, dtype=np.float32)
    flat = array.reshape(-1)
    if flat.size and np.all(flat == flat[0]):
        return const(graph, float(flat[0]), array.shape)
    if flat.size > 256:
        raise GlcompError(
            f"a constant of shape {array.shape} with distinct values meets a computed tensor; "
            "glcomp imports such constants up to 256 elements"
        )
    return reshape(cat([const(graph, float(v), (1,)) for v in flat]), array.shape)


def _static(value: Any, what: str) -> np.ndarray:
    if isinstance(value, Tensor):
        raise GlcompError(f"{what} must be a constant known at compile time, not a computed tensor")
    if value is None:
        raise GlcompError(f"{what} is missing")
    return np.asarray(value)


def _ints(value: Any, what: str) -> list[int]:
    return [int(v) for v in _static(value, what).reshape(-1)]


def _operands(a: Any, b: Any) -> tuple[Any, Any]:
    """Both operands as tensors, or a tensor and a Python float (0-d constants)."""
    graph = _graph_of((a, b))

    def lift(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v
        arr = np.asarray(v)
        return float(arr) if arr.ndim == 0 else _tensor(arr, graph)

    return lift(a), lift(b)


def _axis(axis: int, ndim: int, node: _Node) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise node.fail(f"axis {axis} is out of range for rank {ndim}")
    return axis % max(ndim, 1)


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(v.shape) if isinstance(v, Tensor) else tuple(np.shape(v))


Handler = Callable[[OnnxModule, _Node, list[Any]], list[Any]]
_HANDLERS: dict[str, Handler] = {}


def _op(*names: str) -> Callable[[Handler], Handler]:
    def register(fn: Handler) -> Handler:
        for name in names:
            _HANDLERS[name] = fn
        return fn

    return register


# -- elementwise -----------------------------------------------------------------------------------
_BINARY: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = {
    "Add": (lambda a, b: a + b, np.add),
    "Sub": (lambda a, b: a - b, np.subtract),
    "Mul": (lambda a, b: a * b, np.multiply),
    "Div": (
        lambda a, b: a / b,
        lambda a, b: np.trunc(a / b).astype(a.dtype) if np.issubdtype(a.dtype, np.integer) else a / b,
    ),
}


@_op(*_BINARY)
def _binary(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    symbolic, numeric = _BINARY[node.op]
    a, b = x[0], x[1]
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return [numeric(np.asarray(a), np.asarray(b))]
    out = symbolic(*_operands(a, b))
    if node.op == "Div" and m._integer(node.outputs[0]):
        # Integer division truncates toward zero: round, then step back toward zero where
        # rounding went away from it (exact for quotients below 2**22).
        r = _rounded(out)
        out = where(r.abs() > out.abs(), r - out.sign(), r)
    return [out]


@_op("Pow")
def _pow(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """A scalar constant exponent: Tensor.pow (repeated products for integers). A tensor
    exponent (computed, or a constant array): |base|^e = exp(e log |base|), with 1 where e == 0,
    0 where base == 0 < e, the sign (-1)^e where base < 0 and e is an integer, and
    exp(e log base) where base < 0 and e is not: NaN, the log of a negative number, and +inf for
    0 ** e < 0 (as numpy's float pow, but for the sign of -0.0). Integers are told apart from
    fractions by rounding, exactly for |e| < 2**22."""
    base, exponent = x[0], x[1]
    if not isinstance(base, Tensor) and not isinstance(exponent, Tensor):
        return [np.power(np.asarray(base), np.asarray(exponent))]
    if not isinstance(exponent, Tensor) and np.size(exponent) == 1:
        return [base.pow(float(np.asarray(exponent).reshape(-1)[0]))]
    graph = _graph_of(x)
    b, e = _tensor(base, graph), _tensor(exponent, graph)
    shape = broadcast_shapes(b.shape, e.shape)
    b, e = broadcast_to(b, shape), broadcast_to(e, shape)
    return [_tensor_pow(b, e)]


_ROUND = 12582912.0  # 1.5 * 2**23: (v + _ROUND) - _ROUND rounds a float32 |v| < 2**22 to an integer


def _rounded(v: Tensor) -> Tensor:
    """v rounded to an integer where |v| < 2**22. The maximum between the two additions keeps
    shader compilers from folding (v + c) - c back to v (they may reassociate floats)."""
    return (maximum(v + _ROUND, _ROUND - 2.0**23) - _ROUND).detach()


def _tensor_pow(b: Tensor, e: Tensor) -> Tensor:
    from glcomp.ir.tensor import eq, gt, lt

    magnitude = (b.abs().log() * e).exp()
    whole = eq(_rounded(e), e)  # e is an integer (every float32 beyond 2**22 is one)
    half = e * 0.5
    odd = whole * (1.0 - eq(_rounded(half), half))
    sign = where(odd, -1.0, 1.0)
    # Not an integer: exp(e log b), NaN from the log of a negative number (no NaN constants).
    negative = where(whole, magnitude * sign, (b.log() * e).exp())
    out = where(lt(b, 0.0), negative, magnitude)
    out = where(eq(b, 0.0) * gt(e, 0.0), 0.0, out)
    # 0 ** negative: +inf, as the product of two large finite constants (a shader's literal
    # infinity is clamped to a finite value).
    pole = eq(b, 0.0) * lt(e, 0.0)
    big = where(pole, 3.0e38, 1.0)
    out = where(pole, big * big, out)
    return where(eq(e, 0.0), 1.0, out)


_UNARY: dict[str, tuple[Callable[[Tensor], Tensor], Callable[[np.ndarray], np.ndarray]]] = {
    "Sqrt": (lambda t: t.sqrt(), np.sqrt),
    "Exp": (lambda t: t.exp(), np.exp),
    "Log": (lambda t: t.log(), np.log),
    "Neg": (lambda t: -t, np.negative),
    "Abs": (lambda t: t.abs(), np.abs),
    "Reciprocal": (lambda t: 1.0 / t, np.reciprocal),
    "Erf": (F.erf, np.vectorize(math.erf, otypes=[np.float32])),
    "Relu": (F.relu, lambda a: np.maximum(a, 0)),
    "Sigmoid": (F.sigmoid, lambda a: 1 / (1 + np.exp(-a))),
    "Tanh": (F.tanh, np.tanh),
    "Sign": (lambda t: t.sign(), np.sign),
    "Softplus": (F.softplus, lambda a: np.logaddexp(0, a).astype(a.dtype)),
    "Softsign": (lambda t: t / (1.0 + t.abs()), lambda a: a / (1 + np.abs(a))),
}


@_op(*_UNARY)
def _unary(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    symbolic, numeric = _UNARY[node.op]
    if isinstance(x[0], Tensor):
        return [symbolic(x[0])]
    return [numeric(np.asarray(x[0]))]


def _need_tensor(node: _Node, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        return value
    raise node.fail("this op is imported for computed tensors only; its input here is a constant")


@_op("LeakyRelu")
def _leaky_relu(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    return [F.leaky_relu(_need_tensor(node, x[0]), float(node.attr("alpha", 0.01)))]


@_op("Elu", "Selu", "Celu")
def _elu(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    if node.op == "Elu":
        return [F.elu(t, float(node.attr("alpha", 1.0)))]
    if node.op == "Celu":
        alpha = float(node.attr("alpha", 1.0))
        return [F.elu(t * (1.0 / alpha), 1.0) * alpha]
    alpha = float(node.attr("alpha", 1.67326319217681884765625))
    gamma = float(node.attr("gamma", 1.05070102214813232421875))
    return [F.elu(t, alpha) * gamma]


@_op("PRelu")
def _prelu(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """x where x >= 0, slope * x elsewhere; the slope broadcasts to x (before opset 7 a 1-D slope
    of C values is per channel, axis 1)."""
    from glcomp.ir.tensor import lt

    t = _need_tensor(node, x[0])
    slope = x[1]
    shape = _shape(slope)
    if m._opset < 7 and len(shape) == 1 and t.ndim > 2 and shape[0] == t.shape[1]:
        slope = _reshape_any(slope, (shape[0],) + (1,) * (t.ndim - 2))
    slope = slope if isinstance(slope, Tensor) or np.ndim(slope) == 0 else _tensor(slope, t.graph)
    slope = float(slope) if not isinstance(slope, Tensor) else slope
    if isinstance(slope, Tensor) and broadcast_shapes(t.shape, slope.shape) != t.shape:
        raise node.fail(f"the slope of shape {slope.shape} does not broadcast to the input's {t.shape}")
    return [where(lt(t, 0.0), t * slope, t)]


@_op("Shrink")
def _shrink(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    from glcomp.ir.tensor import gt, lt

    t = _need_tensor(node, x[0])
    lambd, bias = float(node.attr("lambd", 0.5)), float(node.attr("bias", 0.0))
    return [where(lt(t, -lambd), t + bias, where(gt(t, lambd), t - bias, 0.0))]


@_op("HardSigmoid")
def _hard_sigmoid(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    alpha, beta = float(node.attr("alpha", 0.2)), float(node.attr("beta", 0.5))
    return [(t * alpha + beta).clamp(0.0, 1.0)]


# -- variadic elementwise --------------------------------------------------------------------------
_VARIADIC: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = {
    "Sum": (lambda a, b: a + b, np.add),
    "Mean": (lambda a, b: a + b, np.add),
    "Max": (maximum, np.maximum),
    "Min": (minimum, np.minimum),
}


@_op(*_VARIADIC)
def _variadic(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """Sum / Mean / Max / Min of any number of inputs, with numpy broadcasting, folded pairwise."""
    symbolic, numeric = _VARIADIC[node.op]
    parts = [v for v in x if v is not None]
    if not parts:
        raise node.fail("needs at least one input")
    acc = parts[0]
    for v in parts[1:]:
        if isinstance(acc, Tensor) or isinstance(v, Tensor):
            acc = symbolic(*_operands(acc, v))
        else:
            acc = numeric(np.asarray(acc), np.asarray(v))
    if node.op == "Mean" and len(parts) > 1:
        acc = acc * (1.0 / len(parts)) if isinstance(acc, Tensor) else acc / len(parts)
    if isinstance(acc, Tensor):
        shape = ()
        for v in parts:
            shape = broadcast_shapes(shape, _shape(v))
        acc = broadcast_to(acc, shape)
    return [acc]


@_op("Gelu")
def _gelu(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    return [F.gelu(_need_tensor(node, x[0]), node.attr("approximate", "none"))]


@_op("Clip")
def _clip(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    lo, hi = node.attr("min"), node.attr("max")
    if len(x) > 1 and x[1] is not None:
        lo = float(_static(x[1], "min"))
    if len(x) > 2 and x[2] is not None:
        hi = float(_static(x[2], "max"))
    t = _need_tensor(node, x[0])
    return [t if lo is None and hi is None else t.clamp(lo, hi)]


@_op("Softmax", "LogSoftmax")
def _softmax(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    fn = F.softmax if node.op == "Softmax" else F.log_softmax
    axis = _axis(int(node.attr("axis", -1 if m._opset >= 13 else 1)), t.ndim, node)
    if m._opset >= 13 or axis == t.ndim - 1:
        return [fn(t, axis)]
    # Before opset 13 the input is coerced to 2-D at `axis` and normalised over the second part.
    flat = reshape(t, (math.prod(t.shape[:axis]), math.prod(t.shape[axis:])))
    return [reshape(fn(flat, 1), t.shape)]


# -- linear algebra --------------------------------------------------------------------------------
@_op("MatMul")
def _matmul(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    a, b = x
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        return [np.matmul(a, b)]
    graph = _graph_of(x)
    return [_tensor(a, graph) @ _tensor(b, graph)]


@_op("Gemm")
def _gemm(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    graph = _graph_of(x)
    if graph is None:
        raise node.fail("Gemm of constants is not supported")
    a, b = _tensor(x[0], graph), _tensor(x[1], graph)
    if a.ndim != 2 or b.ndim != 2:
        raise node.fail(f"Gemm needs 2-D operands, got {a.shape} and {b.shape}")
    if node.attr("transA", 0):
        a = a.T
    if node.attr("transB", 0):
        b = b.T
    y = a @ b
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = y * alpha
    if len(x) > 2 and x[2] is not None and beta != 0.0:
        c = x[2] if isinstance(x[2], Tensor) else np.asarray(x[2], np.float32)
        c = c * beta if beta != 1.0 else c
        y = y + (c if isinstance(c, Tensor) else _operands(y, c)[1])
    return [y]


def _pads_2d(node: _Node, x: Tensor) -> tuple[tuple[int, int], tuple[int, int] | None]:
    """Symmetric (top, left) padding, or a zero-padding prelude for asymmetric pads."""
    auto = node.attr("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        raise node.fail(f"auto_pad={auto!r} is not supported; export with explicit pads")
    pads = [int(p) for p in node.attr("pads", [0, 0, 0, 0])] if auto == "NOTSET" else [0, 0, 0, 0]
    if len(pads) != 4:
        raise node.fail(f"only 2-D spatial inputs are supported, got pads {pads}")
    if pads[0] == pads[2] and pads[1] == pads[3]:
        return (pads[0], pads[1]), None
    return (0, 0), (pads[0], pads[2], pads[1], pads[3])


def _spatial_checks(node: _Node, x: Tensor, dilated: bool = False) -> None:
    if x.ndim != 4:
        raise node.fail(f"only 2-D spatial inputs (N, C, H, W) are supported, got {x.shape}")
    if not dilated and any(int(d) != 1 for d in node.attr("dilations", [1, 1])):
        raise node.fail(f"dilations {node.attr('dilations')} are not supported")


def _conv_attrs(node: _Node) -> tuple[tuple[int, int], tuple[int, int], int]:
    strides = [int(s) for s in node.attr("strides", [1, 1])]
    dilations = [int(d) for d in node.attr("dilations", [1, 1])]
    if len(strides) != 2 or len(dilations) != 2:
        raise node.fail(f"only 2-D convolutions are supported (strides {strides}, dilations {dilations})")
    return (strides[0], strides[1]), (dilations[0], dilations[1]), int(node.attr("group", 1))


# 1-D Conv / ConvTranspose / pools run as 2-D ones over (N, C, 1, L): a unit height, kernel 1,
# stride 1, dilation 1 and no padding along it; the weight (O, I, k) is viewed as (O, I, 1, k).
_UNIT_AXIS = {"kernel_shape": 1, "strides": 1, "dilations": 1, "output_padding": 0}


def _unit_height(node: _Node) -> _Node:
    twin = copy.copy(node)
    attrs = dict(node.attrs)
    for key, unit in _UNIT_AXIS.items():
        if key in attrs:
            values = [int(v) for v in attrs[key]]
            if len(values) != 1:
                raise node.fail(f"{key} {values} must hold one value for a 1-D input")
            attrs[key] = [unit, *values]
    if "pads" in attrs:
        pads = [int(v) for v in attrs["pads"]]
        if len(pads) != 2:
            raise node.fail(f"pads {pads} must hold two values for a 1-D input")
        attrs["pads"] = [0, pads[0], 0, pads[1]]
    if "output_shape" in attrs:
        attrs["output_shape"] = [1, *[int(v) for v in attrs["output_shape"]][-1:]]
    twin.attrs = attrs
    return twin


def _one_d(handler: Handler) -> Handler:
    """Run `handler` on a 3-D (N, C, L) input as on (N, C, 1, L) and drop the unit axis again."""

    def run(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
        t = x[0]
        if not isinstance(t, Tensor) or t.ndim != 3:
            return handler(m, node, x)
        args = [reshape(t, t.shape[:2] + (1,) + t.shape[2:]), *x[1:]]
        if node.op in ("Conv", "ConvTranspose") and len(args) > 1 and len(_shape(args[1])) == 3:
            w = _shape(args[1])
            args[1] = _reshape_any(args[1], w[:2] + (1,) + w[2:])
        out = handler(m, _unit_height(node), args)
        return [reshape(v, v.shape[:2] + v.shape[3:]) if isinstance(v, Tensor) else v for v in out]

    return run


def _auto_pad(handler: Handler) -> Handler:
    """Run `handler` with ``auto_pad=SAME_UPPER|SAME_LOWER`` turned into explicit pads: per
    spatial axis the output is ceil(in / stride) and the padding that needs is split evenly,
    the odd one at the end (SAME_UPPER) or at the beginning (SAME_LOWER)."""

    def run(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
        auto = node.attr("auto_pad", "NOTSET")
        if auto not in ("SAME_UPPER", "SAME_LOWER") or not isinstance(x[0], Tensor):
            return handler(m, node, x)
        spatial = x[0].shape[2:]
        if node.op == "Conv" and len(x) > 1 and x[1] is not None:
            kernel = [int(k) for k in _shape(x[1])[2:]]
        else:
            kernel = [int(k) for k in node.attr("kernel_shape", [])]
        strides = [int(v) for v in node.attr("strides", [1] * len(spatial))]
        dilations = [int(v) for v in node.attr("dilations", [1] * len(spatial))]
        if not len(kernel) == len(strides) == len(dilations) == len(spatial):
            raise node.fail(f"auto_pad={auto!r} with kernel {kernel} for input {x[0].shape}")
        begins, ends = [], []
        for n, k, st, d in zip(spatial, kernel, strides, dilations):
            total = max((-(-n // st) - 1) * st + (k - 1) * d + 1 - n, 0)
            small, large = total // 2, total - total // 2
            begins.append(small if auto == "SAME_UPPER" else large)
            ends.append(large if auto == "SAME_UPPER" else small)
        twin = copy.copy(node)
        twin.attrs = {**node.attrs, "auto_pad": "NOTSET", "pads": begins + ends}
        return handler(m, twin, x)

    return run


@_op("Conv")
@_auto_pad
@_one_d
def _conv(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    _spatial_checks(node, t, dilated=True)
    stride, dilation, group = _conv_attrs(node)
    w = _tensor(x[1], t.graph)
    padding, prelude = _pads_2d(node, t)
    if prelude is not None:
        top, bottom, left, right = prelude
        t = F.pad(t, (left, right, top, bottom))
    bias = _tensor(x[2], t.graph) if len(x) > 2 and x[2] is not None else None
    return [F.conv2d(t, w, bias, stride=stride, padding=padding, dilation=dilation, groups=group)]


@_op("ConvTranspose")
@_one_d
def _conv_transpose(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """ONNX's ConvTranspose: symmetric pads map onto F.conv_transpose2d; asymmetric pads and
    ``output_shape`` scatter onto the unpadded extent and crop (zero-extending past it)."""
    t = _need_tensor(node, x[0])
    _spatial_checks(node, t, dilated=True)
    stride, dilation, group = _conv_attrs(node)
    w = _tensor(x[1], t.graph)
    bias = _tensor(x[2], t.graph) if len(x) > 2 and x[2] is not None else None
    if w.ndim != 4:
        raise node.fail(f"the weight must be (C_in, C_out / group, kH, kW), got {w.shape}")
    auto = node.attr("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        raise node.fail(f"auto_pad={auto!r} is not supported; export with explicit pads")
    pads = [int(p) for p in node.attr("pads", [0, 0, 0, 0])] if auto == "NOTSET" else [0, 0, 0, 0]
    output_padding = [int(p) for p in node.attr("output_padding", [0, 0])]
    keff = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilation)]
    full = [(n - 1) * s + k for n, s, k in zip(t.shape[2:], stride, keff)]
    shape = node.attr("output_shape")
    if shape is not None:
        shape = [int(v) for v in shape][-2:]
        totals = [f + op - o for f, op, o in zip(full, output_padding, shape)]
        if min(totals) < 0:
            raise node.fail(f"output_shape {shape} is larger than the transposed convolution's extent")
        pads = [tt - tt // 2 for tt in totals] + [tt // 2 for tt in totals]
    if len(pads) != 4 or len(output_padding) != 2:
        raise node.fail(f"only 2-D convolutions are supported (pads {pads})")
    if pads[:2] == pads[2:] and all(op < max(s, d) for op, s, d in zip(output_padding, stride, dilation)):
        y = F.conv_transpose2d(t, w, bias, stride, tuple(pads[:2]), tuple(output_padding), group, dilation)
        return [y]
    y = F.conv_transpose2d(t, w, None, stride, 0, 0, group, dilation)
    size = [f + op - b - e for f, op, b, e in zip(full, output_padding, pads[:2], pads[2:])]
    if min(size) < 1:
        raise node.fail(f"pads {pads} leave an empty output")
    for axis in (2, 3):
        begin, n, f = pads[axis - 2], size[axis - 2], full[axis - 2]
        if begin >= f:
            raise node.fail(f"pads {pads} crop the whole output")
        y = slice_axis(y, axis, begin, min(begin + n, f))
    grow = [0, size[1] - y.shape[3], 0, size[0] - y.shape[2]]
    if any(grow):
        y = F.pad(y, grow)
    return [y if bias is None else y + reshape(bias, (1, -1, 1, 1))]


_LOWEST = -3.4028234663852886e38  # float32's most negative finite value: max pooling's padding


def _explicit_pads(node: _Node) -> list[int]:
    auto = node.attr("auto_pad", "NOTSET")
    if auto not in ("NOTSET", "VALID"):
        raise node.fail(f"auto_pad={auto!r} is not supported; export with explicit pads")
    pads = [int(p) for p in node.attr("pads", [0, 0, 0, 0])] if auto == "NOTSET" else [0, 0, 0, 0]
    if len(pads) != 4 or min(pads) < 0:
        raise node.fail(f"only 1-D and 2-D spatial inputs with pads >= 0 are supported, got pads {pads}")
    return pads


@_op("MaxPool", "AveragePool")
@_auto_pad
@_one_d
def _pool(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """Symmetric pads of at most half the kernel go to the pool primitives; other pads are
    explicit: edge values for MaxPool (every window holds an input element, so its maximum is
    unchanged), zeros for AveragePool (count_include_pad=0 divides by the count of input
    elements: the same pool over ones). Dilated MaxPool samples every d-th element when the
    stride is a multiple of the dilation and pools that."""
    t = _need_tensor(node, x[0])
    if t.ndim != 4:
        raise node.fail(
            f"only 1-D and 2-D spatial inputs (N, C, L) / (N, C, H, W) are supported, got {t.shape}"
        )
    kernel = tuple(int(k) for k in node.attr("kernel_shape"))
    stride = tuple(int(s) for s in node.attr("strides", [1, 1]))
    dilation = tuple(int(d) for d in node.attr("dilations", [1, 1]))
    if len(kernel) != 2 or len(stride) != 2 or len(dilation) != 2:
        raise node.fail(f"kernel_shape {list(kernel)} / strides {list(stride)} do not match a 2-D input")
    pads = _explicit_pads(node)
    extent = [(k - 1) * d + 1 for k, d in zip(kernel, dilation)]
    out = [
        (n + pads[i] + pads[i + 2] - e) // s + 1
        for i, (n, e, s) in enumerate(zip(t.shape[2:], extent, stride))
    ]
    if min(out) < 1:
        raise node.fail(f"the window {extent} is larger than the padded input {t.shape[2:]} (pads {pads})")
    extra = [0, 0]  # ceil_mode: end padding for a last, partial window (none past the input)
    if int(node.attr("ceil_mode", 0)):
        for i, (n, e, s) in enumerate(zip(t.shape[2:], extent, stride)):
            size = -(-(n + pads[i] + pads[i + 2] - e) // s) + 1
            if (size - 1) * s >= n + pads[i]:
                size -= 1  # torch's and ONNX's rule: the last window starts inside the input
            extra[i] = max((size - 1) * s + e - (n + pads[i] + pads[i + 2]), 0)
            out[i] = size
    if any(extra):
        real = list(pads)
        pads = [*pads[:2], pads[2] + extra[0], pads[3] + extra[1]]
        if node.op == "AveragePool" and dilation == (1, 1):
            # The divisor counts input elements, and the real pads where count_include_pad=1,
            # never the ceil extension: the same pool over ones padded that way.
            count_pad = float(int(node.attr("count_include_pad", 0)))
            begins, ends = [0, 0, *real[:2]], [0, 0, *real[2:]]
            ones = _pad_constant(const(t.graph, 1.0, t.shape), begins, ends, count_pad)
            ones = _pad_constant(ones, [0, 0, 0, 0], [0, 0, *extra], 0.0)
            summed = F.avg_pool2d(
                _pad_constant(t, [0, 0, *pads[:2]], [0, 0, *pads[2:]], 0.0), kernel, stride, 0
            )
            return [summed / F.avg_pool2d(ones, kernel, stride, 0)]
    symmetric = pads[:2] == pads[2:] and all(2 * p <= k for p, k in zip(pads[:2], kernel))
    if node.op == "MaxPool":
        indices = _Unsupported(f"the indices of MaxPool {node.name!r}")
        if dilation == (1, 1) and symmetric:
            return [F.max_pool2d(t, kernel, stride, tuple(pads[:2])), indices]
        return [_max_pool_explicit(node, t, kernel, stride, dilation, pads, out), indices]
    if dilation != (1, 1):
        raise node.fail(f"dilations {list(dilation)} are not supported for AveragePool")
    count_pad = int(node.attr("count_include_pad", 0))
    if symmetric:
        padding = tuple(pads[:2])
        y = F.avg_pool2d(t, kernel, stride, padding)
        if any(padding) and not count_pad:
            y = y / F.avg_pool2d(const(t.graph, 1.0, t.shape), kernel, stride, padding)
        return [y]
    begins, ends = [0, 0, *pads[:2]], [0, 0, *pads[2:]]
    y = F.avg_pool2d(_pad_constant(t, begins, ends, 0.0), kernel, stride, 0)
    if not count_pad:
        y = y / F.avg_pool2d(
            _pad_constant(const(t.graph, 1.0, t.shape), begins, ends, 0.0), kernel, stride, 0
        )
    return [y]


def _max_pool_explicit(
    node: _Node,
    t: Tensor,
    kernel: tuple[int, ...],
    stride: tuple[int, ...],
    dilation: tuple[int, ...],
    pads: list[int],
    out: list[int],
) -> Tensor:
    for i, n in enumerate(t.shape[2:]):
        starts = np.arange(out[i])[:, None] * stride[i] + np.arange(kernel[i])[None, :] * dilation[i]
        real = (starts >= pads[i]) & (starts < pads[i] + n)
        if not real.any(axis=1).all():
            raise node.fail(f"pads {pads} leave a pooling window without input elements")
    if dilation == (1, 1):
        y = t
        for i in range(2):
            if pads[i] or pads[i + 2]:
                y = _pad_axis(node, y, i + 2, pads[i], pads[i + 2], "edge")
        return F.max_pool2d(y, kernel, stride, 0)
    if any(s % d for s, d in zip(stride, dilation)):
        raise node.fail(
            f"dilations {list(dilation)} are supported only for strides that are multiples ({list(stride)})"
        )
    begins, ends = [0, 0, *pads[:2]], [0, 0, *pads[2:]]
    inside = _pad_constant(const(t.graph, 1.0, t.shape), begins, ends, 0.0)
    y = where(inside, _pad_constant(t, begins, ends, 0.0), _LOWEST)
    for i, d in enumerate(dilation):
        if d == 1:
            continue
        axis, n = i + 2, y.shape[i + 2]
        cells = -(-n // d)
        y = _pad_constant(y, [0] * 4, [cells * d - n if a == axis else 0 for a in range(4)], 0.0)
        split = y.shape[:axis] + (cells, d) + y.shape[axis + 1 :]
        y = slice_axis(reshape(y, split), axis + 1, 0, 1)
        y = reshape(y, split[:axis] + (cells,) + split[axis + 2 :])
    y = F.max_pool2d(y, kernel, tuple(s // d for s, d in zip(stride, dilation)), 0)
    for i in range(2):
        y = slice_axis(y, i + 2, 0, out[i])
    return y


@_op("GlobalAveragePool", "GlobalMaxPool")
def _global_pool(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    axes = tuple(range(2, t.ndim))
    return [t.mean(axes, keepdim=True) if node.op == "GlobalAveragePool" else t.amax(axes, keepdim=True)]


@_op("Resize", "Upsample")
def _resize(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """Nearest resizing with torch's sampling (coordinate_transformation_mode "asymmetric",
    nearest_mode "floor": source index floor(i / scale)), of the two spatial axes only."""
    t = _need_tensor(node, x[0])
    if t.ndim != 4:
        raise node.fail(f"only 2-D spatial inputs (N, C, H, W) are supported, got {t.shape}")
    mode = node.attr("mode", "nearest")
    ctm = node.attr("coordinate_transformation_mode", "half_pixel" if node.op == "Resize" else "asymmetric")
    nearest = node.attr("nearest_mode", "round_prefer_floor" if node.op == "Resize" else "floor")
    if mode != "nearest" or ctm != "asymmetric" or nearest != "floor":
        raise node.fail(
            f"only mode 'nearest' with coordinate_transformation_mode 'asymmetric' and nearest_mode "
            f"'floor' (torch's nearest) is supported, got {mode!r}, {ctm!r}, {nearest!r}"
        )
    if node.op == "Upsample":
        given = x[1] if len(x) > 1 and x[1] is not None else node.attr("scales")
        scales, sizes = [float(v) for v in _static(given, "scales").reshape(-1)], None
    else:
        if node.attr("axes") is not None or int(node.attr("antialias", 0)):
            raise node.fail("the axes and antialias attributes are not supported")
        scales = sizes = None
        if len(x) > 3 and x[3] is not None and np.size(x[3]):
            sizes = _ints(x[3], "sizes")
        elif len(x) > 2 and x[2] is not None and np.size(x[2]):
            scales = [float(v) for v in _static(x[2], "scales").reshape(-1)]
        else:
            raise node.fail("needs scales or sizes")
    if sizes is not None:
        if len(sizes) != 4 or tuple(sizes[:2]) != t.shape[:2]:
            raise node.fail(f"sizes {sizes} must keep the batch and channel sizes of {t.shape}")
        return [F.interpolate(t, size=tuple(sizes[2:]))]
    if scales is None or len(scales) != 4 or scales[:2] != [1.0, 1.0]:
        raise node.fail(f"scales {scales} must be 1 on the batch and channel axes")
    return [F.interpolate(t, scale_factor=(scales[2], scales[3]))]


# ONNX gate blocks in torch's order: LSTM i o f c -> i f g o, GRU z r h -> r z n.
_TORCH_GATES = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2)}


@_op("LSTM", "GRU")
def _recurrent(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """ONNX LSTM / GRU with the default activations, unrolled like glcomp.nn.LSTM / GRU: the W, R
    and B initializers stay parameters in ONNX layout and are regrouped into torch's gate order
    by slices inside the graph, so their gradients land in ONNX layout."""
    from glcomp.ir.tensor import stack
    from glcomp.nn.recurrent import _step

    t = _need_tensor(node, x[0])
    hidden = int(node.attr("hidden_size", 0))
    direction = node.attr("direction", "forward")
    layout = int(node.attr("layout", 0))
    order = _TORCH_GATES[node.op]
    gates = len(order)
    if direction not in ("forward", "reverse", "bidirectional"):
        raise node.fail(f"unknown direction {direction!r}")
    default_acts = ["Sigmoid", "Tanh", "Tanh"] if node.op == "LSTM" else ["Sigmoid", "Tanh"]
    acts = node.attr("activations")
    if acts is not None and [a.lower() for a in acts] != [a.lower() for a in default_acts] * (
        len(acts) // len(default_acts)
    ):
        raise node.fail(f"activations {acts} are not supported (only the defaults {default_acts})")
    if node.attr("clip") is not None or int(node.attr("input_forget", 0)):
        raise node.fail("clip and input_forget are not supported")
    reset_first = node.op == "GRU" and not int(node.attr("linear_before_reset", 0))
    if node.op == "LSTM" and len(x) > 7 and x[7] is not None:
        raise node.fail("peephole weights (input P) are not supported")
    if t.ndim != 3:
        raise node.fail(f"input X must be 3-D, got {t.shape}")
    if layout:
        t = permute(t, (1, 0, 2))
    steps, n, width = t.shape
    dirs = 2 if direction == "bidirectional" else 1
    w, r = _tensor(x[1], t.graph), _tensor(x[2], t.graph)
    if w.shape != (dirs, gates * hidden, width) or r.shape != (dirs, gates * hidden, hidden):
        raise node.fail(f"W {w.shape} / R {r.shape} do not match hidden_size {hidden} and input {t.shape}")
    b = _tensor(x[3], t.graph) if len(x) > 3 and x[3] is not None else None
    if b is not None and b.shape != (dirs, 2 * gates * hidden):
        raise node.fail(f"B {b.shape} does not match hidden_size {hidden}")
    if len(x) > 4 and x[4] is not None:
        lens = _static(x[4], "sequence_lens").reshape(-1)
        if np.any(lens != steps):
            raise node.fail(
                f"sequence_lens {lens.tolist()} other than the full length {steps} are not supported"
            )

    def initial(i: int, what: str) -> list[Any]:
        v = x[i] if len(x) > i else None
        if v is None or (not isinstance(v, Tensor) and not np.any(np.asarray(v))):
            return [None] * dirs  # zeros: the first step leaves out the recurrent product
        v = _tensor(v, t.graph)
        if layout:
            v = permute(v, (1, 0, 2))
        if v.shape != (dirs, n, hidden):
            raise node.fail(f"{what} must have shape {(dirs, n, hidden)}, got {v.shape}")
        return [getitem(v, d) for d in range(dirs)]

    def torch_order(v: Tensor, start: int) -> Tensor:
        return cat([slice_axis(v, 0, start + k * hidden, start + (k + 1) * hidden) for k in order], 0)

    h0, c0 = initial(5, "initial_h"), initial(6, "initial_c")
    flat = reshape(t, (steps * n, width))
    ys, hs, cs = [], [], []
    for d in range(dirs):
        w_ih, w_hh = torch_order(getitem(w, d), 0), torch_order(getitem(r, d), 0)
        b_ih = b_hh = None
        if b is not None:
            b_ih, b_hh = torch_order(getitem(b, d), 0), torch_order(getitem(b, d), gates * hidden)
        gx = reshape(F.linear(flat, w_ih, b_ih), (steps, n, gates * hidden))
        h, c = h0[d], c0[d]
        seq: list[Tensor] = []
        backward = direction == "reverse" or d == 1
        for s in reversed(range(steps)) if backward else range(steps):
            if reset_first:
                h, c = _gru_reset_first(getitem(gx, s), h, w_hh, b_hh), None
            else:
                h, c = _step(node.op, getitem(gx, s), h, c, w_hh, b_hh)
            seq.append(h)
        if backward:
            seq.reverse()
        ys.append(stack(seq, 0))
        hs.append(h)
        cs.append(c)
    y, y_h = stack(ys, 1), stack(hs, 0)  # (T, D, N, H), (D, N, H)
    y_c = stack(cs, 0) if node.op == "LSTM" else None
    if layout:
        y, y_h = permute(y, (2, 0, 1, 3)), permute(y_h, (1, 0, 2))
        y_c = permute(y_c, (1, 0, 2)) if y_c is not None else None
    return [y, y_h] + ([y_c] if y_c is not None else [])


def _gru_reset_first(gx: Tensor, h: Tensor | None, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    """One GRU step with ONNX's default linear_before_reset=0: the reset gate multiplies the state
    before the recurrent product of the new gate, n = tanh(W_n x + R_n (r * h) + Rb_n + Wb_n)
    (torch's GRU, linear_before_reset=1, multiplies the product instead). Gates in torch's order
    r, z, n; ``h is None`` is a zero state."""
    hsz = w_hh.shape[1]
    w_rz, w_n = slice_axis(w_hh, 0, 0, 2 * hsz), slice_axis(w_hh, 0, 2 * hsz, 3 * hsz)
    b_rz = slice_axis(b_hh, 0, 0, 2 * hsz) if b_hh is not None else None
    b_n = slice_axis(b_hh, 0, 2 * hsz, 3 * hsz) if b_hh is not None else None
    rz = gx[:, : 2 * hsz] if h is None else gx[:, : 2 * hsz] + h @ w_rz.T
    rz = rz + b_rz if b_rz is not None else rz
    r, z = rz[:, :hsz].sigmoid(), rz[:, hsz:].sigmoid()
    n = gx[:, 2 * hsz :] if h is None else gx[:, 2 * hsz :] + (r * h) @ w_n.T
    n = (n + b_n if b_n is not None else n).tanh()
    return (1.0 - z) * n if h is None else n + z * (h - n)


# -- normalisation ---------------------------------------------------------------------------------
@_op("BatchNormalization")
def _batch_norm(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    if t.ndim < 2:
        raise node.fail(f"input must be (N, C, ...), got {t.shape}")
    c = t.shape[1]
    scale, bias, mean, var = (_tensor(v, t.graph) for v in x[1:5])
    for what, v in (("scale", scale), ("B", bias), ("input_mean", mean), ("input_var", var)):
        if v.shape != (c,):
            raise node.fail(f"{what} must have shape ({c},), got {v.shape}")
    eps, momentum = float(node.attr("epsilon", 1e-5)), float(node.attr("momentum", 0.9))
    shape = tuple(c if i == 1 else 1 for i in range(t.ndim))
    extra: list[Any] = []
    if not m.training and node.attr("training_mode", 0):
        # ONNX's training mode outside a train step (predict): batch statistics, and the running
        # statistics averaged with the biased batch variance as ONNX's reference does.
        axes = tuple(i for i in range(t.ndim) if i != 1)
        y, batch_mean, batch_var = F.batch_norm_train(t, axes, eps)
        new_mean = mean * momentum + reshape(batch_mean, (c,)) * (1 - momentum)
        new_var = var * momentum + reshape(batch_var, (c,)) * (1 - momentum)
        extra = [new_mean, new_var]
    elif m.training:
        axes = tuple(i for i in range(t.ndim) if i != 1)
        y, batch_mean, batch_var = F.batch_norm_train(t, axes, eps)
        n = math.prod(t.shape[i] for i in axes)
        new_mean = mean * momentum + reshape(batch_mean, (c,)) * (1 - momentum)
        new_var = var * momentum + reshape(batch_var, (c,)) * (n / max(n - 1, 1) * (1 - momentum))
        trace = active_trace()
        for onnx_name, value in ((node.inputs[3], new_mean), (node.inputs[4], new_var)):
            key = m._state.get(onnx_name)
            if trace is not None and key in m._buffers:
                trace.buffer_updates[key] = value
        extra = [new_mean, new_var]
    else:
        y = (t - reshape(mean, shape)) / (reshape(var, shape) + eps).sqrt()
        extra = [mean, var]
    y = y * reshape(scale, shape) + reshape(bias, shape)
    return [y, *extra]


@_op("LayerNormalization")
def _layer_norm(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = _need_tensor(node, x[0])
    axis = _axis(int(node.attr("axis", -1)), t.ndim, node)
    shape = t.shape[axis:]
    scale = _tensor(x[1], t.graph) if len(x) > 1 and x[1] is not None else None
    bias = _tensor(x[2], t.graph) if len(x) > 2 and x[2] is not None else None
    eps = float(node.attr("epsilon", 1e-5))
    y = F.layer_norm(t, shape, scale, bias, eps)
    if len(node.outputs) == 1 or not any(node.outputs[1:]):
        return [y]
    # The optional Mean and InvStdDev outputs, over the normalized axes kept as size 1.
    axes = tuple(range(axis, t.ndim))
    mean = t.mean(axes, keepdim=True)
    centered = t - mean
    inv_std = 1.0 / ((centered * centered).mean(axes, keepdim=True) + eps).sqrt()
    return [y, mean, inv_std]


@_op("InstanceNormalization")
def _instance_norm(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """(x - mean) / sqrt(var + epsilon) * scale + B over the spatial axes of each (n, c)."""
    t = _need_tensor(node, x[0])
    if t.ndim < 3:
        raise node.fail(f"input must be (N, C, D1, ...), got {t.shape}")
    c = t.shape[1]
    scale, bias = _tensor(x[1], t.graph), _tensor(x[2], t.graph)
    for what, v in (("scale", scale), ("B", bias)):
        if v.shape != (c,):
            raise node.fail(f"{what} must have shape ({c},), got {v.shape}")
    y = F.batch_norm_train(t, tuple(range(2, t.ndim)), float(node.attr("epsilon", 1e-5)))[0]
    shape = (c,) + (1,) * (t.ndim - 2)
    return [y * reshape(scale, shape) + reshape(bias, shape)]


@_op("LRN")
def _lrn(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """x / (bias + alpha / size * sum of x^2 over the channels c - (size-1)//2 .. c + size//2)^beta,
    the sum over `size` shifted slices of the zero-padded squares."""
    t = _need_tensor(node, x[0])
    if t.ndim < 3:
        raise node.fail(f"input must be (N, C, D1, ...), got {t.shape}")
    size = int(node.attr("size", 0))
    if size < 1:
        raise node.fail(f"size must be positive, got {size}")
    alpha, beta = float(node.attr("alpha", 1e-4)), float(node.attr("beta", 0.75))
    bias = float(node.attr("bias", 1.0))
    c, lo = t.shape[1], (size - 1) // 2
    squares = _pad_constant(t * t, [0, lo] + [0] * (t.ndim - 2), [0, size - 1 - lo] + [0] * (t.ndim - 2), 0.0)
    total = slice_axis(squares, 1, 0, c)
    for k in range(1, size):
        total = total + slice_axis(squares, 1, k, k + c)
    return [t / (total * (alpha / size) + bias).pow(beta)]


@_op("Dropout")
def _dropout(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    ratio = float(node.attr("ratio", 0.5))
    if len(x) > 1 and x[1] is not None:
        ratio = float(_static(x[1], "ratio"))
    t = _need_tensor(node, x[0])
    return [F.dropout(t, ratio, m.training), _Unsupported(f"the mask output of Dropout {node.name!r}")]


# -- reductions ------------------------------------------------------------------------------------
def _np_logsumexp(a: np.ndarray, axis: tuple[int, ...], keepdims: bool) -> np.ndarray:
    out = get_op("logsumexp").reference(np.asarray(a), axes=axis)
    return out if keepdims else np.squeeze(out, axis=axis)


@_op("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceLogSumExp")
def _reduce(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    t = x[0]
    axes = node.attr("axes")
    if len(x) > 1 and x[1] is not None:
        axes = _ints(x[1], "axes")
    keep = bool(node.attr("keepdims", 1))
    ndim = len(_shape(t))
    if not axes:
        if int(node.attr("noop_with_empty_axes", 0)):
            return [t]
        axes = list(range(ndim))
    dims = tuple(sorted(_axis(int(a), ndim, node) for a in axes))
    if not isinstance(t, Tensor):
        fn = {
            "ReduceMean": np.mean,
            "ReduceSum": np.sum,
            "ReduceMax": np.max,
            "ReduceMin": np.min,
            "ReduceLogSumExp": _np_logsumexp,
        }[node.op]
        return [fn(np.asarray(t), axis=dims, keepdims=keep)]
    method = {
        "ReduceMean": t.mean,
        "ReduceSum": t.sum,
        "ReduceMax": t.amax,
        "ReduceMin": t.amin,
        "ReduceLogSumExp": t.logsumexp,
    }[node.op]
    return [method(dims, keepdim=keep)]


# -- movement --------------------------------------------------------------------------------------
def _reshape_any(v: Any, shape: Sequence[int]) -> Any:
    return reshape(v, tuple(shape)) if isinstance(v, Tensor) else np.reshape(v, tuple(shape))


@_op("Reshape")
def _reshape(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    target = _ints(x[1], "the target shape")
    current = _shape(x[0])
    if not int(node.attr("allowzero", 0)):
        target = [current[i] if s == 0 and i < len(current) else s for i, s in enumerate(target)]
    known = math.prod(s for s in target if s != -1)
    if target.count(-1) > 1 or (-1 in target and (known == 0 or math.prod(current) % known)):
        raise node.fail(f"cannot reshape {current} to {target}")
    if -1 not in target and math.prod(target) != math.prod(current):
        raise node.fail(f"cannot reshape {current} to {target}")
    return [_reshape_any(x[0], target)]


@_op("Flatten")
def _flatten(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    shape = _shape(x[0])
    axis = int(node.attr("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    return [_reshape_any(x[0], (math.prod(shape[:axis]), math.prod(shape[axis:])))]


@_op("Transpose")
def _transpose(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    ndim = len(_shape(x[0]))
    perm = tuple(int(p) for p in node.attr("perm", list(range(ndim))[::-1]))
    return [permute(x[0], perm) if isinstance(x[0], Tensor) else np.transpose(x[0], perm)]


@_op("Concat")
def _concat(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    parts = [v for v in x if v is not None]
    ndim = len(_shape(parts[0]))
    axis = _axis(int(node.attr("axis")), ndim, node)
    graph = _graph_of(parts)
    if graph is None:
        return [np.concatenate([np.asarray(p) for p in parts], axis=axis)]
    parts = [p for p in parts if _shape(p)[axis] > 0]
    return [cat([_tensor(p, graph) for p in parts], axis)]


@_op("Slice")
def _slice(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    shape = _shape(x[0])
    if m._opset >= 10:
        starts, ends = _ints(x[1], "starts"), _ints(x[2], "ends")
        axes = _ints(x[3], "axes") if len(x) > 3 and x[3] is not None else list(range(len(starts)))
        steps = _ints(x[4], "steps") if len(x) > 4 and x[4] is not None else [1] * len(starts)
    else:
        starts, ends = list(node.attr("starts")), list(node.attr("ends"))
        axes = list(node.attr("axes", list(range(len(starts)))))
        steps = [1] * len(starts)
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(starts, ends, axes, steps):
        a = _axis(axis, len(shape), node)
        index[a] = slice(start, None if end >= _INT64_MAX // 2 else max(end, -_INT64_MAX // 2), step)
    if not isinstance(x[0], Tensor):
        return [np.asarray(x[0])[tuple(index)]]
    t = x[0]
    for a, s in enumerate(index):
        start, stop, step = s.indices(shape[a])
        if step != 1:
            # Strided and reversed slices: the selected elements one by one, concatenated (as
            # Gather's constant indices), so gradients scatter back to them.
            picked = range(start, stop, step)
            if not picked:
                raise node.fail(f"the slice selects no element along axis {a} (a zero-size tensor)")
            t = (
                cat([slice_axis(t, a, i, i + 1) for i in picked], a)
                if len(picked) > 1
                else slice_axis(t, a, picked[0], picked[0] + 1)
            )
            continue
        t = slice_axis(t, a, start, max(start, stop))
    return [t]


@_op("Gather")
def _gather(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """Constant indices: slices and concatenation. Computed indices (fed as numbers) along axis 0:
    F.embedding, one_hot(indices) @ data, with negative indices counted from the end; an index
    outside [-size, size) reads a row of zeros (ONNX leaves it undefined)."""
    shape = _shape(x[0])
    axis = _axis(int(node.attr("axis", 0)), len(shape), node)
    if isinstance(x[1], Tensor):
        if axis != 0:
            raise node.fail(f"computed indices are supported along axis 0 only, not axis {axis}")
        from glcomp.ir.tensor import lt

        ids, size = x[1], shape[0]
        ids = where(lt(ids, 0.0), ids + float(size), ids)
        data = _tensor(x[0], ids.graph)
        rows = F.embedding(ids, reshape(data, (size, math.prod(shape[1:]))))
        return [reshape(rows, ids.shape + shape[1:])]
    indices = _static(x[1], "the indices").astype(np.int64)
    size = shape[axis]
    if np.any(indices < -size) or np.any(indices >= size):
        raise node.fail(f"indices {indices.tolist()} out of range for axis {axis} of size {size}")
    indices = indices % size
    if not isinstance(x[0], Tensor):
        return [np.take(np.asarray(x[0]), indices, axis=axis)]
    t = x[0]
    if indices.ndim == 0:
        return [getitem(t, (slice(None),) * axis + (int(indices),))]
    pieces = [slice_axis(t, axis, int(i), int(i) + 1) for i in indices.reshape(-1)]
    out = cat(pieces, axis)
    return [reshape(out, shape[:axis] + indices.shape + shape[axis + 1 :])]


def _unsqueeze_axes(m: OnnxModule, node: _Node, x: list[Any]) -> list[int]:
    if len(x) > 1 and x[1] is not None:
        return _ints(x[1], "axes")
    return [int(a) for a in node.attr("axes", [])]


@_op("Unsqueeze")
def _unsqueeze(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    shape = list(_shape(x[0]))
    out_rank = len(shape) + len(_unsqueeze_axes(m, node, x))
    for a in sorted(_axis(a, out_rank, node) for a in _unsqueeze_axes(m, node, x)):
        shape.insert(a, 1)
    return [_reshape_any(x[0], shape)]


@_op("Squeeze")
def _squeeze(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    shape = _shape(x[0])
    axes = _unsqueeze_axes(m, node, x)
    drop = {_axis(a, len(shape), node) for a in axes} if axes else {i for i, s in enumerate(shape) if s == 1}
    if any(shape[a] != 1 for a in drop):
        raise node.fail(f"cannot squeeze axes {sorted(drop)} of shape {shape}")
    return [_reshape_any(x[0], [s for i, s in enumerate(shape) if i not in drop])]


@_op("Expand")
def _expand(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    target = tuple(_ints(x[1], "the shape"))
    shape = _shape(x[0])
    rank = max(len(target), len(shape))
    a, b = (1,) * (rank - len(shape)) + shape, (1,) * (rank - len(target)) + target
    out = tuple(s if t == 1 else t for s, t in zip(a, b))
    if not isinstance(x[0], Tensor):
        return [np.broadcast_to(np.asarray(x[0]), out).copy()]
    return [broadcast_to(x[0], out)]


_PAD_MODES = {"constant": "constant", "reflect": "reflect", "edge": "edge", "wrap": "wrap"}


@_op("Pad")
def _pad(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    """Pad (constant with any value, reflect, edge, wrap) per axis; negative pads crop."""
    shape = _shape(x[0])
    mode = node.attr("mode", "constant")
    if mode not in _PAD_MODES:
        raise node.fail(f"mode {mode!r} is not supported (constant, reflect, edge, wrap)")
    if m._opset >= 11:
        pads = _ints(x[1], "pads") if len(x) > 1 and x[1] is not None else []
        value = x[2] if len(x) > 2 and x[2] is not None and np.size(x[2]) else 0.0
        value = float(np.asarray(_static(value, "constant_value")).reshape(-1)[0])
        axes = _ints(x[3], "axes") if len(x) > 3 and x[3] is not None else list(range(len(shape)))
    else:
        pads = [int(p) for p in node.attr("pads", node.attr("paddings", []))]
        value, axes = float(node.attr("value", 0.0)), list(range(len(shape)))
    axes = [_axis(a, len(shape), node) for a in axes]
    if len(pads) != 2 * len(axes) or len(set(axes)) != len(axes):
        raise node.fail(f"pads {pads} must hold a begin and an end for each of the axes {axes}")
    begins, ends = [0] * len(shape), [0] * len(shape)
    for k, a in enumerate(axes):
        begins[a], ends[a] = pads[k], pads[k + len(axes)]
    if not isinstance(x[0], Tensor):
        array = np.asarray(x[0])
        index = tuple(slice(max(-b, 0), n - max(-e, 0)) for b, e, n in zip(begins, ends, shape))
        array = array[index]
        widths = [(max(b, 0), max(e, 0)) for b, e in zip(begins, ends)]
        kw = {"constant_values": value} if mode == "constant" else {}
        return [np.pad(array, widths, mode=_PAD_MODES[mode], **kw)]
    t = x[0]
    for a, (b, e) in enumerate(zip(begins, ends)):
        if b < 0 or e < 0:
            start, stop = max(-b, 0), shape[a] - max(-e, 0)
            if stop <= start:
                raise node.fail(f"pads {pads} crop axis {a} of size {shape[a]} to nothing")
            t = slice_axis(t, a, start, stop)
    begins, ends = [max(b, 0) for b in begins], [max(e, 0) for e in ends]
    if mode == "constant":
        return [_pad_constant(t, begins, ends, value)]
    for a, (b, e) in enumerate(zip(begins, ends)):
        if b or e:
            t = _pad_axis(node, t, a, b, e, mode)
    return [t]


def _pad_constant(t: Tensor, begins: Sequence[int], ends: Sequence[int], value: float) -> Tensor:
    """Zero padding (the pad primitive), then `value` where the padding is."""
    if not any(begins) and not any(ends):
        return t
    flat = [p for b, e in zip(reversed(begins), reversed(ends)) for p in (b, e)]
    padded = F.pad(t, flat)
    if value == 0.0:
        return padded
    inside = F.pad(const(t.graph, 1.0, t.shape), flat)
    return where(inside, padded, value)


def _pad_axis(node: _Node, t: Tensor, axis: int, before: int, after: int, mode: str) -> Tensor:
    """Reflect, edge or wrap padding of one axis from slices and concatenation."""
    n = t.shape[axis]
    if mode == "reflect":
        if max(before, after) >= n:
            raise node.fail(
                f"reflect pads ({before}, {after}) must be smaller than the size {n} of axis {axis}"
            )
        head = [slice_axis(t, axis, i, i + 1) for i in range(before, 0, -1)]
        tail = [slice_axis(t, axis, n - 2 - j, n - 1 - j) for j in range(after)]
    elif mode == "edge":
        grow = [s if i != axis else 0 for i, s in enumerate(t.shape)]

        def edge(i: int, k: int) -> list[Tensor]:
            if not k:
                return []
            grow[axis] = k
            return [broadcast_to(slice_axis(t, axis, i, i + 1), tuple(grow))]

        head, tail = edge(0, before), edge(n - 1, after)
    else:  # wrap
        if max(before, after) > n:
            raise node.fail(f"wrap pads ({before}, {after}) must be at most the size {n} of axis {axis}")
        head = [slice_axis(t, axis, n - before, n)] if before else []
        tail = [slice_axis(t, axis, 0, after)] if after else []
    return cat(head + [t] + tail, axis)


@_op("Split")
def _split(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    shape = _shape(x[0])
    axis = _axis(int(node.attr("axis", 0)), len(shape), node)
    size = shape[axis]
    if len(x) > 1 and x[1] is not None:
        sizes = _ints(x[1], "split")
    elif node.attr("split") is not None:
        sizes = [int(v) for v in node.attr("split")]
    else:
        parts = int(node.attr("num_outputs", len(node.outputs)))
        chunk = -(-size // parts)
        sizes = [min(chunk, size - k * chunk) for k in range(parts)]
        if m._opset < 18 and size % parts:
            raise node.fail(f"axis {axis} of size {size} does not split into {parts} equal parts")
    if sum(sizes) != size or min(sizes, default=0) < 0 or len(sizes) != len(node.outputs):
        raise node.fail(
            f"split sizes {sizes} must be {len(node.outputs)} sizes adding up to {size} (axis {axis})"
        )
    out, at = [], 0
    for n in sizes:
        if isinstance(x[0], Tensor):
            if n == 0:
                raise node.fail("empty split outputs are not supported")
            out.append(slice_axis(x[0], axis, at, at + n))
        else:
            out.append(np.take(np.asarray(x[0]), range(at, at + n), axis=axis))
        at += n
    return out


@_op("Tile")
def _tile(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    repeats = _ints(x[1], "repeats")
    shape = _shape(x[0])
    if len(repeats) != len(shape) or min(repeats, default=1) < 1:
        raise node.fail(f"repeats {repeats} must be one positive count per axis of {shape}")
    if not isinstance(x[0], Tensor):
        return [np.tile(np.asarray(x[0]), repeats)]
    return [x[0] if all(r == 1 for r in repeats) else x[0].repeat(*repeats)]


# -- constants and shapes --------------------------------------------------------------------------
@_op("Identity")
def _identity(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    return [x[0]]


@_op("Constant")
def _constant(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    from onnx import numpy_helper

    a = node.attrs
    if "value" in a:
        return [numpy_helper.to_array(a["value"])]
    for key, dtype in (("value_float", np.float32), ("value_floats", np.float32)):
        if key in a:
            return [np.asarray(a[key], dtype)]
    for key in ("value_int", "value_ints"):
        if key in a:
            return [np.asarray(a[key], np.int64)]
    raise node.fail(f"unsupported Constant attributes {sorted(a)}")


@_op("Shape")
def _shape_op(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    shape = _shape(x[0])
    start, end = int(node.attr("start", 0)), node.attr("end")
    return [np.asarray(shape[start : None if end is None else int(end)], np.int64)]


@_op("ConstantOfShape")
def _constant_of_shape(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    from onnx import numpy_helper

    shape = _ints(x[0], "the shape")
    value = node.attrs.get("value")
    fill = numpy_helper.to_array(value).reshape(-1) if value is not None else np.zeros(1, np.float32)
    return [np.full(shape, fill[0], fill.dtype)]


_CASTS = {1: np.float32, 6: np.int32, 7: np.int64, 9: np.bool_, 10: np.float16, 11: np.float64}


@_op("Cast")
def _cast(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    to = int(node.attr("to"))
    if isinstance(x[0], Tensor):
        if to not in (1, 10, 11):
            raise node.fail("casting a computed tensor to a non-float type is not supported")
        return [x[0]]
    if to not in _CASTS:
        raise node.fail(f"cast to ONNX type {to} is not supported")
    return [np.asarray(x[0]).astype(_CASTS[to])]


@_op("Equal")
def _equal(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    if isinstance(x[0], Tensor) or isinstance(x[1], Tensor):
        from glcomp.ir.tensor import eq

        return [eq(*_operands(x[0], x[1]))]
    return [np.equal(np.asarray(x[0]), np.asarray(x[1]))]


@_op("Where")
def _where(m: OnnxModule, node: _Node, x: list[Any]) -> list[Any]:
    graph = _graph_of(x)
    if graph is None:
        return [np.where(np.asarray(x[0]).astype(bool), x[1], x[2])]
    from glcomp.ir.tensor import where

    cond = x[0] if isinstance(x[0], Tensor) else _tensor(np.asarray(x[0], np.float32), graph)
    a, b = (v if isinstance(v, Tensor) or np.ndim(v) == 0 else _tensor(v, graph) for v in x[1:3])
    return [where(cond, a if isinstance(a, Tensor) else float(a), b if isinstance(b, Tensor) else float(b))]


SUPPORTED_OPS: tuple[str, ...] = tuple(sorted(_HANDLERS))
