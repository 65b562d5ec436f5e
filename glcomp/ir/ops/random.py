"""Counter-based random numbers: ``hash_uniform(a, b)`` over a vector of n elements is a uniform
value in [0, 1) per element, a hash of (element index, a, b). Dropout feeds a step counter and a
per-call seed, so masks are reproducible, differ between steps and need no random state on the
GPU beyond the counter.

The hash is integer arithmetic modulo 2^24 (three rounds of ``h * (2h + 1)``, a multiplication
by an odd constant and a fold of the high 12 bits into the low 12, per absorbed word). The shader
holds every integer as two 12-bit limbs in floats (``glc_uniform`` in the prelude), so each
intermediate is an integer below 2^24: exact in GLSL ES 1.00 and 3.00 highp float, equal bit for
bit to this numpy reference. Operands count as ``floor(x) mod 2^24`` (NaN or infinite: NaN).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import st
from glcomp.ir.ops.registry import Op, register

MASK = (1 << 24) - 1
# The odd multipliers of the three rounds (24-bit); the prelude's glc_mix24 uses the same.
MULTIPLIERS = (0x9E3779, 0x85EBCB, 0xC2B2AF)


def _fold(h: np.ndarray) -> np.ndarray:
    hi, lo = h >> 12, h & 4095
    return (hi << 12) | ((lo + hi) & 4095)


def mix24(h: np.ndarray) -> np.ndarray:
    """The bijection of [0, 2^24) that the hash applies after absorbing each word."""
    for c in MULTIPLIERS:
        h = (h * (2 * h + 1)) & MASK
        h = _fold((h * c) & MASK)
    return h


def word(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``floor(x) mod 2^24`` as int64, and where x is not finite."""
    x = np.asarray(x, np.float64)
    bad = ~np.isfinite(x)
    k = np.floor(np.where(bad, 0.0, x))
    k = k - 16777216.0 * np.floor(k / 16777216.0)
    return k.astype(np.int64), bad


def hash_uniform_ref(a: np.ndarray, b: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    ka, bad_a = word(a)
    kb, bad_b = word(b)
    index = np.arange(np.shape(a)[0], dtype=np.int64)
    h = mix24(kb)
    h = mix24((h + ka) & MASK)
    h = mix24((h + index) & MASK)
    u = h.astype(np.float64) / 16777216.0
    return np.where(bad_a | bad_b, np.nan, u).astype(np.asarray(a).dtype if dtype is None else dtype)


def _shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    if len(a) != 1 or a != b:
        raise GlcompError(f"hash_uniform takes two vectors of one length, got shapes {a} and {b}")
    if a[0] > 1 << 24:
        raise GlcompError(f"hash_uniform: at most 2^24 elements, got {a[0]}")
    return a


def _sample(draw: Any) -> tuple[list[tuple[int, ...]], dict[str, Any]]:
    n = draw(st().integers(1, 40))
    return [(n,), (n,)], {}


register(
    Op(
        "hash_uniform",
        "elementwise",
        _shape,
        lambda a, b: hash_uniform_ref(a, b, None),
        lambda g, out, a, b: (None, None),
        2,
        "glc_uniform(a, b, i0)",  # i0: the element index (the op is one-dimensional)
        _sample,
        smooth=False,
        glsl4="vec4(glc_uniform(a.x, b.x, j0), glc_uniform(a.y, b.y, j0 + 1), "
        "glc_uniform(a.z, b.z, j0 + 2), glc_uniform(a.w, b.w, j0 + 3))",  # j0: the texel's first index
    )
)
