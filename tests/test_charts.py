"""The demo page's training chart (glcomp/runtime/js/chart.js) in Chromium: distinct loss tick labels,
a legend clear of the epoch labels, and a page that says when its bundle is already trained.

Before: the loss axis was labelled with toFixed(2), so losses below 0.01 gave repeated labels
(0.00, 0.00, ...); the legend was drawn on the epoch labels' baseline, across the epoch numbers; and
a trained bundle (the quick start's) gave a flat curve with no word that training had been done.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from test_browser import browser, page, site  # noqa: F401  (fixtures)

import glcomp
from glcomp import nn, optim
from glcomp.serve import make_server

pytestmark = pytest.mark.browser

DRAW = """async ({losses, accuracies, epochs, stepsPerEpoch}) => {
  const { drawChart } = await import("/chart.js");
  const canvas = document.createElement("canvas");
  canvas.width = 720; canvas.height = 260;
  document.body.append(canvas);
  return drawChart(canvas, { losses, accuracies, epochs, stepsPerEpoch });
}"""


def _overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return (
        a["x"] < b["x"] + b["w"]
        and b["x"] < a["x"] + a["w"]
        and a["y"] < b["y"] + b["h"]
        and b["y"] < a["y"] + a["h"]
    )


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
def test_loss_ticks_are_distinct_and_cover_the_losses(page: Any, losses: list[float]) -> None:  # noqa: F811
    drawn = page.evaluate(DRAW, {"losses": losses, "accuracies": [], "epochs": 3, "stepsPerEpoch": 1})
    labels = drawn["yTicks"]
    assert 3 <= len(labels) <= 7, labels
    assert len(set(labels)) == len(labels), f"repeated loss labels {labels} for losses {losses}"
    assert float(labels[0]) == 0 and float(labels[-1]) >= max(losses), labels


@pytest.mark.parametrize("epochs", [2, 5, 40])
def test_legend_stays_clear_of_the_epoch_labels(page: Any, epochs: int) -> None:  # noqa: F811
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
    browser: Any,  # noqa: F811
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
        chart = demo["chart"]
        assert len(set(chart["yTicks"])) == len(chart["yTicks"])
        assert not _overlap(chart["legend"], chart["xAxis"])
    finally:
        context.close()
