"""Single-kernel benchmarks: matmul, conv2d and a long reduction on the GL runtime (and torch).

    python benchmarks/kernels.py                      # matmul n = 256, 512, 1024, conv layers, a reduction
    python benchmarks/kernels.py --large              # also matmul n = 2048, 4096
    python benchmarks/kernels.py --only matmul --webgl1 --json out.json
    python benchmarks/kernels.py --only linear --plain    # with a hand-written vec4-dot shader as yardstick

Each case compiles a one-op model for `predict`, uploads its inputs once and then times its draws
(the loop kernel and any epilogue): one warm-up pass with ``ctx.finish()``, then `reps` passes
issued back to back with a single ``ctx.finish()`` at the end, `reps` chosen so the timed run
lasts about ``--seconds``. GFLOP/s counts one multiply-add as 2 FLOP (a reduction element as
1). When PyTorch with CUDA is importable, the same op runs on the GPU in the same process
(FP32, TF32 off), timed with CUDA synchronisation.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import glcomp
from glcomp import nn
from glcomp.runtime.gl import current_context


class MatMul(nn.Module):
    """x @ w with w stored as (K, N): the right operand is read along its packed axis."""

    def __init__(self, k: int, n: int) -> None:
        super().__init__()
        self.w = nn.Parameter(np.random.default_rng(1).standard_normal((k, n)).astype(np.float32) / k**0.5)

    def forward(self, x: Any) -> Any:
        return x @ self.w


class Sum(nn.Module):
    """Sum over the last axis."""

    def forward(self, x: Any) -> Any:
        return x.sum(-1)


@dataclass
class Case:
    name: str
    model: Callable[[], nn.Module]
    x_shape: tuple[int, ...]
    flop: float
    torch_fn: Callable[[Any, Any], Callable[[], Any]] | None = None


def _matmul_cases(sizes: list[int]) -> list[Case]:
    out = []
    for n in sizes:
        out.append(
            Case(
                f"matmul x@W {n}^3",
                lambda n=n: MatMul(n, n),
                (n, n),
                2.0 * n**3,
                lambda torch, dev, n=n: _torch_mm(torch, dev, n, False),
            )
        )
        out.append(
            Case(
                f"linear x@W.T {n}^3",
                lambda n=n: nn.Linear(n, n, bias=False),
                (n, n),
                2.0 * n**3,
                lambda torch, dev, n=n: _torch_mm(torch, dev, n, True),
            )
        )
    return out


def _torch_mm(torch: Any, dev: Any, n: int, transposed: bool) -> Callable[[], Any]:
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    return (lambda: a @ b.T) if transposed else (lambda: a @ b)


CONVS = [  # (batch, in, out, size, kernel, stride, padding)
    (8, 3, 16, 32, 3, 1, 1),
    (8, 16, 32, 32, 3, 1, 1),
    (8, 32, 64, 16, 3, 1, 1),
    (8, 32, 32, 16, 3, 2, 1),
    (4, 16, 16, 28, 5, 1, 0),
]


def _conv_cases() -> list[Case]:
    out = []
    for b, c, o, s, k, st, p in CONVS:
        os_ = (s + 2 * p - k) // st + 1
        flop = 2.0 * b * o * os_ * os_ * c * k * k

        def torch_fn(torch: Any, dev: Any, b=b, c=c, o=o, s=s, k=k, st=st, p=p) -> Callable[[], Any]:
            x = torch.randn(b, c, s, s, device=dev)
            w = torch.randn(o, c, k, k, device=dev)
            return lambda: torch.nn.functional.conv2d(x, w, stride=st, padding=p)

        out.append(
            Case(
                f"conv {b}x{c}x{s}x{s} -> {o} k{k} s{st} p{p}",
                lambda c=c, o=o, k=k, st=st, p=p: nn.Conv2d(c, o, k, stride=st, padding=p, bias=False),
                (b, c, s, s),
                flop,
                torch_fn,
            )
        )
    return out


def _reduce_cases() -> list[Case]:
    rows, n = 64, 1 << 16

    def torch_fn(torch: Any, dev: Any) -> Callable[[], Any]:
        x = torch.randn(rows, n, device=dev)
        return lambda: x.sum(-1)

    return [Case(f"sum ({rows}, {n}) over last axis", Sum, (rows, n), float(rows * n), torch_fn)]


def time_gl(case: Case, target: str, seconds: float, ctx: Any, **limits: Any) -> tuple[float, int]:
    """Milliseconds per pass of the predict draws, and the number of draws per pass (`limits`:
    target limits such as max_draw_buffers, which decide the matmul's block shape)."""
    model = case.model()
    prog = glcomp.compile(model, {"x": case.x_shape}, target=target, **limits)
    rt = prog.runtime("gl", ctx=ctx)
    x = np.random.default_rng(0).standard_normal(case.x_shape).astype(np.float32)
    rt.run("predict", {"x": x}, read=[])  # upload the input and compile (first draw JITs)
    draws = rt.manifest["entries"]["predict"]["draws"]
    # Raw draws outside a runtime call: the context must be current (and the GL lock held), or
    # the draws and finish() would go nowhere.
    with current_context(rt.ctx):
        rt.ctx.finish()
        t0 = time.perf_counter()
        for d in draws:
            rt._draw(d)
        rt.ctx.finish()
        once = time.perf_counter() - t0
        reps = max(1, min(200, int(seconds / max(once, 1e-6))))
        t0 = time.perf_counter()
        for _ in range(reps):
            for d in draws:
                rt._draw(d)
        rt.ctx.finish()
        ms = (time.perf_counter() - t0) / reps * 1e3
    rt.release()
    return ms, len(draws)


PLAIN = """#version 300 es
precision highp float;
precision highp int;
uniform sampler2D A;
uniform sampler2D B;
out vec4 o;
void main() {
  int row = int(gl_FragCoord.y);
  int c = int(gl_FragCoord.x) * 4;
  vec4 acc = vec4(0.0);
  for (int k = 0; k < K4; k++) {
    vec4 a = texelFetch(A, ivec2(k, row), 0);
    acc.x += dot(a, texelFetch(B, ivec2(k, c), 0));
    acc.y += dot(a, texelFetch(B, ivec2(k, c + 1), 0));
    acc.z += dot(a, texelFetch(B, ivec2(k, c + 2), 0));
    acc.w += dot(a, texelFetch(B, ivec2(k, c + 3), 0));
  }
  o = acc;
}
"""


def time_plain(n: int, seconds: float, ctx: Any) -> float:
    """The hand-written vec4-dot shader of A (n x n/4 texels) and the rows of W, in textures shaped
    for it (not glcomp's layout): a yardstick for the generated matmul kernels."""
    with current_context(ctx):
        return _time_plain(n, seconds, ctx)


def _time_plain(n: int, seconds: float, ctx: Any) -> float:
    import moderngl

    vert = "#version 300 es\nin vec2 p;\nvoid main() { gl_Position = vec4(p, 0.0, 1.0); }\n"
    prog = ctx.program(vertex_shader=vert, fragment_shader=PLAIN.replace("K4", str(n // 4)))
    rng = np.random.default_rng(0)
    texs = []
    for unit, name in enumerate(("A", "B")):
        t = ctx.texture((n // 4, n), 4, rng.standard_normal(n * n).astype(np.float32).tobytes(), dtype="f4")
        t.filter = (moderngl.NEAREST, moderngl.NEAREST)
        t.use(location=unit)
        prog[name].value = unit
        texs.append(t)
    out = ctx.texture((n // 4, n), 4, dtype="f4")
    fbo = ctx.framebuffer(color_attachments=[out])
    vbo = ctx.buffer(np.array([-1, -1, 3, -1, -1, 3], np.float32).tobytes())
    vao = ctx.vertex_array(prog, [(vbo, "2f", "p")])
    fbo.use()
    ctx.viewport = (0, 0, n // 4, n)

    def draw() -> None:
        vao.render(moderngl.TRIANGLES, vertices=3)

    draw()
    ctx.finish()
    t0 = time.perf_counter()
    draw()
    ctx.finish()
    reps = max(1, min(200, int(seconds / max(time.perf_counter() - t0, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(reps):
        draw()
    ctx.finish()
    ms = (time.perf_counter() - t0) / reps * 1e3
    for obj in [vao, vbo, fbo, out, *texs, prog]:
        obj.release()
    return ms


def time_torch(case: Case, torch: Any, dev: Any, seconds: float) -> float:
    fn = case.torch_fn(torch, dev)
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    once = time.perf_counter() - t0
    reps = max(3, min(1000, int(seconds / max(once, 1e-6))))
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="add matmul n = 2048 and 4096")
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes (matmul,linear,conv,sum)")
    ap.add_argument("--webgl1", action="store_true", help="compile for GLSL ES 1.00 instead of 3.00")
    ap.add_argument("--seconds", type=float, default=1.0, help="target duration of each timed run")
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--plain", action="store_true", help="also time a hand-written vec4-dot matmul shader")
    ap.add_argument(
        "--draw-buffers", type=int, default=0, help="the target's max_draw_buffers (default: the preset's)"
    )
    args = ap.parse_args()

    sizes = [256, 512, 1024] + ([2048, 4096] if args.large else [])
    cases = _matmul_cases(sizes) + _conv_cases() + _reduce_cases()
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(","))
        cases = [c for c in cases if c.name.startswith(prefixes)]

    from glcomp.runtime.gl import context_info, create_context

    ctx = create_context()
    renderer = context_info(ctx)["renderer"]
    torch = dev = None
    try:
        import torch as _torch

        if _torch.cuda.is_available():
            torch, dev = _torch, _torch.device("cuda")
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
    except ImportError:
        pass

    target = "webgl1" if args.webgl1 else "webgl2"
    limits_note = f", max_draw_buffers={args.draw_buffers}" if args.draw_buffers else ""
    device = torch.cuda.get_device_name() if torch else "not available"
    print(f"GL: {renderer} ({target}{limits_note}); torch: {device}")
    head = f"{'case':<36} {'draws':>5} {'GL ms':>10} {'GL GFLOP/s':>11}"
    if torch:
        head += f" {'torch ms':>10} {'torch GFLOP/s':>14}"
    print(head)
    rows = []
    for case in cases:
        limits = {"max_draw_buffers": args.draw_buffers} if args.draw_buffers else {}
        ms, ndraws = time_gl(case, target, args.seconds, ctx, **limits)
        row: dict[str, Any] = {
            "case": case.name,
            "draws": ndraws,
            "gl_ms": ms,
            "gl_gflops": case.flop / ms / 1e6,
        }
        line = f"{case.name:<36} {ndraws:>5} {ms:>10.3f} {row['gl_gflops']:>11.3f}"
        if torch and case.torch_fn:
            tms = time_torch(case, torch, dev, min(args.seconds, 0.5))
            row |= {"torch_ms": tms, "torch_gflops": case.flop / tms / 1e6}
            line += f" {tms:>10.4f} {row['torch_gflops']:>14.1f}"
        print(line, flush=True)
        rows.append(row)
    if args.plain:
        for n in sizes:
            ms = time_plain(n, args.seconds, ctx)
            row = {
                "case": f"plain vec4-dot shader {n}^3",
                "draws": 1,
                "gl_ms": ms,
                "gl_gflops": 2.0 * n**3 / ms / 1e6,
            }
            print(f"{row['case']:<36} {1:>5} {ms:>10.3f} {row['gl_gflops']:>11.3f}", flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"renderer": renderer, "target": target, "draw_buffers": args.draw_buffers, "rows": rows},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
