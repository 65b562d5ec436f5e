"""The camera fine-tuning demo (camera.html, examples/camera_finetune.py) in headless Chromium with a
fake camera: a YUV4MPEG2 video the test writes shows three classes in turn (tinted stripes of three
orientations, with noise), the test records frames of each class through the page's getUserMedia
video, fine-tunes for a fixed number of steps, then predicts on the <video> element (paused on each
frame it predicts) to check the held-out accuracy; the exported weights load into the same network
in PyTorch. No step depends on wall-clock time: every wait is for a condition (a video frame, the
page's state), so a loaded machine makes a run slower, never different."""

from __future__ import annotations

import base64
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser.support import CHROMIUM_ARGS, Site

import glcomp
from glcomp import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import camera_finetune as cam

pytestmark = pytest.mark.browser

WIDTH, HEIGHT = cam.SOURCE[1], cam.SOURCE[0]
FPS = 15
SEGMENT = 16  # frames per class: the first half is recorded, the second half held out
CLASSES = 3
RECORD = 8  # frames recorded per class
HELD_OUT = 6  # held-out predictions per class
STEPS = 40
MAX_FRAMES = 3000  # video frames a run may wait for (some 60 loops of the video) before it gives up
BATCH = 8  # frames per step (the demo's default is 16; 8 halves the test's time on SwiftShader)
MIN_ACCURACY = 0.8  # chance is 1/3
BLOCK = 8  # the top-left BLOCK x BLOCK pixels say which half of its segment a frame is in


def y4m_video(path: Path, loops: int = 1, seed: int = 0) -> Path:
    """CLASSES segments of SEGMENT frames (4:2:0): class c shows stripes at c * 60 degrees (a random
    phase per frame, luma noise of sigma 10) tinted red, green or blue through the chroma planes;
    the top-left block is white in a segment's first half, black in its second (grey chroma)."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float64)
    tints = [(110, 180), (70, 70), (190, 110)]  # (U, V): red, green, blue
    out = [f"YUV4MPEG2 W{WIDTH} H{HEIGHT} F{FPS}:1 Ip A1:1 C420jpeg\n".encode()]
    for _ in range(loops):
        for c in range(CLASSES):
            angle = c * np.pi / 3
            for f in range(SEGMENT):
                phase = rng.uniform(0, 2 * np.pi)
                wave = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / 10 + phase)
                luma = 128 + 70 * wave + rng.normal(0, 10, wave.shape)
                luma[:BLOCK, :BLOCK] = 235 if f < SEGMENT // 2 else 16
                u = np.full((HEIGHT // 2, WIDTH // 2), tints[c][0], np.float64)
                v = np.full((HEIGHT // 2, WIDTH // 2), tints[c][1], np.float64)
                u[: BLOCK // 2, : BLOCK // 2] = v[: BLOCK // 2, : BLOCK // 2] = 128
                planes = [np.clip(np.rint(p), 0, 255).astype(np.uint8) for p in (luma, u, v)]
                out += [b"FRAME\n", *(p.tobytes() for p in planes)]
    path.write_bytes(b"".join(out))
    return path


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo's bundle, from freshly initialised convolutions (no pretraining: its cost is
    examples/camera_finetune.py's, and the fake camera's classes need no pretrained features)."""
    from safetensors.numpy import save_file

    out = tmp_path_factory.mktemp("camera")
    glcomp.manual_seed(7)
    weights = out / "init.safetensors"
    save_file(cam.CameraNet(cam.PRETRAIN_CLASSES).state_dict(), str(weights))
    cam.build(out / "site", weights=weights, seed=7, batch=BATCH)
    (out / "site" / "bundle").rename(out / "site" / "camera")
    y4m_video(out / "classes.y4m")
    return out


@pytest.fixture(scope="module")
def camera_browser(built: Path) -> Iterator[Any]:
    """Chromium whose camera is the fake device playing `classes.y4m` in a loop."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail(
            "the camera demo test needs Chromium on PATH (Debian: apt-get install chromium)", pytrace=False
        )
    from playwright.sync_api import sync_playwright

    fake = [
        "--use-fake-device-for-media-stream",
        "--use-fake-ui-for-media-stream",
        f"--use-file-for-fake-video-capture={built / 'classes.y4m'}",
        "--autoplay-policy=no-user-gesture-required",
    ]
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS + fake)
        yield b
        b.close()


# The test's own view of the camera (not the model's): which class a frame shows (its dominant
# tint) and which half of its segment (the block's luma). Frames where the two reads differ are
# dropped, so the labels are right even when a segment changes between a read and a capture.
ORACLE_JS = """
const W = arg.width, H = arg.height, B = arg.block;
const canvas = new OffscreenCanvas(W, H);
const ctx = canvas.getContext("2d", { willReadFrequently: true });
const see = (src) => {
  ctx.drawImage(src, 0, 0, W, H);
  const px = ctx.getImageData(0, 0, W, H).data;
  const sum = [0, 0, 0];
  let block = 0;
  for (let y = 0; y < H; y++) for (let x = 0; x < W; x++) {
    const i = 4 * (y * W + x);
    if (x < B && y < B) { block += px[i] + px[i + 1] + px[i + 2]; continue; }
    for (let k = 0; k < 3; k++) sum[k] += px[i + k];
  }
  const mean = sum.map((s) => s / (W * H - B * B));
  const tint = [0, 1, 2].map((k) => mean[k] - (mean[0] + mean[1] + mean[2] - mean[k]) / 2);
  const cls = tint.indexOf(Math.max(...tint));
  const first = block / (3 * B * B) > 128;
  return `${cls}/${first ? "rec" : "held"}`;
};
const api = window.glcompCamera;
const frame = () => new Promise((r) => api.video.requestVideoFrameCallback(() => r()));
"""

RECORD_JS = (
    ORACLE_JS
    + """
const { classes, record, heldOut, maxFrames } = arg;
// Every wait is for the next video frame, and counted: a run gives up after `maxFrames` of them
// (many loops of the video), never after a wall-clock time, so a slow machine only makes it slower.
let waited = 0;
const next = async (what) => {
  if (++waited > maxFrames) throw new Error(`${what}: nothing after ${maxFrames} video frames`);
  await frame();
};
await api.start();
api.setClasses(classes);
// the live predictions run on the video as it plays
while (api.state.prediction === null && !api.state.error) await next("live prediction");
const live = api.state.prediction;
await api.live(false); // from here on the test's own captures and predictions alone use the page
// the page's own record button, briefly: frames of whatever the camera shows, then dropped
document.getElementById("seconds").value = "0.5";
document.getElementById("record-0").click();
const recorded = () => api.state.status === "ready" && api.state.examples.length > 0;
while (!recorded() && !api.state.error) await next("record button");
const clicked = api.state.examples.splice(0).length;
const want = (c) => api.state.examples.filter((e) => e.y === c).length < record;
let dropped = 0;
while ([...Array(classes).keys()].some(want)) {
  const seen = see(api.video);
  const [c, half] = seen.split("/");
  if (half === "rec" && want(Number(c))) {
    const bitmap = await api.capture(Number(c));
    // the label is the kept frame's own: a frame the video moved past meanwhile is dropped
    if (see(bitmap) !== seen) { api.state.examples.pop(); bitmap.close(); dropped++; }
  }
  await next("recording"); // one frame per video frame, as the record button takes them
}
const counts = [...Array(classes).keys()].map((c) => api.state.examples.filter((e) => e.y === c).length);
const losses = await api.finetune(arg.steps, 0);
const stats = document.getElementById("stats").textContent;
// held out: the second halves, predicted from the <video> element itself, paused on a frame so
// that the oracle and the model read the same one however long a prediction takes
const preds = [...Array(classes)].map(() => []);
const tally = { predictions: 0, moved: 0 };
while (preds.some((p) => p.length < heldOut)) {
  await next("held-out predictions");
  api.video.pause();
  const before = see(api.video);
  const [c, half] = before.split("/");
  const cls = Number(c);
  if (half === "held" && preds[cls].length < heldOut) {
    const [p] = await api.predict();
    tally.predictions++;
    if (see(api.video) === before) preds[cls].push(p.label);
    else tally.moved++;
  }
  await api.video.play();
}
// a few recorded frames (bytes) with the page's probabilities for them, to check the export
const some = [0, 1, 2].map((c) => api.state.examples.find((e) => e.y === c).frame);
const probs = (await api.predict(some)).map((p) => [0, 1, 2].map((c) => p.probs[c]));
const bytes = some.map((b) => {
  ctx.drawImage(b, 0, 0);
  return Array.from(ctx.getImageData(0, 0, W, H).data);
});
const weights = api.exportWeights();
let bin = "";
for (const v of new Uint8Array(weights)) bin += String.fromCharCode(v);
return { live, clicked, counts, dropped, losses, stats, preds, probs, bytes, weights: btoa(bin),
  info: api.info, infoText: document.getElementById("info").textContent, camera: api.state.camera,
  error: api.state.error, tally, waited };
"""
)


def _run_demo(camera_browser: Any, built: Path, *, record: int, steps: int, held_out: int) -> dict[str, Any]:
    """camera.html on the fake camera: record `record` frames of each class, fine-tune `steps`
    steps, predict `held_out` held-out frames of each class from the video; checks what every run
    must show (the page, the camera, the recording, finite losses) and returns the page's results."""
    site = Site(built / "site")
    context = camera_browser.new_context(permissions=["camera"])
    try:
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(site.url + "camera.html?bundle=/bundle/camera/")
        page.wait_for_function(
            "document.getElementById('info').textContent.startsWith('WebGL') || "
            "!document.getElementById('error').hidden",
            timeout=300_000,  # a bound on a hung page only: the shaders compile in seconds
        )
        assert page.evaluate("document.getElementById('error').textContent") == ""
        arg = {
            "width": WIDTH,
            "height": HEIGHT,
            "block": BLOCK,
            "classes": CLASSES,
            "record": record,
            "heldOut": held_out,
            "steps": steps,
            "maxFrames": MAX_FRAMES,
        }
        got = page.evaluate(f"async (arg) => {{ {RECORD_JS} }}", arg)
    finally:
        context.close()
        site.close()
    assert not errors and got["error"] is None, (errors, got["error"])
    assert got["camera"] == {"width": WIDTH, "height": HEIGHT, "scaled": False}
    assert got["live"]["label"] in range(cam.CLASSES)  # the live loop predicted the video
    assert got["clicked"] > 0  # the record button recorded frames
    assert got["counts"] == [record] * CLASSES, got
    assert got["info"]["software"] is True and isinstance(got["info"]["performanceCaveat"], bool)
    assert "software renderer: yes" in got["infoText"]
    losses = np.array(got["losses"])
    assert len(losses) == steps and np.all(np.isfinite(losses)), losses
    assert f"step {steps}/{steps}" in got["stats"] and "loss" in got["stats"]
    preds = got["preds"]
    assert [len(p) for p in preds] == [held_out] * CLASSES, (preds, got["tally"])
    assert all(label in range(CLASSES) for p in preds for label in p), preds  # recorded classes only
    return got


def test_fake_camera_to_trained_classifier(camera_browser: Any, built: Path) -> None:
    """Fake camera -> preprocessing -> fine-tuning -> held-out predictions on the <video> itself:
    the loss falls, held-out accuracy is at least MIN_ACCURACY (chance: 1/3), and the export is
    the page's model (its probabilities in PyTorch), the frozen layers untouched."""
    got = _run_demo(camera_browser, built, record=RECORD, steps=STEPS, held_out=HELD_OUT)
    losses = np.array(got["losses"])
    assert losses[-10:].mean() < 0.75 * losses[:5].mean(), losses  # measured: about 0.5
    accuracy = np.mean([label == c for c, p in enumerate(got["preds"]) for label in p])
    print(f"camera demo: held-out accuracy {accuracy:.3f} on {CLASSES * HELD_OUT} frames after {STEPS} steps")
    assert accuracy >= MIN_ACCURACY, (accuracy, got["preds"])
    _check_export(got, built)


def _check_export(got: dict[str, Any], built: Path) -> None:
    import torch
    from safetensors.numpy import load, load_file

    # the export: torch names, frozen layers as they were, the rest trained
    weights = load(base64.b64decode(got["weights"]))
    (stored,) = (built / "site" / "camera").glob("weights*.safetensors")  # the bundle's initial state
    before = load_file(str(stored))
    assert set(weights) == set(cam.CameraNet().state_dict()) <= set(before)
    for name in weights:
        frozen = name.startswith(cam.FROZEN)
        assert np.array_equal(weights[name], before[name]) == frozen, name

    class TorchCameraNet(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            tnn = torch.nn
            self.features = tnn.Sequential(
                *(tnn.Conv2d(3, 8, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2)),
                *(tnn.Conv2d(8, 16, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2)),
                *(tnn.Conv2d(16, 16, 3, padding=1), tnn.ReLU(), tnn.MaxPool2d(2)),
            )
            self.head = tnn.Linear(256, cam.CLASSES)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.flatten(self.features(x), 1))

    net = TorchCameraNet()
    net.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    frames = np.array(got["bytes"], np.uint8).reshape(CLASSES, HEIGHT, WIDTH, 4)
    pre = cam.CameraNet().pre
    x = glcomp.compile(nn.Sequential(pre), {"x": pre.input(CLASSES)}).runtime("reference").predict(x=frames)
    with torch.no_grad():
        logits = net(torch.from_numpy(x))[:, :CLASSES]
    np.testing.assert_allclose(torch.softmax(logits, 1).numpy(), np.array(got["probs"]), atol=2e-3)
