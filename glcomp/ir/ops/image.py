"""Image ops: `preprocess` turns camera-style RGBA8 frames into a model's float input.

Frames reach the GPU as a *frame sheet*: an input tensor of shape (Q, Hp, Wt, 4) whose packed
layout (glcomp.codegen.layout) is exactly Wt texels wide, so texel (x, y) of the texture is sheet
element [y // Hp, y % Hp, x, :], one pixel per texel. Frame n of a batch of N frames of Hs x Ws
pixels lies at rows [(n // C) * Hp, ...) and columns [(n % C) * Ws, ...) of the texture (C
columns of frames): a browser uploads it there with one texSubImage2D, and Python packs it like
any other input. Each element holds a byte as the GPU samples an RGBA8 texel (k / 255); the op
reads k back exactly (floor(255 v + 0.5)).

The arithmetic is exact, so GL and the numpy reference agree bit for bit: bilinear weights are
rounded to sixteenths and grey is (77 R + 150 G + 29 B) / 256, so every intermediate is an
integer below 2^24; the normalisation is then one subtraction and one product per channel,
(p - mean / scale) * (scale / std), each rounded once in float32.
"""

from __future__ import annotations

import math

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import st
from glcomp.ir.ops.registry import Op, register

MODES = ("resize", "crop", "center_crop")
GREY = (77, 150, 29)  # integer luma weights, summing to 256 (ITU-R BT.601 to within 1/256)
STEPS = 16  # bilinear weights are multiples of 1/STEPS


def _pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def frame_sheet(batch: int, height: int, width: int) -> tuple[int, int, int, int]:
    """The sheet of a batch of `batch` frames of `height` x `width` pixels: (Q, Hp, Wt, C), the
    sheet shape (Q, Hp, Wt, 4) and the frame columns C, chosen for the smallest texture. Its
    packed layout is Wt texels wide (Q * Hp lies in (Wt / 4, Wt], so the default layout's width,
    the power of two at least sqrt(Q * Hp * Wt), is Wt)."""
    if min(batch, height, width) < 1:
        raise GlcompError(f"an image input needs batch, height and width >= 1, got {(batch, height, width)}")
    best = None
    for cols in range(1, batch + 1):
        q = math.ceil(batch / cols)
        wt = _pow2(cols * width)
        if q * height > wt:
            wt = _pow2(q * height)
        hp = max(height, wt // (4 * q) + 1)
        area = wt * _pow2(q * hp)
        if best is None or area < best[0]:
            best = (area, (q, hp, wt, cols))
    assert best is not None
    return best[1]


def _preprocess_shape(sheet, batch, source, columns, size, mode, grey, top, left, offset, gain):
    hs, ws = source
    h, w = size
    q = math.ceil(batch / columns)
    if len(sheet) != 4 or sheet[-1] != 4 or sheet[0] != q or sheet[1] < hs or sheet[2] < columns * ws:
        raise GlcompError(
            f"preprocess: the frame sheet has shape {tuple(sheet)}, not one of {batch} frames of {hs}x{ws} "
            "(declare the input with glcomp.transforms.image_input)"
        )
    if mode not in MODES:
        raise GlcompError(f"preprocess: mode must be one of {list(MODES)}, got {mode!r}")
    if min(h, w) < 1:
        raise GlcompError(f"preprocess: size must be positive, got {(h, w)}")
    if mode != "resize" and not (0 <= top and top + h <= hs and 0 <= left and left + w <= ws):
        raise GlcompError(
            f"preprocess: a {h}x{w} crop at (top={top}, left={left}) does not fit {hs}x{ws} frames"
        )
    channels = 1 if grey else 3
    if len(offset) != channels or len(gain) != channels:
        raise GlcompError(f"preprocess: mean and std need {channels} value(s)")
    return (batch, channels, h, w)


def bilinear_taps(out: int, src: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each of `out` output positions resized from `src`: the two source positions and the
    weight of the second in sixteenths (half-pixel centres, as torch's bilinear interpolation
    without antialiasing; positions before the first pixel clamp to it). Integer arithmetic, as
    the shader computes it."""
    i = np.arange(out, dtype=np.int64)
    a = np.maximum(8 * (2 * i + 1) * src - 8 * out, 0)  # 16 * ((i + 1/2) * src / out - 1/2) * out
    q = (2 * a + out) // (2 * out)  # rounded to the nearest sixteenth
    lo, frac = q // STEPS, q % STEPS
    last = lo >= src - 1
    lo = np.where(last, src - 1, lo)
    frac = np.where(last, 0, frac)
    return lo, np.minimum(lo + 1, src - 1), frac


def preprocess_ref(sheet, batch, source, columns, size, mode, grey, top, left, offset, gain, dtype=None):
    """The frames of the sheet resized or cropped, turned grey or kept RGB and normalised, as
    (N, C, h, w) float32, with the shader's exact arithmetic (in float64 for a float64 sheet, as
    the other references follow their inputs' precision)."""
    f32 = np.float64 if np.asarray(sheet).dtype == np.float64 else np.float32
    hs, ws = source
    h, w = size
    k = np.floor(np.asarray(sheet, f32) * f32(255) + f32(0.5))
    frames = np.stack(
        [k[n // columns, :hs, (n % columns) * ws : (n % columns + 1) * ws, :3] for n in range(batch)]
    )  # (N, Hs, Ws, 3): the byte values
    if mode == "resize":
        y0, y1, fy = bilinear_taps(h, hs)
        x0, x1, fx = bilinear_taps(w, ws)
        wx, wy = fx.astype(f32)[None, None, :, None], fy.astype(f32)[None, :, None, None]
        s = f32(STEPS)
        row0 = frames[:, y0][:, :, x0] * (s - wx) + frames[:, y0][:, :, x1] * wx
        row1 = frames[:, y1][:, :, x0] * (s - wx) + frames[:, y1][:, :, x1] * wx
        v = row0 * (s - wy) + row1 * wy  # integers: the byte in 1/256ths
    else:
        v = frames[:, top : top + h, left : left + w] * f32(STEPS * STEPS)
    units = STEPS * STEPS
    if grey:
        v = (v[..., 0] * f32(GREY[0]) + v[..., 1] * f32(GREY[1]) + v[..., 2] * f32(GREY[2]))[..., None]
        units *= 256
    p = v * f32(1.0 / units)  # exact: a power of two
    out = (p - np.asarray(offset, f32)) * np.asarray(gain, f32)
    return np.ascontiguousarray(out.transpose(0, 3, 1, 2)).astype(f32 if dtype is None else dtype)


def sample_preprocess(draw):
    """A small frame sheet and any valid preprocessing of it."""
    batch = draw(st().integers(1, 3))
    hs, ws = draw(st().integers(1, 5)), draw(st().integers(1, 5))
    q, hp, wt, columns = frame_sheet(batch, hs, ws)
    sheet = (q, hp, wt, 4)
    mode = draw(st().sampled_from(MODES))
    if mode == "resize":
        h, w, top, left = draw(st().integers(1, 5)), draw(st().integers(1, 5)), 0, 0
    else:
        h, w = draw(st().integers(1, hs)), draw(st().integers(1, ws))
        top, left = draw(st().integers(0, hs - h)), draw(st().integers(0, ws - w))
    grey = draw(st().booleans())
    values = st().floats(-2.0, 2.0, width=32)
    channels = 1 if grey else 3
    offset = [draw(values) for _ in range(channels)]
    gain = [draw(values) for _ in range(channels)]
    attrs = {"batch": batch, "source": (hs, ws), "columns": columns, "size": (h, w), "mode": mode}
    return [sheet], attrs | {"grey": grey, "top": top, "left": left, "offset": offset, "gain": gain}


register(
    Op(
        "preprocess",
        "index",
        _preprocess_shape,
        preprocess_ref,
        lambda g, out, sheet, **attrs: (None,),  # frames are data, never differentiated
        smooth=False,
        sample=sample_preprocess,
        domain="bytes",
        attrs=("batch", "source", "columns", "size", "mode", "grey", "top", "left", "offset", "gain"),
        # Up to 12 texel reads and a few dozen integer operations an element: readers that read
        # an element many times (convolutions) read it stored, not recomputed.
        cost=40,
    )
)
