"""Single-kernel benchmarks: matmul, conv2d (forward, input and weight gradient) and a long reduction
on the GL runtime (and torch), against the fragment shader's FMA ceiling.

    python benchmarks/kernels.py                      # matmul n = 256, 512, 1024, conv layers, a reduction
    python benchmarks/kernels.py --large              # also matmul n = 2048, 4096
    python benchmarks/kernels.py --only matmul --webgl1 --json out.json
    python benchmarks/kernels.py --only linear --plain    # with a hand-written vec4-dot shader as yardstick
    python benchmarks/kernels.py --only conv --realistic --target webgl2-gpu

Matmul and reduction cases compile a one-op model for `predict`, upload its inputs once and then
time its draws (the loop kernel and any epilogue): one warm-up pass with ``ctx.finish()``, then
`reps` passes issued back to back with a single ``ctx.finish()`` at the end, `reps` chosen so the
timed run lasts about ``--seconds``.

Convolution cases are the small batch-8 inference layers of CONVS and, with ``--realistic`` (off by
default: they take minutes on a CPU rasterizer), the layers of benchmarks/realistic.py's workloads
in REALISTIC_CONVS (VGG-wide b64, ResNet b32 with its stride-2 conv and 1x1 shortcut, MobileNet's
depthwise 3x3 and pointwise 1x1 b32, the hourglass's stride-2 ConvTranspose2d b8); ``--batch``
overrides their batch size. Each is one layer (no bias) applied to its input held as a parameter
(so that glcomp differentiates it), compiled once with the loss sum(output * y); its three
passes are timed as above, from draws of that program:

- ``fwd``: the draws of the `predict` entry point (the layer's kernel and its epilogue);
- ``dx``: the draws of the `gradients` entry point that grad:x depends on (through the textures
  draws write and read, in draw order) and neither the loss nor grad:conv.weight does (the
  input-gradient kernel and its epilogue);
- ``dw``: likewise the draws only grad:conv.weight depends on (the weight-gradient kernel, its
  partial sums over batch chunks and its reshape).

Left out of both: the forward, the loss' product and sum (the loss needs them) and the draw
writing the upstream gradient (y times the loss' unit gradient), which both gradients read as a
layer's gradients read the next layer's in a real backward. When glcomp's mrt pass merges the
two gradient kernels into one draw of two outputs (it does for small layers), no split by draw
can attribute it: that layer is compiled again with ``passes={"mrt": False}`` and its dx and dw
are marked ``*``. dx and dw are replayed after one whole `gradients` call, so every texture they
read holds its value.

FLOP of each pass: 2 * B * O * OH * OW * C * KH * KW / groups (a ConvTranspose2d counted as the
convolution it is the input gradient of: its input positions in place of OH * OW).

GFLOP/s counts one multiply-add as 2 FLOP (a reduction element as 1); "% ceil" is that rate as a
share of benchmarks/gl_peak.py's fragment FMA shader, measured on the same context at the start of
the run (benchmarks/realistic.py's fma_ceiling; ``--ceiling`` gives it instead, since it takes a
minute and a half on llvmpipe). ``--target`` picks glcomp's target preset (glcomp.codegen.target:
webgl2, webgl2-gpu, webgl1, ...). When PyTorch with CUDA is importable, the same op runs on the GPU
in the same process (FP32, TF32 off), timed with CUDA synchronisation: a conv's fwd is
torch.nn.functional.conv2d (conv_transpose2d), its dx and dw the two pieces of its autograd
backward, aten.convolution_backward with only the input's or only the weight's output.
``--json`` writes the rows with the renderer, the target and the ceiling.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

import glcomp
from glcomp import nn
from glcomp.codegen.target import TARGETS
from glcomp.runtime.gl import current_context

BENCHMARKS = str(Path(__file__).resolve().parent)
if BENCHMARKS not in sys.path:  # realistic.py and gl_peak.py, when imported from elsewhere
    sys.path.insert(0, BENCHMARKS)

from realistic import fma_ceiling  # noqa: E402


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


CONVS = [  # (batch, in, out, size, kernel, stride, padding): small inference layers
    (8, 3, 16, 32, 3, 1, 1),
    (8, 16, 32, 32, 3, 1, 1),
    (8, 32, 64, 16, 3, 1, 1),
    (8, 32, 32, 16, 3, 2, 1),
    (4, 16, 16, 28, 5, 1, 0),
]

# The convolution layers of benchmarks/realistic.py's workloads, at their table batch sizes:
# (workload, batch, in, out, (height, width), kernel, stride, padding, groups, transposed).
REALISTIC_CONVS: list[tuple[str, int, int, int, tuple[int, int], int, int, int, int, bool]] = [
    ("vgg_wide", 64, 3, 64, (32, 32), 3, 1, 1, 1, False),
    ("vgg_wide", 64, 64, 64, (32, 32), 3, 1, 1, 1, False),
    ("vgg_wide", 64, 64, 128, (16, 16), 3, 1, 1, 1, False),
    ("vgg_wide", 64, 128, 128, (16, 16), 3, 1, 1, 1, False),
    ("resnet", 32, 32, 32, (32, 32), 3, 1, 1, 1, False),
    ("resnet", 32, 32, 64, (32, 32), 3, 2, 1, 1, False),  # the first 64-wide block's conv1
    ("resnet", 32, 32, 64, (32, 32), 1, 2, 0, 1, False),  # its 1x1 projection shortcut
    ("resnet", 32, 64, 64, (16, 16), 3, 1, 1, 1, False),
    ("mobilenet", 32, 32, 32, (32, 32), 3, 1, 1, 32, False),  # depthwise (groups = channels)
    ("mobilenet", 32, 32, 64, (32, 32), 1, 1, 0, 1, False),  # its pointwise 1x1
    ("hourglass", 8, 128, 64, (12, 16), 4, 2, 1, 1, True),  # the first ConvTranspose2d stage up
]

PASSES = ("fwd", "dx", "dw")


@dataclass
class ConvCase:
    """One convolution layer (no bias): Conv2d, or ConvTranspose2d when `transposed`, on an input
    of (batch, cin, height, width)."""

    batch: int
    cin: int
    cout: int
    hw: tuple[int, int]
    kernel: int
    stride: int
    padding: int
    groups: int = 1
    transposed: bool = False
    workload: str = ""  # the benchmarks/realistic.py workload the layer comes from

    @property
    def name(self) -> str:
        kind = "convT" if self.transposed else "conv"
        h, w = self.hw
        group = f" g{self.groups}" if self.groups > 1 else ""
        tail = f" ({self.workload})" if self.workload else ""
        shape = f"{self.batch}x{self.cin}x{h}x{w} -> {self.cout}"
        return f"{kind} {shape} k{self.kernel} s{self.stride} p{self.padding}{group}{tail}"

    @property
    def out_hw(self) -> tuple[int, int]:
        k, s, p = self.kernel, self.stride, self.padding
        if self.transposed:
            return tuple((n - 1) * s - 2 * p + k for n in self.hw)  # type: ignore[return-value]
        return tuple((n + 2 * p - k) // s + 1 for n in self.hw)  # type: ignore[return-value]

    @property
    def flop(self) -> float:
        """FLOPs of the forward, and of each gradient: 2 * B * O * OH * OW * C * KH * KW / groups
        of the convolution; a transposed convolution is the input gradient of the convolution from
        its output to its input, so counted as that one (2 * B * C * H * W * O * KH * KW / groups)."""
        oh, ow = self.hw if self.transposed else self.out_hw
        return 2.0 * self.batch * self.cout * oh * ow * self.cin * self.kernel**2 / self.groups

    def model(self) -> nn.Module:
        """The layer on its input held as a parameter (_LayerOnInput)."""
        return _LayerOnInput(self)

    def compile(self, target: str = "webgl2", **options: Any) -> glcomp.Program:
        """The layer compiled with the loss sum(output * y) (`options`: glcomp.compile's)."""
        return glcomp.compile(self.model(), {"z": (1,)}, loss=_dot_loss, target=target, **options)

    @property
    def backward_ops(self) -> dict[str, str]:
        """The IR op of each gradient's kernel (a ConvTranspose2d is conv2d_input_grad forward)."""
        return {"dx": "conv2d" if self.transposed else "conv2d_input_grad", "dw": "conv2d_weight_grad"}

    def torch_passes(self, torch: Any, dev: Any) -> dict[str, Callable[[], Any]]:
        """The forward (torch.nn.functional.conv2d / conv_transpose2d) and the two pieces of its
        autograd backward (aten.convolution_backward with output_mask input-only / weight-only)."""
        f = torch.nn.functional
        x = torch.randn(self.batch, self.cin, *self.hw, device=dev)
        k, st, p, g = self.kernel, self.stride, self.padding, self.groups
        shape = (self.cin, self.cout // g, k, k) if self.transposed else (self.cout, self.cin // g, k, k)
        w = torch.randn(*shape, device=dev)
        if self.transposed:

            def fwd() -> Any:
                return f.conv_transpose2d(x, w, stride=st, padding=p, groups=g)
        else:

            def fwd() -> Any:
                return f.conv2d(x, w, stride=st, padding=p, groups=g)

        gy = torch.randn_like(fwd())
        back = torch.ops.aten.convolution_backward

        def grad(mask: list[bool]) -> Callable[[], Any]:
            return lambda: back(gy, x, w, None, [st, st], [p, p], [1, 1], self.transposed, [0, 0], g, mask)

        return {"fwd": fwd, "dx": grad([True, False, False]), "dw": grad([False, True, False])}


class _LayerOnInput(nn.Module):
    """The layer applied to its input held as a parameter `x`, so that `gradients` computes the
    input's gradient (grad:x) as it computes the weight's (grad:conv.weight). `z`, the data input
    the compiler needs, is unused."""

    def __init__(self, case: ConvCase) -> None:
        super().__init__()
        shape = (case.batch, case.cin, *case.hw)
        self.x = nn.Parameter(np.random.default_rng(0).standard_normal(shape).astype(np.float32))
        layer = nn.ConvTranspose2d if case.transposed else nn.Conv2d
        self.conv = layer(
            case.cin,
            case.cout,
            case.kernel,
            stride=case.stride,
            padding=case.padding,
            groups=case.groups,
            bias=False,
        )

    def forward(self, z: Any) -> Any:
        return self.conv(self.x)


def _dot_loss(out: Any, y: Any) -> Any:
    """sum(out * y): its gradient in `out` is the target `y`, written by one elementwise draw that
    both gradients read, as a layer's gradients read the upstream gradient in a real backward."""
    return (out * y).sum()


def _conv_cases(realistic: bool = False, batch: int = 0) -> list[ConvCase]:
    """The small layers of CONVS, then with `realistic` those of REALISTIC_CONVS; `batch` (when
    non-zero) replaces every case's batch size."""
    cases = [ConvCase(b, c, o, (s, s), k, st, p) for b, c, o, s, k, st, p in CONVS]
    if realistic:
        cases += [
            ConvCase(b, c, o, hw, k, st, p, g, t, w) for w, b, c, o, hw, k, st, p, g, t in REALISTIC_CONVS
        ]
    if batch:
        cases = [replace(case, batch=batch) for case in cases]
    return cases


def _writers(draws: list[dict[str, Any]]) -> tuple[list[set[int]], dict[str, int]]:
    """Each draw's producers (the draws that last wrote a texture it samples, or a target it blends
    into) and each texture's last writer, walking the draws in order (textures are reused)."""
    last: dict[str, int] = {}
    deps: list[set[int]] = []
    for i, d in enumerate(draws):
        reads = [ref for ref in d["samplers"].values() if isinstance(ref, str)]  # dicts: state textures
        if d.get("blend"):
            reads += d["targets"]
        deps.append({last[t] for t in reads if t in last})
        for t in d["targets"]:
            last[t] = i
    return deps, last


def _ancestors(deps: list[set[int]], roots: set[int]) -> set[int]:
    """`roots` and every draw they depend on, directly or not."""
    seen, stack = set(), list(roots)
    while stack:
        i = stack.pop()
        if i not in seen:
            seen.add(i)
            stack.extend(deps[i])
    return seen


def _root_op(kernel: str) -> str:
    """The op computing a kernel's output: "k5_conv2d_weight_grad+k6" -> "conv2d_weight_grad"."""
    return kernel.split("_", 1)[1].split("+", 1)[0]


def split_gradient_draws(entry: dict[str, Any]) -> dict[str, list[int]]:
    """The indices of the `gradients` entry's draws that only the input gradient needs ("dx") and
    only the weight gradient needs ("dw"): the draws grad:x (grad:conv.weight) depends on, through
    the textures they write and read in draw order, less those the loss or the other gradient
    depends on (the forward, the loss' product and sum, the upstream gradient)."""
    deps, last = _writers(entry["draws"])

    def needs(name: str) -> set[int]:
        return _ancestors(deps, {last[t] for t in entry["outputs"][name]["textures"] if t in last})

    loss, gx, gw = needs("loss"), needs("grad:x"), needs("grad:conv.weight")
    return {"dx": sorted(gx - loss - gw), "dw": sorted(gw - loss - gx)}


def is_clean(case: ConvCase, entry: dict[str, Any], split: dict[str, list[int]]) -> bool:
    """Whether each pass's draws hold its gradient's kernel and the draw that writes the gradient:
    not when glcomp's mrt pass merged the input- and weight-gradient kernels into one draw (both
    gradients need it: neither pass has it). The kernel is the convolution's (case.backward_ops)
    or, where the pointwise pass made a 1x1 convolution a product, a matmul (a tiled product's
    block draw is named for the op it is fused into, with "_mm": "k4_reshape_mm")."""
    ops = [_root_op(d["kernel"]) for d in entry["draws"]]
    _, last = _writers(entry["draws"])
    for name, output in (("dx", "grad:x"), ("dw", "grad:conv.weight")):
        kernels = {ops[i] for i in split[name]}
        if not any(op in (case.backward_ops[name], "matmul") or op.endswith("_mm") for op in kernels):
            return False
        writers = {last[t] for t in entry["outputs"][output]["textures"] if t in last}
        if not writers or not writers <= set(split[name]):
            return False
    return True


def time_draws(rt: Any, draws: list[dict[str, Any]], seconds: float) -> float:
    """Milliseconds per pass of `draws` (already drawn once, so their programs are compiled and
    their inputs written): one pass with ``ctx.finish()`` to size the run, then `reps` passes back
    to back and one ``ctx.finish()``."""
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
        return (time.perf_counter() - t0) / reps * 1e3


NO_MRT = {"passes": {"mrt": False}}


def plan_conv(
    case: ConvCase, target: str = "webgl2", **limits: Any
) -> tuple[Any, dict[str, list[int]], bool]:
    """The layer's program, the split of its gradient draws and whether the mrt pass was switched
    off: only when the split is not clean with it on (is_clean)."""
    prog = case.compile(target, **limits)
    entry = prog.bundle().manifest["entries"]["gradients"]
    split = split_gradient_draws(entry)
    if is_clean(case, entry, split):
        return prog, split, False
    prog = case.compile(target, **limits, **NO_MRT)
    entry = prog.bundle().manifest["entries"]["gradients"]
    split = split_gradient_draws(entry)
    if not is_clean(case, entry, split):
        kernels = [d["kernel"] for d in entry["draws"]]
        raise RuntimeError(f"{case.name}: no clean split of the gradient draws {kernels} into {split}")
    return prog, split, True


def time_conv_gl(
    case: ConvCase, target: str, seconds: float, ctx: Any, **limits: Any
) -> tuple[dict[str, tuple[float, int]], bool]:
    """Per pass (fwd, dx, dw): milliseconds and number of draws, and whether the mrt pass was off
    (plan_conv). fwd is the `predict` entry's draws; dx and dw the draws of `gradients` that
    split_gradient_draws gives them, replayed after one whole `gradients` call has written every
    texture they read."""
    prog, split, no_mrt = plan_conv(case, target, **limits)
    rt = prog.runtime("gl", ctx=ctx)
    rng = np.random.default_rng(0)
    z = np.zeros((1,), np.float32)
    y = rng.standard_normal((case.batch, case.cout, *case.out_hw)).astype(np.float32)
    entries = rt.manifest["entries"]
    out: dict[str, tuple[float, int]] = {}
    try:
        rt.run("predict", {"z": z}, read=[])  # compiles the programs (first draw JITs)
        fwd = entries["predict"]["draws"]
        out["fwd"] = (time_draws(rt, fwd, seconds), len(fwd))
        rt.run("gradients", {"z": z, "y": y}, read=[])
        draws = entries["gradients"]["draws"]
        for name, idx in split.items():
            chosen = [draws[i] for i in idx]
            out[name] = (time_draws(rt, chosen, seconds), len(chosen))
    finally:
        rt.release()
    return out, no_mrt


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
    ms = time_draws(rt, draws, seconds)
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


def time_torch(fn: Callable[[], Any], torch: Any, seconds: float) -> float:
    """Milliseconds per call of `fn` on CUDA: three warm-up calls, one to size the run, then
    `reps` back to back with one synchronisation at the end."""
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


def _cuda_torch() -> tuple[Any, Any]:
    """torch and its CUDA device with TF32 off, or (None, None) without torch or CUDA."""
    try:
        import torch
    except ImportError:
        return None, None
    if not torch.cuda.is_available():
        return None, None
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch, torch.device("cuda")


HEAD = f"{'case':<52} {'pass':<4} {'draws':>5} {'GL ms':>10} {'GFLOP/s':>9} {'% ceil':>7}"


def _row(name: str, pass_: str, ndraws: int, ms: float, flop: float, ceiling: float) -> dict[str, Any]:
    gflops = flop / ms / 1e6
    row = {"case": name, "pass": pass_, "draws": ndraws, "gl_ms": ms, "gl_gflops": gflops}
    return row | {"pct_of_ceiling": 100 * gflops / (ceiling * 1e3)}


def _line(row: dict[str, Any]) -> str:
    line = f"{row['case']:<52} {row['pass']:<4} {row['draws']:>5} {row['gl_ms']:>10.3f}"
    line += f" {row['gl_gflops']:>9.3f} {row['pct_of_ceiling']:>7.2f}"
    if "torch_ms" in row:
        line += f" {row['torch_ms']:>10.4f} {row['torch_gflops']:>14.1f}"
    return line


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    """Run the cases the arguments select, print the table and return its rows."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--large", action="store_true", help="add matmul n = 2048 and 4096")
    ap.add_argument("--only", default="", help="comma-separated case-name prefixes (matmul,linear,conv,sum)")
    ap.add_argument("--target", default="webgl2", choices=TARGETS, help="compile target (glcomp's presets)")
    ap.add_argument("--webgl1", action="store_true", help="the same as --target webgl1")
    ap.add_argument("--realistic", action="store_true", help="add the conv layers of benchmarks/realistic.py")
    ap.add_argument("--batch", type=int, default=0, help="override every conv case's batch size")
    ap.add_argument("--seconds", type=float, default=1.0, help="target duration of each timed run")
    ap.add_argument(
        "--ceiling", type=float, default=0.0, help="the fragment FMA ceiling in TFLOP/s (default: measure it)"
    )
    ap.add_argument("--json", help="write the rows to this file")
    ap.add_argument("--plain", action="store_true", help="also time a hand-written vec4-dot matmul shader")
    ap.add_argument(
        "--draw-buffers", type=int, default=0, help="the target's max_draw_buffers (default: the preset's)"
    )
    args = ap.parse_args(argv)

    sizes = [256, 512, 1024] + ([2048, 4096] if args.large else [])
    cases: list[Case | ConvCase] = [*_matmul_cases(sizes), *_conv_cases(args.realistic, args.batch)]
    cases += _reduce_cases()
    if args.only:
        prefixes = tuple(p.strip() for p in args.only.split(","))
        cases = [c for c in cases if c.name.startswith(prefixes)]

    from glcomp.runtime.gl import context_info, create_context

    ctx = create_context()
    renderer = context_info(ctx)["renderer"]
    torch, dev = _cuda_torch()
    target = "webgl1" if args.webgl1 else args.target
    if args.ceiling:
        ceiling, how = args.ceiling, "given"
    else:
        with current_context(ctx):
            ceiling, how = fma_ceiling(ctx), "measured"
    limits_note = f", max_draw_buffers={args.draw_buffers}" if args.draw_buffers else ""
    device = torch.cuda.get_device_name() if torch else "not available"
    print(
        f"GL: {renderer} ({target}{limits_note}); fragment FMA ceiling {ceiling:.4f} TFLOP/s ({how}); "
        f"torch: {device}"
    )
    head = HEAD + (f" {'torch ms':>10} {'torch GFLOP/s':>14}" if torch else "")
    print(head)
    limits = {"max_draw_buffers": args.draw_buffers} if args.draw_buffers else {}
    rows = []
    for case in cases:
        if isinstance(case, ConvCase):
            timed, no_mrt = time_conv_gl(case, target, args.seconds, ctx, **limits)
            fns = case.torch_passes(torch, dev) if torch else {}
            mark = "*" if no_mrt else ""
            passes = [(p + mark * (p != "fwd"), *timed[p], case.flop, fns.get(p)) for p in PASSES]
        else:
            ms, ndraws = time_gl(case, target, args.seconds, ctx, **limits)
            fn = case.torch_fn(torch, dev) if torch and case.torch_fn else None
            passes = [("fwd", ms, ndraws, case.flop, fn)]
        for pass_, ms, ndraws, flop, fn in passes:
            row = _row(case.name, pass_, ndraws, ms, flop, ceiling)
            if pass_.endswith("*"):
                row["mrt_off"] = True
            if fn is not None:
                tms = time_torch(fn, torch, min(args.seconds, 0.5))
                row |= {"torch_ms": tms, "torch_gflops": flop / tms / 1e6}
            print(_line(row), flush=True)
            rows.append(row)
    if any(r.get("mrt_off") for r in rows):
        print("*: the input- and weight-gradient kernels shared a draw (mrt pass): timed with mrt off")
    if args.plain:
        for n in sizes:
            ms = time_plain(n, args.seconds, ctx)
            row = _row(f"plain vec4-dot shader {n}^3", "fwd", 1, ms, 2.0 * n**3, ceiling)
            print(_line(row), flush=True)
            rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            record = {"renderer": renderer, "target": target, "draw_buffers": args.draw_buffers}
            record |= {"ceiling_tflops": ceiling, "rows": rows}
            json.dump(record, f, indent=1)
    ctx.release()
    return rows


if __name__ == "__main__":
    main()
