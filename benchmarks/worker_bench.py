"""Training on the main thread vs in a dedicated Worker, in a visible and in a hidden tab of Chromium.

Prints a table: steps/s while the page is the visible tab and while it is a hidden background
tab, for main-thread training that yields with requestAnimationFrame (``train({yieldTo:
"frame"})``), main-thread training that yields with tasks, and worker training (``load(...,
{worker: true})``); the main thread's long tasks (PerformanceObserver 'longtask', over 50 ms)
during each run; what ``document.visibilityState`` and the page's ``visibilitychange`` events
said; the load average.

Hiding the tab for real: headless Chromium never hides a page (``visibilityState`` stays
"visible" whatever CDP does), so this runs a headed Chromium on a virtual X server (Xvfb, started
here) and backgrounds the page the way a user does: a second tab of the same window is opened and
brought to the front. Chromium is started by this script, not by Playwright's ``launch``, which
adds ``--disable-background-timer-throttling``, ``--disable-backgrounding-occluded-windows`` and
``--disable-renderer-backgrounding``: none of those (nor any other flag that turns background
throttling off) is passed, so Chromium's own background tab policy applies (rAF stops, main-thread
timers are throttled). Playwright attaches over CDP with ``no_defaults``: without it, Playwright
turns on focus emulation in every page, which keeps a background tab "visible". Minimizing the
window (``Browser.setWindowBounds`` windowState "minimized") does not hide it here: Xvfb has no
window manager to minimize to.

Visible and hidden phases alternate (``--rounds`` of each, ``--seconds`` each), so load from other
processes affects both alike. Chromium's intensive wake-up throttling of a page's timers starts
after 5 minutes hidden; ``--long-hidden S`` adds one phase of S seconds hidden in a row for the
task-yielding modes and reports the steps/s of its last minute (S > 360 covers it).

    python benchmarks/worker_bench.py [--seconds 30] [--rounds 2] [--modes frame,task,worker]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import glcomp
from glcomp import nn, optim
from glcomp.serve import make_server

# Headed Chromium: WebGL through SwiftShader (a CPU implementation), no first-run UI, no
# background downloads; nothing that changes how background tabs are scheduled.
CHROMIUM_FLAGS = [
    "--no-sandbox",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--password-store=basic",
    "--window-size=1024,768",
]
# The flags Playwright's launch would add that turn Chromium's background throttling off; they must
# never reach a hidden-tab measurement.
THROTTLING_OFF = (
    "--disable-background-timer-throttling",
    "--disable-backgrounding-occluded-windows",
    "--disable-renderer-backgrounding",
)

# Records the page's visibility changes from its first script on.
VISIBILITY_JS = """
window.__visEvents = [];
document.addEventListener("visibilitychange", () => window.__visEvents.push(document.visibilityState));
"""

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


def _batches() -> list[dict[str, list[Any]]]:
    rng = np.random.default_rng(0)
    return [
        {"x": rng.normal(size=32 * 64).tolist(), "y": rng.integers(0, 10, size=32).tolist()} for _ in range(4)
    ]


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout: float = 60.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode} before it was ready")
        time.sleep(0.1)
    raise RuntimeError(f"{what} was not ready after {timeout:.0f} s")


@contextlib.contextmanager
def headed_chromium(pw: Any, exe: str | None = None) -> Iterator[Any]:
    """A headed Chromium on its own Xvfb display, Playwright attached over CDP without its default
    overrides; yields the default browser context (its first page is about:blank). Raises
    RuntimeError when Xvfb or Chromium is missing or does not start."""
    xvfb = shutil.which("Xvfb")
    exe = exe or shutil.which("chromium")
    if xvfb is None or exe is None:
        raise RuntimeError(
            "a hidden tab needs Xvfb and Chromium on PATH (Debian: apt-get install xvfb chromium)"
        )
    with tempfile.TemporaryDirectory() as tmp:
        read_fd, write_fd = os.pipe()
        server = subprocess.Popen(
            [xvfb, "-displayfd", str(write_fd), "-screen", "0", "1280x1024x24", "-nolisten", "tcp"],
            pass_fds=[write_fd],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(write_fd)
        chromium = None
        try:
            with os.fdopen(read_fd, "rb") as displayfd:
                display = displayfd.readline().decode().strip()
            if not display:
                raise RuntimeError("Xvfb did not start")
            profile = Path(tmp) / "profile"
            args = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--remote-debugging-port=0"]
            args.append("about:blank")
            assert not set(args) & set(THROTTLING_OFF)
            env = {**os.environ, "DISPLAY": f":{display}"}
            chromium = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            port = _wait_file(profile / "DevToolsActivePort", chromium, "Chromium").split()[0]
            browser = pw.chromium.connect_over_cdp(f"http://127.0.0.1:{port}", no_defaults=True)
            try:
                yield browser.contexts[0]
            finally:
                browser.close()
        finally:
            for proc in (chromium, server):
                if proc is not None and proc.poll() is None:
                    proc.terminate()
                    try:
                        proc.wait(10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()


def hide(page: Any) -> Any:
    """Open another tab in the page's window and bring it to the front; wait until the page says
    it is hidden. Returns the other tab."""
    other = page.context.new_page()
    other.bring_to_front()
    page.wait_for_function("document.visibilityState === 'hidden'", timeout=30_000, polling=100)
    return other


def show(page: Any, other: Any) -> None:
    """Bring the page back to the front (closing the tab that hid it); wait until it is visible."""
    page.bring_to_front()
    other.close()
    page.wait_for_function("document.visibilityState === 'visible'", timeout=30_000, polling=100)


def _rate(page: Any, seconds: float) -> tuple[int, float]:
    s0, t0 = page.evaluate("window.__steps"), time.perf_counter()
    time.sleep(seconds)
    s1, t1 = page.evaluate("window.__steps"), time.perf_counter()
    return s1 - s0, t1 - t0


def measure(
    context: Any, url: str, mode: str, seconds: float, rounds: int, long_hidden: float
) -> dict[str, Any]:
    page = context.new_page()
    page.add_init_script(VISIBILITY_JS)
    page.goto(url + "glcomp.js")
    page.bring_to_front()
    thread = page.evaluate(START_JS, {"base": "/bundle/bench/", "batches": _batches(), "mode": mode})
    page.wait_for_function("window.__steps > 3", timeout=120_000)
    time.sleep(2)  # past the first steps' shader compilation
    totals = {"visible": [0, 0.0], "hidden": [0, 0.0]}
    states = {"visible": set(), "hidden": set()}
    for _ in range(rounds):
        for state in ("visible", "hidden"):
            other = hide(page) if state == "hidden" else None
            steps, secs = _rate(page, seconds)
            states[state].add(page.evaluate("document.visibilityState"))
            if other is not None:
                show(page, other)
            totals[state][0] += steps
            totals[state][1] += secs
    long_rate = None
    if long_hidden > 0 and mode != "frame":
        other = hide(page)
        time.sleep(max(0.0, long_hidden - 60))
        steps, secs = _rate(page, min(60.0, long_hidden))
        states["hidden"].add(page.evaluate("document.visibilityState"))
        show(page, other)
        long_rate = steps / secs
    events = page.evaluate("window.__visEvents")
    long_all = page.evaluate("window.__long")
    page.evaluate("window.__stop = true")
    page.evaluate("window.__done")
    page.close()
    return {
        "mode": mode,
        "thread": thread,
        "visible": totals["visible"][0] / totals["visible"][1],
        "hidden": totals["hidden"][0] / totals["hidden"][1],
        "long_hidden": long_rate,
        "long_total": len(long_all),
        "long_max": max(long_all, default=0.0),
        "visibility": f"{','.join(sorted(states['hidden']))} ({len(events)} visibilitychange)",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="length of each visible or hidden phase")
    ap.add_argument("--rounds", type=int, default=2, help="visible/hidden phase pairs per mode")
    ap.add_argument("--modes", default="frame,task,worker", help="comma-separated: frame, task, worker")
    ap.add_argument("--long-hidden", type=float, default=0.0, help="one hidden phase of this many s")
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as root:
        _program().save(Path(root) / "bench")
        server = make_server(Path(root))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        rows = []
        with sync_playwright() as pw:
            try:
                with headed_chromium(pw) as context:
                    version = context.browser.version
                    for mode in args.modes.split(","):
                        rows.append(measure(context, url, mode, args.seconds, args.rounds, args.long_hidden))
            except RuntimeError as err:
                sys.exit(str(err))
        server.shutdown()
    load_after = os.getloadavg()
    loads = [" ".join(f"{v:.2f}" for v in la) for la in (load_before, load_after)]
    print(
        f"Chromium {version}, headed on Xvfb; load average {loads[0]} before, {loads[1]} after; "
        f"{args.rounds} x {args.seconds:.0f} s per state, interleaved"
    )
    long_col = f"{'hidden ' + str(int(args.long_hidden)) + 's':>14}" if args.long_hidden else ""
    print(
        f"{'training':<14}{'thread':<8}{'visible':>9}{'hidden':>9}{'hid/vis':>9}{long_col}"
        f"{'long tasks':>12}{'max ms':>8}  hidden page said"
    )
    for r in rows:
        name = {"frame": "main, rAF", "task": "main, tasks", "worker": "worker"}[r["mode"]]
        ratio = r["hidden"] / r["visible"] if r["visible"] else float("nan")
        extra = ""
        if args.long_hidden:
            extra = f"{r['long_hidden']:>14.1f}" if r["long_hidden"] is not None else f"{'-':>14}"
        print(
            f"{name:<14}{r['thread']:<8}{r['visible']:>9.1f}{r['hidden']:>9.1f}{ratio:>9.0%}{extra}"
            f"{r['long_total']:>12}{r['long_max']:>8.0f}  {r['visibility']}"
        )
    print("steps/s; long tasks: main-thread tasks over 50 ms during the whole run (visible + hidden)")
    if args.long_hidden:
        print(f"hidden {int(args.long_hidden)}s: steps/s over the last minute of one hidden phase that long")


if __name__ == "__main__":
    main()
