"""Training in a dedicated Worker (glcomp/runtime/js/worker.js) and the browser's texture inspector,
in headless Chromium (the browser fixtures of tests/conftest.py).

Functional properties only (a loaded 2-core machine makes timing thresholds flaky; the timings
are benchmarks/worker_bench.py's): the worker's losses are the main thread's bit for bit (the
same shaders on the same WebGL implementation, the same order of draws), a hidden tab keeps the
worker stepping, long tasks of the page are observed and counted, errors come back as Errors with
their message, and rt.inspect in JavaScript returns what the Python reference runtime computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from browser.support import Site, _js
from glcomp import nn, optim

pytestmark = pytest.mark.browser
STEPS = 12


def _program(**options: Any) -> glcomp.Program:
    glcomp.manual_seed(21)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Linear(16, 4))
    return glcomp.compile(
        model, {"x": (8, 10)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2), **options
    )


def _batches(count: int = STEPS) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    return [
        {"x": rng.normal(size=(8, 10)).astype(np.float32), "y": rng.integers(0, 4, size=8)}
        for _ in range(count)
    ]


def _as_js(batches: list[dict[str, np.ndarray]]) -> list[dict[str, list[Any]]]:
    return [{k: v.ravel().tolist() for k, v in b.items()} for b in batches]


@pytest.fixture(scope="module")
def bundle(site: Site) -> str:
    _program(inspect=["1", "grad:0.weight"]).save(Path(site.root) / "worker_mlp")
    return "/bundle/worker_mlp/"


SAME_LOSSES_JS = """
const { base, batches } = arg;
const feeds = batches.map((b) => ({ x: Float32Array.from(b.x), y: Int32Array.from(b.y) }));
const main = await g.load(base, { worker: false, quiet: true });
const wk = await g.load(base, { worker: true, quiet: true });
const mainLosses = await main.train({ steps: feeds.length, batches: feeds });
const seen = [];
const workerLosses = await wk.train({ steps: feeds.length, batches: feeds,
  onStep: (i, l) => { seen.push([i, l]); } });
const single = [await main.trainStep(feeds[0]), await wk.trainStep(feeds[0])];
const pm = await main.predict({ x: feeds[0].x });
const pw = await wk.predict({ x: feeds[0].x });
const wm = main.getWeights();
const ww = await wk.getWeights();
const sameWeights = Object.keys(wm).every((k) => wm[k].data.every((v, i) => Object.is(v, ww[k].data[i])));
const inspect = { main: Array.from((await main.inspect("1")).data),
  worker: Array.from((await wk.inspect("1")).data) };
let error = null;
try { await wk.inspect("grad:0.weigth"); } catch (err) {
  error = { name: err.name, message: err.message, isError: err instanceof Error };
}
let stopAt = null;
const stopped = await wk.train({ steps: 50, batches: feeds,
  onStep: (i) => { stopAt = i; return i < 2 ? undefined : false; } });
const threads = [main.thread, wk.thread, wk.info().thread];
main.dispose();
const live = await wk.dispose();
let disposed = null;
try { await wk.trainStep(feeds[0]); } catch (err) { disposed = err.message; }
return { mainLosses, workerLosses, seen, single, pm: Array.from(pm.data), pw: Array.from(pw.data),
  pwShape: pw.shape,
  sameWeights, inspect, error, stopped: stopped.length, stopAt, threads, live, disposed, steps: wk.steps };
"""


def test_worker_trains_like_the_main_thread(page: Any, bundle: str) -> None:
    got = _js(page, SAME_LOSSES_JS, {"base": bundle, "batches": _as_js(_batches())})
    assert got["threads"] == ["main", "worker", "worker"]
    assert len(got["mainLosses"]) == STEPS
    assert got["workerLosses"] == got["mainLosses"]  # bit for bit
    assert [s for s, _ in got["seen"]] == list(range(STEPS))  # progress for every step
    assert [loss for _, loss in got["seen"]] == got["workerLosses"]
    assert got["single"][0] == got["single"][1]
    assert got["pw"] == got["pm"] and got["pwShape"] == [8, 4]
    assert got["sameWeights"]
    assert got["inspect"]["worker"] == got["inspect"]["main"] and len(got["inspect"]["main"]) == 8 * 16
    err = got["error"]
    assert err["isError"] and err["name"] == "GlcompError"
    assert "no tensor named 'grad:0.weigth'" in err["message"] and "'grad:0.weight'" in err["message"]
    # onStep returned false at step 2: the stop message reaches the worker a few steps later (the
    # progress and the stop cross between threads while it keeps stepping; how many depends on
    # the machine's load), before step 50
    assert got["stopAt"] >= 2 and 3 <= got["stopped"] < 50
    assert got["steps"] == STEPS + 1 + got["stopped"]
    assert got["live"] and not any(got["live"].values())  # dispose freed every GL object
    assert "disposed" in got["disposed"]
    # The comparison reads both runtimes' weights back synchronously (getWeights), which Chromium
    # may report as a "GPU stall due to ReadPixels" performance warning depending on timing; any
    # other GL error or warning fails the test.
    assert not [e for e in page.errors if "GPU stall due to ReadPixels" not in e]


HIDDEN_JS = """
const { base, batches, steps } = arg;
const feeds = batches.map((b) => ({ x: Float32Array.from(b.x), y: Int32Array.from(b.y) }));
window.__longTasks = [];
new PerformanceObserver((list) => { for (const e of list.getEntries()) window.__longTasks.push(e.duration); })
  .observe({ type: "longtask", buffered: true });
const wk = await g.load(base, { worker: true, quiet: true });
window.__progress = [];
window.__visibility = [];
window.__train = wk.train({ steps, batches: feeds, progressEvery: 1, onStep: (i) => {
  window.__progress.push(i); window.__visibility.push(document.visibilityState); } })
  .then((l) => { window.__done = l.length; return wk.dispose(); });
return true;
"""


def _background(pg: Any, on: bool) -> None:
    """Background the page as far as headless Chromium allows: focus emulation off, another page
    in front, page lifecycle state "frozen" (headless Chromium keeps visibilityState "visible";
    benchmarks/worker_bench.py reports what the page saw)."""
    cdp = pg.context.new_cdp_session(pg)
    cdp.send("Page.enable")
    if on:
        cdp.send("Emulation.setFocusEmulationEnabled", {"enabled": False})
        pg.context.new_page().bring_to_front()
        cdp.send("Page.setWebLifecycleState", {"state": "frozen"})
    else:
        cdp.send("Page.setWebLifecycleState", {"state": "active"})
        pg.bring_to_front()


def test_backgrounded_page_keeps_the_worker_training(page: Any, bundle: str) -> None:
    steps = 300
    _js(page, HIDDEN_JS, {"base": bundle, "batches": _as_js(_batches(4)), "steps": steps})
    page.wait_for_function("window.__progress.length > 5", timeout=60_000)
    _background(page, True)
    before = page.evaluate("window.__progress.length")
    page.wait_for_function(f"window.__progress.length > {before + 20}", timeout=60_000)
    _background(page, False)
    page.wait_for_function("window.__done !== undefined", timeout=120_000)
    assert page.evaluate("window.__done") == steps  # every step ran, none lost in the background
    assert page.evaluate("window.__progress") == list(range(steps))
    assert set(page.evaluate("window.__visibility")) <= {"visible", "hidden"}
    long_tasks = page.evaluate("window.__longTasks")
    assert isinstance(long_tasks, list)  # observed; benchmarks/worker_bench.py reports the counts
    assert all(d > 50 for d in long_tasks)  # 'longtask' entries are tasks over 50 ms
    assert not page.errors


JS_INSPECT = """
const { base, batches, names } = arg;
const rt = await g.Runtime.load(base, { quiet: true });
for (const b of batches) await rt.trainStep({ x: Float32Array.from(b.x), y: Int32Array.from(b.y) });
const out = {};
for (const n of names) {
  const t = await rt.inspect(n);
  out[n] = { shape: t.shape, data: Array.from(t.data, Number) };
}
rt.dispose();
return out;
"""


def test_js_inspect_equals_the_python_reference(page: Any, bundle: str) -> None:
    prog = _program(inspect=["1", "grad:0.weight"])
    ref = prog.runtime("reference")
    batches = _batches(3)
    for b in batches:
        ref.train_step(**b)
    names = ["1", "grad:0.weight", "0.weight", "opt.0.weight.exp_avg_sq", "loss"]
    got = _js(page, JS_INSPECT, {"base": bundle, "batches": _as_js(batches), "names": names})
    for name in names:
        want = ref.inspect(name)
        assert tuple(got[name]["shape"]) == want.shape, name
        np.testing.assert_allclose(
            np.reshape(got[name]["data"], want.shape), want, rtol=1e-4, atol=1e-5, err_msg=name
        )


FALLBACK_JS = """
const { base, batch } = arg;
const feed = { x: Float32Array.from(batch.x), y: Int32Array.from(batch.y) };
const kept = globalThis.OffscreenCanvas;
delete globalThis.OffscreenCanvas; // a browser without OffscreenCanvas
let refused = null;
try {
  const auto = await g.load(base, { quiet: true });
  const first = await auto.trainStep(feed);
  const fallback = { thread: auto.thread, reason: auto.fallbackReason ?? null, loss: first };
  try { await g.load(base, { worker: true, quiet: true }); } catch (err) {
    refused = { name: err.name, reason: err.reason, message: err.message };
  }
  auto.dispose();
  globalThis.OffscreenCanvas = kept;
  const wk = await g.load(base, { quiet: true });
  const loss = await wk.trainStep(feed);
  const thread = wk.thread;
  await wk.dispose();
  return { fallback, refused, worker: { thread, loss } };
} finally {
  globalThis.OffscreenCanvas = kept;
}
"""


def test_load_falls_back_to_the_main_thread_where_a_worker_cannot_draw(page: Any, bundle: str) -> None:
    """worker: "auto" (the default) trains on the main thread where there is no OffscreenCanvas
    and says why (fallbackReason); worker: true refuses with a GlcompError of reason
    "no-worker-webgl"; with OffscreenCanvas back, "auto" is a worker, and both give the same loss."""
    (batch,) = _as_js(_batches(1))
    got = _js(page, FALLBACK_JS, {"base": bundle, "batch": batch})
    assert got["fallback"]["thread"] == "main"
    assert "OffscreenCanvas" in got["fallback"]["reason"]
    assert got["refused"]["name"] == "GlcompError" and got["refused"]["reason"] == "no-worker-webgl"
    assert "OffscreenCanvas" in got["refused"]["message"]
    assert got["worker"]["thread"] == "worker"
    assert got["worker"]["loss"] == got["fallback"]["loss"]
