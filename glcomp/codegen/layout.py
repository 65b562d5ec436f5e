"""Texture packing: where each element of a logical tensor lives in RGBA float textures.

Packing rule (also implemented by both runtimes' pack/unpack): the tensor is viewed as
``rows x row_len`` (row_len = last axis, rows = product of the others; a scalar is 1 x 1).
Each row takes ``row_texels = ceil(row_len / 4)`` texels holding 4 consecutive elements of the
last axis, zero-padded. Texel ``t`` of the flat sequence lies on page ``t // (width*height)`` at
``x = t % width``, ``y = (t // width) % height``. Width and height are powers of two no larger
than the target's max texture size; a tensor that does not fit one texture is split into pages.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass
from typing import Any


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class Layout:
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
