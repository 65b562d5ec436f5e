"""Optimizers with torch's exact update rules, lowered into the training graph.

An optimizer here is a description: `glcomp.compile` asks it for the state each parameter needs
and for the update, written with the same symbolic ops as the model, so the whole train step is
one graph (and, on the GPU, one schedule of kernels).
"""

from __future__ import annotations

import math
from typing import Any

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor


class Optimizer:
    """Base class. `params`, if given, restricts the update to those Parameters."""

    def __init__(self, params: Any = None, lr: float = 1e-3) -> None:
        if lr < 0:
            raise GlcompError(f"{type(self).__name__}: invalid learning rate {lr}")
        self.params = list(params) if params is not None else None
        self.lr = float(lr)

    def slots(self) -> tuple[str, ...]:
        """Per-parameter state names (zero-initialised arrays of the parameter's shape)."""
        return ()

    def uses_step(self) -> bool:
        """Whether the update needs the step count (a shared scalar state starting at 0)."""
        return False

    def update(
        self, p: Tensor, g: Tensor, state: dict[str, Tensor], lr: Tensor, step: Tensor | None
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The new parameter and new state for one step (written with symbolic tensor ops)."""
        raise GlcompError(f"{type(self).__name__} defines no update rule (Optimizer.update)")


class SGD(Optimizer):
    """torch.optim.SGD (dampening 0): buf = momentum * buf + g; p -= lr * (g + momentum * buf
    if nesterov else buf). torch starts buf at g, which equals this rule from buf = 0."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1e-3,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(params, lr)
        if momentum < 0 or weight_decay < 0:
            raise GlcompError(f"SGD: momentum and weight_decay must be >= 0, got {momentum}, {weight_decay}")
        if nesterov and momentum <= 0:
            raise GlcompError("SGD: nesterov momentum requires a momentum > 0")
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov

    def slots(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def update(self, p, g, state, lr, step):
        if self.weight_decay:
            g = g + p * self.weight_decay
        new_state = {}
        if self.momentum:
            buf = state["momentum_buffer"] * self.momentum + g
            new_state["momentum_buffer"] = buf
            g = g + buf * self.momentum if self.nesterov else buf
        return p - lr * g, new_state


class Adam(Optimizer):
    """torch.optim.Adam (amsgrad off)."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        if not all(0.0 <= b < 1.0 for b in betas):
            raise GlcompError(f"Adam: betas must be in [0, 1), got {betas}")
        self.betas, self.eps, self.weight_decay = tuple(betas), eps, weight_decay

    def slots(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def uses_step(self) -> bool:
        return True

    def update(self, p, g, state, lr, step):
        b1, b2 = self.betas
        if self.weight_decay:
            g = g + p * self.weight_decay
        m = state["exp_avg"] + (g - state["exp_avg"]) * (1 - b1)  # torch's lerp form
        v = state["exp_avg_sq"] * b2 + g * g * (1 - b2)
        # beta ** step as exp(step * ln(beta)), the step being a graph value.
        bc1 = 1.0 - (step * math.log(b1)).exp() if b1 > 0 else step * 0 + 1.0
        bc2 = 1.0 - (step * math.log(b2)).exp() if b2 > 0 else step * 0 + 1.0
        denom = v.sqrt() / bc2.sqrt() + self.eps
        return p - (lr / bc1) * m / denom, {"exp_avg": m, "exp_avg_sq": v}


__all__ = ["SGD", "Adam", "Optimizer"]
