"""What a fragment shader can reach on this GL device: FP32 multiply-add peak and texel fetch rate.

    python benchmarks/gl_peak.py             # GL rows; on a CUDA machine also torch's FP32 matmul

Standalone shaders (no glcomp) on one headless context, draws only, timed with ``ctx.finish()``:

- ``fma``: every fragment runs `chains` independent vec4 multiply-add chains for `n` iterations
  (the loop bound is a uniform, so nothing folds); FLOP = fragments * n * chains * 4 * 2.
- ``fetch``: every fragment reads `n` RGBA32F texels with ``texelFetch`` along its row of a 1024^2
  texture (neighbouring fragments read neighbouring texels, as a matmul's do).

These are the ceilings of any kernel glcomp emits on the device: a kernel cannot multiply-add faster
than ``fma`` nor read operands faster than ``fetch``. On a CUDA machine the same run times a 4096^3
FP32 matmul with torch (TF32 off), so the GL ceiling is compared with what the chip does in compute.
"""

from __future__ import annotations

import argparse
import time

import moderngl
import numpy as np

VERT = "#version 300 es\nin vec2 p;\nvoid main() { gl_Position = vec4(p, 0.0, 1.0); }\n"


def fma_shader(chains: int) -> str:
    init = "\n".join(f"  vec4 a{i} = gl_FragCoord.xyxy * 1e-6 + float({i});" for i in range(chains))
    body = "\n".join(f"    a{i} = a{i} * b + c;" for i in range(chains))
    total = " + ".join(f"a{i}" for i in range(chains))
    return f"""#version 300 es
precision highp float;
precision highp int;
uniform vec4 b;
uniform vec4 c;
uniform int n;
out vec4 o;
void main() {{
{init}
  for (int i = 0; i < n; i++) {{
{body}
  }}
  o = {total};
}}
"""


FETCH = """#version 300 es
precision highp float;
precision highp int;
precision highp sampler2D;
uniform sampler2D t;
uniform int n;
out vec4 o;
void main() {
  ivec2 p = ivec2(gl_FragCoord.xy) & 1023;
  vec4 s = vec4(0.0);
  for (int i = 0; i < n; i++) {
    s += texelFetch(t, ivec2((p.x + i) & 1023, p.y), 0);
  }
  o = s;
}
"""


def timed(ctx: moderngl.Context, draw, reps: int) -> float:
    """Seconds per call of `draw`, the median of `reps` after one warm-up call."""
    draw()
    ctx.finish()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        draw()
        ctx.finish()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=2048, help="render target side (fragments = size^2)")
    ap.add_argument("--n", type=int, default=1024, help="loop iterations per fragment")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    ctx = moderngl.create_context(standalone=True, backend="egl")
    print(ctx.info["GL_RENDERER"], "|", ctx.info["GL_VERSION"])
    size, n = args.size, args.n
    frags = size * size
    vbo = ctx.buffer(np.array([-1, -1, 3, -1, -1, 3], np.float32).tobytes())
    out = ctx.texture((size, size), 4, dtype="f4")
    fbo = ctx.framebuffer([out])
    rows = [("case", "fragments", "iterations", "ms", "result")]

    def program(source: str) -> tuple[moderngl.Program, moderngl.VertexArray]:
        prog = ctx.program(vertex_shader=VERT, fragment_shader=source)
        return prog, ctx.vertex_array(prog, [(vbo, "2f", "p")])

    for chains in (4, 8, 16):
        prog, vao = program(fma_shader(chains))
        prog["b"].value = (0.999, 0.999, 0.999, 0.999)
        prog["c"].value = (1e-3, 1e-3, 1e-3, 1e-3)
        prog["n"].value = n

        def draw(vao: moderngl.VertexArray = vao) -> None:
            fbo.use()
            vao.render(moderngl.TRIANGLES)

        s = timed(ctx, draw, args.reps)
        flops = frags * n * chains * 8
        rate = f"{flops / s / 1e12:.3f} TFLOP/s"
        rows.append((f"fma {chains} vec4 chains", f"{frags:,}", f"{n}", f"{s * 1e3:.1f}", rate))

    src = ctx.texture((1024, 1024), 4, np.ones((1024, 1024, 4), np.float32).tobytes(), dtype="f4")
    src.filter = (moderngl.NEAREST, moderngl.NEAREST)
    prog, vao = program(FETCH)
    prog["n"].value = n
    prog["t"].value = 0

    def fetch() -> None:
        fbo.use()
        src.use(0)
        vao.render(moderngl.TRIANGLES)

    s = timed(ctx, fetch, args.reps)
    rate = f"{frags * n / s / 1e9:.1f} G texels/s"
    rows.append(("fetch RGBA32F texelFetch", f"{frags:,}", f"{n}", f"{s * 1e3:.1f}", rate))
    check = np.frombuffer(out.read(), np.float32)[:4]
    assert np.allclose(check, n), f"fetch shader summed {check}, expected {n}"

    try:
        import torch

        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            a = torch.randn(4096, 4096, device="cuda")
            b = torch.randn(4096, 4096, device="cuda")
            torch.cuda.synchronize()
            times = []
            for _ in range(args.reps + 1):
                t0 = time.perf_counter()
                a @ b
                torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
            s = float(np.median(times[1:]))
            name = torch.cuda.get_device_name()
            rate = f"{2 * 4096**3 / s / 1e12:.3f} TFLOP/s"
            rows.append((f"torch matmul 4096^3 FP32 ({name})", "", "", f"{s * 1e3:.1f}", rate))
    except ImportError:
        pass
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for i, r in enumerate(rows):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


if __name__ == "__main__":
    main()
