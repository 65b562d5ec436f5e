"""Training steps of models at the sizes people fine-tune, against the device's fragment ceiling.

    python benchmarks/realistic.py                       # every workload, GL (and torch CUDA if present)
    python benchmarks/realistic.py --only gpt_medium --steps 10 --out results.json

For each workload: glcomp's GL train step (ms, median of `--steps` after warm-up, one finish per
step through the loss read-back), its draws per train step and per predict, the FLOPs of one step
counted by torch's FlopCounterMode on the torch twin of the model (forward + backward), GFLOP/s and
that rate as a share of the fragment-shader FMA ceiling measured in the same process
(benchmarks/gl_peak.py's shader), and torch eager on CUDA when a GPU is present. The GPT workloads
are `examples/char_gpt.py` itself with its configuration changed (its torch twin is the same source
with torch's imports).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

import glcomp  # noqa: E402
from glcomp import nn, optim  # noqa: E402

EXAMPLE = ROOT / "examples" / "char_gpt.py"
GLCOMP_IMPORTS = "import glcomp as torch\nfrom glcomp import nn\nfrom glcomp.nn import functional as F\n"
TORCH_IMPORTS = "import torch\nfrom torch import nn\nfrom torch.nn import functional as F\n"


def char_gpt(library: str, **config: Any) -> ModuleType:
    """examples/char_gpt.py run from its source with `library`'s imports, `config` set."""
    source = EXAMPLE.read_text(encoding="utf-8")
    if library == "torch":
        source = source.replace(GLCOMP_IMPORTS, TORCH_IMPORTS)
    module = ModuleType(f"char_gpt_{library}")
    module.__file__ = str(EXAMPLE)
    exec(compile(source, str(EXAMPLE), "exec"), module.__dict__)  # the repository's own example
    module.__dict__.update(config)
    return module


@dataclass
class Realistic:
    """A workload: how to compile it in glcomp, its batch, and its torch twin with a batch."""

    name: str
    description: str
    compile: Callable[[], glcomp.Program]
    batch: Callable[[], dict[str, np.ndarray]]
    torch_twin: Callable[[str], tuple[Any, Callable[[], Any]]]  # device -> (model, one step)
    flops: Callable[[], float] | None = None  # FLOPs of a step where FlopCounterMode counts none


# Compile options every workload is built with (``--storage f16`` sets {"storage": "f16"}).
OPTIONS: dict[str, Any] = {}


def _gpt(name: str, batch: int, block: int, embd: int, heads: int, layers: int) -> Realistic:
    config = {"batch_size": batch, "block_size": block, "n_embd": embd, "n_head": heads, "n_layer": layers}
    config["dropout"] = 0.0

    def make() -> glcomp.Program:
        g = char_gpt("glcomp", **config)
        glcomp.manual_seed(0)
        model = g.GPTLanguageModel()
        spec = {"shape": (batch, block), "dtype": "int32", "num_classes": g.vocab_size}
        opt = g.torch.optim.AdamW(model.parameters(), lr=3e-4)
        shapes = {"idx": (batch, block)}
        return glcomp.compile(
            model, shapes, "forward", opt, target_name="targets", target_spec=spec, **OPTIONS
        )

    def data() -> dict[str, np.ndarray]:
        g = char_gpt("glcomp", **config)
        rng = np.random.default_rng(0)
        ids = rng.integers(0, g.vocab_size, size=(batch, block + 1))
        return {"idx": ids[:, :-1].astype(np.int32), "targets": ids[:, 1:].astype(np.int32)}

    def twin(device: str) -> tuple[Any, Callable[[], Any]]:
        import torch

        t = char_gpt("torch", **config, device=device)  # the example places its arange on `device`
        model = t.GPTLanguageModel().to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
        d = data()
        idx = torch.tensor(d["idx"], dtype=torch.long, device=device)
        tgt = torch.tensor(d["targets"], dtype=torch.long, device=device)

        def step() -> Any:
            opt.zero_grad()
            _, loss = model(idx, tgt)
            loss.backward()
            opt.step()
            return loss

        return model, step

    desc = f"char-GPT b{batch}, block {block}, embd {embd}, {heads} heads, {layers} layers, AdamW"
    return Realistic(name, desc, make, data, twin)


def _vgg_layers(lib: Any, widths: tuple[int, int], fc: int) -> list[Any]:
    a, b = widths
    convs = [(3, a), (a, a), "pool", (a, b), (b, b), "pool"]
    layers: list[Any] = []
    for c in convs:
        layers += [lib.MaxPool2d(2)] if c == "pool" else [lib.Conv2d(*c, 3, padding=1), lib.ReLU()]
    return [*layers, lib.Flatten(), lib.Linear(b * 64, fc), lib.ReLU(), lib.Linear(fc, 10)]


def _residual_block(lib: Any, cin: int, cout: int, stride: int) -> Any:
    """A ResNet basic block (two 3x3 conv + BatchNorm, identity or 1x1 projection shortcut),
    written once for glcomp.nn and torch.nn (`lib`)."""

    class Block(lib.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = lib.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
            self.bn1 = lib.BatchNorm2d(cout)
            self.conv2 = lib.Conv2d(cout, cout, 3, padding=1, bias=False)
            self.bn2 = lib.BatchNorm2d(cout)
            self.relu = lib.ReLU()
            if stride != 1 or cin != cout:
                self.short = lib.Sequential(
                    lib.Conv2d(cin, cout, 1, stride=stride, bias=False), lib.BatchNorm2d(cout)
                )
            else:
                self.short = lib.Identity()

        def forward(self, x: Any) -> Any:
            y = self.relu(self.bn1(self.conv1(x)))
            return self.relu(self.bn2(self.conv2(y)) + self.short(x))

    return Block()


def _resnet_layers(lib: Any) -> list[Any]:
    stem = [lib.Conv2d(3, 32, 3, padding=1, bias=False), lib.BatchNorm2d(32), lib.ReLU()]
    blocks = [_residual_block(lib, 32, 32, 1), _residual_block(lib, 32, 32, 1)]
    blocks += [_residual_block(lib, 32, 64, 2), _residual_block(lib, 64, 64, 1)]
    return [*stem, *blocks, lib.AdaptiveAvgPool2d(1), lib.Flatten(), lib.Linear(64, 10)]


def _mobilenet_layers(lib: Any) -> list[Any]:
    """MobileNet-style: a 3x3 stem, then depthwise (groups = channels) 3x3 + pointwise 1x1
    blocks, each with BatchNorm and ReLU, widths 32-64-128-128-256."""

    def bn_relu(c: int) -> list[Any]:
        return [lib.BatchNorm2d(c), lib.ReLU()]

    layers = [lib.Conv2d(3, 32, 3, padding=1, bias=False), *bn_relu(32)]
    for cin, cout, stride in ((32, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2)):
        layers += [lib.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False), *bn_relu(cin)]
        layers += [lib.Conv2d(cin, cout, 1, bias=False), *bn_relu(cout)]
    return [*layers, lib.AdaptiveAvgPool2d(1), lib.Flatten(), lib.Linear(256, 10)]


def _hourglass_layers(lib: Any) -> list[Any]:
    """An hourglass encoder-decoder (the pose use case): three stride-2 conv stages down, three
    ConvTranspose2d stages up, 16 heat-map channels at the input resolution."""

    def down(cin: int, cout: int) -> list[Any]:
        return [lib.Conv2d(cin, cout, 3, stride=2, padding=1), lib.BatchNorm2d(cout), lib.ReLU()]

    def up(cin: int, cout: int) -> list[Any]:
        return [lib.ConvTranspose2d(cin, cout, 4, stride=2, padding=1), lib.BatchNorm2d(cout), lib.ReLU()]

    body = [*down(3, 32), *down(32, 64), *down(64, 128), lib.Conv2d(128, 128, 3, padding=1), lib.ReLU()]
    return [*body, *up(128, 64), *up(64, 32), *up(32, 32), lib.Conv2d(32, 16, 1)]


class _Recurrent:
    """LSTM(64 -> 256) over the sequence, a linear layer on the last step's output (both libs)."""

    @staticmethod
    def layers(lib: Any) -> list[Any]:
        class LastStep(lib.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = lib.LSTM(64, 256, batch_first=True)
                self.fc = lib.Linear(256, 10)

            def forward(self, x: Any) -> Any:
                out, _ = self.lstm(x)
                return self.fc(out[:, -1])

        return [LastStep()]


def _supervised(
    name: str,
    description: str,
    layers: Callable[[Any], list[Any]],
    x_shape: tuple[int, ...],
    optimizer: str,
    target: str = "classes",
    flops: Callable[[], float] | None = None,
) -> Realistic:
    """A workload of `layers` (built for glcomp.nn or torch.nn) on inputs of `x_shape` (batch
    first), trained with cross-entropy on 10 classes or (target "heatmaps") MSE against a target
    of the output's shape; optimizer "sgd" (momentum 0.9, lr 0.01) or "adam" (lr 1e-3)."""
    out_shape = (x_shape[0], 16, *x_shape[2:])

    def make_opt(lib: Any, params: Any = None) -> Any:
        if lib is optim:
            return optim.SGD(lr=0.01, momentum=0.9) if optimizer == "sgd" else optim.Adam(lr=1e-3)
        return lib.SGD(params, lr=0.01, momentum=0.9) if optimizer == "sgd" else lib.Adam(params, lr=1e-3)

    def make() -> glcomp.Program:
        glcomp.manual_seed(0)
        model = nn.Sequential(*layers(nn))
        loss = nn.MSELoss() if target == "heatmaps" else nn.CrossEntropyLoss()
        return glcomp.compile(model, {"x": x_shape}, loss=loss, optimizer=make_opt(optim), **OPTIONS)

    def data() -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        x = rng.normal(size=x_shape).astype(np.float32)
        if target == "heatmaps":
            return {"x": x, "y": rng.random(out_shape, dtype=np.float32)}
        return {"x": x, "y": rng.integers(0, 10, size=x_shape[0])}

    def twin(device: str) -> tuple[Any, Callable[[], Any]]:
        import torch

        model = torch.nn.Sequential(*layers(torch.nn)).to(device)
        opt = make_opt(torch.optim, model.parameters())
        d = data()
        x = torch.tensor(d["x"], device=device)
        y = torch.tensor(d["y"], device=device)
        if target != "heatmaps":
            y = y.long()
        lossf = torch.nn.functional.mse_loss if target == "heatmaps" else torch.nn.functional.cross_entropy

        def step() -> Any:
            opt.zero_grad()
            loss = lossf(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return model, step

    return Realistic(name, description, make, data, twin, flops)


def _vgg(name: str, batch: int, widths: tuple[int, int], fc: int) -> Realistic:
    a, b = widths
    desc = f"VGG-style 3x32x32 (conv {a},{a},pool,{b},{b},pool, fc {fc}) b{batch}, SGD momentum"
    return _supervised(name, desc, lambda lib: _vgg_layers(lib, widths, fc), (batch, 3, 32, 32), "sgd")


# name -> (builder of the workload at a batch size, its batch size in the table)
BUILDERS: dict[str, tuple[Callable[[int], Realistic], int]] = {
    "gpt_small": (lambda b: _gpt("gpt_small", b, 64, 128, 4, 2), 32),
    "gpt_medium": (lambda b: _gpt("gpt_medium", b, 128, 256, 4, 4), 32),
    "vgg": (lambda b: _vgg("vgg", b, (32, 64), 256), 32),
    "vgg_wide": (lambda b: _vgg("vgg_wide", b, (64, 128), 256), 64),
    "resnet": (
        lambda b: _supervised(
            "resnet",
            f"ResNet-style 3x32x32 (2 blocks at 32, 2 at 64, BatchNorm) b{b}, Adam",
            _resnet_layers,
            (b, 3, 32, 32),
            "adam",
        ),
        32,
    ),
    "mobilenet": (
        lambda b: _supervised(
            "mobilenet",
            f"MobileNet-style 3x32x32 (depthwise-separable 32-64-128-128-256, BatchNorm) b{b}, Adam",
            _mobilenet_layers,
            (b, 3, 32, 32),
            "adam",
        ),
        32,
    ),
    "lstm": (
        lambda b: _supervised(
            "lstm",
            f"LSTM(64 -> 256) over 32 steps, last output, Linear 256-10, b{b}, Adam",
            _Recurrent.layers,
            (b, 32, 64),
            "adam",
            flops=lambda: lstm_flops(b, 32, 64, 256, 10),
        ),
        32,
    ),
    "hourglass": (
        lambda b: _supervised(
            "hourglass",
            f"hourglass 3x96x128 -> 16 heat maps (ConvTranspose2d, BatchNorm) b{b}, Adam, MSE",
            _hourglass_layers,
            (b, 3, 96, 128),
            "adam",
            target="heatmaps",
        ),
        8,
    ),
}


def workload(name: str, batch: int | None = None) -> Realistic:
    """The workload `name` at `batch` (its table batch size when None)."""
    build, default = BUILDERS[name]
    return build(default if batch is None else batch)


WORKLOADS = {name: workload(name) for name in BUILDERS}


def fma_ceiling(ctx: Any) -> float:
    """The fragment path's FP32 multiply-add rate on `ctx` (TFLOP/s; gl_peak.py's 4-chain shader)."""
    import moderngl
    from gl_peak import VERT, fma_shader, timed

    size, n = 2048, 1024
    vbo = ctx.buffer(np.array([-1, -1, 3, -1, -1, 3], np.float32).tobytes())
    out = ctx.texture((size, size), 4, dtype="f4")
    fbo = ctx.framebuffer([out])
    prog = ctx.program(vertex_shader=VERT, fragment_shader=fma_shader(4))
    prog["b"].value, prog["c"].value, prog["n"].value = (0.999,) * 4, (1e-3,) * 4, n
    vao = ctx.vertex_array(prog, [(vbo, "2f", "p")])

    def draw() -> None:
        fbo.use()
        vao.render(moderngl.TRIANGLES)

    seconds = timed(ctx, draw, 5)
    for obj in (vao, prog, fbo, out, vbo):
        obj.release()
    return size * size * n * 4 * 8 / seconds / 1e12


def step_flops(w: Realistic) -> float:
    """FLOPs of one training step (forward + backward) of the torch twin, on the CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    if w.flops is not None:
        return w.flops()
    _, step = w.torch_twin("cpu")
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


def lstm_flops(batch: int, steps: int, inputs: int, hidden: int, classes: int) -> float:
    """FLOPs of an LSTM training step (FlopCounterMode does not count torch's fused LSTM): per
    time step the gate products x W_ih^T and h W_hh^T (2 B 4H (I + H) multiply-adds as FLOPs),
    the head's 2 B H K; backward twice the forward (both operands' gradients)."""
    forward = steps * 2 * batch * 4 * hidden * (inputs + hidden) + 2 * batch * hidden * classes
    return 3.0 * forward


def time_gl(w: Realistic, steps: int, ctx: Any) -> dict[str, Any]:
    start = time.perf_counter()
    prog = w.compile()
    compiled = time.perf_counter() - start
    rt = prog.runtime("gl", ctx=ctx)
    feeds = w.batch()
    entries = rt.manifest["entries"]
    record = {
        "compile_s": compiled,
        "draws_train_step": len(entries["train_step"]["draws"]),
        "draws_predict": len(entries["predict"]["draws"]),
    }
    for _ in range(2):  # warm-up: programs compile at their first draw
        rt.train_step(**feeds)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        rt.train_step(**feeds)  # reads the loss back: the step has finished
        times.append(time.perf_counter() - t0)
    rt.release()
    return record | {"ms": float(np.median(times)) * 1e3, "ms_min": min(times) * 1e3}


def profile(w: Realistic, ctx: Any, top: int = 15, reps: int = 20) -> str:
    """Where one train step's time goes, per kernel: after two warm-up steps (the first renders
    into each state texture's second copy: slow first renders), each draw of a step is timed
    alone (``ctx.finish()`` before and after) and `reps` times back to back (one finish after
    them, so its cost in a stream of draws). The back-to-back times add up to the step's time;
    the costliest kernels first."""
    from glcomp.runtime.gl import current_context

    rt = w.compile().runtime("gl", ctx=ctx)
    feeds = w.batch()
    for _ in range(2):
        rt.train_step(**feeds)
    t0 = time.perf_counter()
    rt.train_step(**feeds)
    step_ms = (time.perf_counter() - t0) * 1e3
    alone: dict[str, float] = {}
    stream: dict[str, float] = {}
    shape: dict[str, str] = {}
    with current_context(rt.ctx):
        for d in rt.manifest["entries"]["train_step"]["draws"]:
            k = d["kernel"]
            ctx.finish()
            t0 = time.perf_counter()
            rt._draw(d)
            ctx.finish()
            alone[k] = alone.get(k, 0.0) + time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(reps):
                rt._draw(d)
            ctx.finish()
            stream[k] = stream.get(k, 0.0) + (time.perf_counter() - t0) / reps
            shape[k] = "x".join(map(str, d["viewport"]))
    rt.release()
    total = sum(stream.values())
    rows = [
        [k, shape[k], f"{t * 1e3:.2f}", f"{alone[k] * 1e3:.2f}", f"{100 * t / total:.1f}%"]
        for k, t in sorted(stream.items(), key=lambda kv: -kv[1])[:top]
    ]
    from bench import markdown

    by_root: dict[str, float] = {}
    for k, t in stream.items():
        root = k.split("_", 1)[-1].split("+", 1)[0]
        by_root[root] = by_root.get(root, 0.0) + t
    ranked = sorted(by_root.items(), key=lambda kv: -kv[1])
    roots = ", ".join(f"{r} {100 * t / total:.0f}%" for r, t in ranked)
    head = ["kernel", "viewport", "ms back to back", "ms alone", "share"]
    title = (
        f"{w.name}: {total * 1e3:.1f} ms back to back ({sum(alone.values()) * 1e3:.1f} ms alone; the step "
        f"{step_ms:.1f} ms) in {len(stream)} kernels; by root op: {roots}"
    )
    return title + "\n" + markdown(head, rows)


def time_torch(w: Realistic, steps: int) -> float | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    _, step = w.torch_twin("cuda")
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        step().item()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def plan_record(name: str, batch: int) -> dict[str, Any]:
    """Draws of the train step and of predict, and the CPU time of compiling the workload and
    building its bundle (no GL context: the shaders are generated, not compiled by a driver)."""
    w = workload(name, batch)
    start = time.process_time()
    manifest = w.compile().bundle().manifest
    cpu = time.process_time() - start
    entries = manifest["entries"]
    return {
        "draws_train_step": len(entries["train_step"]["draws"]),
        "draws_predict": len(entries["predict"]["draws"]),
        "compile_cpu_s": cpu,
    }


def plan_table(names: list[str], batches: tuple[int, ...] = (4, 32)) -> str:
    """Per workload: draws per train step / predict at each of `batches`, and the compile + bundle
    CPU time at the workload's own batch."""
    rows = []
    for name in names:
        draws = [plan_record(name, b) for b in batches]
        own = plan_record(name, BUILDERS[name][1])
        rows.append(
            [name]
            + [f"{d['draws_train_step']} / {d['draws_predict']}" for d in draws]
            + [f"{own['compile_cpu_s']:.2f}"]
        )
    from bench import markdown

    head = ["workload", *(f"draws b{b} step / predict" for b in batches), "compile + bundle CPU s"]
    return markdown(head, rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="", help="write the records as JSON here")
    ap.add_argument("--profile", action="store_true", help="time each draw of one step instead")
    ap.add_argument("--storage", default="f32", choices=["f32", "f16"], help="texture storage")
    ap.add_argument("--target", default="webgl2", help="compile target (webgl2-gpu: a GPU's costs)")
    ap.add_argument(
        "--plan", action="store_true", help="no GL: draws at batch 4 and 32 and compile CPU time per workload"
    )
    args = ap.parse_args(argv)
    if args.storage != "f32":
        OPTIONS["storage"] = args.storage
    if args.target != "webgl2":
        OPTIONS["target"] = args.target
    if args.plan:
        names = [n for n in args.only.split(",") if n] or list(BUILDERS)
        print(f"plans (no GL); target {args.target}; storage {args.storage}; load {os.getloadavg()}")
        print(plan_table(names))
        print(f"load average after: {os.getloadavg()}")
        return 0
    import moderngl
    from bench import markdown

    names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
    ctx = moderngl.create_context(standalone=True, backend="egl")
    ceiling = fma_ceiling(ctx)
    print(
        f"{ctx.info['GL_RENDERER']}; fragment FMA ceiling {ceiling:.3f} TFLOP/s; storage {args.storage}; "
        f"load {os.getloadavg()}"
    )
    if args.profile:
        for name in names:
            print(profile(WORKLOADS[name], ctx))
        return 0
    rows, records = [], []
    for name in names:
        w = WORKLOADS[name]
        rec = {"name": name, "description": w.description, "ceiling_tflops": ceiling}
        rec |= time_gl(w, args.steps, ctx)
        rec["gflop_per_step"] = step_flops(w) / 1e9
        rec["gflops"] = rec["gflop_per_step"] / (rec["ms"] / 1e3)
        rec["share_of_ceiling"] = rec["gflops"] / (ceiling * 1e3)
        rec["torch_cuda_ms"] = time_torch(w, args.steps)
        records.append(rec)
        torch_ms = "-" if rec["torch_cuda_ms"] is None else f"{rec['torch_cuda_ms']:.1f}"
        rows.append(
            [
                name,
                f"{rec['ms']:.1f}",
                f"{rec['gflops']:.0f}",
                f"{100 * rec['share_of_ceiling']:.1f}%",
                f"{rec['draws_train_step']} / {rec['draws_predict']}",
                f"{rec['compile_s']:.1f}",
                torch_ms,
            ]
        )
        print(f"{name}: {rec['ms']:.1f} ms/step", flush=True)
    head = ["workload", "GL ms/step", "GFLOP/s", "% of ceiling", "draws step / predict", "compile s"]
    head.append("torch CUDA ms")
    print(markdown(head, rows))
    print(f"load average after: {os.getloadavg()}")
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
