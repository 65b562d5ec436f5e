"""The packing rule: where each element of a logical tensor lives in RGBA float textures.

The rule: the tensor is viewed as ``rows x row_len`` (row_len = last axis, rows = product of the
others; a scalar is 1 x 1). Each row takes ``row_texels = ceil(row_len / 4)`` texels holding 4
consecutive elements of the last axis, zero-padded. Texel ``t`` of the flat sequence lies on page
``t // (width*height)`` at ``x = t % width``, ``y = (t // width) % height``. Width and height are
powers of two no larger than the target's max texture size; a tensor that does not fit one
texture is split into pages.

`layout_for` computes a layout (the code generator records it in the manifest); `pack` and
`unpack` follow a recorded layout (the runtimes read only its numbers, never recompute it).
glcomp.js's pack and unpack (glcomp/runtime/js/format/packing.js) follow the same rule; the parity test is
tests/format/test_format_packing.py.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Layout:
    """The packed layout of one tensor (a manifest's ``layout`` record, see `to_json`)."""

    shape: tuple[int, ...]
    rows: int
    row_len: int
    row_texels: int
    texels: int
    width: int
    height: int
    pages: int

    @property
    def page_texels(self) -> int:
        return self.width * self.height

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["shape"] = list(self.shape)
        return d


def layout_for(shape: tuple[int, ...], max_size: int, width: int | None = None) -> Layout:
    """The packed layout of a tensor of `shape` under a max texture side of `max_size`
    (`width` forces the texture width, for render targets that must share a footprint).
    Layouts are values: equal arguments give the same (cached) one."""
    return _layout(tuple(shape), max_size, width)


@functools.lru_cache(maxsize=1 << 14)
def _layout(shape: tuple[int, ...], max_size: int, width: int | None) -> Layout:
    row_len = shape[-1] if shape else 1
    rows = math.prod(shape[:-1]) if shape else 1
    row_texels = max(1, math.ceil(row_len / 4))
    texels = max(1, rows * row_texels)
    if width is not None:
        height = min(max_size, _pow2(math.ceil(texels / width)))
        pages = math.ceil(texels / (width * height))
    elif texels <= max_size * max_size:
        width = min(max_size, _pow2(math.ceil(math.sqrt(texels))))
        height = min(max_size, _pow2(math.ceil(texels / width)))
        pages = 1
    else:
        width = height = max_size
        pages = math.ceil(texels / (max_size * max_size))
    return Layout(tuple(shape), rows, row_len, row_texels, texels, width, height, pages)


def pack(array: np.ndarray, layout: Mapping[str, Any]) -> list[np.ndarray]:
    """`array` (of the layout's shape) as one float32 array of shape (height, width, 4) per page
    of the layout record `layout` (a manifest's, or `Layout.to_json()`)."""
    rows, row_len, row_texels = layout["rows"], layout["row_len"], layout["row_texels"]
    width, height, pages = layout["width"], layout["height"], layout["pages"]
    flat = np.asarray(array, dtype=np.float32).reshape(rows, row_len)
    padded = np.zeros((rows, row_texels * 4), np.float32)
    padded[:, :row_len] = flat
    texels = np.zeros((pages * width * height, 4), np.float32)
    texels[: rows * row_texels] = padded.reshape(rows * row_texels, 4)
    return [p.reshape(height, width, 4) for p in np.split(texels, pages)]


def unpack(pages: list[np.ndarray], layout: Mapping[str, Any]) -> np.ndarray:
    """Inverse of `pack`: pages of (height, width, 4) floats -> array of the logical shape."""
    rows, row_len, row_texels = layout["rows"], layout["row_len"], layout["row_texels"]
    texels = np.concatenate([np.asarray(p, np.float32).reshape(-1, 4) for p in pages])
    data = texels[: rows * row_texels].reshape(rows, row_texels * 4)[:, :row_len]
    return data.reshape(tuple(layout["shape"]))
