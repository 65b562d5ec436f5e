"""The pages' training chart (glcomp/pages/chart.js) in Chromium: distinct loss tick labels,
a legend clear of the epoch labels, labelled axes, and pages that say whether their bundle is already
trained. The demo page plots epochs; the fine-tuning page (finetune.html) and the camera page
(camera.html) plot the loss of every step through the same chart while they train.

Before: the loss axis was labelled with toFixed(2), so losses below 0.01 gave repeated labels
(0.00, 0.00, ...); the legend was drawn on the epoch labels' baseline, across the epoch numbers; and
a trained bundle (the quick start's) gave a flat curve with no word that training had been done. The
fine-tuning page had no loss plot, the camera page an unlabelled line without axes.
"""

from __future__ import annotations

import importlib
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.serve import make_server

pytestmark = pytest.mark.browser

DRAW = """async ({losses, accuracies, epochs, stepsPerEpoch, steps}) => {
  const { drawChart } = await import("/chart.js");
  const canvas = document.createElement("canvas");
  canvas.width = 720; canvas.height = 260;
  document.body.append(canvas);
  return drawChart(canvas, { losses, accuracies, epochs: epochs ?? undefined, stepsPerEpoch, steps });
}"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


def _check_step_chart(chart: dict[str, Any], steps: int, width: int, height: int) -> None:
    """A per-step loss chart as chart.js drew it: `steps` points, labelled axes, step and loss
    ticks that do not repeat, and no two labels (ticks, axis names, legend) on top of each other
    or off the canvas."""
    assert chart["points"] == steps, chart["points"]
    assert chart["xLabel"] == "step" and chart["yLabel"] == "loss"
    for ticks in (chart["xTicks"], chart["yTicks"]):
        assert ticks and len(set(ticks)) == len(ticks), ticks
    steps_shown = [int(t) for t in chart["xTicks"]]
    assert steps_shown == sorted(steps_shown) and 1 <= steps_shown[0] and steps_shown[-1] <= max(steps, 2)
    boxes = chart["labels"]
    assert len(boxes) >= 2 + len(chart["xTicks"]) + len(chart["yTicks"])  # axis names, ticks, legend
    for i, a in enumerate(boxes):
        assert a["x"] >= 0 and a["y"] >= 0 and a["x"] + a["w"] <= width and a["y"] + a["h"] <= height, a
        for b in boxes[i + 1 :]:
            assert not _overlap(a, b), (a, b)


@pytest.mark.parametrize(
    "losses",
    [
        [0.0012, 0.0011, 0.00105],
        [0.012, 0.011, 0.0105],
        [2.3, 1.1, 0.4],
        [3e-7, 2e-7],
        [512.0, 90.0],
        [0.0, 0.0],
    ],
)
def test_loss_ticks_are_distinct_and_cover_the_losses(page: Any, losses: list[float]) -> None:
    drawn = page.evaluate(DRAW, {"losses": losses, "accuracies": [], "epochs": 3, "stepsPerEpoch": 1})
    labels = drawn["yTicks"]
    assert 3 <= len(labels) <= 7, labels
    assert len(set(labels)) == len(labels), f"repeated loss labels {labels} for losses {losses}"
    assert float(labels[0]) == 0 and float(labels[-1]) >= max(losses), labels


@pytest.mark.parametrize("epochs", [2, 5, 40])
def test_legend_stays_clear_of_the_epoch_labels(page: Any, epochs: int) -> None:
    losses = list(np.linspace(2.0, 0.1, epochs * 3))
    drawn = page.evaluate(
        DRAW, {"losses": losses, "accuracies": [0.5] * epochs, "epochs": epochs, "stepsPerEpoch": 3}
    )
    legend, axis, plot = drawn["legend"], drawn["xAxis"], drawn["plot"]
    assert not _overlap(legend, axis), (legend, axis)
    assert legend["y"] + legend["h"] <= plot["y"] and axis["y"] >= plot["y"] + plot["h"], (legend, axis, plot)
    assert legend["w"] > 100  # both entries: the loss and the test accuracy
    assert drawn["xTicks"], "no epoch labels drawn"
    assert 0 <= legend["y"] and axis["y"] + axis["h"] <= 260


@pytest.mark.parametrize("steps", [1, 2, 7, 60, 997, 10_000])
def test_step_chart_plots_every_step_with_labelled_axes(page: Any, steps: int) -> None:
    losses = list(2.0 * np.exp(-np.arange(steps) / max(1, steps / 4)) + 0.01)
    drawn = page.evaluate(DRAW, {"losses": losses, "epochs": None, "stepsPerEpoch": 1, "steps": steps})
    _check_step_chart(drawn, steps, 720, 260)
    # a run under way: the axis is the whole run's, the points the steps run so far
    part = page.evaluate(
        DRAW, {"losses": losses[: steps // 2 + 1], "epochs": None, "stepsPerEpoch": 1, "steps": steps}
    )
    assert part["points"] == steps // 2 + 1 and part["xTicks"] == drawn["xTicks"]


def test_step_chart_leaves_out_non_finite_losses(page: Any) -> None:
    losses = [1.0, 0.8, float("nan"), 0.5, float("inf"), 0.3]
    drawn = page.evaluate(DRAW, {"losses": losses, "epochs": None, "stepsPerEpoch": 1, "steps": 6})
    assert drawn["points"] == 4 and float(drawn["yTicks"][-1]) >= 1.0


def test_epoch_chart_labels_do_not_overlap(page: Any) -> None:
    losses = [3e-7, 2e-7, 1e-7] * 10
    drawn = page.evaluate(
        DRAW, {"losses": losses, "accuracies": [0.2, 0.9], "epochs": 2, "stepsPerEpoch": 15}
    )
    assert drawn["points"] == 30 and drawn["xLabel"] == "epoch" and drawn["yLabel"] == "loss"
    boxes = drawn["labels"]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), boxes


@pytest.fixture(scope="module", params=[0, 3], ids=["untrained", "trained"])
def demo_site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """The demo page serving a small classifier's bundle saved after `request.param` train steps."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    prog = glcomp.compile(model, {"x": (16, 4)}, nn.CrossEntropyLoss(), optim.Adam(lr=0.01))
    rt = prog.runtime("reference")
    if request.param:
        rt.train_steps([{"x": x[:16], "y": y[:16]}] * request.param)
    bundle = rt.save(tmp_path_factory.mktemp("trained") / "bundle")
    server = make_server(bundle, data=(x[:48], y[:48], x[48:], y[48:]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", request.param
    server.shutdown()
    server.server_close()


def test_demo_says_whether_its_bundle_is_trained_and_draws_through_the_chart(
    browser: Any,
    demo_site: tuple[str, int],
) -> None:
    url, trained_steps = demo_site
    context = browser.new_context()
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        pg.goto(url + "?epochs=2&autostart=1")
        pg.wait_for_function("['done', 'error'].includes(window.glcompDemo?.status)", timeout=120_000)
        demo = pg.evaluate("window.glcompDemo")
        assert demo["status"] == "done", demo["error"]
        assert not errors, errors
        assert demo["pretrained"] is (trained_steps > 0)
        assert ("this bundle is already trained" in pg.locator("#info").inner_text()) is (trained_steps > 0)
        assert "software renderer: yes" in pg.locator("#info").inner_text()
        chart = demo["chart"]
        assert len(set(chart["yTicks"])) == len(chart["yTicks"])
        assert not _overlap(chart["legend"], chart["xAxis"])
    finally:
        context.close()

    # the demo's chart: the loss axis labelled, no two labels on top of each other
    assert chart["yLabel"] == "loss" and chart["xLabel"] == "epoch"
    assert chart["points"] == len(demo["losses"]) > 0
    boxes = chart["labels"]
    assert not any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1 :]), boxes


HEAT_JS = """async (name) => {
  const select = document.getElementById("tensor");
  const names = [...select.options].map((o) => o.value);
  select.value = name;
  select.dispatchEvent(new Event("change"));
  const label = document.getElementById("heat-label");
  while (!label.textContent.startsWith(name + " ")) await new Promise((r) => setTimeout(r, 10));
  const canvas = document.getElementById("heat");
  const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  return { names, label: label.textContent, width: canvas.width, height: canvas.height, px: Array.from(px) };
}"""


def test_demo_draws_a_weight_as_a_heat_map(browser: Any, tmp_path: Path) -> None:
    """The demo page's texture inspector: a parameter chosen in its list is drawn from the GL
    texture (rt.inspect) as a heat map, rows its first axis, red positive, blue negative, scaled
    by the largest magnitude; the pixels are the bundle's weights under that colour map."""
    glcomp.manual_seed(3)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    prog = glcomp.compile(model, {"x": (16, 4)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    bundle = prog.runtime("reference").save(tmp_path / "bundle")
    x = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    server = make_server(bundle, data=(x[:16], y[:16], x[16:], y[16:]))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(f"http://127.0.0.1:{server.server_address[1]}/")
        pg.wait_for_function("['ready', 'error'].includes(window.glcompDemo?.status)", timeout=120_000)
        assert pg.evaluate("window.glcompDemo.status") == "ready", pg.evaluate("window.glcompDemo.error")
        got = pg.evaluate(HEAT_JS, "0.weight")
    finally:
        context.close()
        server.shutdown()
        server.server_close()
    assert {"0.weight", "0.bias", "2.weight", "2.bias"} <= set(got["names"])
    w = np.asarray(prog.params["0.weight"], np.float64)  # (8, 4): 8 rows of 4 pixels
    assert (got["height"], got["width"]) == w.shape and "[8,4]" in got["label"]
    u = w / np.abs(w).max()
    want = np.where(
        (u >= 0)[..., None],
        np.stack([np.full_like(u, 255), 255 * (1 - u), 255 * (1 - u)], -1),
        np.stack([255 * (1 + u), 255 * (1 + u), np.full_like(u, 255)], -1),
    )
    px = np.array(got["px"], np.float64).reshape(*w.shape, 4)
    assert np.all(px[..., 3] == 255)
    np.testing.assert_allclose(px[..., :3], want, atol=1.0)
    assert px[..., 0].min() < 128 and px[..., 2].min() < 128  # both signs shown


# -- the fine-tuning pages: finetune.html and camera.html -----------------------------------------

# Starts a fine-tuning run of `steps` steps on the page's API object (`api`), watching the chart
# between steps; returns the losses, the chart's point counts seen while it trained, the chart at
# the end, how many of the chart canvas's pixels are the loss line's blue, and the page's word on
# its bundle.
FINETUNE_JS = """async ({api, steps}) => {
  const f = window[api];
  const seen = [];
  let done = false;
  const run = f.finetune(steps, 0).finally(() => { done = true; });
  while (!done) {
    if (f.state.status === "training" && f.state.chart) seen.push(f.state.chart.points);
    await new Promise((r) => setTimeout(r, 2));
  }
  const losses = await run;
  const canvas = document.getElementById("chart");
  const px = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
  let blue = 0;
  for (let i = 0; i < px.length; i += 4) if (px[i + 2] > 150 && px[i] < 90 && px[i + 3] > 200) blue++;
  return { losses, seen, chart: f.state.chart, blue, width: canvas.width, height: canvas.height,
    pretrained: f.state.pretrained, trained: document.getElementById("trained").textContent,
    error: f.state.error };
}"""

STEPS = 12  # a few steps: each is a SwiftShader draw sequence


def _serve(bundle: Path) -> Iterator[str]:
    server = make_server(bundle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _finetune_on_page(browser: Any, url: str, api: str, setup: str) -> dict[str, Any]:
    context = browser.new_context()
    try:
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda err: errors.append(str(err)))
        pg.goto(url)
        pg.wait_for_function(
            f"['ready', 'error'].includes(window.{api}?.state.status)", timeout=300_000
        )  # a bound on a hung page only
        assert pg.evaluate(f"window.{api}.state.error") is None
        assert pg.evaluate("document.getElementById('trained').textContent").startswith("Starting bundle:")
        # the page says which renderer it trains on; the tests run Chromium on SwiftShader
        assert "software renderer: yes" in pg.evaluate("document.getElementById('info').textContent")
        before = pg.evaluate(f"window.{api}.state.chart")
        assert before["points"] == 0 and before["xLabel"] == "step"  # drawn, empty, before training
        pg.evaluate(setup)
        got = pg.evaluate(FINETUNE_JS, {"api": api, "steps": STEPS})
        assert not errors and got["error"] is None, (errors, got["error"])
        return got
    finally:
        context.close()


def _check_finetune_page(got: dict[str, Any], trained_steps: int) -> None:
    assert len(got["losses"]) == STEPS and all(np.isfinite(got["losses"])), got["losses"]
    _check_step_chart(got["chart"], STEPS, got["width"], got["height"])
    assert any(0 < n < STEPS for n in got["seen"]), (
        f"the chart was not redrawn while training: {sorted(set(got['seen']))}"
    )
    assert got["seen"] == sorted(got["seen"]), got["seen"]
    assert got["blue"] > 50, "no loss line on the chart's canvas"
    assert got["pretrained"] is (trained_steps > 0)
    assert ("already trained" in got["trained"]) is (trained_steps > 0), got["trained"]
    assert ("untrained" in got["trained"]) is (trained_steps == 0), got["trained"]


@pytest.fixture(scope="module", params=[0, 2], ids=["untrained", "trained"])
def finetune_site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """finetune.html serving examples/finetune_digits.py's program (from freshly initialised
    weights: pretraining is that example's test's cost), saved after `request.param` train steps."""
    from safetensors.numpy import save_file

    ft = _example("finetune_digits")
    out = tmp_path_factory.mktemp("finetune")
    glcomp.manual_seed(0)
    save_file(ft.model().state_dict(), str(out / "init.safetensors"))
    rt = ft.finetune_program(out / "init.safetensors").runtime("reference")
    rng = np.random.default_rng(0)
    if request.param:
        x = rng.uniform(0, 1, (ft.BATCH, 1, 8, 8)).astype(np.float32)
        rt.train_steps([{"x": x, "y": np.arange(ft.BATCH) % 10}] * request.param)
    bundle = rt.save(out / "bundle")
    for url in _serve(bundle):
        yield url + "finetune.html", request.param


def test_finetune_page_plots_the_loss_of_every_step(browser: Any, finetune_site: tuple[str, int]) -> None:
    url, trained_steps = finetune_site
    setup = """(() => { const f = window.glcompFinetune; const n = f.shape.h * f.shape.w;
      const pixels = (i) => Array.from({ length: n }, (_, k) => ((k * 7 + i * 3) % 11) / 10);
      for (let i = 0; i < 20; i++) f.addExample(pixels(i), i % 10);
    })()"""
    _check_finetune_page(_finetune_on_page(browser, url, "glcompFinetune", setup), trained_steps)


@pytest.fixture(scope="module", params=[0, 1], ids=["untrained", "trained"])
def camera_site(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, int]]:
    """camera.html serving examples/camera_finetune.py's program (freshly initialised convolutions,
    batches of 4), saved after `request.param` train steps."""
    from safetensors.numpy import save_file

    cam = _example("camera_finetune")
    out = tmp_path_factory.mktemp("camera")
    glcomp.manual_seed(7)
    save_file(cam.CameraNet(cam.PRETRAIN_CLASSES).state_dict(), str(out / "init.safetensors"))
    rt = cam.finetune_program(out / "init.safetensors", batch=4).runtime("reference")
    if request.param:
        frames, labels = cam.synthetic_frames(4)
        rt.train_steps([{"x": frames, "y": labels % cam.CLASSES}] * request.param)
    bundle = rt.save(out / "bundle")
    for url in _serve(bundle):
        yield url + "camera.html", request.param


def test_camera_page_plots_the_loss_of_every_step(browser: Any, camera_site: tuple[str, int]) -> None:
    """Two classes of frames (red and blue, made in the page: no camera needed to train)."""
    url, trained_steps = camera_site
    setup = """(async () => { const c = window.glcompCamera; const { width, height } = c.shape;
      for (let i = 0; i < 6; i++) {
        const canvas = new OffscreenCanvas(width, height);
        const ctx = canvas.getContext("2d");
        ctx.fillStyle = i % 2 ? "#d22" : "#22d";
        ctx.fillRect(0, 0, width, height);
        ctx.fillStyle = "#888";
        ctx.fillRect(i * 5, i * 3, 12, 12);
        const options = { premultiplyAlpha: "none", colorSpaceConversion: "none" };
        const frame = await createImageBitmap(canvas, options);
        c.state.examples.push({ frame, y: i % 2 });
      }
    })()"""
    _check_finetune_page(_finetune_on_page(browser, url, "glcompCamera", setup), trained_steps)


def _example(name: str) -> Any:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    return importlib.import_module(name)
