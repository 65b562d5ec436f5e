"""The torch-level functions ported scripts call as ``torch.xxx`` (here ``glcomp.xxx``).

On traced tensors they build graph nodes like the tensor methods. The creation functions
(`zeros`, `ones`, `full`, `arange`, `tril`, ...) return graph constants while a model is traced
and float32 numpy arrays otherwise, so ``register_buffer("mask", glcomp.tril(glcomp.ones(8, 8)))``
in ``__init__`` works as in torch.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir import tensor as T
from glcomp.ir.tensor import Tensor
from glcomp.nn import functional as F

float32 = np.float32
# glcomp computes in float32: double/float64 are accepted where torch takes a dtype (ignored there).
double = float64 = np.float64
long = int64 = np.int64
int32 = np.int32


class device:  # noqa: N801 - torch's name
    """torch.device look-alike: glcomp places everything itself, so this only records the name."""

    def __init__(self, kind: str = "cpu", index: int | None = None) -> None:
        self.type, self.index = str(kind).split(":")[0], index

    def __repr__(self) -> str:
        return f"device(type={self.type!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, device) and other.type == self.type

    def __hash__(self) -> int:
        return hash(self.type)


class cuda:  # noqa: N801 - torch.cuda's spelling in scripts
    @staticmethod
    def is_available() -> bool:
        """False: glcomp runs on GL, not CUDA; scripts then pick their "cpu" path."""
        return False


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """A no-op context: predict never computes gradients in glcomp."""
    yield


def _graph() -> Any:
    from glcomp.ir.trace import active_trace

    state = active_trace()
    return None if state is None else state.graph


def _size(size: tuple[Any, ...]) -> tuple[int, ...]:
    if len(size) == 1 and isinstance(size[0], tuple | list):
        size = tuple(size[0])
    return tuple(int(s) for s in size)


def full(size: Any, fill_value: float, **_: Any) -> Any:
    shape = _size((size,))
    graph = _graph()
    if graph is None:
        return np.full(shape, fill_value, np.float32)
    return T.const(graph, float(fill_value), shape)


def zeros(*size: Any, **_: Any) -> Any:
    return full(_size(size), 0.0)


def ones(*size: Any, **_: Any) -> Any:
    return full(_size(size), 1.0)


def _random(size: tuple[int, ...], normal: bool) -> Any:
    graph = _graph()
    if graph is None:
        from glcomp.nn.init import draw

        return draw(size, normal)
    return (F.randn if normal else F.rand)(graph, size)


def rand(*size: Any, **_: Any) -> Any:
    """Uniform values in [0, 1): inside forward drawn anew in each train step (the counter-based
    generator of dropout, see glcomp.nn.functional.rand), outside it from glcomp.manual_seed's
    numpy generator."""
    return _random(_size(size), False)


def randn(*size: Any, **_: Any) -> Any:
    """Standard normal values, drawn as `rand` (inside forward by the Box-Muller transform)."""
    return _random(_size(size), True)


def rand_like(t: Any, **_: Any) -> Any:
    return _random(tuple(np.shape(t)) if not isinstance(t, Tensor) else t.shape, False)


def randn_like(t: Any, **_: Any) -> Any:
    """torch.randn_like: inside forward, e.g. a VAE's reparameterisation, new noise every step."""
    return _random(tuple(np.shape(t)) if not isinstance(t, Tensor) else t.shape, True)


def zeros_like(t: Any, **_: Any) -> Any:
    return T.zeros_like(t) if isinstance(t, Tensor) else np.zeros_like(np.asarray(t, np.float32))


def ones_like(t: Any, **_: Any) -> Any:
    return T.ones_like(t) if isinstance(t, Tensor) else np.ones_like(np.asarray(t, np.float32))


def full_like(t: Any, fill_value: float, **_: Any) -> Any:
    if isinstance(t, Tensor):
        return T.const(t.graph, float(fill_value), t.shape)
    return np.full(np.shape(t), fill_value, np.float32)


def arange(start: float, end: float | None = None, step: float = 1, **_: Any) -> Any:
    """start, start + step, ... below end (floats); a graph constant while tracing."""
    if end is None:
        start, end = 0, start
    n = max(0, math.ceil((end - start) / step))
    graph = _graph()
    if graph is None:
        return (start + step * np.arange(n)).astype(np.float32)
    out = T.arange(graph, n)
    return out * float(step) + float(start) if (step, start) != (1, 0) else out


def _triangle(t: Any, diagonal: int, lower: bool) -> Any:
    if not isinstance(t, Tensor):
        a = np.asarray(t)
        return np.tril(a, diagonal) if lower else np.triu(a, diagonal)
    if t.ndim < 2:
        raise GlcompError(f"tril/triu need a tensor of rank >= 2, got {t.shape}")
    rows, cols = t.shape[-2:]
    r = T.reshape(T.arange(t.graph, rows), (rows, 1))
    c = T.reshape(T.arange(t.graph, cols), (1, cols))
    keep = T.le(c - r, float(diagonal)) if lower else T.ge(c - r, float(diagonal))
    return T.where(T.broadcast_to(keep, t.shape), t, 0.0)


def tril(t: Any, diagonal: int = 0) -> Any:
    """Zero the elements above the `diagonal`-th diagonal (numpy arrays outside a trace)."""
    return _triangle(t, diagonal, True)


def triu(t: Any, diagonal: int = 0) -> Any:
    return _triangle(t, diagonal, False)


def _need(t: Any, what: str) -> Tensor:
    if not isinstance(t, Tensor):
        if isinstance(t, np.ndarray | np.generic):
            raise GlcompError(
                f"glcomp.{what} works on the tensors of a model being compiled, not on numpy arrays (got "
                f"{type(t).__name__}): compile the model first (prog = glcomp.compile(model, inputs, loss, "
                "optimizer)) and run it with prog.runtime(...).predict / train_step"
            )
        raise GlcompError(f"glcomp.{what} takes a traced tensor here, got {type(t).__name__}")
    return t


def flatten(t: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return _need(t, "flatten").flatten(start_dim, end_dim)


def log(t: Tensor) -> Tensor:
    return _need(t, "log").log()


def exp(t: Tensor) -> Tensor:
    return _need(t, "exp").exp()


def sqrt(t: Tensor) -> Tensor:
    return _need(t, "sqrt").sqrt()


def abs(t: Tensor) -> Tensor:  # noqa: A001
    return _need(t, "abs").abs()


def erf(t: Tensor) -> Tensor:
    return _need(t, "erf").erf()


def sigmoid(t: Tensor) -> Tensor:
    return _need(t, "sigmoid").sigmoid()


def tanh(t: Tensor) -> Tensor:
    return _need(t, "tanh").tanh()


def relu(t: Tensor) -> Tensor:
    return _need(t, "relu").relu()


def softmax(t: Tensor, dim: int) -> Tensor:
    return F.softmax(_need(t, "softmax"), dim)


def log_softmax(t: Tensor, dim: int) -> Tensor:
    return F.log_softmax(_need(t, "log_softmax"), dim)


def sum(t: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:  # noqa: A001
    return _need(t, "sum").sum(dim, keepdim)


def mean(t: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
    return _need(t, "mean").mean(dim, keepdim)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(b, Tensor):
        _need(a, "matmul")  # numpy operands: GlcompError saying to compile the model first
    return T.matmul(a, b)


bmm = matmul


def clamp(t: Tensor, min: Any = None, max: Any = None) -> Tensor:
    return T.clamp(_need(t, "clamp"), min, max)


clip = clamp


def pow(a: Any, b: Any) -> Tensor:  # noqa: A001
    """torch.pow (glcomp.ir.tensor.pow)."""
    if not isinstance(b, Tensor):
        _need(a, "pow")  # numpy operands: GlcompError saying to compile the model first
    return T.pow(a, b)


def split(t: Tensor, split_size: Any, dim: int = 0) -> tuple[Tensor, ...]:
    return T.split(_need(t, "split"), split_size, dim)


def chunk(t: Tensor, chunks: int, dim: int = 0) -> tuple[Tensor, ...]:
    return _need(t, "chunk").chunk(chunks, dim)


def masked_fill(t: Tensor, mask: Any, value: Any) -> Tensor:
    return _need(t, "masked_fill").masked_fill(mask, value)


def transpose(t: Tensor, dim0: int, dim1: int) -> Tensor:
    return _need(t, "transpose").transpose(dim0, dim1)


def reshape(t: Tensor, shape: Any) -> Tensor:
    return _need(t, "reshape").reshape(shape)


def unsqueeze(t: Tensor, dim: int) -> Tensor:
    return _need(t, "unsqueeze").unsqueeze(dim)


def squeeze(t: Tensor, dim: int | None = None) -> Tensor:
    return _need(t, "squeeze").squeeze(dim)


def argmax(t: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    return _need(t, "argmax").argmax(dim, keepdim)


__all__ = [
    "abs", "arange", "argmax", "bmm", "chunk", "clamp", "clip", "cuda", "device", "erf", "exp", "flatten",
    "float32", "full", "full_like", "int32", "int64", "log", "log_softmax", "long", "masked_fill",
    "matmul", "mean", "no_grad", "ones", "ones_like", "pow", "relu", "reshape", "sigmoid", "softmax",
    "split", "sqrt", "squeeze", "sum", "tanh", "transpose", "tril", "triu", "unsqueeze", "zeros",
    "zeros_like",
]  # fmt: skip
