"""The runtime interface: what the GL runtime (`glcomp.runtime.gl.GLRuntime`) and the numpy
reference runtime (`glcomp.runtime.reference.ReferenceRuntime`) both offer, and what
``Program.runtime(...)`` returns.

Inputs are keyword arguments named as the program's inputs (a positional one is refused with a
GlcompError naming them); states are named as the torch twin of the model names them. A runtime
is usable until `release()` (or the end of a ``with`` block); afterwards every call raises
GlcompError. Each runtime adds its own members beyond these (GL: ``info()``, ``run()``,
``gl_objects()``, ``manifest``; reference: ``params``, ``opt_state``, ``dtype``);
tests/runtime/test_runtime_protocol.py checks that both satisfy this protocol with the same signatures.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, Self, runtime_checkable

import numpy as np


@runtime_checkable
class Runtime(Protocol):
    """A compiled program that runs: predict, gradients, training steps, state in and out."""

    def predict(self, *args: Any, **inputs: Any) -> np.ndarray:
        """The model's output for `inputs` (a dict of arrays for a model with several outputs)."""
        ...

    def gradients(self, *args: Any, **inputs: Any) -> dict[str, np.ndarray]:
        """The loss's gradient for every parameter, by its name; nothing changes."""
        ...

    def train_step(self, *args: Any, **inputs: Any) -> float:
        """One forward, backward and optimizer step; returns the loss (nan or inf when the
        training diverged: the step is taken all the same)."""
        ...

    def train_steps(self, batches: Iterable[dict[str, Any]], read_every: int = 0) -> list[float]:
        """One train step per batch; the losses of every `read_every`-th step and the last one
        (0: only the last). GlcompError naming the step when a loss read is nan or infinite."""
        ...

    def inspect(self, name: str) -> np.ndarray:
        """The tensor `name`: a state as it is now, a counter, or a tensor of the last entry point
        run (docs/inspect.md). GlcompError listing near matches for an unknown name."""
        ...

    def set_lr(self, lr: float) -> None:
        """Set the learning rate (a finite number >= 0) of the following train steps."""
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, buffers and counters by their torch names (copies)."""
        ...

    def load_state_dict(
        self, state: Mapping[str, Any], optimizer: str | Mapping[str, Any] | None = None
    ) -> None:
        """Load parameters, buffers and counters (every key, checked before anything is loaded);
        `optimizer`: None keeps the optimizer state, ``"reset"`` zeroes it, a dict from
        `optimizer_state()` restores it."""
        ...

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer state (``opt.<param>.<slot>``, ``opt.step``) as it is now."""
        ...

    def reset_optimizer(self) -> None:
        """Set every optimizer state (moments, momentum, the step count) to zero."""
        ...

    def reset_state(self, names: Any = None) -> None:
        """Zero the state carried across batches (glcomp.compile's ``carry=``): every carried
        input, or those in `names`."""
        ...

    def save_weights(self, path: Any) -> Any:
        """Write `state_dict()`'s parameters and buffers to the safetensors file `path`,
        atomically, for the torch twin of the model; returns the path."""
        ...

    def save(self, directory: Any) -> Any:
        """Save the runtime as a bundle holding its current state (atomically);
        ``glcomp.load(directory)`` resumes from exactly this state."""
        ...

    def release(self) -> None:
        """Free what the runtime holds; safe to call more than once."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...
