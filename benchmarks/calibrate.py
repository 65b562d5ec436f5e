"""Calibrate the code generator's cost model (glcomp/codegen/cost.py) on this machine's GL device.

    python benchmarks/calibrate.py            # prints the measured costs and DRAW in the model's unit

The model's unit is one *element-iteration*: one iteration of a kernel loop for one output element,
a texel fetch and a multiply-add (a vec4 kernel's iteration for a whole texel counts 4). This script
times, on one GL context with `ctx.finish()` around many repetitions:

- a loop kernel over a 256x256 viewport (65,536 texels, 4 elements each) running K iterations per
  fragment (one texelFetch and one vec4 multiply-add each), for two K: the slope is the time of one
  element-iteration;
- 1x1 draws that do nothing but write a texel, each after switching program, framebuffer and
  texture as consecutive kernels do: the time of one draw.

DRAW is the ratio: how many element-iterations one draw costs. The default in cost.py comes from
the measurements recorded there; run this on a device to see where it stands.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

VERT = "#version 330\nin vec2 p;\nvoid main() { gl_Position = vec4(p, 0.0, 1.0); }\n"
LOOP = """#version 330
uniform sampler2D s;
out vec4 o;
void main() {
  ivec2 q = ivec2(gl_FragCoord.xy);
  vec4 acc = vec4(0.0);
  for (int k = 0; k < %d; k++) {
    vec4 a = texelFetch(s, ivec2((q.x + k) & 255, q.y), 0);
    acc += a * float(k + 1);
  }
  o = acc;
}
"""
POINT = """#version 330
uniform sampler2D s;
out vec4 o;
void main() { o = texelFetch(s, ivec2(0, 0), 0) + vec4(%d.0); }
"""


def _time(run, reps: int, ctx) -> float:
    run()
    ctx.finish()
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    ctx.finish()
    return (time.perf_counter() - t0) / reps


def measure(ctx, k_small: int = 16, k_large: int = 80) -> dict[str, float]:
    """Seconds per element-iteration and per draw on `ctx`, and DRAW (their ratio)."""
    quad = ctx.buffer(np.array([-1, -1, 3, -1, -1, 3], dtype="f4").tobytes())
    data = np.random.default_rng(0).random((256, 256, 4), dtype="f4").tobytes()
    src = ctx.texture((256, 256), 4, data, dtype="f4")
    out = ctx.texture((256, 256), 4, dtype="f4")
    fbo = ctx.framebuffer(color_attachments=[out])
    loops = {}
    for k in (k_small, k_large):
        prog = ctx.program(vertex_shader=VERT, fragment_shader=LOOP % k)
        vao = ctx.vertex_array(prog, [(quad, "2f", "p")])
        loops[k] = (prog, vao)

    def loop_draw(k: int):
        def run() -> None:
            fbo.use()
            src.use(0)
            loops[k][1].render(vertices=3)

        return run

    reps = 20
    t_small = _time(loop_draw(k_small), reps, ctx)
    t_large = _time(loop_draw(k_large), reps, ctx)
    per_iter = (t_large - t_small) / ((k_large - k_small) * 256 * 256 * 4)
    # Consecutive small kernels: each draw binds its own program, target and input.
    points = []
    for i in range(8):
        prog = ctx.program(vertex_shader=VERT, fragment_shader=POINT % i)
        tex = ctx.texture((1, 1), 4, dtype="f4")
        points.append((ctx.vertex_array(prog, [(quad, "2f", "p")]), ctx.framebuffer(color_attachments=[tex])))

    def chain() -> None:
        for vao, f in points:
            f.use()
            src.use(0)
            vao.render(vertices=3)

    per_draw = _time(chain, 200, ctx) / len(points)
    objects = [quad, src, out, fbo, *(x for pair in loops.values() for x in pair)]
    for obj in objects + [x for p in points for x in p]:
        obj.release()
    return {"element_iteration_s": per_iter, "draw_s": per_draw, "draw_in_iterations": per_draw / per_iter}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    import moderngl

    from glcomp.codegen.cost import DRAW

    ctx = moderngl.create_context(standalone=True, backend="egl")
    r = measure(ctx)
    print(f"device: {ctx.info['GL_RENDERER']}")
    print(f"one element-iteration: {r['element_iteration_s'] * 1e9:.3f} ns")
    print(f"one draw (program, target and texture switched): {r['draw_s'] * 1e6:.1f} us")
    print(f"one draw = {r['draw_in_iterations']:,.0f} element-iterations (cost.DRAW = {DRAW:,}; see cost.py)")


if __name__ == "__main__":
    main()
