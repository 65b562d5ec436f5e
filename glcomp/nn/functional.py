"""torch.nn.functional-style functions on symbolic tensors, lowered to registry primitives."""

from __future__ import annotations

from typing import Any

from glcomp.ir.tensor import Tensor, _fail, one_hot, prim, unary


def _pair(v: Any) -> tuple[int, int]:
    return (int(v[0]), int(v[1])) if isinstance(v, tuple | list) else (int(v), int(v))


def relu(x: Tensor) -> Tensor:
    return unary("relu", x)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    # relu(x) - s * relu(-x): two fused elementwise ops, no extra primitive needed.
    return unary("relu", x) - negative_slope * unary("relu", -x)


def sigmoid(x: Tensor) -> Tensor:
    return unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    return unary("tanh", x)


def exp(x: Tensor) -> Tensor:
    return unary("exp", x)


def log(x: Tensor) -> Tensor:
    return unary("log", x)


def _shifted(x: Tensor, dim: int) -> Tensor:
    # Subtracting the (gradient-free) max keeps exp() finite; it does not change the result.
    return x - x.amax(dim, keepdim=True).detach()


def softmax(x: Tensor, dim: int = -1) -> Tensor:
    e = _shifted(x, dim).exp()
    return e / e.sum(dim, keepdim=True)


def log_softmax(x: Tensor, dim: int = -1) -> Tensor:
    z = _shifted(x, dim)
    return z - z.exp().sum(dim, keepdim=True).log()


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise _fail(f"unknown reduction {reduction!r}; use 'mean', 'sum' or 'none'")


def cross_entropy(logits: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    """Logits (N, C) and integer class targets (N,), as torch.nn.functional.cross_entropy."""
    if logits.ndim != 2:
        raise _fail(f"cross_entropy expects logits of shape (N, C), got {logits.shape}")
    if target.shape != logits.shape[:1]:
        raise _fail(f"cross_entropy target expected shape {logits.shape[:1]} but got {target.shape}")
    picked = (log_softmax(logits, 1) * one_hot(target, logits.shape[1])).sum(1)
    return _reduce(-picked, reduction)


def mse_loss(input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
    if input.shape != target.shape:
        raise _fail(f"mse_loss target expected shape {input.shape} but got {target.shape}")
    d = input - target
    return _reduce(d * d, reduction)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    out = x @ weight.T
    return out + bias if bias is not None else out


def conv2d(
    x: Tensor, weight: Tensor, bias: Tensor | None = None, stride: Any = 1, padding: Any = 0
) -> Tensor:
    if x.ndim != 4:
        raise _fail(f"conv2d expects input of shape (N, C, H, W), got {x.shape}")
    out = prim("conv2d", x, weight, stride=_pair(stride), padding=_pair(padding))
    if bias is not None:
        out = out + bias.reshape(1, -1, 1, 1)
    return out


def max_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    k = _pair(kernel_size)
    s = _pair(stride) if stride is not None else k
    return prim("max_pool2d", x, kernel=k, stride=s, padding=_pair(padding))


def avg_pool2d(x: Tensor, kernel_size: Any, stride: Any = None, padding: Any = 0) -> Tensor:
    k = _pair(kernel_size)
    s = _pair(stride) if stride is not None else k
    return prim("avg_pool2d", x, kernel=k, stride=s, padding=_pair(padding))


def flatten(x: Tensor, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    return x.flatten(start_dim, end_dim)


def batch_norm_train(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Normalise with batch statistics; returns (normalised, mean, biased variance)."""
    mean = x.mean(axes, keepdim=True)
    centered = x - mean
    var = (centered * centered).mean(axes, keepdim=True)
    return centered / (var + eps).sqrt(), mean, var


__all__ = [
    "avg_pool2d",
    "conv2d",
    "cross_entropy",
    "exp",
    "flatten",
    "leaky_relu",
    "linear",
    "log",
    "log_softmax",
    "max_pool2d",
    "mse_loss",
    "relu",
    "sigmoid",
    "softmax",
    "tanh",
]
