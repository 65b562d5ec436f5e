"""What the augmentation modules share: argument checks that name the transform, the input check
and the per-sample random draws of the train step."""

from __future__ import annotations

import abc
import math
import numbers
from typing import Any

import networkx as nx

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor, cat, const
from glcomp.nn.functional import rand
from glcomp.nn.module import Module


class Augmentation(Module, abc.ABC):
    """A random transform of a batch of images (N, C, H, W) in train mode, the identity in eval
    mode (predict). Subclasses define `augment`; parameters are drawn per image of the batch from
    the step counter and a seed per call (glcomp.nn.functional.rand), so a seed (glcomp.manual_seed)
    reproduces a run and each train step draws new ones."""

    def forward(self, x: Any) -> Any:
        if not self.training:
            return x
        check_image(self, x)
        return self.augment(x)

    @abc.abstractmethod
    def augment(self, x: Tensor) -> Tensor:
        """The transformed batch (train mode only; `forward` checked `x`)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.extra_repr()})"


def fail(owner: Any, message: str) -> GlcompError:
    return GlcompError(f"{type(owner).__name__ if not isinstance(owner, str) else owner}: {message}")


def check_image(owner: Any, x: Any) -> None:
    """`x` is a batch of images (N, C, H, W) computed from the model's inputs alone: the
    transforms have no gradient, so they refuse values that depend on parameters."""
    if not isinstance(x, Tensor):
        raise fail(owner, f"expects a tensor of images (N, C, H, W), got {type(x).__name__}")
    if x.ndim != 4:
        raise fail(owner, f"expects images (N, C, H, W), got shape {x.shape}")
    g = x.graph
    for n in nx.ancestors(g.g, x.node) | {x.node}:
        if g.op(n) == "input" and g.attrs(n)["role"] == "param":
            raise fail(
                owner,
                f"its input depends on parameter {g.attrs(n)['name']!r}; augmentations have no "
                "gradient, so apply them to model inputs (before any layer)",
            )


def number(owner: Any, what: str, value: Any, lo: float | None = None, hi: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise fail(owner, f"{what} must be a number, got {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise fail(owner, f"{what} must lie in [{lo}, {hi}], got {value!r}")
    return float(value)


def interval(
    owner: Any, what: str, value: Any, lo: float | None, hi: float | None, symmetric: float | None = None
) -> tuple[float, float]:
    """A (min, max) range: a sequence of two numbers, or a number v meaning (symmetric - v,
    symmetric + v) (v >= 0) where `symmetric` is given."""
    if symmetric is not None and isinstance(value, numbers.Real) and not isinstance(value, bool):
        v = number(owner, what, value)
        if v < 0:
            raise fail(owner, f"{what}: a single number must be non-negative, got {value!r}")
        pair = (symmetric - v, symmetric + v)
    elif isinstance(value, list | tuple) and len(value) == 2:
        pair = (number(owner, what, value[0]), number(owner, what, value[1]))
    else:
        raise fail(
            owner,
            f"{what} must be {'a number or ' if symmetric is not None else ''}(min, max), got {value!r}",
        )
    if pair[0] > pair[1]:
        raise fail(owner, f"{what}: min must not exceed max, got {value!r}")
    for v in pair:
        number(owner, what, v, lo, hi)
    return pair


def draws(x: Tensor, k: int) -> list[Tensor]:
    """k uniforms in [0, 1) per image of the batch: k tensors (N, 1)."""
    u = rand(x.graph, (x.shape[0], k))
    return [u[:, i : i + 1] for i in range(k)]


def columns(x: Tensor, values: list[Tensor | float]) -> Tensor:
    """(N, len(values)): per-image columns, numbers repeated for every image, stored in a texture
    (a sum over an axis of one: a loop result): a gather reads every entry at every pixel, and a
    fused concat of the columns' arithmetic would be recomputed at each of those reads."""
    n = x.shape[0]
    cols = [v if isinstance(v, Tensor) else const(x.graph, float(v), (n, 1)) for v in values]
    m = cat(cols, 1)
    return m.reshape(n, len(values), 1).sum(2)
