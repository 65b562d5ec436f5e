"""Integer-exact resampling primitives of the augmentation transforms (glcomp.transforms).

``floor`` rounds down elementwise. ``affine_gather(x, m)`` reads each output pixel of a batch of
images from the input pixel that a per-sample affine map of integers sends it to (nearest
neighbour), or writes `fill` where that pixel lies outside the image.

Exactness: the transforms build `m` from integer-valued floats below 2^24 and ``affine_gather``
computes only sums and products of such integers and floor divisions corrected by their
remainder, so GLSL ES 1.00 and 3.00 highp floats compute exactly what this numpy reference does
(a fused multiply-add of exact integers is exact too). Neither op has a gradient: the transforms
apply to model inputs (glcomp.transforms refuses tensors computed from parameters).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import same_shapes, st
from glcomp.ir.ops.elementwise import same_shape
from glcomp.ir.ops.registry import Op, register

# The columns of m: (ax, bx, cx, dx, ay, by, cy, dy), see affine_gather_ref.
PARAMS = 8


def affine_gather_shape(
    x: tuple[int, ...], m: tuple[int, ...], size: tuple[int, int], fill: float
) -> tuple[int, ...]:
    if len(x) != 4:
        raise GlcompError(f"affine_gather takes images (N, C, H, W), got shape {x}")
    if m != (x[0], PARAMS):
        raise GlcompError(f"affine_gather: the map must have shape ({x[0]}, {PARAMS}), got {m}")
    if len(size) != 2 or min(size) < 1:
        raise GlcompError(f"affine_gather: size must be two positive sides, got {size}")
    return (x[0], x[1], int(size[0]), int(size[1]))


def affine_gather_ref(x: np.ndarray, m: np.ndarray, size: tuple[int, int], fill: float) -> np.ndarray:
    """out[n, c, i, j] = x[n, c, sy, sx] where, with P = 2j + 1 - OW and Q = 2i + 1 - OH (output
    pixel centres in half pixels from the centre) and the entries of m floored,
    sx = floor((ax P + bx Q + cx) / max(dx, 1)) and sy = floor((ay P + by Q + cy) / max(dy, 1));
    `fill` where (sy, sx) lies outside the image. Exact while |ax P| + |bx Q| + |cx| < 2^24 (and
    likewise for y): what the transforms guarantee by construction."""
    n, _, h, w = x.shape
    oh, ow = size
    k = np.floor(np.asarray(m, np.float64))
    k = np.where(np.isfinite(k), k, 0.0).astype(np.int64)
    p = (2 * np.arange(ow) + 1 - ow)[None, None, :]
    q = (2 * np.arange(oh) + 1 - oh)[None, :, None]

    def coord(col: int) -> np.ndarray:
        a, b, cc, d = (k[:, col + i][:, None, None] for i in range(4))
        return np.floor_divide(a * p + b * q + cc, np.maximum(d, 1))

    sx, sy = coord(0), coord(4)  # (N, OH, OW)
    inside = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    rows = np.arange(n)[:, None, None]
    picked = x[rows, :, np.clip(sy, 0, h - 1), np.clip(sx, 0, w - 1)]  # (N, OH, OW, C)
    out = np.where(inside[..., None], picked, np.asarray(fill, x.dtype))
    return np.ascontiguousarray(np.moveaxis(out, -1, 1)).astype(x.dtype)


def _sample(draw: Any) -> tuple[list[tuple[int, ...]], dict[str, Any]]:
    n, c = draw(st().integers(1, 3)), draw(st().integers(1, 3))
    h, w = draw(st().integers(1, 5)), draw(st().integers(1, 5))
    size = (draw(st().integers(1, 5)), draw(st().integers(1, 5)))
    return [(n, c, h, w), (n, PARAMS)], {"size": size, "fill": draw(st().sampled_from([0.0, 0.5]))}


register(
    Op(
        "floor",
        "elementwise",
        same_shape,
        np.floor,
        lambda g, out, a: (None,),  # zero almost everywhere
        1,
        "floor(a)",
        same_shapes(1),
        smooth=False,
    )
)
register(
    Op(
        "affine_gather",
        "index",
        affine_gather_shape,
        affine_gather_ref,
        lambda g, out, x, m, size, fill: (None, None),
        2,
        sample=_sample,
        smooth=False,
        attrs=("size", "fill"),
        cost=8,
    )
)
