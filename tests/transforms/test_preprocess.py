"""glcomp.transforms.Preprocess: frames to a model's input, compiled into the bundle. The GL
runtime equals the numpy reference bit for bit in both dialects, the reference equals an
independent numpy expectation, and mistakes raise GlcompError naming the input."""

from __future__ import annotations

import numpy as np
import pytest

import glcomp
from glcomp import nn
from glcomp.errors import GlcompError
from glcomp.ir.ops.image import frame_sheet
from glcomp.transforms.preprocess import Preprocess, image_input

RNG = np.random.default_rng(22)
CASES = [
    # (size, source, mode, channels, batch)
    ((6, 5), (9, 7), "resize", "rgb", 3),
    ((12, 16), (5, 6), "resize", "grey", 2),  # upsampling: positions before the first pixel clamp
    ((4, 4), (9, 7), "center_crop", "rgb", 5),
    ((3, 5), (6, 6), "crop", "grey", 1),
]


def _compile(size, source, mode, channels, batch, target="webgl2", **kw):
    pre = Preprocess(size=size, source=source, mode=mode, channels=channels, top=1, left=1, **kw)
    return glcomp.compile(nn.Sequential(pre), {"x": pre.input(batch)}, target=target)


def _expected(images: np.ndarray, size, mode, channels, mean, std, top=1, left=1) -> np.ndarray:
    """The preprocessing in float64 from its definition (bilinear taps from the continuous
    source position, rounded to sixteenths), rounded to float32 at the end."""
    _, hs, ws, _ = images.shape
    h, w = size
    x = images[..., :3].astype(np.float64)
    if mode == "resize":

        def taps(out, src):
            pos = np.maximum((np.arange(out) + 0.5) * src / out - 0.5, 0)
            q = np.floor(pos * 16 + 0.5).astype(int)
            lo, f = q // 16, (q % 16) / 16
            f = np.where(lo >= src - 1, 0, f)
            lo = np.minimum(lo, src - 1)
            return lo, np.minimum(lo + 1, src - 1), f

        y0, y1, fy = taps(h, hs)
        x0, x1, fx = taps(w, ws)
        fx, fy = fx[None, None, :, None], fy[None, :, None, None]
        r0 = x[:, y0][:, :, x0] * (1 - fx) + x[:, y0][:, :, x1] * fx
        r1 = x[:, y1][:, :, x0] * (1 - fx) + x[:, y1][:, :, x1] * fx
        v = r0 * (1 - fy) + r1 * fy
    else:
        if mode == "center_crop":
            top, left = round((hs - h) / 2), round((ws - w) / 2)
        v = x[:, top : top + h, left : left + w]
    if channels == "grey":
        v = (v @ np.array([77, 150, 29]) / 256)[..., None]
    out = (v / 255 - mean) / std
    return out.transpose(0, 3, 1, 2)


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}-{c[3]}")
def test_gl_equals_reference_bit_for_bit_in_both_dialects(case):
    size, source, mode, channels, batch = case
    images = RNG.integers(0, 256, (batch, *source, 4), dtype=np.uint8)
    images[0, 0, 0, :3] = (0, 255, 255)  # the extremes
    for target in ("webgl2", "webgl1"):
        prog = _compile(size, source, mode, channels, batch, target, mean=0.45, std=0.226)
        ref = prog.runtime("reference").predict(x=images)
        gl = prog.runtime("gl").predict(x=images)
        assert ref.dtype == gl.dtype == np.float32
        assert ref.shape == (batch, 1 if channels == "grey" else 3, *size)
        assert np.array_equal(ref.view(np.uint32), gl.view(np.uint32)), (target, np.abs(ref - gl).max())


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[2]}-{c[3]}")
def test_reference_matches_the_definition(case):
    size, source, mode, channels, batch = case
    images = RNG.integers(0, 256, (batch, *source, 4), dtype=np.uint8)
    mean, std = (0.5, 0.4, 0.3)[: 1 if channels == "grey" else 3], 0.25
    prog = _compile(size, source, mode, channels, batch, mean=mean, std=std)
    got = prog.runtime("reference").predict(x=images)
    want = _expected(images, size, mode, channels, np.array(mean)[:, None, None].T, std)
    assert np.abs(got - want).max() < 1e-5


def test_rgb_images_take_alpha_255_and_alpha_is_ignored():
    prog = _compile((4, 4), (6, 6), "resize", "rgb", 2)
    ref = prog.runtime("reference")
    rgba = RNG.integers(0, 256, (2, 6, 6, 4), dtype=np.uint8)
    a = ref.predict(x=rgba)
    b = ref.predict(x=np.ascontiguousarray(rgba[..., :3]))
    assert np.array_equal(a, b)
    assert a.min() >= 0 and a.max() <= 1 and a.max() > 0.5  # scale 1/255 by default


def test_a_model_trains_on_images_and_gl_follows_reference():
    pre = Preprocess(size=(8, 8), source=(10, 12), mean=0.5, std=0.5)
    model = nn.Sequential(pre, nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 36, 2))
    prog = glcomp.compile(
        model, {"x": pre.input(4)}, loss=nn.CrossEntropyLoss(), optimizer=glcomp.optim.SGD(lr=0.1)
    )
    images = RNG.integers(0, 256, (4, 10, 12, 3), dtype=np.uint8)
    y = np.array([0, 1, 0, 1])
    ref, gl = prog.runtime("reference"), prog.runtime("gl")
    losses = [(ref.train_step(x=images, y=y), gl.train_step(x=images, y=y)) for _ in range(3)]
    assert all(abs(r - g) < 1e-4 for r, g in losses)
    assert losses[-1][0] < losses[0][0]


def test_the_sheet_layout_is_one_frame_row_per_texture_row():
    from glcomp.codegen.layout import layout_for

    for batch, h, w in [(1, 8, 8), (16, 120, 160), (32, 1, 640), (7, 5, 3), (64, 24, 32), (3, 480, 640)]:
        q, hp, wt, cols = frame_sheet(batch, h, w)
        lay = layout_for((q, hp, wt, 4), 8192)
        assert lay.width == wt and lay.pages == 1 and hp >= h and cols * w <= wt and q * cols >= batch


def test_errors_name_the_input_and_sizes():
    prog = _compile((4, 4), (6, 6), "resize", "rgb", 2)
    ref, gl = prog.runtime("reference"), prog.runtime("gl")
    for rt in (ref, gl):
        with pytest.raises(
            GlcompError, match=r"input 'x' takes 2 images of 6x6 pixels.*got shape \(2, 5, 6, 4\)"
        ):
            rt.predict(x=np.zeros((2, 5, 6, 4), np.uint8))
        with pytest.raises(GlcompError, match=r"input 'x' is an image input: pass uint8"):
            rt.predict(x=np.zeros((2, 6, 6, 4), np.float32))
    with pytest.raises(GlcompError, match="does not fit"):
        Preprocess(size=(8, 8), source=(6, 6), mode="crop")
    with pytest.raises(GlcompError, match="mode must be one of"):
        Preprocess(size=(4, 4), source=(6, 6), mode="stretch")
    with pytest.raises(GlcompError, match="channels must be one of"):
        Preprocess(size=(4, 4), source=(6, 6), channels="bgr")
    with pytest.raises(GlcompError, match="std must be"):
        Preprocess(size=(4, 4), source=(6, 6), std=(1, 0, 1))
    pre = Preprocess(size=(4, 4), source=(6, 6))
    with pytest.raises(GlcompError, match=r"image_input\(batch, 6, 6\)"):
        glcomp.compile(nn.Sequential(pre), {"x": (2, 6, 6, 4)})
    with pytest.raises(GlcompError, match=r"got 5x6 frames"):
        glcomp.compile(nn.Sequential(pre), {"x": image_input(2, 5, 6)})
    with pytest.raises(GlcompError, match="storage='rgba8'"):
        glcomp.compile(nn.Sequential(pre), {"x": pre.input(2)}, storage="rgba8")
    with pytest.raises(GlcompError, match="batch must be a positive integer"):
        image_input(0, 6, 6)


def test_manifest_declares_the_image_input():
    from glcomp.codegen.bundle import build_bundle

    prog = _compile((4, 4), (6, 7), "resize", "rgb", 5)
    spec = build_bundle(prog).manifest["inputs"]["x"]
    q, hp, wt, cols = frame_sheet(5, 6, 7)
    assert spec["image"] == {
        "batch": 5,
        "height": 6,
        "width": 7,
        "columns": cols,
        "frame_rows": hp,
        "channels": "rgba",
    }
    assert spec["shape"] == [q, hp, wt, 4] and spec["layout"]["width"] == wt


def test_info_says_whether_the_renderer_is_software():
    from glcomp.runtime.gl import SOFTWARE_RENDERERS

    prog = _compile((4, 4), (6, 6), "resize", "rgb", 1)
    info = prog.runtime("gl").info()
    assert isinstance(info["renderer"], str) and info["renderer"]
    assert info["software"] == bool(SOFTWARE_RENDERERS.search(f"{info['renderer']} {info['vendor']}"))
    for name in ("llvmpipe (LLVM 15.0.6, 256 bits)", "Google SwiftShader", "Microsoft Basic Render Driver"):
        assert SOFTWARE_RENDERERS.search(name), name
    for name in ("NVIDIA GeForce RTX 3080/PCIe/SSE2", "Apple M1", "ANGLE (Intel, Intel(R) UHD Graphics 630)"):
        assert not SOFTWARE_RENDERERS.search(name), name
