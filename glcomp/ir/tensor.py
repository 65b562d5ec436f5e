"""Symbolic tensors: the torch-like surface that builds IR nodes.

The tracer hands `Tensor`s to a model's `forward`; gradient rules and optimizer lowering use the
same API, so every graph, forward or backward, is built by one set of functions. Composite
operations (sub-broadcasting, mean, softmax, indexing) are lowered here to registry primitives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph, current_origin

Scalar = int | float


class Tensor:
    """A value in a Graph under construction. Supports the torch operators models use."""

    __slots__ = ("graph", "node")
    __array_priority__ = 1000  # make `ndarray * Tensor` defer to Tensor

    def __init__(self, graph: Graph, node: int) -> None:
        self.graph = graph
        self.node = node

    # -- metadata ---------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        return self.graph.shape(self.node)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> str:
        return self.graph.node(self.node)["dtype"]

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[_axis(dim, self.ndim)]

    def dim(self) -> int:
        return self.ndim

    def numel(self) -> int:
        return math.prod(self.shape)

    def __repr__(self) -> str:
        return f"Tensor(%{self.node}, shape={self.shape})"

    def __len__(self) -> int:
        return self.shape[0]

    # -- arithmetic ---------------------------------------------------------------------------
    def __add__(self, o: Any) -> Tensor:
        return add(self, o)

    def __radd__(self, o: Any) -> Tensor:
        return add(o, self)

    def __sub__(self, o: Any) -> Tensor:
        return sub(self, o)

    def __rsub__(self, o: Any) -> Tensor:
        return sub(o, self)

    def __mul__(self, o: Any) -> Tensor:
        return mul(self, o)

    def __rmul__(self, o: Any) -> Tensor:
        return mul(o, self)

    def __truediv__(self, o: Any) -> Tensor:
        return div(self, o)

    def __rtruediv__(self, o: Any) -> Tensor:
        return div(o, self)

    def __neg__(self) -> Tensor:
        return unary("neg", self)

    def __matmul__(self, o: Tensor) -> Tensor:
        return matmul(self, o)

    def __pow__(self, p: Scalar) -> Tensor:
        if p == 2:
            return self * self
        if p == 0.5:
            return self.sqrt()
        if p == 1:
            return self
        if p == -1:
            return 1.0 / self
        raise GlcompError(f"{current_origin()}: only powers 2, 0.5, 1 and -1 are supported, got {p}")

    # -- unary functions ----------------------------------------------------------------------
    def exp(self) -> Tensor:
        return unary("exp", self)

    def log(self) -> Tensor:
        return unary("log", self)

    def tanh(self) -> Tensor:
        return unary("tanh", self)

    def sigmoid(self) -> Tensor:
        return unary("sigmoid", self)

    def relu(self) -> Tensor:
        return unary("relu", self)

    def sqrt(self) -> Tensor:
        return unary("sqrt", self)

    def detach(self) -> Tensor:
        return unary("stop_gradient", self)

    # -- reductions ---------------------------------------------------------------------------
    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return reduce("sum", self, dim, keepdim)

    def max(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return reduce("max", self, dim, keepdim)

    def amax(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return reduce("max", self, dim, keepdim)

    def mean(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        axes = _axes(dim, self.ndim)
        count = math.prod(self.shape[a] for a in axes)
        return reduce("sum", self, axes, keepdim) * (1.0 / count)

    # -- movement -----------------------------------------------------------------------------
    def reshape(self, *shape: Any) -> Tensor:
        return reshape(self, _shape_arg(shape))

    def view(self, *shape: Any) -> Tensor:
        return reshape(self, _shape_arg(shape))

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        s, e = _axis(start_dim, self.ndim), _axis(end_dim, self.ndim)
        shape = self.shape[:s] + (math.prod(self.shape[s : e + 1]),) + self.shape[e + 1 :]
        return reshape(self, shape)

    def permute(self, *dims: Any) -> Tensor:
        dims = _shape_arg(dims)
        return permute(self, tuple(_axis(d, self.ndim) for d in dims))

    def transpose(self, dim0: int, dim1: int) -> Tensor:
        perm = list(range(self.ndim))
        a, b = _axis(dim0, self.ndim), _axis(dim1, self.ndim)
        perm[a], perm[b] = perm[b], perm[a]
        return permute(self, tuple(perm))

    @property
    def T(self) -> Tensor:  # noqa: N802 - torch's name
        return permute(self, tuple(reversed(range(self.ndim))))

    def t(self) -> Tensor:
        return self.T

    def unsqueeze(self, dim: int) -> Tensor:
        d = _axis(dim, self.ndim + 1)
        return reshape(self, self.shape[:d] + (1,) + self.shape[d:])

    def squeeze(self, dim: int | None = None) -> Tensor:
        if dim is None:
            return reshape(self, tuple(s for s in self.shape if s != 1))
        d = _axis(dim, self.ndim)
        if self.shape[d] != 1:
            return self
        return reshape(self, self.shape[:d] + self.shape[d + 1 :])

    def expand(self, *shape: Any) -> Tensor:
        shape = tuple(s if s != -1 else o for s, o in zip(_shape_arg(shape), self.shape, strict=False))
        return broadcast_to(self, shape)

    def __getitem__(self, index: Any) -> Tensor:
        return getitem(self, index)


# -- helpers ----------------------------------------------------------------------------------
def _shape_arg(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], list | tuple):
        shape = tuple(shape[0])
    return tuple(int(s) for s in shape)


def _fail(msg: str) -> GlcompError:
    where = current_origin()
    return GlcompError(f"{where}: {msg}" if where else msg)


def _axis(d: int, ndim: int) -> int:
    if not -ndim <= d < max(ndim, 1):
        raise _fail(f"dimension {d} out of range for a tensor of rank {ndim}")
    return d % max(ndim, 1)


def _axes(dim: int | Sequence[int] | None, ndim: int) -> tuple[int, ...]:
    if dim is None:
        return tuple(range(ndim))
    if isinstance(dim, int):
        dim = (dim,)
    return tuple(sorted({_axis(d, ndim) for d in dim}))


def prim(op: str, *operands: Tensor, **attrs: Any) -> Tensor:
    """Add one primitive node over `operands` (all in the same graph)."""
    graph = operands[0].graph
    return Tensor(graph, graph.add(op, [t.node for t in operands], **attrs))


def const(graph: Graph, value: float, shape: tuple[int, ...] = ()) -> Tensor:
    t = Tensor(graph, graph.add("const", (), value=float(value)))
    return broadcast_to(t, shape) if shape else t


def zeros_like(t: Tensor) -> Tensor:
    return const(t.graph, 0.0, t.shape)


def ones_like(t: Tensor) -> Tensor:
    return const(t.graph, 1.0, t.shape)


def _lift(a: Any, b: Any) -> tuple[Tensor, Tensor]:
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        if a.graph is not b.graph:
            raise _fail("tensors from different traces cannot be combined")
        return a, b
    if isinstance(a, Tensor):
        return a, const(a.graph, _scalar(b))
    if isinstance(b, Tensor):
        return const(b.graph, _scalar(a)), b
    raise TypeError("at least one operand must be a Tensor")


def _scalar(v: Any) -> float:
    if isinstance(v, int | float):
        return float(v)
    try:
        import numpy as np

        arr = np.asarray(v)
        if arr.ndim == 0:
            return float(arr)
    except (TypeError, ValueError):
        pass
    raise _fail(f"cannot combine a symbolic tensor with {type(v).__name__}; use a scalar")


def broadcast_shapes(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for x, y in zip(((1,) * (len(b) - len(a)) + a), ((1,) * (len(a) - len(b)) + b), strict=True):
        if x != y and 1 not in (x, y):
            raise _fail(f"shapes {a} and {b} cannot be broadcast together")
        out.append(max(x, y) if min(x, y) != 0 else 0)
    return tuple(out)


def broadcast_to(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    shape = tuple(shape)
    if t.shape == shape:
        return t
    if len(shape) < t.ndim:
        raise _fail(f"cannot broadcast shape {t.shape} to {shape}")
    if t.ndim < len(shape):
        t = reshape(t, (1,) * (len(shape) - t.ndim) + t.shape)
        if t.shape == shape:
            return t
    return prim("expand", t, shape=shape)


def binary(op: str, a: Any, b: Any) -> Tensor:
    a, b = _lift(a, b)
    shape = broadcast_shapes(a.shape, b.shape)
    return prim(op, broadcast_to(a, shape), broadcast_to(b, shape))


def unary(op: str, a: Tensor) -> Tensor:
    return prim(op, a)


def add(a: Any, b: Any) -> Tensor:
    return binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    return binary("sub", a, b)


def mul(a: Any, b: Any) -> Tensor:
    return binary("mul", a, b)


def div(a: Any, b: Any) -> Tensor:
    return binary("div", a, b)


def maximum(a: Any, b: Any) -> Tensor:
    return binary("maximum", a, b)


def reduce(op: str, t: Tensor, dim: int | Sequence[int] | None, keepdim: bool) -> Tensor:
    axes = _axes(dim, t.ndim)
    if not axes:
        return t
    out = prim(op, t, axes=axes)  # the primitive keeps reduced dims as size 1
    if keepdim:
        return out
    return reshape(out, tuple(s for i, s in enumerate(t.shape) if i not in axes))


def sum_to_shape(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    """Sum `t` over the axes that broadcasting expanded from `shape` (un-broadcasting)."""
    if t.shape == shape:
        return t
    lead = t.ndim - len(shape)
    padded = (1,) * lead + tuple(shape)
    axes = tuple(i for i, (s, o) in enumerate(zip(padded, t.shape, strict=True)) if s == 1 and o != 1)
    out = prim("sum", t, axes=axes) if axes else t
    return reshape(out, tuple(shape))


def reshape(t: Tensor, shape: tuple[int, ...]) -> Tensor:
    shape = tuple(int(s) for s in shape)
    if shape.count(-1) > 1:
        raise _fail(f"reshape {t.shape} -> {shape}: at most one -1")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or t.numel() % known:
            raise _fail(f"cannot reshape a tensor of shape {t.shape} to {shape}")
        shape = tuple(t.numel() // known if s == -1 else s for s in shape)
    if shape == t.shape:
        return t
    return prim("reshape", t, shape=shape)


def permute(t: Tensor, perm: tuple[int, ...]) -> Tensor:
    if tuple(perm) == tuple(range(t.ndim)):
        return t
    return prim("permute", t, perm=tuple(perm))


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(b, Tensor) or not isinstance(a, Tensor):
        raise _fail("matmul needs two tensors")
    if a.ndim < 1 or b.ndim < 1:
        raise _fail(f"matmul of shapes {a.shape} and {b.shape}: operands must have rank >= 1")
    if b.ndim > 2:
        raise _fail(f"matmul with a right operand of rank {b.ndim} ({b.shape}) is not supported")
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    b2 = b.unsqueeze(1) if b.ndim == 1 else b
    if a2.shape[-1] != b2.shape[0]:
        raise _fail(
            f"matmul size mismatch: {a.shape} @ {b.shape} "
            f"(inner sizes {a2.shape[-1]} and {b2.shape[0]} differ)"
        )
    lead = a2.shape[:-1]
    flat = reshape(a2, (math.prod(lead), a2.shape[-1]))
    out = reshape(prim("matmul", flat, b2), lead + (b2.shape[1],))
    if a.ndim == 1:
        out = out.squeeze(-2) if out.ndim >= 2 else out
    if b.ndim == 1:
        out = out.squeeze(-1)
    return out


def slice_axis(t: Tensor, axis: int, start: int, stop: int) -> Tensor:
    if start == 0 and stop == t.shape[axis]:
        return t
    starts = tuple(start if i == axis else 0 for i in range(t.ndim))
    stops = tuple(stop if i == axis else s for i, s in enumerate(t.shape))
    return prim("slice", t, starts=starts, stops=stops)


def getitem(t: Tensor, index: Any) -> Tensor:
    """Basic indexing with ints, slices (step 1) and Ellipsis, lowered to slice + reshape."""
    if not isinstance(index, tuple):
        index = (index,)
    if index.count(Ellipsis) > 1:
        raise _fail("only one Ellipsis is allowed in an index")
    if Ellipsis in index:
        i = index.index(Ellipsis)
        fill = t.ndim - (len(index) - 1)
        index = index[:i] + (slice(None),) * fill + index[i + 1 :]
    if len(index) > t.ndim:
        raise _fail(f"too many indices ({len(index)}) for a tensor of shape {t.shape}")
    out_shape: list[int] = []
    for axis, ix in enumerate(index):
        size = t.shape[axis]
        if isinstance(ix, int):
            if not -size <= ix < size:
                raise _fail(f"index {ix} out of range for dimension {axis} of size {size}")
            ix %= size
            t = slice_axis(t, axis, ix, ix + 1)
        elif isinstance(ix, slice):
            start, stop, step = ix.indices(size)
            if step != 1:
                raise _fail(f"slices with step {step} are not supported")
            t = slice_axis(t, axis, start, max(start, stop))
            out_shape.append(max(0, stop - start))
        else:
            raise _fail(f"unsupported index {ix!r}; use ints and slices")
    out_shape += list(t.shape[len(index) :])
    return reshape(t, tuple(out_shape))


def cat(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    tensors = list(tensors)
    if not tensors:
        raise _fail("cat needs at least one tensor")
    if len(tensors) == 1:
        return tensors[0]
    axis = _axis(dim, tensors[0].ndim)
    return prim("concat", *tensors, axis=axis)


def stack(tensors: Sequence[Tensor], dim: int = 0) -> Tensor:
    return cat([t.unsqueeze(dim) for t in tensors], dim)


def one_hot(labels: Tensor, num_classes: int) -> Tensor:
    return prim("one_hot", labels, num_classes=int(num_classes))
