"""Colour and noise augmentations: ColorJitter (brightness, contrast), GaussianNoise and
salt-and-pepper noise, for images with values in [0, 1].

Exactness: a product is the one operation whose rounding a shader compiler may change (by
contracting it with an addition into a fused multiply-add), so every product here is exact: images
are quantized to multiples of 2^-15 before they are scaled, factors step by 1/128, the contrast
mean is a sum of integers, and the noise is an integer times a constant of few significant bits.
Sums then round once, alike on every runtime.
"""

from __future__ import annotations

import math
from typing import Any

from glcomp.ir.tensor import Tensor, lt, maximum, minimum, where
from glcomp.transforms import _fixed as fx
from glcomp.transforms._base import Augmentation, draws, fail, interval, number

QUANT = 15  # image values are quantized to multiples of 2^-QUANT before a product
STEPS = 128  # jitter factors step by 1/STEPS
IRWIN_HALL_STD = math.sqrt(4 * (4096**2 - 1) / 12)  # of the sum of four 12-bit uniforms


def _quantize(x: Tensor) -> Tensor:
    """x in [0, 1] rounded down to a multiple of 2^-QUANT."""
    return fx.floor(x * float(2**QUANT)) * 2.0**-QUANT


def _clamp01(x: Tensor) -> Tensor:
    return minimum(maximum(x, 0.0), 1.0)


class ColorJitter(Augmentation):
    """torchvision's ColorJitter for brightness and contrast: per image a brightness factor in
    `brightness` (a number b: [max(0, 1 - b), 1 + b]) and a contrast factor in `contrast`, applied
    in a random order per image (torchvision: per call). Brightness scales the image; contrast
    blends it with the mean of its greyscale ((77 R + 150 G + 29 B) / 256, torchvision 0.2989,
    0.587, 0.114); both clamp to [0, 1]. Factors step by 1/128 up to 4; images are read as
    multiples of 2^-15 (below 8-bit camera resolution). Saturation and hue are not compiled."""

    def __init__(self, brightness: Any = 0, contrast: Any = 0, saturation: Any = 0, hue: Any = 0) -> None:
        super().__init__()
        self.brightness = self._factor("brightness", brightness)
        self.contrast = self._factor("contrast", contrast)
        for what, value in (("saturation", saturation), ("hue", hue)):
            if value not in (0, None, (1, 1), [1, 1]) or (what == "hue" and value in ((1, 1), [1, 1])):
                raise fail(self, f"{what} is not compiled (only brightness and contrast), got {value!r}")

    def _factor(self, what: str, value: Any) -> tuple[float, float] | None:
        if value is None or (not isinstance(value, list | tuple) and value == 0):
            return None
        lo, hi = interval(self, what, value, None, None, symmetric=1.0)
        lo = max(lo, 0.0)
        if hi > 4.0:
            raise fail(self, f"{what}: factors up to 4 are compiled, got {value!r}")
        return (lo, hi)

    def extra_repr(self) -> str:
        return f"brightness={self.brightness}, contrast={self.contrast}"

    def _steps(self, u: Tensor, pair: tuple[float, float]) -> Tensor:
        return fx.uniform_int(u, round(pair[0] * STEPS), round(pair[1] * STEPS))

    def _bright(self, x: Tensor, k: Tensor) -> Tensor:
        return minimum(_quantize(x) * (k * (1.0 / STEPS)), 1.0)

    def _contrast(self, x: Tensor, k: Tensor) -> Tensor:
        n, c, h, w = x.shape
        xq = _quantize(x)
        units = xq * float(2**QUANT)  # integers <= 2^15
        shift = max(0, math.ceil(math.log2(h * w)) - 9)  # the per-image sum stays below 2^24
        if c == 3:
            grey = units[:, 0:1] * 77.0 + units[:, 1:2] * 150.0 + units[:, 2:3] * 29.0
            grey = fx.shr(grey, 8 + shift)
        else:
            grey = fx.shr(units.sum(1, keepdim=True) if c > 1 else units, shift)
            if c > 1:
                raise fail(self, f"contrast needs 1 or 3 channels, got {c}")
        total = grey.sum((2, 3), keepdim=True)  # exact: integers
        mean = fx.floor(total * fx.f32(2.0**shift / (h * w)))  # in units of 2^-15
        k4 = k.reshape(n, 1, 1, 1)
        f = k4 * (1.0 / STEPS)
        rest = (float(STEPS) - k4) * (1.0 / STEPS)
        return _clamp01(xq * f + rest * (mean * 2.0**-QUANT))

    def augment(self, x: Tensor) -> Tensor:
        if self.brightness is None and self.contrast is None:
            return x
        u = draws(x, 3)
        x = _clamp01(x)
        if self.contrast is None:
            return self._bright(x, self._steps(u[0], self.brightness).reshape(x.shape[0], 1, 1, 1))
        kc = self._steps(u[1], self.contrast)
        if self.brightness is None:
            return self._contrast(x, kc)
        kb = self._steps(u[0], self.brightness).reshape(x.shape[0], 1, 1, 1)
        first = lt(u[2], 0.5).reshape(x.shape[0], 1, 1, 1)  # brightness first
        one = self._contrast(self._bright(x, kb), kc)
        other = self._bright(self._contrast(x, kc), kb)
        return where(first, one, other)


def _few_bits(value: float, bits: int) -> float:
    """`value` rounded to `bits` significant bits."""
    if value == 0:
        return 0.0
    e = math.floor(math.log2(abs(value))) - bits + 1
    return round(value / 2.0**e) * 2.0**e


class GaussianNoise(Augmentation):
    """torchvision.transforms.v2's GaussianNoise(mean, sigma, clip): adds mean + sigma z to every
    element, z of unit variance, then clamps to [0, 1] with `clip`. z is the sum of four 12-bit
    uniforms from two counter-hash draws, centred and scaled (Irwin-Hall: |z| < 3.47, kurtosis
    -0.3; torchvision: normal); sigma is kept to 10 significant bits and mean to a multiple of
    sigma / 2^11.5 so that the noise is exact."""

    def __init__(self, mean: float = 0.0, sigma: float = 0.1, clip: bool = True) -> None:
        super().__init__()
        self.mean = number(self, "mean", mean)
        self.sigma = number(self, "sigma", sigma, 0.0)
        if not isinstance(clip, bool):
            raise fail(self, f"clip must be True or False, got {clip!r}")
        self.clip = clip
        self.scale = _few_bits(self.sigma / IRWIN_HALL_STD, 10)
        self.offset = round(self.mean / self.scale) if self.scale else 0
        bits = 24 - (8190 + abs(self.offset)).bit_length()
        if self.scale == 0 and self.mean != 0:
            raise fail(self, "mean without sigma: add a constant instead")
        if bits < 4:
            raise fail(self, f"mean {mean!r} is too large against sigma {sigma!r} for exact noise")
        if bits < 10:
            self.scale = _few_bits(self.sigma / IRWIN_HALL_STD, bits)
            self.offset = round(self.mean / self.scale)

    def extra_repr(self) -> str:
        return f"mean={self.mean}, sigma={self.sigma}, clip={self.clip}"

    def augment(self, x: Tensor) -> Tensor:
        if self.sigma == 0:
            return _clamp01(x) if self.clip else x
        from glcomp.nn.functional import rand

        total = None
        for _ in range(2):
            u = rand(x.graph, x.shape)
            hi = fx.floor(u * 4096.0)
            lo = u * float(2**24) - hi * 4096.0
            total = hi + lo if total is None else total + hi + lo
        noise = (total - float(8190 - self.offset)) * self.scale
        out = x + noise
        return _clamp01(out) if self.clip else out


class SaltAndPepperNoise(Augmentation):
    """Salt-and-pepper noise: each pixel (all its channels) becomes 1 (salt) or 0 (pepper) with
    probability `p`, salt with probability `salt_vs_pepper` among those."""

    def __init__(self, p: float = 0.05, salt_vs_pepper: float = 0.5) -> None:
        super().__init__()
        self.p = number(self, "p", p, 0.0, 1.0)
        self.salt_vs_pepper = number(self, "salt_vs_pepper", salt_vs_pepper, 0.0, 1.0)

    def extra_repr(self) -> str:
        return f"p={self.p}, salt_vs_pepper={self.salt_vs_pepper}"

    def augment(self, x: Tensor) -> Tensor:
        if self.p == 0:
            return x
        from glcomp.ir.tensor import broadcast_to
        from glcomp.nn.functional import rand

        n, _, h, w = x.shape
        u = broadcast_to(rand(x.graph, (n, 1, h, w)), x.shape)
        salt = lt(u, fx.f32(self.p * self.salt_vs_pepper))
        hit = lt(u, fx.f32(self.p))
        return where(salt, 1.0, where(hit, 0.0, x))
