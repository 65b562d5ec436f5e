"""Worker training in a tab that is really hidden: a headed Chromium on a virtual X server (Xvfb),
the page put in the background by another tab brought to the front, Chromium's background
throttling left on (benchmarks/worker_bench.py starts the browser; docs/worker.md).

Headless Chromium never hides a page, so tests/browser/test_worker.py can only background one; here the
page must say `document.visibilityState === "hidden"` and see the `visibilitychange` events, its
requestAnimationFrame must stop and its timers must be throttled (the background tab policy is in
effect), and training must go on at a pace no timer-driven loop reaches there. The share of the
visible pace is not asserted: Chromium also lowers a hidden tab's renderer priority (nice 0 -> 5 on
Linux), so under the parallel suite's load the hidden rate measures the other tests as much as the
runtime (benchmarks/worker_bench.py measures the ratio, interleaved). Fails, never skips, when Xvfb or
Chromium is missing (scripts/install.sh installs both).
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from browser.support import Site

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import worker_bench

pytestmark = pytest.mark.browser
PHASE_S = 4.0  # each of the visible and hidden phases

PAGE_JS = """
window.__ticks = 0;
setInterval(() => { window.__ticks++; }, 10);
window.__frames = 0;
const frame = () => { window.__frames++; requestAnimationFrame(frame); };
requestAnimationFrame(frame);
"""

START_JS = """
async ({ base, batches, worker }) => {
  const g = await import('/glcomp.js');
  const feeds = batches.map((b) => ({ x: Float32Array.from(b.x), y: Int32Array.from(b.y) }));
  const rt = await g.load(base, { worker, quiet: true });
  window.__steps = 0;
  window.__stop = false;
  window.__order = true;
  window.__hiddenSteps = 0;
  window.__done = rt.train({ steps: 1e9, batches: feeds, onStep: (i, loss) => {
    if (i !== window.__steps || !Number.isFinite(loss)) window.__order = false;
    window.__steps++;
    if (document.visibilityState === "hidden") window.__hiddenSteps++;
    return !window.__stop;
  } }).then(async (losses) => {
    const live = (await rt.dispose()) ?? rt.liveObjects();
    return { steps: losses.length, live };
  });
  return rt.thread;
}
"""


@pytest.fixture(scope="module")
def hidden_tab_browser() -> Iterator[Any]:
    missing = [name for name in ("Xvfb", "chromium") if shutil.which(name) is None]
    if missing:
        pytest.fail(
            f"the hidden-tab test needs {' and '.join(missing)} on PATH (Debian: apt-get install xvfb "
            "chromium; scripts/install.sh installs both). It fails rather than skips so that a run "
            "without them never passes.",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw, worker_bench.headed_chromium(pw) as context:
        yield context


def _counters(pg: Any) -> dict[str, Any]:
    return pg.evaluate(
        "({ steps: window.__steps, ticks: window.__ticks, frames: window.__frames,"
        " t: performance.now(), state: document.visibilityState })"
    )


# A hidden page's timers wake about once a second (asserted below), so a training loop that waits on
# them manages about a step a second: main-thread training measured 2.0 steps/s hidden when its
# readbacks polled with setTimeout (docs/worker.md). Unthrottled, both measured 13-14 steps/s hidden
# under the full parallel suite on 2 cores (the renderer at nice 5 against the suite's other worker)
# and 140-176 on an idle machine.
MIN_HIDDEN_RATE = 4.0


@pytest.mark.parametrize("thread", ["worker", "main"])
def test_hidden_tab_keeps_training(hidden_tab_browser: Any, site: Site, thread: str) -> None:
    worker_bench._program().save(Path(site.root) / "hidden_mlp")
    pg = hidden_tab_browser.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    pg.add_init_script(worker_bench.VISIBILITY_JS)
    pg.add_init_script(PAGE_JS)
    pg.goto(site.url + "glcomp.js")
    pg.bring_to_front()
    assert pg.evaluate("document.visibilityState") == "visible"
    args = {"base": "/bundle/hidden_mlp/", "batches": worker_bench._batches(), "worker": thread == "worker"}
    assert pg.evaluate(START_JS, args) == thread
    pg.wait_for_function("window.__steps > 10", timeout=120_000)
    time.sleep(1)

    v0 = _counters(pg)
    time.sleep(PHASE_S)
    v1 = _counters(pg)
    other = worker_bench.hide(pg)  # waits for visibilityState "hidden"
    h0 = _counters(pg)
    time.sleep(PHASE_S)
    h1 = _counters(pg)
    worker_bench.show(pg, other)
    events = pg.evaluate("window.__visEvents")
    pg.evaluate("window.__stop = true")
    done = pg.evaluate("window.__done")
    hidden_steps = pg.evaluate("window.__hiddenSteps")

    visible_s, hidden_s = (v1["t"] - v0["t"]) / 1e3, (h1["t"] - h0["t"]) / 1e3
    visible_rate = (v1["steps"] - v0["steps"]) / visible_s
    hidden_rate = (h1["steps"] - h0["steps"]) / hidden_s
    ratio = hidden_rate / visible_rate if visible_rate else float("nan")
    print(f"{thread} steps/s: visible {visible_rate:.1f}, hidden {hidden_rate:.1f} ({ratio:.0%})")
    # The tab was hidden for real, with Chromium's background tab policy in effect.
    assert v0["state"] == v1["state"] == "visible"
    assert h0["state"] == h1["state"] == "hidden"
    assert events == ["hidden", "visible"]  # the page's own visibilitychange events
    assert v1["frames"] - v0["frames"] > 5  # requestAnimationFrame runs while visible...
    assert h1["frames"] - h0["frames"] <= 1  # ...and stops in a hidden tab
    # A 10 ms interval wakes about once a second in a hidden tab (budget-based throttling), far
    # below its visible rate: background timer throttling is on.
    assert (v1["ticks"] - v0["ticks"]) / visible_s > 20
    assert (h1["ticks"] - h0["ticks"]) / hidden_s < 5
    # Training went on while hidden at a pace the page's throttled timers cannot drive.
    assert visible_rate > 5
    assert hidden_rate >= MIN_HIDDEN_RATE
    assert hidden_steps >= h1["steps"] - h0["steps"] > 0
    # Every step's loss reached the page, in order, finite; the runtime freed its GL objects.
    assert pg.evaluate("window.__order")
    assert done["steps"] >= pg.evaluate("window.__steps")  # the stop reaches the worker a few steps on
    assert done["live"] and not any(done["live"].values())
    assert not errors
    pg.close()
