"""Frames straight into input textures in Chromium: every kind of source glcomp.js takes for an
image input (ImageData, canvas, OffscreenCanvas, ImageBitmap, VideoFrame) gives the numbers the
Python reference gives for the same pixels, in WebGL 2 and WebGL 1; wrong sizes are refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import glcomp
from browser.support import _js
from glcomp import nn
from glcomp.transforms.preprocess import Preprocess

pytestmark = pytest.mark.browser

# Every source kind made from the RGBA bytes `frames` (width x height each): `images`, `canvas`
# and `kinds` (kind -> one source per frame).
KINDS_JS = """
const images = frames.map((bytes) => new ImageData(new Uint8ClampedArray(bytes), width, height));
const canvas = (img) => { const c = document.createElement("canvas"); c.width = width; c.height = height;
  c.getContext("2d").putImageData(img, 0, 0); return c; };
const offscreen = (img) => { const c = new OffscreenCanvas(width, height);
  c.getContext("2d").putImageData(img, 0, 0); return c; };
const bitmap = (img) => createImageBitmap(img, { premultiplyAlpha: "none", colorSpaceConversion: "none" });
const videoFrame = (bytes) => new VideoFrame(new Uint8Array(bytes), { format: "RGBA", codedWidth: width,
  codedHeight: height, timestamp: 0 });
const kinds = {
  imageData: images,
  canvas: images.map(canvas),
  offscreenCanvas: images.map(offscreen),
  imageBitmap: await Promise.all(images.map(bitmap)),
  videoFrame: frames.map(videoFrame),
};
"""

SOURCES_JS = """
const { base, frames, width, height } = arg;
const rt = await g.Runtime.load(base, { quiet: true });
/* KINDS */
const out = {};
for (const [kind, srcs] of Object.entries(kinds)) {
  const pred = await rt.predict({ x: srcs });
  out[kind] = Array.from(pred.data);
}
const errors = [];
for (const bad of [[images[0]], [...images.slice(1), new ImageData(width + 1, height)]]) {
  try { await rt.predict({ x: bad }); errors.push(null); } catch (err) { errors.push(String(err.message)); }
}
const info = rt.info();
rt.dispose();
return { out, errors, info };
""".replace("/* KINDS */\n", KINDS_JS)


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_every_source_kind_gives_the_reference_numbers(page: Any, site: Any, target: str) -> None:
    batch, height, width = 2, 9, 11
    pre = Preprocess(size=(6, 7), source=(height, width), mean=(0.5, 0.4, 0.3), std=0.25)
    prog = glcomp.compile(nn.Sequential(pre), {"x": pre.input(batch)}, target=target)
    name = f"frames_{target}"
    prog.save(site.root / name)
    rng = np.random.default_rng(3)
    images = rng.integers(0, 256, (batch, height, width, 4), dtype=np.uint8)
    images[..., 3] = 255  # opaque: canvases keep premultiplied pixels, exact only at alpha 255
    want = prog.runtime("reference").predict(x=images)
    frames = [f.ravel().tolist() for f in images]
    arg = {"base": f"/bundle/{name}/", "frames": frames, "width": width, "height": height}
    got = _js(page, SOURCES_JS, arg)
    for kind, values in got["out"].items():
        np.testing.assert_array_equal(np.float32(values).reshape(want.shape), want, err_msg=kind)
    assert "takes 2 frame(s) of 11x9 pixels, got 1" in got["errors"][0]
    assert "frame 1 is 12x9 pixels, the bundle takes 11x9" in got["errors"][1]
    assert isinstance(got["info"]["software"], bool) and got["info"]["renderer"]
    assert got["info"]["software"]  # the tests run Chromium on SwiftShader


WORKER_SOURCES_JS = """
const { base, frames, width, height } = arg;
const main = await g.load(base, { worker: false, quiet: true });
const wk = await g.load(base, { worker: true, quiet: true });
/* KINDS */
const out = {};
for (const [kind, srcs] of Object.entries(kinds)) {
  out[kind] = Array.from((await wk.predict({ x: srcs })).data);
}
// not awaited one by one: the calls reach the worker in the order they were made, the canvases'
// (which wait for their ImageBitmaps) before the swapped ImageData's
const calls = [wk.predict({ x: images.map(canvas) }), wk.inspect("0"),
  wk.predict({ x: [images[1], images[0]] }), wk.inspect("0")];
const order = (await Promise.all(calls)).map((t) => Array.from(t.data));
// a <video> playing a canvas's stream, paused: the worker and the main thread read the same frame
const source = canvas(images[0]);
const video = document.createElement("video");
video.muted = true;
video.srcObject = source.captureStream(0);
await video.play();
while (video.readyState < 2 || video.videoWidth === 0) await new Promise((r) => setTimeout(r, 10));
video.pause();
const both = [video, canvas(images[1])];
const fromVideo = { worker: Array.from((await wk.predict({ x: both })).data),
  main: Array.from((await main.predict({ x: both })).data) };
let error = null;
const empty = document.createElement("video");
try { await wk.predict({ x: [empty, empty] }); } catch (err) { error = err.message; }
const after = Array.from((await wk.predict({ x: kinds.imageData })).data); // the worker goes on
main.dispose();
await wk.dispose();
return { out, order, fromVideo, error, after, thread: wk.thread };
""".replace("/* KINDS */\n", KINDS_JS)


def test_a_worker_runtime_takes_every_frame_source(page: Any, site: Any) -> None:
    """The worker runtime (g.load with worker: true) takes the frame sources the main thread takes:
    a canvas, an OffscreenCanvas and a <video> go to the worker as ImageBitmaps of their pixels,
    ImageData, ImageBitmap and VideoFrame as they are; every kind gives the reference's numbers,
    a <video> the main thread's, and an element with no pixels yet is a GlcompError naming the
    input. Before, a canvas or a <video> given to a worker runtime failed with a DataCloneError."""
    batch, height, width = 2, 9, 11
    pre = Preprocess(size=(6, 7), source=(height, width), mean=(0.5, 0.4, 0.3), std=0.25)
    prog = glcomp.compile(nn.Sequential(pre), {"x": pre.input(batch)}, inspect=["0"])
    prog.save(site.root / "frames_worker")
    rng = np.random.default_rng(4)
    images = rng.integers(0, 256, (batch, height, width, 4), dtype=np.uint8)
    images[..., 3] = 255
    want = prog.runtime("reference").predict(x=images)
    frames = [f.ravel().tolist() for f in images]
    arg = {"base": "/bundle/frames_worker/", "frames": frames, "width": width, "height": height}
    got = _js(page, WORKER_SOURCES_JS, arg)
    assert got["thread"] == "worker"
    for kind, values in got["out"].items():
        np.testing.assert_array_equal(np.float32(values).reshape(want.shape), want, err_msg=kind)
    first, seen_first, swapped, seen_swapped = (np.float32(v).reshape(want.shape) for v in got["order"])
    np.testing.assert_array_equal(first, want)
    np.testing.assert_array_equal(seen_first, want)
    np.testing.assert_array_equal(swapped, want[::-1])
    np.testing.assert_array_equal(seen_swapped, want[::-1])
    np.testing.assert_array_equal(np.float32(got["after"]).reshape(want.shape), want)
    video = got["fromVideo"]
    assert video["worker"] == video["main"]
    # the video's second frame is the canvas: exact; its first went through the video pipeline
    np.testing.assert_array_equal(np.float32(video["worker"]).reshape(want.shape)[1], want[1])
    assert got["error"] and 'input "x"' in got["error"] and "HTMLVideoElement" in got["error"], got["error"]
