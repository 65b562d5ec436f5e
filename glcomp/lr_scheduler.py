"""Learning-rate schedulers with torch.optim.lr_scheduler's names and formulas, run on the host.

A scheduler drives one or more runtimes (anything with ``set_lr``; the learning rate is a
uniform of the train-step shaders, so changing it costs nothing) or a glcomp Optimizer (its
``lr``, used by the next compile). Like torch's, constructing a scheduler sets the step-0
learning rate, and each `step()` (call it after the train steps of an epoch, or after every
train step for OneCycleLR) advances `last_epoch` and sets the new rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from glcomp.errors import GlcompError


def _initial_lr(target: Any) -> float:
    lr = getattr(target, "lr", None)
    if lr is None and isinstance(getattr(target, "hyper", None), dict):
        lr = target.hyper.get("lr")
    if lr is None:
        raise GlcompError(
            f"scheduler: cannot read the learning rate of {type(target).__name__}; pass base_lr="
        )
    return float(lr)


class LRScheduler:
    """Base class: subclasses give the learning rate at `last_epoch` in closed form (`lr_at`)."""

    def __init__(self, target: Any, last_epoch: int = -1, base_lr: float | None = None) -> None:
        targets = list(target) if isinstance(target, list | tuple) else [target]
        for t in targets:
            if not hasattr(t, "set_lr") and not hasattr(t, "lr"):
                raise GlcompError(
                    f"scheduler: {type(t).__name__} has no set_lr; "
                    "pass a runtime (prog.runtime(...)) or an optimizer"
                )
        self.targets = targets
        self.base_lr = float(base_lr) if base_lr is not None else _initial_lr(targets[0])
        self.last_epoch = last_epoch
        self._last_lr = self.base_lr
        self.step()

    def lr_at(self, epoch: int) -> float:
        """The learning rate after `epoch` scheduler steps; each schedule defines it."""
        raise GlcompError(f"{type(self).__name__} defines no schedule (LRScheduler.lr_at)")

    def step(self) -> None:
        """Advance one epoch (or step) and set the learning rate of every target."""
        self.last_epoch += 1
        lr = float(self.lr_at(self.last_epoch))
        for t in self.targets:
            if hasattr(t, "set_lr"):
                t.set_lr(lr)
            else:
                t.lr = lr
        self._last_lr = lr

    def get_last_lr(self) -> list[float]:
        return [self._last_lr]

    def state_dict(self) -> dict[str, Any]:
        return {"last_epoch": self.last_epoch, "base_lr": self.base_lr, "last_lr": self._last_lr}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_epoch, self.base_lr, self._last_lr = state["last_epoch"], state["base_lr"], state["last_lr"]


class StepLR(LRScheduler):
    """base_lr * gamma ** (epoch // step_size)."""

    def __init__(
        self, target: Any, step_size: int, gamma: float = 0.1, last_epoch: int = -1, **kw: Any
    ) -> None:
        self.step_size, self.gamma = int(step_size), float(gamma)
        super().__init__(target, last_epoch, **kw)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** (epoch // self.step_size)


class MultiStepLR(LRScheduler):
    """base_lr * gamma ** (number of milestones <= epoch)."""

    def __init__(
        self, target: Any, milestones: Any, gamma: float = 0.1, last_epoch: int = -1, **kw: Any
    ) -> None:
        self.milestones, self.gamma = sorted(int(m) for m in milestones), float(gamma)
        super().__init__(target, last_epoch, **kw)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma ** sum(1 for m in self.milestones if m <= epoch)


class ExponentialLR(LRScheduler):
    """base_lr * gamma ** epoch."""

    def __init__(self, target: Any, gamma: float, last_epoch: int = -1, **kw: Any) -> None:
        self.gamma = float(gamma)
        super().__init__(target, last_epoch, **kw)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.gamma**epoch


class LambdaLR(LRScheduler):
    """base_lr * lr_lambda(epoch)."""

    def __init__(
        self, target: Any, lr_lambda: Callable[[int], float], last_epoch: int = -1, **kw: Any
    ) -> None:
        self.lr_lambda = lr_lambda
        super().__init__(target, last_epoch, **kw)

    def lr_at(self, epoch: int) -> float:
        return self.base_lr * self.lr_lambda(epoch)


class CosineAnnealingLR(LRScheduler):
    """eta_min + (base_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2 (torch's closed form)."""

    def __init__(
        self,
        target: Any,
        T_max: int,  # noqa: N803 - torch's name
        eta_min: float = 0.0,
        last_epoch: int = -1,
        **kw: Any,
    ) -> None:
        self.T_max, self.eta_min = int(T_max), float(eta_min)
        super().__init__(target, last_epoch, **kw)

    def lr_at(self, epoch: int) -> float:
        return self.eta_min + (self.base_lr - self.eta_min) * (1 + math.cos(math.pi * epoch / self.T_max)) / 2


class OneCycleLR(LRScheduler):
    """torch's OneCycleLR learning rates (call `step()` after every train step). The momentum
    cycling of torch's version is not done: betas and momentum are compiled into the step."""

    def __init__(
        self,
        target: Any,
        max_lr: float,
        total_steps: int | None = None,
        epochs: int | None = None,
        steps_per_epoch: int | None = None,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        cycle_momentum: bool = True,
        base_momentum: float = 0.85,
        max_momentum: float = 0.95,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
        last_epoch: int = -1,
    ) -> None:
        if total_steps is None:
            if epochs is None or steps_per_epoch is None:
                raise GlcompError("OneCycleLR: give total_steps, or epochs and steps_per_epoch")
            total_steps = int(epochs) * int(steps_per_epoch)
        if total_steps <= 0:
            raise GlcompError(f"OneCycleLR: total_steps must be positive, got {total_steps}")
        if anneal_strategy not in ("cos", "linear"):
            raise GlcompError(
                f"OneCycleLR: anneal_strategy must be 'cos' or 'linear', got {anneal_strategy!r}"
            )
        self.total_steps = int(total_steps)
        initial = max_lr / div_factor
        minimum = initial / final_div_factor
        if three_phase:
            self.phases = [
                (float(pct_start * total_steps) - 1, initial, max_lr),
                (float(2 * pct_start * total_steps) - 2, max_lr, initial),
                (total_steps - 1, initial, minimum),
            ]
        else:
            self.phases = [
                (float(pct_start * total_steps) - 1, initial, max_lr),
                (total_steps - 1, max_lr, minimum),
            ]
        self.cosine = anneal_strategy == "cos"
        super().__init__(target, last_epoch, base_lr=initial)

    def _anneal(self, start: float, end: float, pct: float) -> float:
        if self.cosine:
            return end + (start - end) / 2.0 * (math.cos(math.pi * pct) + 1)
        return (end - start) * pct + start

    def lr_at(self, step: int) -> float:
        if step > self.total_steps:
            raise GlcompError(f"OneCycleLR: stepped {step} times, more than total_steps={self.total_steps}")
        start_step = 0.0
        for i, (end_step, lo, hi) in enumerate(self.phases):
            if step <= end_step or i == len(self.phases) - 1:
                return self._anneal(lo, hi, (step - start_step) / (end_step - start_step))
            start_step = end_step
        raise AssertionError("unreachable")


__all__ = [
    "CosineAnnealingLR",
    "ExponentialLR",
    "LRScheduler",
    "LambdaLR",
    "MultiStepLR",
    "OneCycleLR",
    "StepLR",
]
