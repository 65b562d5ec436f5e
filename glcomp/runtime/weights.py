"""Weights files for torch: a state dict (torch name -> array) written as safetensors.

`save_weights` writes what ``torch.nn.Module.load_state_dict(..., strict=True)`` expects of the
torch twin of a model: its parameters and buffers by their torch names, float32 (integer buffers
such as BatchNorm's ``num_batches_tracked`` int64, 0-d), and nothing else: no optimizer state, no
step or random-number counters, no learning rate. The file is written atomically (a temporary
beside it, fsynced, renamed over the target, the directory fsynced), so a reader sees the old
file or the new one and a crash leaves no half-written file at the path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format.files import write_atomic


def as_state_arrays(state: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Every value as a C-contiguous np.ndarray (0-d entries stay 0-d: ``np.ascontiguousarray``
    would make them 1-d): integers as int64, everything else float32."""
    out = {}
    for name, value in state.items():
        arr = np.asarray(value)
        dtype = np.int64 if np.issubdtype(arr.dtype, np.integer) else np.float32
        out[name] = np.array(arr, dtype=dtype, order="C", copy=True)
    return out


def save_weights(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Write `state` as a safetensors file at `path` (atomically, see the module docstring) and
    return the path. GlcompError when a value is not finite (a diverged run) or the file cannot
    be written."""
    from safetensors.numpy import save

    path = Path(path)
    arrays = as_state_arrays(state)
    bad = [k for k, v in arrays.items() if v.dtype != np.int64 and not np.all(np.isfinite(v))]
    if bad:
        raise GlcompError(f"save_weights: {', '.join(bad)} hold NaN or infinite values (nothing was written)")
    if path.is_dir():
        raise GlcompError(f"save_weights: {path} is a directory; give a file path such as model.safetensors")
    parent = path.parent
    if not parent.is_dir():
        raise GlcompError(f"save_weights: {parent} is not a directory")
    # torch's loaders read "format"; transformers' expects "pt" in it.
    data = save(arrays, metadata={"format": "pt"})
    try:
        write_atomic(path, data)
    except OSError as err:
        raise GlcompError(f"save_weights: cannot write {path} ({err.strerror or err})") from None
    return path
