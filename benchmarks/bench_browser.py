"""Training-step benchmarks of the browser runtime (glcomp.js) in headless Chromium.

    python benchmarks/bench_browser.py                        # all workloads, webgl2, 30 timed steps
    python benchmarks/bench_browser.py --workloads mlp,cnn --targets webgl2,webgl1 --json out.json
    python benchmarks/bench_browser.py --peers tfjs --rounds 2 --steps 10 --no-moderngl

Each workload is compiled, saved as a bundle, served on 127.0.0.1 and loaded by the page. After
warm-up steps (the first step includes the driver's shader JIT compilation), every timed step is
one ``await rt.trainStep(batch)``: uploads, the train_step draws and the loss read back (async
pixel-pack-buffer readback on WebGL 2, readPixels on WebGL 1); the batch is a Float32Array or,
for token ids and class labels, an Int32Array, under the program's input names. The table gives
the median and the 10th/90th percentiles, the time per step when ``rt.train`` keeps 2 steps in
flight, the draw calls per step (counted by the runtime) and, for comparison, the moderngl
runtime on this machine.
Chromium is started with SwiftShader (CPU WebGL) unless ``--gpu`` is given.

``--peers tfjs`` trains the same workloads with TensorFlow.js 4.22 (WebGL backend) in the same
Chromium, one page per workload and runtime, interleaved round by round (``--rounds``), with the
1-minute load average recorded around each page. The tfjs models are in
``benchmarks/peers/tfjs_workloads.js``; tfjs itself comes from npm (``cd benchmarks/peers && npm
install``), served with that module by a second static server on 127.0.0.1 (glcomp's server
serves only the runtime and bundles). Every page counts its WebGL calls by wrapping the context
prototypes: draws (drawArrays/drawElements and their instanced forms) and programs
(createProgram, linkProgram). A tfjs step is one ``optimizer.minimize(() => loss, true)`` on a
freshly uploaded batch with the loss read back (``await loss.data()``, ``dataSync()`` with
``--readback sync``). First step: glcomp from ``Runtime.load`` (fetch, context, shader
compilation) to the end of the first step; tfjs from model creation (after its backend is up) to
the end of the first step, which compiles its shaders. This benchmark needs Chromium, Playwright
and, for the peers, npm; it is not part of the test suite.

``--chromium PATH`` drives that Chromium binary (``chromium``, ``chromium-headless-shell``) with
benchmarks/cdp.py over the DevTools protocol instead, with no Playwright: the standard library,
numpy and glcomp are all it needs (and tfjs's files, copied, for the peers). ``--chromium-args``
adds flags to either driver's; ``--console`` prints the pages' console messages.
"""

from __future__ import annotations

import argparse
import contextlib
import http.server
import importlib.util
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

import glcomp
from glcomp.codegen.target import TARGETS
from glcomp.serve import make_server

SWIFTSHADER_ARGS = [
    "--headless",
    "--no-sandbox",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
GPU_ARGS = ["--headless", "--no-sandbox", "--enable-gpu", "--ignore-gpu-blocklist", "--no-first-run"]


def _sibling(name: str) -> Any:
    """benchmarks/<name>.py as a module (loaded once, whatever sys.path holds)."""
    key = f"_glcomp_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _bench() -> Any:
    """benchmarks/bench.py as a module: its workloads (one definition for every benchmark) and
    its markdown tables."""
    return _sibling("bench")


@contextlib.contextmanager
def _launch(chromium: str | None, args: list[str], console: bool) -> Iterator[Any]:
    """A browser with `new_page()`: the Chromium binary `chromium` driven by benchmarks/cdp.py,
    or (None) the system's `chromium` driven by Playwright, imported only then."""
    if chromium is not None:
        if not (os.path.isfile(chromium) and os.access(chromium, os.X_OK)):
            raise SystemExit(f"--chromium {chromium}: not an executable file")
        browser = _sibling("cdp").launch(chromium, args, print_console=console)
        try:
            yield browser
        finally:
            browser.close()
        return
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install chromium), see also --chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=args)
        try:
            yield _ConsolePages(browser) if console else browser
        finally:
            browser.close()


class _ConsolePages:
    """A Playwright browser whose new pages print their console messages and page errors."""

    def __init__(self, browser: Any) -> None:
        self.browser = browser

    def new_page(self) -> Any:
        page = self.browser.new_page()
        page.on("console", lambda msg: print(f"[console.{msg.type}] {msg.text}", file=sys.stderr, flush=True))
        page.on("pageerror", lambda err: print(f"[pageerror] {err}", file=sys.stderr, flush=True))
        return page


def _workloads() -> dict[str, Any]:
    """The workloads of benchmarks/bench.py."""
    return dict(_bench().WORKLOADS)


PEERS = ("tfjs",)
PEERS_DIR = Path(__file__).resolve().with_name("peers")
TFJS_FILES = {
    "/tf.min.js": PEERS_DIR / "node_modules" / "@tensorflow" / "tfjs" / "dist" / "tf.min.js",
    "/tfjs_workloads.js": PEERS_DIR / "tfjs_workloads.js",
}
TFJS_PAGE = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>tfjs peer</title><script src="/tf.min.js"></script></head>
<body></body></html>
"""

# Installed before any script of a page runs: counts draws and program creation/linking on every
# WebGL context of the page (glcomp.js also counts its own draws; tfjs does not).
COUNTERS_JS = """
(() => {
  const counts = { draws: 0, programs: 0, links: 0 };
  globalThis.__glCounts = counts;
  for (const C of [globalThis.WebGLRenderingContext, globalThis.WebGL2RenderingContext]) {
    if (!C) continue;
    const p = C.prototype;
    for (const name of ["drawArrays", "drawElements", "drawArraysInstanced", "drawElementsInstanced"]) {
      const f = p[name];
      if (f) p[name] = function (...a) { counts.draws++; return f.apply(this, a); };
    }
    const create = p.createProgram, link = p.linkProgram;
    p.createProgram = function (...a) { counts.programs++; return create.apply(this, a); };
    p.linkProgram = function (...a) { counts.links++; return link.apply(this, a); };
  }
})();
"""

TFJS_PAGE_JS = """
async (arg) => (await import('/tfjs_workloads.js')).bench(globalThis.tf, arg)
"""

PAGE_JS = """
async (arg) => {
  const g = await import('/glcomp.js');
  let t = performance.now();
  const rt = await g.Runtime.load(arg.base, { quiet: true, readback: arg.readback });
  const loadMs = performance.now() - t;
  // Images or (int32) token ids; heat maps or (int32) class labels, per example or per token.
  const typed = (values, isFloat) => (isFloat ? Float32Array.from(values) : Int32Array.from(values));
  const batch = { [arg.xName]: typed(arg.x, arg.xFloat), [arg.yName]: typed(arg.y, arg.yFloat) };
  t = performance.now();
  await rt.trainStep(batch);
  const firstMs = performance.now() - t;
  for (let i = 1; i < arg.warmup; i++) await rt.trainStep(batch);
  const times = [];
  const before = rt.drawCalls;
  const glBefore = globalThis.__glCounts.draws;
  let loss = 0;
  for (let i = 0; i < arg.steps; i++) {
    t = performance.now();
    loss = await rt.trainStep(batch);
    times.push(performance.now() - t);
  }
  const draws = (rt.drawCalls - before) / arg.steps;
  const glDraws = (globalThis.__glCounts.draws - glBefore) / arg.steps;
  const programs = Object.keys(rt.manifest.programs).length;
  const trainPrograms = new Set(rt.manifest.entries.train_step.draws.map((d) => d.program)).size;
  const glPrograms = globalThis.__glCounts.programs;
  let pipelinedMs = null;
  if (arg.pipelined) {
    t = performance.now();
    await rt.train({ steps: arg.steps, batches: [batch], inflight: 2 });
    pipelinedMs = (performance.now() - t) / arg.steps;
  }
  const info = rt.info();
  rt.dispose();
  return { loadMs, firstMs, times, draws, glDraws, programs, trainPrograms, glPrograms, pipelinedMs, loss,
    renderer: info.renderer, readback: info.readback };
}
"""

# --profile: where a glcomp.js train step's time goes, draw by draw. After the warm-up steps each
# draw of the step runs `reps` times back to back, then a 1-pixel readback of its target waits for
# it (SwiftShader has no timer queries); the readback's own cost is timed alone and taken off.
PROFILE_JS = """
async (arg) => {
  const g = await import('/glcomp.js');
  const rt = await g.Runtime.load(arg.base, { quiet: true, readback: arg.readback });
  const typed = (values, isFloat) => (isFloat ? Float32Array.from(values) : Int32Array.from(values));
  const batch = { [arg.xName]: typed(arg.x, arg.xFloat), [arg.yName]: typed(arg.y, arg.yFloat) };
  for (let i = 0; i < arg.warmup; i++) await rt.trainStep(batch);
  let t = performance.now();
  await rt.trainStep(batch);
  const stepMs = performance.now() - t;
  const gl = rt.gl;
  const px = { f: new Float32Array(4), b: new Uint8Array(4) };
  const wait = (d) => {
    if (rt._texture(d.targets[0]).__span === 4) gl.readPixels(0, 0, 1, 1, gl.RGBA, gl.UNSIGNED_BYTE, px.b);
    else gl.readPixels(0, 0, 1, 1, gl.RGBA, gl.FLOAT, px.f);
  };
  const draws = rt.manifest.entries.train_step.draws;
  const records = [];
  let waitMs = 0;
  for (const d of draws) {
    rt._draw(d);
    wait(d);
    t = performance.now();
    wait(d);
    const w = performance.now() - t;
    waitMs += w;
    t = performance.now();
    for (let i = 0; i < arg.reps; i++) rt._draw(d);
    wait(d);
    const ms = (performance.now() - t - w) / arg.reps;
    records.push({ kernel: d.kernel, program: d.program, viewport: d.viewport, ms });
  }
  gl.disable(gl.BLEND);
  gl.bindFramebuffer(gl.FRAMEBUFFER, null);
  const info = rt.info();
  rt.dispose();
  return { stepMs, waitMs: waitMs / draws.length, records, renderer: info.renderer };
}
"""


def profile_table(name: str, rec: dict[str, Any], top: int = 20) -> str:
    """One workload's per-draw profile (PROFILE_JS's record): the costliest kernels first, then
    the shares by root op (a kernel's name after its index, up to its first fused op)."""
    by_kernel: dict[str, list[Any]] = {}
    for r in rec["records"]:
        k = by_kernel.setdefault(r["kernel"], [0.0, "x".join(map(str, r["viewport"])), 0])
        k[0] += max(r["ms"], 0.0)
        k[2] += 1
    total = sum(v[0] for v in by_kernel.values())
    by_root: dict[str, float] = {}
    for k, v in by_kernel.items():
        root = k.split("_", 1)[-1].split("+", 1)[0]
        by_root[root] = by_root.get(root, 0.0) + v[0]
    ranked = sorted(by_root.items(), key=lambda kv: -kv[1])
    roots = ", ".join(f"{r} {100 * t / total:.0f}%" for r, t in ranked)
    rows = [
        [k, v[1], str(v[2]), f"{v[0]:.2f}", f"{100 * v[0] / total:.1f}%"]
        for k, v in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[:top]
    ]
    title = (
        f"{name}: the draws add up to {total:.1f} ms (the step {rec['stepMs']:.1f} ms; a 1-pixel readback "
        f"{rec['waitMs']:.2f} ms, taken off each) in {len(by_kernel)} kernels; by root op: {roots}"
    )
    return title + "\n" + _bench().markdown(["kernel", "viewport", "draws", "ms", "share"], rows)


def _moderngl_ms(prog: glcomp.Program, feeds: dict[str, np.ndarray], warmup: int, steps: int) -> float | None:
    try:
        rt = prog.runtime("gl")
    except glcomp.GlcompError:
        return None
    for _ in range(warmup):
        rt.train_step(**feeds)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        rt.train_step(**feeds)
        times.append(1000 * (time.perf_counter() - start))
    rt.release()
    return statistics.median(times)


def _load() -> float:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")


class _PeerHandler(http.server.BaseHTTPRequestHandler):
    """Serves the tfjs page, tf.min.js and the tfjs workload module: those three paths, nothing else."""

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/", "/index.html"):
            body, kind = TFJS_PAGE, "text/html; charset=utf-8"
        elif path in TFJS_FILES:
            body, kind = TFJS_FILES[path].read_bytes(), "text/javascript; charset=utf-8"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _peer_server() -> http.server.ThreadingHTTPServer:
    missing = [str(p) for p in TFJS_FILES.values() if not p.is_file()]
    if missing:
        raise SystemExit(f"tfjs is not installed ({missing[0]} is missing): cd {PEERS_DIR} && npm install")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PeerHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _summarise(rec: dict[str, Any], times: list[float], steps: int) -> dict[str, Any]:
    q10, q90 = np.percentile(times, [10, 90])
    return rec | {
        "steps": steps,
        "times_ms": [round(t, 3) for t in times],
        "ms_median": statistics.median(times),
        "ms_p10": float(q10),
        "ms_p90": float(q90),
    }


def _evaluate(page: Any, script: str, arg: dict[str, Any], label: str) -> dict[str, Any] | None:
    try:
        return page.evaluate(script, arg)
    except Exception as err:  # report the workload, go on with the rest
        print(f"    {label} failed: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
        return None
    finally:
        page.close()


def run(
    names: list[str],
    targets: list[str],
    steps: int,
    warmup: int,
    readback: str,
    gpu: bool,
    moderngl: bool,
    peers: tuple[str, ...] = (),
    rounds: int = 1,
    pipelined: bool = True,
    chromium: str | None = None,
    chromium_args: tuple[str, ...] = (),
    console: bool = False,
    profile: int = 0,
) -> list[dict[str, Any]]:
    """Time every workload on glcomp.js (each target) and on each peer, `rounds` times, one fresh
    page per run, interleaved: within a round each workload runs on every runtime in turn (the
    order reversed on odd rounds). One record per run, with the load average before and after.
    `chromium`: a Chromium binary driven by benchmarks/cdp.py (None: the system's, by Playwright),
    started with `chromium_args` after the default flags. `profile` > 0: no peers, and each
    glcomp.js page times every draw of the train step `profile` times back to back instead
    (PROFILE_JS), its record the draws'."""
    workloads = _workloads()
    results: list[dict[str, Any]] = []
    peer_server = _peer_server() if peers else None
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        root = Path(tmp)
        server = make_server(root)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        peer_url = f"http://127.0.0.1:{peer_server.server_address[1]}/" if peer_server else ""
        batches, progs = {}, {}
        for name in names:
            w = workloads[name]
            shape = tuple(w.x_shape)
            # class labels, heat maps (float) for an MSE workload, or int32 token ids and targets
            x, y = _bench()._batch(w)
            batches[name] = (x, y, shape)
            for target in targets:
                print(f"  compiling {name} / {target} ...", file=sys.stderr, flush=True)
                glcomp.manual_seed(0)
                prog = w.compile(target=target)
                prog.save(root / f"{name}_{target}")
                progs[name, target] = prog
        browser_args = [*(GPU_ARGS if gpu else SWIFTSHADER_ARGS), *chromium_args]
        browser = stack.enter_context(_launch(chromium, browser_args, console))
        try:
            for rnd in range(rounds):
                for name in names:
                    x, y, shape = batches[name]
                    runs = [("glcomp.js", t) for t in targets] + [(p, "webgl2") for p in peers if not profile]
                    for runtime, target in runs if rnd % 2 == 0 else runs[::-1]:
                        label = f"{name} / {runtime}" + (f" / {target}" if runtime == "glcomp.js" else "")
                        print(f"  round {rnd + 1}: {label} ...", file=sys.stderr, flush=True)
                        page = browser.new_page()
                        page.set_default_timeout(600_000)
                        page.add_init_script(COUNTERS_JS)
                        common = {
                            "x": x.ravel().tolist(),
                            "y": y.ravel().tolist(),
                            "xFloat": x.dtype.kind == "f",
                            "yFloat": y.dtype.kind == "f",
                            "steps": steps,
                            "warmup": max(1, warmup),
                            "readback": readback,
                        }
                        load_before = _load()
                        if runtime == "glcomp.js":
                            page.goto(url + "glcomp.js")
                            arg = common | {"base": f"/bundle/{name}_{target}/", "pipelined": pipelined}
                            arg |= {"xName": workloads[name].input_name, "yName": workloads[name].target_name}
                            if profile:
                                arg |= {"reps": profile}
                                rec = _evaluate(page, PROFILE_JS, arg, label)
                                if rec is not None:
                                    print(profile_table(label, rec), flush=True)
                                    rec |= {"workload": name, "runtime": runtime, "target": target}
                                    results.append(rec)
                                continue
                            rec = _evaluate(page, PAGE_JS, arg, label)
                        else:
                            page.goto(peer_url)
                            arg = common | {"name": name, "shape": list(shape)}
                            rec = _evaluate(page, TFJS_PAGE_JS, arg, label)
                            if rec is not None:
                                rec["readback"] = readback
                        if rec is None:
                            continue
                        rec = _summarise(rec, rec.pop("times"), steps) | {
                            "workload": name,
                            "runtime": runtime,
                            "target": target,
                            "round": rnd + 1,
                            "load_before": load_before,
                            "load_after": _load(),
                        }
                        if runtime == "glcomp.js" and moderngl and rnd == 0:
                            feeds = workloads[name].feeds(x, y)
                            rec["moderngl_ms"] = _moderngl_ms(progs[name, target], feeds, warmup, steps)
                        results.append(rec)
                        print("    " + _row_text(rec), file=sys.stderr, flush=True)
        finally:
            server.shutdown()
            server.server_close()
            if peer_server is not None:
                peer_server.shutdown()
                peer_server.server_close()
    return results


def _row_text(r: dict[str, Any]) -> str:
    return (
        f"{r['workload']} {r['runtime']} {r['target']}: {r['ms_median']:.1f} ms/step "
        f"({r['ms_p10']:.1f}-{r['ms_p90']:.1f}), {r['draws']:.0f} draws/step, {r['programs']} programs, "
        f"first step {_first_ms(r):.0f} ms, load {r['load_before']:.1f}-{r['load_after']:.1f}"
    )


def _first_ms(r: dict[str, Any]) -> float:
    """Bundle load + first step (glcomp.js); model creation + first step (peers)."""
    return r["firstMs"] + r.get("loadMs", 0.0)


def table(results: list[dict[str, Any]]) -> str:
    """The glcomp.js runs, one row per run."""
    results = [r for r in results if r.get("runtime", "glcomp.js") == "glcomp.js"]
    head = [
        "workload",
        "target",
        "readback",
        "draws/step",
        "load ms",
        "1st step ms",
        "ms/step (p10-p90)",
        "pipelined ms/step",
        "moderngl ms/step",
    ]
    rows = []
    for r in results:
        mgl = r.get("moderngl_ms")
        rows.append(
            [
                r["workload"],
                r["target"],
                r["readback"],
                f"{r['draws']:.0f}",
                f"{r['loadMs']:.0f}",
                f"{r['firstMs']:.0f}",
                f"{r['ms_median']:.1f} ({r['ms_p10']:.1f}-{r['ms_p90']:.1f})",
                "-" if r.get("pipelinedMs") is None else f"{r['pipelinedMs']:.1f}",
                "-" if mgl is None else f"{mgl:.1f}",
            ]
        )
    return _bench().markdown(head, rows)


def peer_table(results: list[dict[str, Any]]) -> str:
    """glcomp.js against its peers, a row per workload and runtime: ms/step median and p10-p90 of
    all timed steps of all rounds, draws per step, programs created, first-step ms (median over
    rounds), the load average over the runs and the ratios peer / glcomp.js (glcomp.js's first
    target)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for r in results:
        groups.setdefault((r["workload"], r["runtime"], r["target"]), []).append(r)
    base = {}
    for (name, runtime, _), recs in groups.items():
        if runtime == "glcomp.js" and name not in base:
            base[name] = recs
    head = [
        "workload",
        "runtime",
        "rounds",
        "ms/step median (p10-p90)",
        "draws/step",
        "programs",
        "1st step ms",
        "load avg",
        "ms ratio",
        "1st step ratio",
    ]

    def stats(recs: list[dict[str, Any]]) -> tuple[float, float, float, float]:
        times = [t for r in recs for t in r["times_ms"]]
        q10, q90 = np.percentile(times, [10, 90])
        return statistics.median(times), float(q10), float(q90), statistics.median(_first_ms(r) for r in recs)

    rows = []
    for (name, runtime, target), recs in groups.items():
        med, q10, q90, first = stats(recs)
        loads = [r[k] for r in recs for k in ("load_before", "load_after")]
        ratio = first_ratio = "-"
        if runtime != "glcomp.js" and name in base:
            bmed, _, _, bfirst = stats(base[name])
            ratio, first_ratio = f"{med / bmed:.2f}", f"{first / bfirst:.2f}"
        rows.append(
            [
                name,
                runtime if runtime != "glcomp.js" else f"glcomp.js ({target})",
                str(len(recs)),
                f"{med:.1f} ({q10:.1f}-{q90:.1f})",
                "/".join(sorted({f"{r['draws']:.0f}" for r in recs})),
                "/".join(sorted({str(r["programs"]) for r in recs})),
                f"{first:.0f}",
                f"{min(loads):.1f}-{max(loads):.1f}",
                ratio,
                first_ratio,
            ]
        )
    return _bench().markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp,cnn,conv_seed,lstm", help="comma-separated subset")
    parser.add_argument(
        "--targets",
        default="webgl2",
        help="glcomp targets to compile for, comma-separated: webgl2, webgl1, webgl2-gpu (a GPU's "
        "cost model, for --gpu), ... (default webgl2)",
    )
    parser.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument(
        "--readback", default="async", choices=["async", "sync"], help="WebGL 2 loss readback (default async)"
    )
    parser.add_argument("--gpu", action="store_true", help="let Chromium use the GPU instead of SwiftShader")
    parser.add_argument("--no-moderngl", action="store_true", help="skip the moderngl comparison column")
    parser.add_argument(
        "--peers", default="", help=f"peer runtimes beside glcomp.js (comma-separated): {', '.join(PEERS)}"
    )
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds over all runs (default 1)")
    parser.add_argument(
        "--no-pipelined", action="store_true", help="skip the glcomp.js pipelined (2 in flight) measurement"
    )
    parser.add_argument(
        "--chromium",
        metavar="PATH",
        help="drive this Chromium binary over the DevTools protocol (benchmarks/cdp.py), no Playwright",
    )
    parser.add_argument(
        "--chromium-args",
        default="",
        metavar="FLAGS",
        help='extra Chromium flags after the defaults, given with "=": '
        '--chromium-args="--use-angle=vulkan --enable-features=Vulkan"',
    )
    parser.add_argument("--console", action="store_true", help="print the pages' console messages")
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="REPS",
        help="time each glcomp.js draw of a train step REPS times back to back instead (no peers)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    known = _workloads()
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(known)}")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if any(t not in TARGETS for t in targets):
        parser.error(f"--targets: names of glcomp's targets ({', '.join(TARGETS)})")
    if args.steps < 1:
        parser.error("--steps must be positive")
    if args.rounds < 1:
        parser.error("--rounds must be positive")
    peers = tuple(p.strip() for p in args.peers.split(",") if p.strip())
    if any(p not in PEERS for p in peers):
        parser.error(f"--peers: choose from {list(PEERS)}")
    load_start = _load()
    results = run(
        names,
        targets,
        args.steps,
        args.warmup,
        args.readback,
        args.gpu,
        not args.no_moderngl,
        peers=peers,
        rounds=args.rounds,
        pipelined=not args.no_pipelined,
        chromium=args.chromium,
        chromium_args=tuple(shlex.split(args.chromium_args)),
        console=args.console,
        profile=args.profile,
    )
    load_end = _load()
    if args.profile:
        print(f"# load average (1 min): {load_start:.2f} at the start, {load_end:.2f} at the end")
        return 0
    if results:
        print(f"# Chromium WebGL renderer: {results[0]['renderer']}", file=sys.stderr)
    print(
        f"# load average (1 min): {load_start:.2f} at the start, {load_end:.2f} at the end",
        file=sys.stderr,
    )
    print(table(results))
    if peers or args.rounds > 1:
        warm = max(1, args.warmup)
        print(f"\n{args.steps} timed steps after {warm} warm-up steps per run; ratios: peer / glcomp.js\n")
        print(peer_table(results))
    if args.json:
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
            "load_average": {"start": load_start, "end": load_end},
            "steps": args.steps,
            "warmup": max(1, args.warmup),
            "rounds": args.rounds,
            "peers": list(peers),
            "driver": "cdp" if args.chromium else "playwright",
            "results": results,
        }
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
