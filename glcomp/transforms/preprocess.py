"""Preprocessing compiled into the bundle: camera-style RGBA8 frames in, a model's float input out.

``Preprocess(size=(h, w), source=(Hs, Ws))`` is the first module of a model whose input is
declared with ``image_input(N, Hs, Ws)`` (or ``pre.input(N)``): the runtimes then take that input
as images, numpy uint8 arrays (N, Hs, Ws, 4) or (N, Hs, Ws, 3) in Python, video elements, canvases,
bitmaps, VideoFrames or ImageData in glcomp.js, and the shaders resize or crop them, keep RGB or
turn them grey and normalise them. The numbers are exact (glcomp.ir.ops.image), so the GL and
reference runtimes agree bit for bit.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops.image import MODES, frame_sheet
from glcomp.ir.tensor import Tensor, prim
from glcomp.nn.module import Module

CHANNELS = ("rgb", "grey")
# The image inputs of the model being traced (by input name), set by glcomp.compile.
_DECLARED: ContextVar[Mapping[str, ImageInput] | None] = ContextVar("glcomp_image_inputs", default=None)


class ImageInput(tuple):
    """The declared shape of an image input: the frame sheet's shape (Q, Hp, Wt, 4) (see
    glcomp.ir.ops.image), carrying the batch and frame size (`batch`, `height`, `width`) and the
    frame columns of the sheet (`columns`). Pass it as the input's shape to glcomp.compile."""

    batch: int
    height: int
    width: int
    columns: int

    def __new__(cls, batch: int, height: int, width: int) -> ImageInput:
        for what, v in (("batch", batch), ("height", height), ("width", width)):
            if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
                raise GlcompError(f"image_input: {what} must be a positive integer, got {v!r}")
        q, hp, wt, cols = frame_sheet(int(batch), int(height), int(width))
        obj = super().__new__(cls, (q, hp, wt, 4))
        obj.batch, obj.height, obj.width, obj.columns = int(batch), int(height), int(width), cols
        return obj

    def manifest(self) -> dict[str, Any]:
        """The manifest's ``image`` record of the input: what a runtime uploads where (frame n at
        column (n % columns) * width, row (n // columns) * frame_rows of the input's texture)."""
        return {
            "batch": self.batch,
            "height": self.height,
            "width": self.width,
            "columns": self.columns,
            "frame_rows": self[1],
            "channels": "rgba",
        }


@contextmanager
def declared_images(inputs: Mapping[str, Any]) -> Iterator[None]:
    """While tracing a model: the inputs declared with `image_input`, which Preprocess reads."""
    token = _DECLARED.set({k: v for k, v in inputs.items() if isinstance(v, ImageInput)})
    try:
        yield
    finally:
        _DECLARED.reset(token)


def image_input(batch: int, height: int, width: int) -> ImageInput:
    """The shape to declare for an input of `batch` RGBA frames of `height` x `width` pixels."""
    return ImageInput(batch, height, width)


def _triple(value: Any, what: str, count: int) -> tuple[float, ...]:
    vals = [value] * count if np.isscalar(value) else list(value)
    if len(vals) == 1:
        vals = vals * count
    if len(vals) != count or not all(isinstance(v, int | float | np.number) and np.isfinite(v) for v in vals):
        raise GlcompError(f"Preprocess: {what} must be a number or {count} finite numbers, got {value!r}")
    return tuple(float(v) for v in vals)


class Preprocess(Module):
    """Frames of `source` = (Hs, Ws) pixels to a float tensor (N, C, h, w).

    mode:     "resize" (bilinear with half-pixel centres, weights rounded to sixteenths),
              "crop" (the h x w pixels from (top, left)) or "center_crop" (centred, torchvision's
              rounding).
    channels: "rgb" (C = 3) or "grey" (C = 1, (77 R + 150 G + 29 B) / 256).
    scale, mean, std: the output is (p * scale - mean) / std for a pixel byte p, computed as
              (p - mean / scale) * (scale / std) in float32 (one rounding each).
    The alpha channel is ignored.
    """

    def __init__(
        self,
        size: Sequence[int],
        source: Sequence[int],
        mode: str = "resize",
        channels: str = "rgb",
        scale: float = 1 / 255,
        mean: float | Sequence[float] = 0.0,
        std: float | Sequence[float] = 1.0,
        top: int = 0,
        left: int = 0,
    ) -> None:
        super().__init__()
        if mode not in MODES:
            raise GlcompError(f"Preprocess: mode must be one of {list(MODES)}, got {mode!r}")
        if channels not in CHANNELS:
            raise GlcompError(f"Preprocess: channels must be one of {list(CHANNELS)}, got {channels!r}")
        size, source = tuple(int(v) for v in size), tuple(int(v) for v in source)
        if len(size) != 2 or len(source) != 2 or min(size + source) < 1:
            raise GlcompError(
                f"Preprocess: size and source must be (height, width) > 0, got {size}, {source}"
            )
        count = 1 if channels == "grey" else 3
        mean_t, std_t = _triple(mean, "mean", count), _triple(std, "std", count)
        if not np.isfinite(scale) or scale == 0 or any(s == 0 for s in std_t):
            raise GlcompError(f"Preprocess: scale and std must be finite and non-zero, got {scale}, {std}")
        if mode == "center_crop":  # torchvision's center_crop
            top, left = round((source[0] - size[0]) / 2.0), round((source[1] - size[1]) / 2.0)
        if mode != "resize" and not (0 <= top <= source[0] - size[0] and 0 <= left <= source[1] - size[1]):
            raise GlcompError(
                f"Preprocess: a {size[0]}x{size[1]} crop at ({top}, {left}) does not fit {source} frames"
            )
        f32 = np.float32
        self.size, self.source, self.mode, self.channels = size, source, mode, channels
        self.top, self.left = (int(top), int(left)) if mode != "resize" else (0, 0)
        self.offset = tuple(float(f32(m / scale)) for m in mean_t)
        self.gain = tuple(float(f32(scale / s)) for s in std_t)

    def input(self, batch: int) -> ImageInput:
        """The input shape to declare for batches of `batch` frames of this module's source size."""
        return ImageInput(batch, *self.source)

    def forward(self, x: Tensor) -> Tensor:
        hs, ws = self.source
        graph = x.graph
        node = x.node
        name = graph.attrs(node).get("name") if graph.op(node) == "input" else None
        sheet = (_DECLARED.get() or {}).get(name) if name is not None else None
        if sheet is None or (sheet.height, sheet.width) != (hs, ws):
            got = f"{sheet.height}x{sheet.width} frames" if sheet is not None else f"shape {tuple(x.shape)}"
            raise GlcompError(
                f"Preprocess: its input {name or '(an intermediate tensor)'!r} must be a model input "
                f"declared as glcomp.transforms.image_input(batch, {hs}, {ws}) (or Preprocess.input(batch)); "
                f"got {got}"
            )
        batch = sheet.batch
        return prim(
            "preprocess",
            x,
            batch=batch,
            source=self.source,
            columns=sheet.columns,
            size=self.size,
            mode=self.mode,
            grey=self.channels == "grey",
            top=self.top,
            left=self.left,
            offset=self.offset,
            gain=self.gain,
        )
