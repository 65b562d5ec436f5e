"""State dictionaries (torch name -> array): checking one against the shapes a model or a
runtime expects. Shared by `glcomp.nn.Module.load_state_dict` and every runtime, so it depends
on nothing but numpy and the error type."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from glcomp.errors import GlcompError


def check_state(
    state: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], owner: str, strict: bool = True
) -> None:
    """Raise GlcompError naming every missing, unexpected or wrongly shaped entry."""
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
            given = tuple(np.shape(state[key]))
            if given != tuple(shape) and not (np.prod(given) == np.prod(shape) == 1):
                problems.append(f"{key!r} expected shape {tuple(shape)} but got {given}")
            elif not np.all(np.isfinite(np.asarray(state[key], dtype=np.float64))):
                problems.append(f"{key!r} holds NaN or infinite values")
    if problems:
        raise GlcompError(f"load_state_dict into {owner}: " + "; ".join(problems) + " (nothing was loaded)")
