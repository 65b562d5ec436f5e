"""What each program of a workload's train step costs at its first draw in the browser.

    python benchmarks/first_draw.py                     # every workload of benchmarks/bench.py
    python benchmarks/first_draw.py --workloads lstm --rounds 3

A software renderer (SwiftShader, what headless Chromium and GPU-less browsers draw with)
compiles a program's pipeline to machine code at its first draw, not at link: that compilation is
most of a bundle's first training step. For every program of the bundle (each compiled anew, so
no cache answers), in one headless Chromium with SwiftShader: the time to compile and link it, its
first draw (one draw over 32 x 32 fragments into as many RGBA32F targets as it writes, then a
1-pixel readback) and its second draw, median over `--rounds` compilations of each. Every sampler
reads a 64 x 64 RGBA32F texture of zeros and every uniform is 0: the draws time compilation, not
the kernels' work. Run it on two checkouts to compare what a code generator change does to the
first step; the sum of first draws over the train step's programs is what its first step pays.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
from pathlib import Path

import glcomp
from glcomp import nn
from glcomp.codegen.bundle import build_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench  # the workloads, one definition for every benchmark

ARGS = ["--headless", "--no-sandbox", "--use-angle=swiftshader", "--enable-unsafe-swiftshader"]

WARM = "#version 300 es\nprecision highp float;\nout vec4 o;\nvoid main() { o = vec4(1.0); }\n"

PAGE_JS = r"""(arg) => {
const gl = document.createElement("canvas").getContext("webgl2");
if (!gl || !gl.getExtension("EXT_color_buffer_float")) throw new Error("no WebGL 2 with float targets");
const vs = gl.createShader(gl.VERTEX_SHADER);
gl.shaderSource(vs, arg.vert);
gl.compileShader(vs);
gl.bindBuffer(gl.ARRAY_BUFFER, gl.createBuffer());
gl.bufferData(gl.ARRAY_BUFFER, new Float32Array([-1, -1, 3, -1, -1, 3]), gl.STATIC_DRAW);
gl.enableVertexAttribArray(0);
gl.vertexAttribPointer(0, 2, gl.FLOAT, false, 0, 0);
const textures = [];
for (let i = 0; i < 24; i++) {
  const t = gl.createTexture();
  gl.bindTexture(gl.TEXTURE_2D, t);
  gl.texStorage2D(gl.TEXTURE_2D, 1, gl.RGBA32F, 64, 64);
  gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MIN_FILTER, gl.NEAREST);
  gl.texParameteri(gl.TEXTURE_2D, gl.TEXTURE_MAG_FILTER, gl.NEAREST);
  textures.push(t);
}
const px = new Float32Array(4);
const sync = () => gl.readPixels(0, 0, 1, 1, gl.RGBA, gl.FLOAT, px);
const out = [];
for (const [name, source, targets] of arg.programs) {
  const fs = gl.createShader(gl.FRAGMENT_SHADER);
  gl.shaderSource(fs, source);
  let t = performance.now();
  gl.compileShader(fs);
  const p = gl.createProgram();
  gl.attachShader(p, vs);
  gl.attachShader(p, fs);
  gl.bindAttribLocation(p, 0, "a_position");
  gl.linkProgram(p);
  if (!gl.getProgramParameter(p, gl.LINK_STATUS)) throw new Error(`${name}: ${gl.getShaderInfoLog(fs)}`);
  const link = performance.now() - t;
  gl.useProgram(p);
  let unit = targets;
  for (let i = 0; i < gl.getProgramParameter(p, gl.ACTIVE_UNIFORMS); i++) {
    const u = gl.getActiveUniform(p, i);
    const loc = gl.getUniformLocation(p, u.name);
    if (u.type === gl.SAMPLER_2D) {
      gl.activeTexture(gl.TEXTURE0 + unit - targets);
      gl.bindTexture(gl.TEXTURE_2D, textures[unit]);
      gl.uniform1i(loc, unit - targets);
      unit++;
    } else if (u.type === gl.INT) gl.uniform1i(loc, 0);
    else if (u.type === gl.FLOAT) gl.uniform1f(loc, 0);
  }
  gl.bindFramebuffer(gl.FRAMEBUFFER, gl.createFramebuffer());
  const buffers = [];
  for (let i = 0; i < targets; i++) {
    gl.framebufferTexture2D(gl.FRAMEBUFFER, gl.COLOR_ATTACHMENT0 + i, gl.TEXTURE_2D, textures[i], 0);
    buffers.push(gl.COLOR_ATTACHMENT0 + i);
  }
  gl.drawBuffers(buffers);
  gl.viewport(0, 0, 32, 32);
  sync();
  t = performance.now();
  gl.drawArrays(gl.TRIANGLES, 0, 3);
  sync();
  const first = performance.now() - t;
  t = performance.now();
  gl.drawArrays(gl.TRIANGLES, 0, 3);
  sync();
  out.push([name, link, first, performance.now() - t]);
}
return out;
}"""


def _unique(source: str, k: int) -> str:
    """`source` made a distinct program for round `k` (a dead test, so no cache serves it)."""
    return source.replace("void main() {", f"void main() {{\n  if (gl_FragCoord.x < -{k + 1}.5) discard;", 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default=",".join(bench.WORKLOADS), help="comma-separated subset")
    ap.add_argument("--rounds", type=int, default=3, help="compilations of each program (median)")
    args = ap.parse_args()
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        raise SystemExit("needs Chromium (apt-get install chromium) and Playwright (pip install playwright)")
    from playwright.sync_api import sync_playwright

    rows = [("workload", "programs (train step)", "link ms", "1st draw ms", "2nd draw ms", "largest 1st")]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=ARGS)
        for name in args.workloads.split(","):
            w = bench.WORKLOADS[name]
            glcomp.manual_seed(0)
            if w.tokens:  # a language model: token ids in, its loss computed in forward
                prog = w.compile()
            else:
                prog = glcomp.compile(w.model(), {"x": w.x_shape}, nn.CrossEntropyLoss(), w.optimizer())
            bundle = build_bundle(prog)
            m = bundle.manifest
            used = {d["program"] for d in m["entries"]["train_step"]["draws"]}
            programs = [
                (pid, bundle.shaders[p["fragment"]], p["outputs"]) for pid, p in m["programs"].items()
            ]
            page = browser.new_page()
            warm = ("warm", WARM, 1)
            runs = [warm]
            runs += [(pid, _unique(src, k), n) for k in range(args.rounds) for pid, src, n in programs]
            times = page.evaluate(PAGE_JS, {"vert": bundle.shaders[m["vertex_shader"]], "programs": runs})
            page.close()
            per: dict[str, list[list[float]]] = {}
            for pid, link, first, second in times[1:]:
                per.setdefault(pid, []).append([link, first, second])
            med = {
                pid: [statistics.median(v[i] for v in vals) for i in range(3)] for pid, vals in per.items()
            }
            train = {pid: v for pid, v in med.items() if pid in used}
            top = sorted(train.items(), key=lambda kv: -kv[1][1])[:3]
            rows.append(
                (
                    name,
                    f"{len(train)} of {len(med)}",
                    f"{sum(v[0] for v in train.values()):.0f}",
                    f"{sum(v[1] for v in train.values()):.0f}",
                    f"{sum(v[2] for v in train.values()):.0f}",
                    ", ".join(f"{pid} {v[1]:.0f}" for pid, v in top),
                )
            )
        browser.close()
    print(bench.markdown(list(rows[0]), [list(r) for r in rows[1:]]))


if __name__ == "__main__":
    main()
