"""Optimizers with torch's exact update rules, lowered into the training graph.

An optimizer here is a description: `glcomp.compile` asks it for the state each parameter needs
and for the update, written with the same symbolic ops as the model, so the whole train step is
one graph (and, on the GPU, one schedule of kernels).
"""

from __future__ import annotations

import math
import numbers
import weakref
from typing import Any

from glcomp.errors import GlcompError
from glcomp.ir.tensor import Tensor, where


def _ok(v: Any) -> bool:
    """A finite number >= 0 (not a bool): what every learning rate and hyper-parameter must be."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v) and v >= 0


class Optimizer:
    """Base class. `params`, if given, restricts the update to those Parameters."""

    def __init__(self, params: Any = None, lr: float = 1e-3) -> None:
        if not _ok(lr):  # as set_lr: a NaN or infinite rate would train to NaN from the second step
            raise GlcompError(f"{type(self).__name__}: invalid learning rate {lr!r}")
        self.params = list(params) if params is not None else None
        self.lr = float(lr)
        self._runtimes: weakref.WeakSet[Any] = weakref.WeakSet()

    def bind(self, runtime: Any) -> None:
        """Let `set_lr` reach `runtime` too (done for every runtime of a program compiled with
        this optimizer; held weakly)."""
        self._runtimes.add(runtime)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate here (for later compiles) and in every live runtime of the
        programs compiled with this optimizer: what torch's ``param_groups[0]["lr"] = lr`` does,
        so a scheduler built on the optimizer, ``StepLR(optimizer, ...)``, drives the training."""
        if not isinstance(lr, int | float) or not math.isfinite(lr) or lr < 0:
            raise GlcompError(f"{type(self).__name__}: invalid learning rate {lr!r}")
        self.lr = float(lr)
        for runtime in list(self._runtimes):
            if not getattr(runtime, "_released", False):
                runtime.set_lr(self.lr)

    def slots(self) -> tuple[str, ...]:
        """Per-parameter state names (zero-initialised arrays of the parameter's shape)."""
        return ()

    def scalars(self) -> dict[str, float]:
        """Shared scalar state (``opt.<name>`` -> initial value), updated once per step by
        `advance` and kept in the optimizer state like the per-parameter slots."""
        return {}

    def advance(self, scalars: dict[str, Tensor]) -> dict[str, Tensor]:
        """The shared scalar state after this step, from its value before the step."""
        return dict(scalars)

    def update(
        self, p: Tensor, g: Tensor, state: dict[str, Tensor], lr: Tensor, shared: dict[str, Tensor]
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The new parameter and new state for one step (written with symbolic tensor ops);
        `shared` holds the scalar state after `advance`."""
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
        if not (_ok(momentum) and _ok(weight_decay)):
            raise GlcompError(f"SGD: momentum and weight_decay must be >= 0, got {momentum}, {weight_decay}")
        if nesterov and momentum <= 0:
            raise GlcompError("SGD: nesterov momentum requires a momentum > 0")
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov

    def slots(self) -> tuple[str, ...]:
        return ("momentum_buffer",) if self.momentum else ()

    def update(self, p, g, state, lr, shared):
        if self.weight_decay:
            g = g + p * self.weight_decay
        new_state = {}
        if self.momentum:
            buf = state["momentum_buffer"] * self.momentum + g
            new_state["momentum_buffer"] = buf
            g = g + buf * self.momentum if self.nesterov else buf
        return p - lr * g, new_state


def _bias_correction(c: Tensor, d: Tensor, beta: float) -> tuple[Tensor, Tensor, Tensor]:
    """One step of ``1 - beta**t`` in float32 with a relative error of a few ulp at every t.

    Two recurrences, each accurate where the other is not: ``c' = c + (1 - beta) * (1 - c)``
    (c = 1 - beta**t; accurate while c is small, it stalls below 1 once the increment drops under
    half an ulp) and ``d' = d - (1 - beta) * d`` (d = beta**t, relative error ~ulp per step, but
    1 - d cancels while d is near 1). The result takes c while c < 1/2, else 1 - d (exact there).
    Returns (new c, new d, the bias correction). Computing 1 - exp(t * ln(beta)) instead loses
    ~1e-4 relative at t = 1 for beta = 0.999 on GPUs with approximate exp.
    """
    rate = 1.0 - beta
    c = c + (1.0 - c) * rate
    d = d - d * rate
    use_c = (c < 0.5).detach()
    return c, d, where(use_c, c, 1.0 - d)


class Adam(Optimizer):
    """torch.optim.Adam (amsgrad off). torch computes the bias corrections ``1 - beta**t`` in
    double precision on the host; here they are optimizer state (``opt.bias_correction<i>``,
    ``opt.beta<i>_power``) advanced by float32 recurrences that keep them within a few ulp."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        if not isinstance(betas, tuple | list) or len(betas) != 2:
            raise GlcompError(f"Adam: betas must be a pair of floats, got {betas!r}")
        if not all(isinstance(b, int | float) and 0.0 <= b < 1.0 for b in betas):
            raise GlcompError(f"Adam: betas must be in [0, 1), got {betas}")
        if not _ok(eps):
            raise GlcompError(f"Adam: eps must be a number >= 0, got {eps!r}")
        if not _ok(weight_decay):
            raise GlcompError(f"Adam: weight_decay must be a number >= 0, got {weight_decay!r}")
        self.betas, self.eps, self.weight_decay = (float(betas[0]), float(betas[1])), eps, weight_decay

    def slots(self) -> tuple[str, ...]:
        return ("exp_avg", "exp_avg_sq")

    def scalars(self) -> dict[str, float]:
        return {
            "step": 0.0,
            "bias_correction1": 0.0,
            "bias_correction2": 0.0,
            "beta1_power": 1.0,
            "beta2_power": 1.0,
        }

    def advance(self, scalars: dict[str, Tensor]) -> dict[str, Tensor]:
        out = {"step": scalars["step"] + 1.0}
        for i, beta in ((1, self.betas[0]), (2, self.betas[1])):
            c, d, bc = _bias_correction(scalars[f"bias_correction{i}"], scalars[f"beta{i}_power"], beta)
            out |= {f"bias_correction{i}": c, f"beta{i}_power": d, f"_bc{i}": bc}
        return out

    def update(self, p, g, state, lr, shared):
        b1, b2 = self.betas
        if self.weight_decay:
            g = g + p * self.weight_decay
        m = state["exp_avg"] + (g - state["exp_avg"]) * (1 - b1)  # torch's lerp form
        v = state["exp_avg_sq"] * b2 + g * g * (1 - b2)
        bc1, bc2 = shared["_bc1"], shared["_bc2"]
        denom = v.sqrt() / bc2.sqrt() + self.eps
        return p - (lr / bc1) * m / denom, {"exp_avg": m, "exp_avg_sq": v}


class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay ``p *= 1 - lr * weight_decay`` before the Adam
    step (default weight_decay 0.01)."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        super().__init__(params, lr, betas, eps, 0.0)
        if not _ok(weight_decay):
            raise GlcompError(f"AdamW: weight_decay must be a number >= 0, got {weight_decay!r}")
        self.decoupled = float(weight_decay)

    def update(self, p, g, state, lr, shared):
        if self.decoupled:
            p = p * (1.0 - lr * self.decoupled)
        return super().update(p, g, state, lr, shared)


def _nonneg(owner: str, **values: Any) -> None:
    for name, v in values.items():
        if not _ok(v):
            raise GlcompError(f"{owner}: {name} must be a finite number >= 0, got {v!r}")


class RMSprop(Optimizer):
    """torch.optim.RMSprop: square_avg = alpha sa + (1 - alpha) g^2, avg = sqrt(sa (- grad_avg^2
    when centered)) + eps, then p -= lr g / avg, or through a momentum buffer."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ) -> None:
        super().__init__(params, lr)
        _nonneg("RMSprop", alpha=alpha, eps=eps, weight_decay=weight_decay, momentum=momentum)
        self.alpha, self.eps, self.weight_decay = alpha, eps, weight_decay
        self.momentum, self.centered = momentum, centered

    def slots(self) -> tuple[str, ...]:
        return (
            ("square_avg",)
            + (("momentum_buffer",) if self.momentum else ())
            + (("grad_avg",) if self.centered else ())
        )

    def update(self, p, g, state, lr, shared):
        if self.weight_decay:
            g = g + p * self.weight_decay
        sq = state["square_avg"] * self.alpha + g * g * (1 - self.alpha)
        new = {"square_avg": sq}
        if self.centered:
            ga = state["grad_avg"] + (g - state["grad_avg"]) * (1 - self.alpha)
            new["grad_avg"] = ga
            avg = (sq - ga * ga).sqrt() + self.eps
        else:
            avg = sq.sqrt() + self.eps
        if self.momentum:
            buf = state["momentum_buffer"] * self.momentum + g / avg
            new["momentum_buffer"] = buf
            return p - lr * buf, new
        return p - lr * (g / avg), new


class Adagrad(Optimizer):
    """torch.optim.Adagrad: sum += g^2; p -= lr / (1 + (t - 1) lr_decay) * g / (sqrt(sum) + eps).
    The stored ``sum`` slot leaves out `initial_accumulator_value` (slots start at zero)."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1e-2,
        lr_decay: float = 0.0,
        weight_decay: float = 0.0,
        initial_accumulator_value: float = 0.0,
        eps: float = 1e-10,
    ) -> None:
        super().__init__(params, lr)
        _nonneg("Adagrad", lr_decay=lr_decay, weight_decay=weight_decay, eps=eps,
                initial_accumulator_value=initial_accumulator_value)  # fmt: skip
        self.lr_decay, self.weight_decay, self.eps = lr_decay, weight_decay, eps
        self.initial = initial_accumulator_value

    def slots(self) -> tuple[str, ...]:
        return ("sum",)

    def scalars(self) -> dict[str, float]:
        return {"step": 0.0}

    def advance(self, scalars: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"step": scalars["step"] + 1.0}

    def update(self, p, g, state, lr, shared):
        if self.weight_decay:
            g = g + p * self.weight_decay
        total = state["sum"] + g * g
        clr = lr / ((shared["step"] - 1.0) * self.lr_decay + 1.0) if self.lr_decay else lr
        std = ((total + self.initial) if self.initial else total).sqrt() + self.eps
        return p - clr * (g / std), {"sum": total}


class Adadelta(Optimizer):
    """torch.optim.Adadelta: square_avg = rho sa + (1 - rho) g^2; delta = sqrt(acc_delta + eps)
    / sqrt(sa + eps) * g; acc_delta = rho ad + (1 - rho) delta^2; p -= lr * delta."""

    def __init__(
        self,
        params: Any = None,
        lr: float = 1.0,
        rho: float = 0.9,
        eps: float = 1e-6,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        _nonneg("Adadelta", rho=rho, eps=eps, weight_decay=weight_decay)
        if rho > 1:
            raise GlcompError(f"Adadelta: rho must be in [0, 1], got {rho}")
        self.rho, self.eps, self.weight_decay = rho, eps, weight_decay

    def slots(self) -> tuple[str, ...]:
        return ("square_avg", "acc_delta")

    def update(self, p, g, state, lr, shared):
        if self.weight_decay:
            g = g + p * self.weight_decay
        sq = state["square_avg"] * self.rho + g * g * (1 - self.rho)
        delta = (state["acc_delta"] + self.eps).sqrt() / (sq + self.eps).sqrt() * g
        acc = state["acc_delta"] * self.rho + delta * delta * (1 - self.rho)
        return p - lr * delta, {"square_avg": sq, "acc_delta": acc}


class LBFGS:
    """torch.optim.LBFGS is not available: its ``step(closure)`` re-evaluates the loss several
    times per step from the host, and a compiled train step is one fixed graph. Constructing it
    raises a GlcompError naming the optimizers to use instead."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise GlcompError(
            "LBFGS is not supported: closure-based optimizers (optimizer.step(closure), which "
            "re-evaluates the loss several times per step) cannot be compiled into one train step; "
            "use Adam, AdamW, SGD (momentum, nesterov), RMSprop, Adagrad or Adadelta"
        )


__all__ = ["SGD", "Adadelta", "Adagrad", "Adam", "AdamW", "Optimizer", "RMSprop", "lr_scheduler"]

import sys  # noqa: E402

from glcomp import lr_scheduler  # noqa: E402  (glcomp.optim.lr_scheduler, as torch.optim.lr_scheduler)

sys.modules[f"{__name__}.lr_scheduler"] = lr_scheduler
