"""Symbolic tensors: the torch-like surface that builds IR nodes.

The tracer hands `Tensor`s to a model's `forward`; gradient rules and optimizer lowering use the
same API, so every graph, forward or backward, is built by one set of functions. Composite
operations (sub-broadcasting, mean, softmax, indexing) are lowered here to registry primitives.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

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
        if not self.shape:
            raise _fail("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[Tensor]:
        return (self[i] for i in range(len(self)))

    # Tensors are graph values, compared elementwise like torch's: identity stays the hash, so
    # they still work as dict keys and set members.
    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise _fail(
            f"the truth value of a traced tensor {self.shape} is not known while tracing; "
            "use glcomp.where(cond, a, b) or a mask instead of `if`/`and`/`or` on tensors"
        )

    # -- numpy interop: refused, a traced tensor holds no data ----------------------------------
    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise _fail(
            f"np.asarray / np.array of a traced glcomp tensor {self.shape}: it holds no values while "
            "tracing; use tensor methods (or glcomp.nn.functional) inside forward()"
        )

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        arithmetic = _UFUNC_OPERATORS.get(ufunc.__name__)
        if method == "__call__" and arithmetic is not None and len(inputs) == 2 and not kwargs:
            return arithmetic(*inputs)  # numpy scalars on the left: `np.float32(2) * t`
        raise _fail(
            f"numpy function np.{ufunc.__name__} cannot take a traced glcomp tensor {self.shape}; "
            "use the tensor method or glcomp.nn.functional (e.g. t.tanh(), F.relu(t))"
        )

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        raise _fail(
            f"numpy function np.{func.__name__} cannot take a traced glcomp tensor {self.shape}; "
            "use tensor methods, glcomp.cat or glcomp.stack"
        )

    # -- comparisons: float masks (1.0 true, 0.0 false), no gradient, False wherever NaN is ------
    def __eq__(self, o: Any) -> Tensor:  # type: ignore[override]
        return eq(self, o)

    def __ne__(self, o: Any) -> Tensor:  # type: ignore[override]
        return ne(self, o)

    def __gt__(self, o: Any) -> Tensor:
        return gt(self, o)

    def __ge__(self, o: Any) -> Tensor:
        return ge(self, o)

    def __lt__(self, o: Any) -> Tensor:
        return lt(self, o)

    def __le__(self, o: Any) -> Tensor:
        return le(self, o)

    def __abs__(self) -> Tensor:
        return self.abs()

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

    def __pow__(self, p: Any) -> Tensor:
        return pow(self, p)

    def __rpow__(self, base: Any) -> Tensor:
        return pow(base, self)

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

    def abs(self) -> Tensor:
        return maximum(self, -self)

    def erf(self) -> Tensor:
        return unary("erf", self)

    def neg(self) -> Tensor:
        return unary("neg", self)

    def square(self) -> Tensor:
        return self * self

    def rsqrt(self) -> Tensor:
        return 1.0 / self.sqrt()

    def reciprocal(self) -> Tensor:
        return 1.0 / self

    def sign(self) -> Tensor:
        """-1, 0 or 1 (no gradient), as torch.sign."""
        return (unary("step", self) - unary("step", -self)).detach()

    def pow(self, p: Any) -> Tensor:
        return pow(self, p)

    def clamp(self, min: Any = None, max: Any = None) -> Tensor:
        """torch.clamp: bounds are scalars or tensors; NaN stays NaN. At a bound the gradient
        goes to the tensor being clamped, as in torch."""
        return clamp(self, min, max)

    clip = clamp

    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """`value` where `mask` is non-zero, else self (torch.Tensor.masked_fill)."""
        return where(mask, value, self)

    def softmax(self, dim: int) -> Tensor:
        return softmax(self, dim)

    def log_softmax(self, dim: int) -> Tensor:
        return log_softmax(self, dim)

    def var(
        self, dim: Any = None, unbiased: bool = True, keepdim: bool = False, *, correction: Any = None
    ) -> Tensor:
        """Variance over `dim`, with Bessel's correction unless ``unbiased=False`` / ``correction=0``."""
        axes = _axes(dim, self.ndim)
        n = math.prod(self.shape[a] for a in axes)
        c = (1 if unbiased else 0) if correction is None else correction
        d = self - self.mean(axes, keepdim=True)
        return (d * d).sum(axes, keepdim) * (1.0 / max(n - c, 0) if n - c > 0 else math.inf)

    def std(
        self, dim: Any = None, unbiased: bool = True, keepdim: bool = False, *, correction: Any = None
    ) -> Tensor:
        return self.var(dim, unbiased, keepdim, correction=correction).sqrt()

    # -- spellings of device and dtype handling in torch scripts: no-ops on traced tensors --------
    def contiguous(self, *args: Any, **kwargs: Any) -> Tensor:
        return self

    def to(self, *args: Any, **kwargs: Any) -> Tensor:
        return self

    def cuda(self, *args: Any, **kwargs: Any) -> Tensor:
        return self

    def cpu(self) -> Tensor:
        return self

    def float(self) -> Tensor:
        return self

    def long(self) -> Tensor:
        """Integer ids are float32 on the GPU (exact below 2^24): the tensor itself."""
        return self

    def type_as(self, other: Any) -> Tensor:
        return self

    def isnan(self) -> Tensor:
        return isnan(self)

    def where(self, condition: Any, other: Any) -> Tensor:
        return where(condition, self, other)

    def maximum(self, other: Any) -> Tensor:
        return maximum(self, other)

    def minimum(self, other: Any) -> Tensor:
        return minimum(self, other)

    # -- reductions ---------------------------------------------------------------------------
    def sum(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        return reduce("sum", self, dim, keepdim)

    def max(self, dim: Any = None, keepdim: bool = False) -> Any:
        """As torch: ``max()`` is the largest value, ``max(dim)`` a (values, indices) pair (the
        first maximum's index as a float tensor; the gradient goes to that element only), and
        ``max(other_tensor)`` the elementwise maximum. NaN propagates: a NaN is the maximum."""
        if isinstance(dim, Tensor):
            return maximum(self, dim)
        if dim is None:
            return reduce("max", self, None, keepdim)
        return _max_with_index(self, _single_axis(dim, self.ndim, "max"), keepdim)

    def min(self, dim: Any = None, keepdim: bool = False) -> Any:
        """As `max`, for the minimum."""
        if isinstance(dim, Tensor):
            return minimum(self, dim)
        if dim is None:
            return -reduce("max", -self, None, keepdim)
        values, indices = _max_with_index(-self, _single_axis(dim, self.ndim, "min"), keepdim)
        return MinMax(-values, indices)

    def logsumexp(self, dim: int | Sequence[int], keepdim: bool = False) -> Tensor:
        """log(sum(exp(self))) over `dim`, computed on self minus its max (torch.logsumexp)."""
        return reduce("logsumexp", self, dim, keepdim)

    def amax(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Largest values over `dim` (all axes by default); ties share the gradient equally."""
        return reduce("max", self, dim, keepdim)

    def amin(self, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Tensor:
        """Smallest values over `dim` (all axes by default); ties share the gradient equally."""
        return -reduce("max", -self, dim, keepdim)

    def argmax(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first maximum along `dim` (of the flattened tensor without one), as floats."""
        if dim is None:
            return _max_with_index(self.reshape(-1), 0, False).indices
        return _max_with_index(self, _single_axis(dim, self.ndim, "argmax"), keepdim).indices

    def argmin(self, dim: int | None = None, keepdim: bool = False) -> Tensor:
        """Index of the first minimum along `dim` (of the flattened tensor without one), as floats."""
        return (-self).argmax(dim, keepdim)

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

    def view_as(self, other: Tensor) -> Tensor:
        return reshape(self, other.shape)

    reshape_as = view_as

    def expand_as(self, other: Tensor) -> Tensor:
        return broadcast_to(self, other.shape)

    def repeat(self, *sizes: Any) -> Tensor:
        """torch.Tensor.repeat: tile the tensor `sizes` times along each dimension."""
        sizes = _shape_arg(sizes)
        if len(sizes) < self.ndim:
            raise _fail(f"repeat: {len(sizes)} sizes for a tensor of rank {self.ndim}")
        t = reshape(self, (1,) * (len(sizes) - self.ndim) + self.shape)
        inter = tuple(x for r, s in zip(sizes, t.shape, strict=True) for x in (r, s))
        t = reshape(t, tuple(x for s in t.shape for x in (1, s)))
        t = broadcast_to(t, inter)
        return reshape(t, tuple(r * s for r, s in zip(sizes, t.shape[1::2], strict=True)))

    def split(self, split_size: Any, dim: int = 0) -> tuple[Tensor, ...]:
        """torch.split: pieces of `split_size` along `dim` (the last may be smaller), or the
        sizes in a list."""
        return split(self, split_size, dim)

    def chunk(self, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
        """torch.chunk: `chunks` pieces of ceil(size / chunks) along `dim` (fewer if they run out)."""
        axis = _axis(dim, self.ndim)
        size = -(-self.shape[axis] // int(chunks))
        return split(self, max(size, 1), axis)

    def unbind(self, dim: int = 0) -> tuple[Tensor, ...]:
        axis = _axis(dim, self.ndim)
        return tuple(getitem(self, (slice(None),) * axis + (i,)) for i in range(self.shape[axis]))

    def matmul(self, other: Tensor) -> Tensor:
        return matmul(self, other)

    bmm = matmul

    def __getitem__(self, index: Any) -> Tensor:
        return getitem(self, index)


class MinMax(NamedTuple):
    """What ``Tensor.max(dim)`` / ``Tensor.min(dim)`` return, like torch.return_types.max:
    ``values`` and ``indices`` (float32 holding integer positions; no gradient)."""

    values: Tensor
    indices: Tensor


# -- helpers ----------------------------------------------------------------------------------
def _single_axis(dim: Any, ndim: int, what: str) -> int:
    if not isinstance(dim, int) or isinstance(dim, bool):
        raise _fail(f"{what}(dim): dim must be one int (a tensor for the elementwise form), got {dim!r}")
    return _axis(dim, ndim)


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
    """Elementwise maximum (torch.maximum): NaN if either operand is NaN."""
    return binary("maximum", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    """Elementwise minimum (torch.minimum): NaN if either operand is NaN."""
    return -binary("maximum", _negated(a), _negated(b))


def _negated(v: Any) -> Any:
    return -v if isinstance(v, Tensor) else -_scalar(v)


# Comparisons as float masks built from the `step` (x > 0) and `eq` primitives; every one is
# false where an operand is NaN (ne: true), as torch's are, and none has a gradient.
def gt(a: Any, b: Any) -> Tensor:
    """a > b as 1.0 / 0.0."""
    return unary("step", sub(a, b))


def lt(a: Any, b: Any) -> Tensor:
    """a < b as 1.0 / 0.0."""
    return unary("step", sub(b, a))


def eq(a: Any, b: Any) -> Tensor:
    """a == b as 1.0 / 0.0."""
    return binary("eq", a, b)


def ne(a: Any, b: Any) -> Tensor:
    """a != b as 1.0 / 0.0 (1.0 where either is NaN)."""
    return 1.0 - eq(a, b)


def ge(a: Any, b: Any) -> Tensor:
    """a >= b as 1.0 / 0.0 (a - b is NaN for equal infinities, so equality is tested apart)."""
    return gt(a, b) + eq(a, b)


def le(a: Any, b: Any) -> Tensor:
    """a <= b as 1.0 / 0.0."""
    return lt(a, b) + eq(a, b)


def isnan(t: Tensor) -> Tensor:
    """1.0 where `t` is NaN: the one value that is neither > 0, < 0 nor == 0."""
    return 1.0 - (unary("step", t) + unary("step", -t) + eq(t, 0.0))


def where(condition: Any, a: Any, b: Any) -> Tensor:
    """torch.where: `a` where `condition` is non-zero, else `b` (no mixing, so an inf or NaN in the
    branch not taken does not leak). The gradient flows to the chosen branch only."""
    if not isinstance(condition, Tensor):
        raise _fail(f"where(condition, a, b): condition must be a tensor, got {type(condition).__name__}")
    ta, tb = _lift(condition, a)[1], _lift(condition, b)[1]
    shape = broadcast_shapes(broadcast_shapes(condition.shape, ta.shape), tb.shape)
    return prim("where", *(broadcast_to(t, shape) for t in (condition, ta, tb)))


def arange(graph: Graph, n: int) -> Tensor:
    """0, 1, ..., n-1 as a float tensor, built by doubling (log2(n) concatenations)."""
    t = const(graph, 0.0, (1,))
    while t.shape[0] < n:
        t = cat([t, t + float(t.shape[0])])
    return slice_axis(t, 0, 0, n)


def _max_with_index(t: Tensor, axis: int, keepdim: bool) -> MinMax:
    """Values and first indices of the maxima along `axis` (a NaN counts as the maximum)."""
    n = t.shape[axis]
    best = reduce("max", t, axis, True).detach()
    hit = (eq(t, best) + isnan(t)).detach()  # the max is NaN only where some element is
    pos = reshape(arange(t.graph, n), tuple(n if i == axis else 1 for i in range(t.ndim)))
    pos = broadcast_to(pos, t.shape)
    first = -reduce("max", -where(hit, pos, float(n)), axis, True)
    chosen = eq(pos, first).detach()
    values = reduce("sum", where(chosen, t, 0.0), axis, True)
    if not keepdim:
        out = tuple(s for i, s in enumerate(t.shape) if i != axis)
        values, first = reshape(values, out), reshape(first, out)
    return MinMax(values, first.detach())


def reduce(op: str, t: Tensor, dim: int | Sequence[int] | None, keepdim: bool) -> Tensor:
    axes = _axes(dim, t.ndim)
    if not axes:
        return t
    out = prim(op, t, axes=axes)  # the primitive keeps reduced dims as size 1
    if keepdim:
        return out
    return reshape(out, tuple(s for i, s in enumerate(t.shape) if i not in axes))


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
        return _batched_matmul(a, b)
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


_UFUNC_OPERATORS = {
    "add": lambda a, b: add(a, b),
    "subtract": lambda a, b: sub(a, b),
    "multiply": lambda a, b: mul(a, b),
    "true_divide": lambda a, b: div(a, b),
    "divide": lambda a, b: div(a, b),
    "greater": lambda a, b: gt(a, b),
    "greater_equal": lambda a, b: ge(a, b),
    "less": lambda a, b: lt(a, b),
    "less_equal": lambda a, b: le(a, b),
    "equal": lambda a, b: eq(a, b),
    "not_equal": lambda a, b: ne(a, b),
}


def slice_axis(t: Tensor, axis: int, start: int, stop: int) -> Tensor:
    if start == 0 and stop == t.shape[axis]:
        return t
    starts = tuple(start if i == axis else 0 for i in range(t.ndim))
    stops = tuple(stop if i == axis else s for i, s in enumerate(t.shape))
    return prim("slice", t, starts=starts, stops=stops)


def getitem(t: Tensor, index: Any) -> Tensor:
    """Basic indexing with ints, slices (step 1), Ellipsis and None (a new axis of size 1),
    lowered to slice + reshape."""
    if not isinstance(index, tuple):
        index = (index,)
    if index.count(Ellipsis) > 1:
        raise _fail("only one Ellipsis is allowed in an index")
    real = sum(1 for ix in index if ix is not None and ix is not Ellipsis)
    if Ellipsis in index:
        i = index.index(Ellipsis)
        index = index[:i] + (slice(None),) * (t.ndim - real) + index[i + 1 :]
    if real > t.ndim:
        raise _fail(f"too many indices ({real}) for a tensor of shape {t.shape}")
    out_shape: list[int] = []
    axis = 0
    for ix in index:
        if ix is None:
            out_shape.append(1)
            continue
        size = t.shape[axis]
        if isinstance(ix, int) and not isinstance(ix, bool):
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
            raise _fail(f"unsupported index {ix!r}; use ints, slices, ... and None")
        axis += 1
    out_shape += list(t.shape[axis:])
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


def _batched_matmul(a: Tensor, b: Tensor) -> Tensor:
    """torch.matmul with a batched right operand: batch dims broadcast and flattened into one
    batch axis, one `bmm` over the whole batch (one kernel, whatever the batch size)."""
    a2 = a.unsqueeze(0) if a.ndim == 1 else a
    if a2.shape[-1] != b.shape[-2]:
        raise _fail(
            f"matmul size mismatch: {a.shape} @ {b.shape} "
            f"(inner sizes {a2.shape[-1]} and {b.shape[-2]} differ)"
        )
    batch = broadcast_shapes(a2.shape[:-2], b.shape[:-2])
    count = math.prod(batch)
    lhs = reshape(broadcast_to(a2, batch + a2.shape[-2:]), (count,) + a2.shape[-2:])
    rhs = reshape(broadcast_to(b, batch + b.shape[-2:]), (count,) + b.shape[-2:])
    out = reshape(prim("bmm", lhs, rhs), batch + (a2.shape[-2], b.shape[-1]))
    return out.squeeze(-2) if a.ndim == 1 else out


def pow(base: Any, exponent: Any) -> Tensor:  # noqa: A001 - torch's name
    """torch.pow. A scalar integer exponent is repeated multiplication (negative bases work);
    0.5 is sqrt; other scalar exponents are exp(p * log(x)) (NaN for negative bases, as torch);
    a tensor exponent is exp(exponent * log(base))."""
    if isinstance(base, Tensor) and not isinstance(exponent, Tensor):
        p = _scalar(exponent)
        if p == 0.5:
            return base.sqrt()
        if p == int(p) and abs(p) <= 64:
            n, result, square = abs(int(p)), None, base
            if n == 0:
                return ones_like(base)
            while n:
                if n & 1:
                    result = square if result is None else result * square
                n >>= 1
                if n:
                    square = square * square
            return 1.0 / result if p < 0 else result
        return (base.log() * p).exp()
    if isinstance(exponent, Tensor):
        if isinstance(base, Tensor):
            return (base.log() * exponent).exp()
        b = _scalar(base)
        if b <= 0:
            raise _fail(f"pow with a scalar base {b} <= 0 and a tensor exponent is not supported")
        return (exponent * math.log(b)).exp()
    raise _fail("pow needs a tensor operand")


def clamp(t: Tensor, lo: Any = None, hi: Any = None) -> Tensor:
    """torch.clamp(t, min, max): where(t < lo, lo, t), then where(t > hi, hi, t)."""
    if lo is None and hi is None:
        raise _fail("clamp needs min or max")
    out = t
    if lo is not None:
        out = where(lt(out, lo), lo, out)
    if hi is not None:
        out = where(gt(out, hi), hi, out)
    return out


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    """exp(x - logsumexp(x)) over `dim`: one reduction (the logsumexp primitive, computed on x
    minus its max) and an elementwise exp, where exp(x - max) / sum(exp(x - max)) took two
    reductions and two elementwise passes."""
    return (x - reduce("logsumexp", x, dim, True)).exp()


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    """x - logsumexp(x) over `dim` (one reduction, computed on x minus its max)."""
    return x - reduce("logsumexp", x, dim, True)


def split(t: Tensor, split_size: Any, dim: int = 0) -> tuple[Tensor, ...]:
    axis = _axis(dim, t.ndim)
    size = t.shape[axis]
    if isinstance(split_size, int):
        if split_size < 1:
            raise _fail(f"split size must be positive, got {split_size}")
        sizes = [min(split_size, size - s) for s in range(0, size, split_size)]
    else:
        sizes = [int(s) for s in split_size]
        if sum(sizes) != size:
            raise _fail(f"split sizes {sizes} do not add up to {size} (dimension {axis} of {t.shape})")
    out, at = [], 0
    for n in sizes:
        out.append(slice_axis(t, axis, at, at + n))
        at += n
    return tuple(out)
