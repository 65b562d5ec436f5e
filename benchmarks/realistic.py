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
        return glcomp.compile(model, shapes, "forward", opt, target_name="targets", target_spec=spec)

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


def _vgg(name: str, batch: int, widths: tuple[int, int], fc: int) -> Realistic:
    def make() -> glcomp.Program:
        glcomp.manual_seed(0)
        model = nn.Sequential(*_vgg_layers(nn, widths, fc))
        opt = optim.SGD(lr=0.01, momentum=0.9)
        return glcomp.compile(model, {"x": (batch, 3, 32, 32)}, loss=nn.CrossEntropyLoss(), optimizer=opt)

    def data() -> dict[str, np.ndarray]:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(batch, 3, 32, 32)).astype(np.float32)
        return {"x": x, "y": rng.integers(0, 10, size=batch)}

    def twin(device: str) -> tuple[Any, Callable[[], Any]]:
        import torch

        model = torch.nn.Sequential(*_vgg_layers(torch.nn, widths, fc)).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        d = data()
        x, y = torch.tensor(d["x"], device=device), torch.tensor(d["y"], dtype=torch.long, device=device)

        def step() -> Any:
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            return loss

        return model, step

    a, b = widths
    desc = f"VGG-style 3x32x32 (conv {a},{a},pool,{b},{b},pool, fc {fc}) b{batch}, SGD momentum"
    return Realistic(name, desc, make, data, twin)


WORKLOADS = {
    w.name: w
    for w in (
        _gpt("gpt_small", 32, 64, 128, 4, 2),
        _gpt("gpt_medium", 32, 128, 256, 4, 4),
        _vgg("vgg", 32, (32, 64), 256),
        _vgg("vgg_wide", 64, (64, 128), 256),
    )
}


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

    _, step = w.torch_twin("cpu")
    with FlopCounterMode(display=False) as counter:
        step()
    return float(counter.get_total_flops())


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


def profile(w: Realistic, ctx: Any, top: int = 15) -> str:
    """Where one train step's time goes: every draw timed alone (``ctx.finish()`` before and after,
    so draws are serialised: shares, not totals), summed by kernel, the costliest first."""
    rt = w.compile().runtime("gl", ctx=ctx)
    feeds = w.batch()
    rt.train_step(**feeds)
    draw, spent, shape = rt._draw, {}, {}

    def timed_draw(d: dict[str, Any]) -> None:
        ctx.finish()
        t0 = time.perf_counter()
        draw(d)
        ctx.finish()
        spent[d["kernel"]] = spent.get(d["kernel"], 0.0) + time.perf_counter() - t0
        shape[d["kernel"]] = "x".join(map(str, d["viewport"]))

    rt._draw = timed_draw
    rt.train_step(**feeds)
    rt.release()
    total = sum(spent.values())
    rows = [
        [k, shape[k], f"{t * 1e3:.2f}", f"{100 * t / total:.1f}%"]
        for k, t in sorted(spent.items(), key=lambda kv: -kv[1])[:top]
    ]
    from bench import markdown

    by_root: dict[str, float] = {}
    for k, t in spent.items():
        root = k.split("_", 1)[-1].split("+", 1)[0]
        by_root[root] = by_root.get(root, 0.0) + t
    ranked = sorted(by_root.items(), key=lambda kv: -kv[1])
    roots = ", ".join(f"{r} {100 * t / total:.0f}%" for r, t in ranked)
    head = ["kernel", "viewport", "ms", "share"]
    title = f"{w.name}: {total * 1e3:.1f} ms in {len(spent)} kernels; by root op: {roots}"
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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated workload names")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--out", default="", help="write the records as JSON here")
    ap.add_argument("--profile", action="store_true", help="time each draw of one step instead")
    args = ap.parse_args(argv)
    import moderngl
    from bench import markdown

    names = [n for n in args.only.split(",") if n] or list(WORKLOADS)
    ctx = moderngl.create_context(standalone=True, backend="egl")
    ceiling = fma_ceiling(ctx)
    print(f"{ctx.info['GL_RENDERER']}; fragment FMA ceiling {ceiling:.3f} TFLOP/s; load {os.getloadavg()}")
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
