"""torch's default initialisers, drawn from one seedable numpy generator."""

from __future__ import annotations

import math

import numpy as np

_rng = np.random.default_rng(0)


def manual_seed(seed: int) -> None:
    """Seed the generator that module constructors draw their initial weights from."""
    global _rng
    _rng = np.random.default_rng(seed)


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


def fan_in_bound(fan_in: int) -> float:
    # kaiming_uniform_(a=sqrt(5)), torch's default for Linear and Conv2d weights, and their
    # bias init both reduce to U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
