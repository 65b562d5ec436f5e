"""torch's default initialisers, drawn from one seedable numpy generator, and the torch.nn.init
functions (``kaiming_uniform_``, ``xavier_normal_``, ...) that overwrite a Parameter in place."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

_rng = np.random.default_rng(0)
_seed = 0


def manual_seed(seed: int) -> None:
    """Seed the generator that module constructors draw their initial weights from, and the seeds
    of the random ops (dropout) of models traced afterwards."""
    global _rng, _seed
    _rng = np.random.default_rng(seed)
    _seed = int(seed)


def current_seed() -> int:
    """The seed given to `manual_seed` last (0 by default)."""
    return _seed


def uniform(shape: tuple[int, ...], bound: float) -> np.ndarray:
    return _rng.uniform(-bound, bound, size=shape).astype(np.float32)


def draw(shape: tuple[int, ...], normal: bool) -> np.ndarray:
    """Standard normal (or uniform [0, 1)) float32 values from the seeded generator."""
    values = _rng.standard_normal(size=shape) if normal else _rng.uniform(size=shape)
    return values.astype(np.float32)


def fan_in_bound(fan_in: int) -> float:
    # kaiming_uniform_(a=sqrt(5)), torch's default for Linear and Conv2d weights, and their
    # bias init both reduce to U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0


# -- torch.nn.init ---------------------------------------------------------------------------------
def _data(tensor: Any) -> np.ndarray:
    # A numpy array is filled itself (its own `.data` is a memoryview): torch scripts pass
    # `m.weight.data`, which for a glcomp Parameter is its float32 array.
    data = tensor if isinstance(tensor, np.ndarray) else getattr(tensor, "data", None)
    if not isinstance(data, np.ndarray):
        raise GlcompError(f"nn.init: expected a Parameter or numpy array, got {type(tensor).__name__}")
    return data


def _fill(tensor: Any, values: np.ndarray) -> Any:
    data = _data(tensor)
    data[...] = np.asarray(values, dtype=data.dtype).reshape(data.shape)
    return tensor


def _fans(tensor: Any) -> tuple[int, int]:
    shape = _data(tensor).shape
    if len(shape) < 2:
        raise GlcompError(f"nn.init: fan in and fan out need at least 2 dimensions, got shape {shape}")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """torch.nn.init.calculate_gain."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid", "conv_transpose2d"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise GlcompError(f"nn.init.calculate_gain: unsupported nonlinearity {nonlinearity!r}")


def uniform_(tensor: Any, a: float = 0.0, b: float = 1.0) -> Any:
    return _fill(tensor, _rng.uniform(a, b, size=_data(tensor).shape))


def normal_(tensor: Any, mean: float = 0.0, std: float = 1.0) -> Any:
    return _fill(tensor, _rng.normal(mean, std, size=_data(tensor).shape))


def trunc_normal_(tensor: Any, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0) -> Any:
    """Normal values redrawn until they lie in [a, b]."""
    shape = _data(tensor).shape
    values = _rng.normal(mean, std, size=shape)
    bad = (values < a) | (values > b)
    while bad.any():
        values[bad] = _rng.normal(mean, std, size=int(bad.sum()))
        bad = (values < a) | (values > b)
    return _fill(tensor, values)


def constant_(tensor: Any, val: float) -> Any:
    return _fill(tensor, np.full(_data(tensor).shape, val))


def zeros_(tensor: Any) -> Any:
    return constant_(tensor, 0.0)


def ones_(tensor: Any) -> Any:
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor: Any, gain: float = 1.0) -> Any:
    fan_in, fan_out = _fans(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound)


def xavier_normal_(tensor: Any, gain: float = 1.0) -> Any:
    fan_in, fan_out = _fans(tensor)
    return normal_(tensor, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)))


def _kaiming_std(tensor: Any, a: float, mode: str, nonlinearity: str) -> float:
    if mode not in ("fan_in", "fan_out"):
        raise GlcompError(f"nn.init: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = _fans(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(
    tensor: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Any:
    bound = math.sqrt(3.0) * _kaiming_std(tensor, a, mode, nonlinearity)
    return uniform_(tensor, -bound, bound)


def kaiming_normal_(
    tensor: Any, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu"
) -> Any:
    return normal_(tensor, 0.0, _kaiming_std(tensor, a, mode, nonlinearity))
