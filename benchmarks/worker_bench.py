"""Training on the main thread vs in a dedicated Worker, visible and backgrounded, in Chromium.

Prints a table: steps/s while the page is visible and while it is backgrounded, for main-thread
training that yields with requestAnimationFrame (``train({yieldTo: "frame"})``), main-thread
training that yields with tasks, and worker training (``load(..., {worker: true})``); the main
thread's long tasks (PerformanceObserver 'longtask', over 50 ms) during each run; the load average.

Backgrounding: the page is put in Chromium's page lifecycle state "frozen" (CDP
``Page.setWebLifecycleState``), another page is brought to the front and focus emulation is
switched off; the table also reports what ``document.visibilityState`` said (headless Chromium
may keep it "visible": then only the lifecycle state is in effect).

    python benchmarks/worker_bench.py [--seconds 4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import glcomp
from glcomp import nn, optim
from glcomp.serve import make_server

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-background-networking",
    "--no-first-run",
]

START_JS = """
async ({ base, batches, mode }) => {
  const g = await import('/glcomp.js');
  const feeds = batches.map((b) => ({ x: Float32Array.from(b.x), y: Int32Array.from(b.y) }));
  window.__long = [];
  new PerformanceObserver((l) => { for (const e of l.getEntries()) window.__long.push(e.duration); })
    .observe({ type: "longtask" });
  const rt = await g.load(base, { worker: mode === "worker", quiet: true });
  window.__steps = 0;
  window.__stop = false;
  window.__vis = new Set();
  const onStep = () => {
    window.__steps++;
    window.__vis.add(document.visibilityState);
    return !window.__stop;
  };
  const opts = { steps: 1e9, batches: feeds, onStep };
  if (mode === "frame") opts.yieldTo = "frame";
  if (mode === "task") opts.yieldTo = "task";
  window.__done = rt.train(opts).then(() => rt.dispose());
  return rt.thread;
}
"""


def _program() -> glcomp.Program:
    glcomp.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    return glcomp.compile(model, {"x": (32, 64)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-3))


def _rate(page: Any, seconds: float) -> tuple[float, int]:
    s0, t0 = page.evaluate("window.__steps"), time.perf_counter()
    time.sleep(seconds)
    s1, t1 = page.evaluate("window.__steps"), time.perf_counter()
    return (s1 - s0) / (t1 - t0), s1 - s0


def _background(page: Any, cdp: Any, on: bool) -> Any:
    other = None
    if on:
        cdp.send("Emulation.setFocusEmulationEnabled", {"enabled": False})
        other = page.context.new_page()
        other.bring_to_front()
        cdp.send("Page.setWebLifecycleState", {"state": "frozen"})
    else:
        cdp.send("Page.setWebLifecycleState", {"state": "active"})
        page.bring_to_front()
    return other


def measure(browser: Any, url: str, mode: str, batches: list[Any], seconds: float) -> dict[str, Any]:
    context = browser.new_context()
    page = context.new_page()
    page.goto(url + "glcomp.js")
    cdp = context.new_cdp_session(page)
    cdp.send("Page.enable")
    thread = page.evaluate(START_JS, {"base": "/bundle/bench/", "batches": batches, "mode": mode})
    page.wait_for_function("window.__steps > 3", timeout=120_000)
    visible, _ = _rate(page, seconds)
    long_visible = page.evaluate("window.__long.length")
    vis_visible = page.evaluate("document.visibilityState")
    other = _background(page, cdp, True)
    hidden, _ = _rate(page, seconds)  # the counter is read by Playwright (frozen pages still answer)
    _background(page, cdp, False)
    vis_hidden = sorted(page.evaluate("[...window.__vis]"))
    long_all = page.evaluate("window.__long")
    page.evaluate("window.__stop = true")
    page.evaluate("window.__done")
    if other is not None:
        other.close()
    context.close()
    return {
        "mode": mode,
        "thread": thread,
        "visible": visible,
        "hidden": hidden,
        "long_visible": long_visible,
        "long_total": len(long_all),
        "long_max": max(long_all, default=0.0),
        "visibility": f"{vis_visible} / seen {','.join(vis_hidden)}",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="measuring time of each phase")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium")
    if exe is None:
        sys.exit("needs Chromium on PATH")
    rng = np.random.default_rng(0)
    batches = [
        {"x": rng.normal(size=32 * 64).tolist(), "y": rng.integers(0, 10, size=32).tolist()} for _ in range(4)
    ]
    with tempfile.TemporaryDirectory() as root:
        _program().save(Path(root) / "bench")
        server = make_server(Path(root))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        rows = []
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
            for mode in ("frame", "task", "worker"):
                rows.append(measure(browser, url, mode, batches, args.seconds))
            browser.close()
        server.shutdown()
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {args.seconds:.0f} s a phase")
    print(
        f"{'training':<22}{'thread':<8}{'visible':>9}{'hidden':>9}{'hid/vis':>9}"
        f"{'long tasks':>12}{'max ms':>8}  visibilityState"
    )
    for r in rows:
        name = {"frame": "main, rAF", "task": "main, tasks", "worker": "worker"}[r["mode"]]
        ratio = r["hidden"] / r["visible"] if r["visible"] else float("nan")
        print(
            f"{name:<22}{r['thread']:<8}{r['visible']:>9.1f}{r['hidden']:>9.1f}{ratio:>9.0%}"
            f"{r['long_total']:>12}{r['long_max']:>8.0f}  {r['visibility']}"
        )
    print("steps/s; long tasks: main-thread tasks over 50 ms during the whole run (visible + hidden)")


if __name__ == "__main__":
    main()
