"""Integer arithmetic in float tensors, exact on every runtime: the random parameters of the
augmentation transforms are computed with these helpers from the counter-hash uniforms.

Every value is an integer held in a float32 below 2^24 and every operation keeps it so (sums,
products, floors of products by powers of two, floor divisions and square roots corrected by their
remainder), so the numpy reference, GLSL ES 1.00 and GLSL ES 3.00 agree bit for bit whatever the
shader compiler contracts or reorders: no result depends on a rounding.
"""

from __future__ import annotations

import math

import numpy as np

from glcomp.ir.tensor import Tensor, ge, gt, le, lt, maximum, minimum, unary, where

__all__ = [
    "cos_sin",
    "f32",
    "floor",
    "gt",
    "idiv",
    "isqrt",
    "maximum",
    "minimum",
    "mulshift",
    "shr",
    "uniform_int",
]

# Angles count in units of 1/1024 of a right angle (about 0.088 degrees); sines and cosines are
# fixed point with ONE = 1.0.
RIGHT = 1024
ONE = 4096


def f32(value: float) -> float:
    """`value` rounded to float32: a constant every runtime and GLSL parser reads as the same float."""
    return float(np.float32(value))


def floor(t: Tensor) -> Tensor:
    return unary("floor", t)


def shr(t: Tensor, bits: int) -> Tensor:
    """floor(t / 2^bits)."""
    return floor(t * 2.0**-bits)


def idiv(a: Tensor, b: Tensor | float) -> Tensor:
    """floor(a / b) for integers a and b > 0 (|a| < 2^24): the float quotient, corrected by one
    where its remainder is out of [0, b) (GLSL's division may be off by a few ulps)."""
    q = floor(a / b)
    r = a - q * b
    return q + ge(r, b) - lt(r, 0.0)


def isqrt(n: Tensor) -> Tensor:
    """floor(sqrt(n)) for integers 0 <= n < 2^23, corrected by its square."""
    s = floor(maximum(n, 0.0).sqrt())
    s = s - gt(s * s, n)
    return s + le((s + 1.0) * (s + 1.0), n)


def uniform_int(u: Tensor, lo: int, hi: int) -> Tensor:
    """An integer in [lo, hi] from a uniform u in [0, 1): lo + floor(u (hi - lo + 1))."""
    span = hi - lo + 1
    if span <= 1:
        return u * 0.0 + float(lo)
    return minimum(floor(u * float(span)), float(span - 1)) + float(lo)


def mulshift(a: Tensor, b: Tensor, bits: int = 12) -> Tensor:
    """floor(a b / 2^bits) for integers |a|, |b| < 2^14 (bits >= 6), with every partial product
    below 2^24: a = 64 ah + al splits the product."""
    ah = shr(a, 6)
    al = a - ah * 64.0
    return shr(ah * b + shr(al * b, 6), bits - 6)


def _poly_step(c: Tensor, w: Tensor, k: int) -> Tensor:
    """ONE - floor(c phi^2 / k) with phi^2 = w pi^2 / 2^16: c w / 2^12 times a 12-bit constant."""
    val = math.pi**2 / (16 * k)
    s = 12
    while round(val * 2 ** (s + 1)) < 4096:
        s += 1
    return ONE - shr(shr(c * w, 12) * float(round(val * 2**s)), s)


def cos_sin(angle: Tensor) -> tuple[Tensor, Tensor]:
    """ONE cos and ONE sin of an integer angle in RIGHT units (|angle| < 2^20), within 2 units of
    the exact values; exact at multiples of a right angle. The angle is reduced to a quadrant and
    phi in [-45, 45] degrees, whose cosine and sine are Horner polynomials in fixed point."""
    q = shr(angle + RIGHT // 2, 10)
    r = angle - q * float(RIGHT)
    ar = maximum(r, -r)
    w = shr(ar * ar, 6)
    c = w * 0.0 + float(ONE)
    for k in (56, 30, 12, 2):
        c = _poly_step(c, w, k)
    s = w * 0.0 + float(ONE)
    for k in (42, 20, 6):
        s = _poly_step(s, w, k)
    s = shr(shr(s * ar, 9) * float(round(math.pi / 4 * ONE)), 12)
    s = where(lt(r, 0.0), -s, s)
    quad = q - shr(q, 2) * 4.0
    cos = where(lt(quad, 0.5), c, where(lt(quad, 1.5), -s, where(lt(quad, 2.5), -c, s)))
    sin = where(lt(quad, 0.5), s, where(lt(quad, 1.5), c, where(lt(quad, 2.5), -s, -c)))
    return cos, sin
