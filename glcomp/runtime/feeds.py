"""Checking what callers feed a program, shared by every runtime (reads manifest-style specs)."""

from __future__ import annotations

from typing import Any

import numpy as np

from glcomp.errors import GlcompError


def check_input(name: str, spec: dict[str, Any], value: Any) -> np.ndarray:
    """Return `value` as an array of the spec's shape; raise GlcompError naming the tensor."""
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError) as err:
        raise GlcompError(f"input {name!r}: not an array ({err})") from None
    shape = tuple(spec["shape"])
    if arr.shape != shape:
        raise GlcompError(f"input {name!r} expected shape {shape} but got {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) and arr.dtype != np.bool_:
        raise GlcompError(f"input {name!r} must hold numbers, got dtype {arr.dtype}")
    classes = spec.get("num_classes")
    if classes is not None:
        if not np.issubdtype(arr.dtype, np.integer) and not np.all(np.mod(arr, 1) == 0):
            raise GlcompError(f"input {name!r}: class labels must be integers")
        if arr.size and (arr.min() < 0 or arr.max() >= classes):
            raise GlcompError(
                f"input {name!r}: class labels must lie in [0, {classes}), "
                f"got values from {arr.min()} to {arr.max()}"
            )
    elif not np.all(np.isfinite(arr)):
        raise GlcompError(f"input {name!r} holds NaN or infinite values")
    return arr


def check_feeds(entry: str, specs: dict[str, dict[str, Any]], given: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every name known, none missing, each one checked by `check_input`."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise GlcompError(f"{entry}: unknown input names {unknown}; expected {sorted(specs)}")
    missing = sorted(set(specs) - set(given))
    if missing:
        raise GlcompError(f"{entry}: missing inputs {missing}")
    return {name: check_input(name, spec, given[name]) for name, spec in specs.items()}


def refuse_positional(entry: str, args: tuple[Any, ...], names: list[str]) -> None:
    """Runtimes take inputs by name only; a positional argument is a GlcompError saying so."""
    if args:
        example = ", ".join(f"{n}=..." for n in names) or "..."
        raise GlcompError(f"pass inputs by name: {entry}({example}); got {len(args)} positional argument(s)")
