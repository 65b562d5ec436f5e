"""Pack arrays into RGBA texel pages and back, following a layout record from a manifest.

See glcomp/codegen/layout.py for the rule; this module only reads the recorded numbers, so the
runtimes stay independent of the compiler.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def pack(array: np.ndarray, layout: dict[str, Any]) -> list[np.ndarray]:
    """Return one float32 array of shape (height, width, 4) per page."""
    rows, row_len, row_texels = layout["rows"], layout["row_len"], layout["row_texels"]
    width, height, pages = layout["width"], layout["height"], layout["pages"]
    flat = np.asarray(array, dtype=np.float32).reshape(rows, row_len)
    padded = np.zeros((rows, row_texels * 4), np.float32)
    padded[:, :row_len] = flat
    texels = np.zeros((pages * width * height, 4), np.float32)
    texels[: rows * row_texels] = padded.reshape(rows * row_texels, 4)
    return [p.reshape(height, width, 4) for p in np.split(texels, pages)]


def unpack(pages: list[np.ndarray], layout: dict[str, Any]) -> np.ndarray:
    """Inverse of `pack`: pages of (height, width, 4) floats -> array of the logical shape."""
    rows, row_len, row_texels = layout["rows"], layout["row_len"], layout["row_texels"]
    texels = np.concatenate([np.asarray(p, np.float32).reshape(-1, 4) for p in pages])
    data = texels[: rows * row_texels].reshape(rows, row_texels * 4)[:, :row_len]
    return data.reshape(tuple(layout["shape"]))
