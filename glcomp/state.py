"""State dictionaries (torch name -> array): checking one against the shapes a model or a
runtime expects. Shared by `glcomp.nn.Module.load_state_dict` and every runtime, so it depends
on nothing but numpy and the error type."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

FLOAT32_MAX = float(np.finfo(np.float32).max)


def _problem(key: str, value: Any, shape: tuple[int, ...]) -> str | None:
    """What is wrong with the entry `key` (expected of `shape`), or None."""
    if getattr(value, "requires_grad", False) and hasattr(value, "detach"):
        return f"{key!r} is a torch tensor that requires grad: pass tensor.detach() (or torch's state_dict())"
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as err:
        return f"{key!r} is not an array ({err})"
    if arr.dtype.kind not in "biuf":  # not complex (its imaginary part would be dropped), not times
        return f"{key!r} holds {arr.dtype} values; real numbers (booleans, integers or floats) expected"
    if arr.shape != tuple(shape) and not (arr.size == math.prod(shape) == 1):
        return f"{key!r} expected shape {tuple(shape)} but got {arr.shape}"
    if arr.dtype.kind == "f":
        if not np.all(np.isfinite(arr)):
            return f"{key!r} holds NaN or infinite values"
        if arr.size and arr.dtype.itemsize > 4 and float(np.abs(arr).max()) > FLOAT32_MAX:
            return (
                f"{key!r} holds values up to {float(np.abs(arr).max()):.3g}, beyond float32's range "
                f"(+-{FLOAT32_MAX:.3g}): they would be infinite in the runtime"
            )
    return None


def check_state(
    state: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], owner: str, strict: bool = True
) -> None:
    """Raise GlcompError naming every missing, unexpected or wrongly shaped entry, and every one
    that does not hold finite real numbers within float32's range (what the runtimes compute
    in): complex values, NaN, infinities, float64 values beyond +-3.4e38."""
    problems = []
    if strict:
        missing = [k for k in expected if k not in state]
        extra = [k for k in state if k not in expected]
        if missing:
            problems.append(f"missing keys {missing}")
        if extra:
            problems.append(f"unexpected keys {extra}")
    for key, shape in expected.items():
        if key in state:
            problem = _problem(key, state[key], tuple(shape))
            if problem is not None:
                problems.append(problem)
    if problems:
        raise GlcompError(f"load_state_dict into {owner}: " + "; ".join(problems) + " (nothing was loaded)")
