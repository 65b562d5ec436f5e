"""Training-step benchmarks of the browser runtime (glcomp.js) in headless Chromium.

    python benchmarks/bench_browser.py                        # all workloads, webgl2, 30 timed steps
    python benchmarks/bench_browser.py --workloads mlp,cnn --targets webgl2,webgl1 --json out.json

Each workload is compiled, saved as a bundle, served on 127.0.0.1 and loaded by the page. After
warm-up steps (the first step includes the driver's shader JIT compilation), every timed step is
one ``await rt.trainStep(batch)``: uploads, the train_step draws and the loss read back (async
pixel-pack-buffer readback on WebGL 2, readPixels on WebGL 1). The table gives the median and the
10th/90th percentiles, the time per step when ``rt.train`` keeps 2 steps in flight, the draw calls
per step (counted by the runtime) and, for comparison, the moderngl runtime on this machine.
Chromium is started with SwiftShader (CPU WebGL) unless ``--gpu`` is given.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

import glcomp
from glcomp import nn
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


def _workloads() -> dict[str, Any]:
    """The workloads of benchmarks/bench.py (one definition for every benchmark)."""
    spec = importlib.util.spec_from_file_location("_glcomp_bench", Path(__file__).with_name("bench.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return {name: (w.model, w.optimizer, tuple(w.x_shape), w.classes) for name, w in module.WORKLOADS.items()}


PAGE_JS = """
async (arg) => {
  const g = await import('/glcomp.js');
  let t = performance.now();
  const rt = await g.Runtime.load(arg.base, { quiet: true, readback: arg.readback });
  const loadMs = performance.now() - t;
  const batch = { x: Float32Array.from(arg.x), y: Int32Array.from(arg.y) };
  t = performance.now();
  await rt.trainStep(batch);
  const firstMs = performance.now() - t;
  for (let i = 1; i < arg.warmup; i++) await rt.trainStep(batch);
  const times = [];
  const before = rt.drawCalls;
  let loss = 0;
  for (let i = 0; i < arg.steps; i++) {
    t = performance.now();
    loss = await rt.trainStep(batch);
    times.push(performance.now() - t);
  }
  const draws = (rt.drawCalls - before) / arg.steps;
  t = performance.now();
  await rt.train({ steps: arg.steps, batches: [batch], inflight: 2 });
  const pipelinedMs = (performance.now() - t) / arg.steps;
  const info = rt.info();
  rt.dispose();
  return { loadMs, firstMs, times, draws, pipelinedMs, loss, renderer: info.renderer,
    readback: info.readback };
}
"""


def _moderngl_ms(prog: glcomp.Program, x: np.ndarray, y: np.ndarray, warmup: int, steps: int) -> float | None:
    try:
        rt = prog.runtime("gl")
    except glcomp.GlcompError:
        return None
    for _ in range(warmup):
        rt.train_step(x=x, y=y)
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        rt.train_step(x=x, y=y)
        times.append(1000 * (time.perf_counter() - start))
    rt.release()
    return statistics.median(times)


def run(
    names: list[str], targets: list[str], steps: int, warmup: int, readback: str, gpu: bool, moderngl: bool
) -> list[dict[str, Any]]:
    from playwright.sync_api import sync_playwright

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("chromium is not installed (Debian: apt-get install chromium)")
    workloads = _workloads()
    results = []
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        root = Path(tmp)
        server = make_server(root)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        browser = pw.chromium.launch(executable_path=exe, args=GPU_ARGS if gpu else SWIFTSHADER_ARGS)
        try:
            for name in names:
                model, make_opt, shape, classes = workloads[name]
                rng = np.random.default_rng(0)
                x = rng.standard_normal(shape).astype(np.float32)
                y = rng.integers(0, classes, size=shape[0])
                for target in targets:
                    print(f"  {name} / {target} ...", file=sys.stderr, flush=True)
                    glcomp.manual_seed(0)
                    prog = glcomp.compile(
                        model(), {"x": shape}, nn.CrossEntropyLoss(), make_opt(), target=target
                    )
                    prog.save(root / f"{name}_{target}")
                    page = browser.new_page()
                    page.set_default_timeout(600_000)
                    page.goto(url + "glcomp.js")
                    arg = {
                        "base": f"/bundle/{name}_{target}/",
                        "x": x.ravel().tolist(),
                        "y": y.tolist(),
                        "steps": steps,
                        "warmup": max(1, warmup),
                        "readback": readback,
                    }
                    try:
                        rec = page.evaluate(PAGE_JS, arg)
                    except Exception as err:  # report the workload, go on with the rest
                        print(f"    failed: {str(err).splitlines()[0]}", file=sys.stderr, flush=True)
                        continue
                    finally:
                        page.close()
                    times = rec.pop("times")
                    q10, q90 = np.percentile(times, [10, 90])
                    rec |= {
                        "workload": name,
                        "target": target,
                        "steps": steps,
                        "ms_median": statistics.median(times),
                        "ms_p10": float(q10),
                        "ms_p90": float(q90),
                    }
                    if moderngl:
                        rec["moderngl_ms"] = _moderngl_ms(prog, x, y, warmup, steps)
                    results.append(rec)
                    print("    " + table([rec]).splitlines()[-1], file=sys.stderr, flush=True)
        finally:
            browser.close()
            server.shutdown()
            server.server_close()
    return results


def table(results: list[dict[str, Any]]) -> str:
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
                f"{r['pipelinedMs']:.1f}",
                "-" if mgl is None else f"{mgl:.1f}",
            ]
        )
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="mlp,cnn,conv_seed,lstm", help="comma-separated subset")
    parser.add_argument("--targets", default="webgl2", help="webgl2, webgl1 or both (comma-separated)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps (default 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument(
        "--readback", default="async", choices=["async", "sync"], help="WebGL 2 loss readback (default async)"
    )
    parser.add_argument("--gpu", action="store_true", help="let Chromium use the GPU instead of SwiftShader")
    parser.add_argument("--no-moderngl", action="store_true", help="skip the moderngl comparison column")
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    known = _workloads()
    unknown = [n for n in names if n not in known]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(known)}")
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    if any(t not in ("webgl2", "webgl1") for t in targets):
        parser.error("--targets: webgl2 and/or webgl1")
    if args.steps < 1:
        parser.error("--steps must be positive")
    results = run(names, targets, args.steps, args.warmup, args.readback, args.gpu, not args.no_moderngl)
    if results:
        print(f"# Chromium WebGL renderer: {results[0]['renderer']}", file=sys.stderr)
    print(table(results))
    if args.json:
        report = {"date": time.strftime("%Y-%m-%d"), "results": results}
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
