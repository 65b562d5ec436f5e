"""Geometric augmentations: flips, random affine maps and random resized crops, each one
``affine_gather`` (nearest neighbour) whose per-image integer map comes from glcomp.transforms._fixed.

Coordinates follow torchvision: pixel j covers [j, j + 1), maps act about the image centre
(W / 2, H / 2), and RandomAffine's matrix is torchvision's inverse affine matrix (clockwise
angles, translations rounded to whole pixels) with its sines, cosines and divisions in fixed
point (ONE = 4096), so a source coordinate is within about 2^-11 of torchvision's times the
distance from the centre; exact for flips, right angles, translations and crops.
"""

from __future__ import annotations

import math
from typing import Any

from glcomp.ir.tensor import Tensor, lt, prim
from glcomp.transforms import _fixed as fx
from glcomp.transforms._base import Augmentation, columns, draws, fail, interval, number

LIMIT = 1 << 24  # integers in floats are exact below this


def _probability(owner: Any, p: Any) -> float:
    return number(owner, "p", p, 0.0, 1.0)


def _nearest_only(owner: Any, interpolation: Any) -> None:
    name = getattr(interpolation, "value", interpolation)
    if str(name).lower() != "nearest":
        raise fail(
            owner, f"interpolation: only 'nearest' is compiled (exact on every GPU), got {interpolation!r}"
        )


def _fill(owner: Any, fill: Any) -> float:
    if isinstance(fill, list | tuple):
        if not fill or any(f != fill[0] for f in fill):
            raise fail(owner, f"fill: one value for all channels, got {fill!r}")
        fill = fill[0]
    return fx.f32(number(owner, "fill", 0.0 if fill is None else fill))


class _Flip(Augmentation):
    axis = 0  # 0: horizontal (mirror columns), 1: vertical (mirror rows)

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        self.p = _probability(self, p)

    def extra_repr(self) -> str:
        return f"p={self.p}"

    def augment(self, x: Tensor) -> Tensor:
        if self.p == 0.0:
            return x
        (u,) = draws(x, 1)
        f = 1.0 - 2.0 * lt(u, fx.f32(self.p))  # -1 where this image flips
        h, w = x.shape[2:]
        a, d = (f, 1.0) if self.axis == 0 else (1.0, f)
        # s = floor((a P + W) / 2) with P = 2j + 1 - W: j, or W - 1 - j where a = -1.
        m = columns(x, [a, 0.0, float(w), 2.0, 0.0, d, float(h), 2.0])
        return prim("affine_gather", x, m, size=(h, w), fill=0.0)


class RandomHorizontalFlip(_Flip):
    """torchvision's RandomHorizontalFlip(p): each image of the batch mirrored left to right with
    probability p."""

    axis = 0


class RandomVerticalFlip(_Flip):
    """torchvision's RandomVerticalFlip(p): each image of the batch mirrored top to bottom with
    probability p."""

    axis = 1


def _units(degrees: float) -> int:
    return round(degrees * fx.RIGHT / 90.0)


class RandomAffine(Augmentation):
    """torchvision's RandomAffine(degrees, translate, scale, shear, interpolation, fill), one draw
    per image: a clockwise angle in `degrees`, a whole-pixel shift up to translate * (W, H), a scale
    in `scale` and shears (x in shear[0:2], y in shear[2:4]; at most 45 degrees) about the centre,
    sampled nearest neighbour; `fill` outside the image. Angles step by 90/1024 degrees and scales
    by 1/1024."""

    def __init__(
        self,
        degrees: Any,
        translate: Any = None,
        scale: Any = None,
        shear: Any = None,
        interpolation: Any = "nearest",
        fill: Any = 0,
        center: Any = None,
    ) -> None:
        super().__init__()
        self.degrees = interval(self, "degrees", degrees, -3600.0, 3600.0, symmetric=0.0)
        self.translate = None
        if translate is not None:
            if not isinstance(translate, list | tuple) or len(translate) != 2:
                raise fail(
                    self, f"translate must be (a, b), the largest shifts as fractions, got {translate!r}"
                )
            self.translate = tuple(number(self, "translate", t, 0.0, 1.0) for t in translate)
        self.scale = None if scale is None else interval(self, "scale", scale, 1.0 / 16, 16.0)
        if self.scale is not None and self.scale[0] <= 0:
            raise fail(self, f"scale must be positive, got {scale!r}")
        self.shear = (0.0, 0.0, 0.0, 0.0)
        if shear is not None:
            if isinstance(shear, list | tuple) and len(shear) == 4:
                self.shear = (
                    *interval(self, "shear", shear[:2], -45.0, 45.0),
                    *interval(self, "shear", shear[2:], -45.0, 45.0),
                )
            else:
                self.shear = (*interval(self, "shear", shear, -45.0, 45.0, symmetric=0.0), 0.0, 0.0)
        _nearest_only(self, interpolation)
        self.fill = _fill(self, fill)
        if center is not None:
            raise fail(self, "center: only the image centre (None) is compiled")

    def extra_repr(self) -> str:
        return f"degrees={self.degrees}, translate={self.translate}, scale={self.scale}, shear={self.shear}"

    def _bound(self, h: int, w: int) -> int:
        """A bound on |ax P| + |bx Q| + |cx| of the map (and likewise for y)."""
        sx = max(abs(self.shear[0]), abs(self.shear[1])) * math.pi / 180
        sy = max(abs(self.shear[2]), abs(self.shear[3])) * math.pi / 180
        amax = 1.0 / math.cos(sy)
        entry = fx.ONE * (1.0 + amax * math.tan(sx)) + 8
        smin = round(self.scale[0] * 1024) if self.scale else 1024
        entry = entry * 1024 / smin + 2
        tx, ty = self._shifts(h, w)
        return int(entry * (w + h + 2 * tx + 2 * ty) + fx.ONE * 2 * max(w, h))

    def _shifts(self, h: int, w: int) -> tuple[int, int]:
        if self.translate is None:
            return 0, 0
        return round(self.translate[0] * w), round(self.translate[1] * h)

    def augment(self, x: Tensor) -> Tensor:
        h, w = x.shape[2:]
        if self._bound(h, w) >= LIMIT:
            raise fail(
                self,
                f"images of {h}x{w} with these ranges exceed the exact fixed-point range; use "
                "smaller scale or shear ranges",
            )
        u = draws(x, 6)
        angle = fx.uniform_int(u[0], _units(self.degrees[0]), _units(self.degrees[1]))
        cos, sin = fx.cos_sin(angle)
        a, c = cos, sin
        if self.shear[2:] != (0.0, 0.0):  # y shear: cos(a - sy) / cos(sy), sin(a - sy) / cos(sy)
            sy = fx.uniform_int(u[5], _units(self.shear[2]), _units(self.shear[3]))
            cd, sd = fx.cos_sin(angle - sy)
            cy, _ = fx.cos_sin(sy)
            a, c = fx.idiv(cd * float(fx.ONE), cy), fx.idiv(sd * float(fx.ONE), cy)
        e00, e01, e10, e11 = cos, sin, -c, a
        if self.shear[:2] != (0.0, 0.0):  # x shear: tan(sx)
            sx = fx.uniform_int(u[4], _units(self.shear[0]), _units(self.shear[1]))
            cx, sxs = fx.cos_sin(sx)
            t = fx.idiv(sxs * float(fx.ONE), cx)
            e00, e01 = cos - fx.mulshift(c, t), fx.mulshift(a, t) + sin
        if self.scale is not None:
            sigma = fx.uniform_int(u[3], round(self.scale[0] * 1024), round(self.scale[1] * 1024))
            e00, e01, e10, e11 = (fx.idiv(e * 1024.0, sigma) for e in (e00, e01, e10, e11))
        cx0, cy0 = float(fx.ONE * w), float(fx.ONE * h)
        tx_max, ty_max = self._shifts(h, w)
        if tx_max or ty_max:
            tx2 = fx.uniform_int(u[1], -tx_max, tx_max) * 2.0
            ty2 = fx.uniform_int(u[2], -ty_max, ty_max) * 2.0
            cxs, cys = cx0 - (e00 * tx2 + e01 * ty2), cy0 - (e10 * tx2 + e11 * ty2)
        else:
            cxs, cys = cx0, cy0
        d = float(2 * fx.ONE)  # the matrix is ONE-scaled and P, Q count half pixels
        m = columns(x, [e00, e01, cxs, d, e10, e11, cys, d])
        return prim("affine_gather", x, m, size=(h, w), fill=self.fill)


class RandomResizedCrop(Augmentation):
    """torchvision's RandomResizedCrop(size, scale, ratio): per image, a crop of area fraction in
    `scale` and aspect ratio (w / h) in `ratio`, anywhere in the image, resized to `size` by
    nearest-exact sampling (the crop pixel whose cell holds the output pixel's centre). The area
    is drawn uniformly in whole pixels and the ratio uniformly in steps of 1/256 (torchvision:
    log-uniform); a crop larger than the image is clamped to it (torchvision retries 10 times,
    then takes a centre crop)."""

    def __init__(
        self,
        size: Any,
        scale: Any = (0.08, 1.0),
        ratio: Any = (3.0 / 4.0, 4.0 / 3.0),
        interpolation: Any = "nearest",
        antialias: Any = True,
    ) -> None:
        super().__init__()
        if isinstance(size, int) and not isinstance(size, bool):
            size = (size, size)
        if (
            not isinstance(size, list | tuple)
            or len(size) not in (1, 2)
            or not all(isinstance(s, int) and not isinstance(s, bool) and 0 < s <= 4096 for s in size)
        ):
            raise fail(self, f"size must be a positive int or (height, width), got {size!r}")
        self.size = (size[0], size[-1])
        self.scale = interval(self, "scale", scale, 0.0, 1.0)
        if self.scale[1] <= 0:
            raise fail(self, f"scale must be positive, got {scale!r}")
        self.ratio = interval(self, "ratio", ratio, 1.0 / 64, 64.0)
        _nearest_only(self, interpolation)

    def extra_repr(self) -> str:
        return f"size={self.size}, scale={self.scale}, ratio={self.ratio}"

    def augment(self, x: Tensor) -> Tensor:
        h, w = x.shape[2:]
        oh, ow = self.size
        area = h * w
        bits = 8  # the ratio's fixed point: A rho stays below 2^22
        while bits > 0 and area * self.ratio[1] * 2**bits >= 2**22:
            bits -= 2
        if (
            area * max(self.ratio[1], 1 / self.ratio[0]) * 2**bits >= 2**22
            or 4 * max(h, w) * max(oh, ow) >= LIMIT
        ):
            raise fail(self, f"images of {h}x{w} are too large for exact crops; resize them first")
        u = draws(x, 4)
        a = fx.uniform_int(u[0], max(1, round(self.scale[0] * area)), max(1, round(self.scale[1] * area)))
        rho = fx.uniform_int(
            u[1], max(1, round(self.ratio[0] * 2**bits)), max(1, round(self.ratio[1] * 2**bits))
        )
        half = 2 ** (bits // 2)
        cw = fx.floor((fx.isqrt(a * rho) + half / 2) * (1.0 / half))  # round(sqrt(a rho))
        n = fx.idiv(a * float(2**bits), rho)  # a / rho
        s = fx.isqrt(n)
        ch = s + fx.gt(n - s * s, s)  # round(sqrt(a / rho))
        cw = fx.minimum(fx.maximum(cw, 1.0), float(w))
        ch = fx.minimum(fx.maximum(ch, 1.0), float(h))
        i = fx.minimum(fx.floor(u[2] * (float(h + 1) - ch)), float(h) - ch)
        j = fx.minimum(fx.floor(u[3] * (float(w + 1) - cw)), float(w) - cw)
        # s = j + floor((2x + 1) cw / (2 OW)) with P = 2x + 1 - OW.
        m = columns(
            x,
            [
                cw,
                0.0,
                cw * float(ow) + j * float(2 * ow),
                float(2 * ow),
                0.0,
                ch,
                ch * float(oh) + i * float(2 * oh),
                float(2 * oh),
            ],
        )
        return prim("affine_gather", x, m, size=(oh, ow), fill=0.0)
