"""Training-step benchmarks: glcomp's GL runtime, its numpy reference runtime and PyTorch CPU.

    python benchmarks/bench.py                                  # all workloads, 30 timed steps each
    python benchmarks/bench.py --workloads mlp,cnn --steps 50 --json out.json
    python benchmarks/bench.py --steps 30 --steps conv_seed=10  # fewer steps for one workload
    python benchmarks/bench.py --passes default --passes memplan=off

For each workload and runtime: warm-up steps (the first GL step includes shader JIT compilation
in the driver), then the median wall time of single training steps. Each GL step reads the loss
back, so it waits for the GPU. Draw calls, kernels and texture bytes come from the bundle manifest
of the train_step entry point; they depend on the compile passes (``--passes``), so GL gets one
column per pass setting; a setting other than the default under which the program does not compile
(a GlcompError) is skipped with its reason, its cells "-". The reference runtime interprets the
graph, which passes do not change.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import glcomp
from glcomp import nn, optim


@dataclasses.dataclass
class Workload:
    """A model, its optimizer and one fixed batch, for glcomp and (as a mirror) torch: class labels
    in [0, classes) and cross-entropy, or (with `target_shape`, the model's output shape) a target
    of uniform [0, 1) values, heat maps, and the mean squared error.

    A language model (`tokens`) takes int32 token ids of `x_shape` (batch, block) as its input
    `input_name` and computes its loss in forward from per-token targets `target_name` of the same
    shape (ids in [0, classes), the vocabulary): `program` compiles it (glcomp's compile with
    loss="forward" and a target_spec), and the torch twin's forward returns (logits, loss)."""

    name: str
    description: str
    model: Callable[[], nn.Module]
    optimizer: Callable[[], optim.Optimizer]
    x_shape: tuple[int, ...]
    classes: int = 10
    target_shape: tuple[int, ...] | None = None
    tokens: bool = False
    input_name: str = "x"
    target_name: str = "y"
    program: Callable[..., glcomp.Program] | None = None  # compile options -> Program

    def loss(self, lib: Any = nn) -> Any:
        """The training loss as a module of `lib` (glcomp.nn or torch.nn)."""
        return lib.MSELoss() if self.target_shape is not None else lib.CrossEntropyLoss()

    def compile(self, **options: Any) -> glcomp.Program:
        """The glcomp program of a train step (`options`: glcomp.compile's passes, target, ...)."""
        if self.program is not None:
            return self.program(**options)
        return glcomp.compile(self.model(), {"x": self.x_shape}, self.loss(), self.optimizer(), **options)

    def feeds(self, x: np.ndarray, y: np.ndarray) -> dict[str, np.ndarray]:
        """A batch of `_batch` as the program's named inputs."""
        return {self.input_name: x, self.target_name: y}


class LastStep(nn.Module):
    """LSTM over the sequence, then a linear layer on the last time step's output."""

    def __init__(self, inputs: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(inputs, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, classes)

    def forward(self, x: Any) -> Any:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def _cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 10),
    )


def _vgg_layers(lib: Any) -> list[Any]:
    """VGG-style CIFAR CNN, written once for glcomp.nn and torch.nn (`lib`): 3x32x32, conv 16, conv
    16, maxpool 2, conv 32, conv 32, maxpool 2 (3x3, padding 1, ReLU after each conv), Linear
    2048-64, ReLU, Linear 64-10. 148,442 parameters."""
    layers: list[Any] = []
    for c in ((3, 16), (16, 16), "pool", (16, 32), (32, 32), "pool"):
        layers += [lib.MaxPool2d(2)] if c == "pool" else [lib.Conv2d(*c, 3, padding=1), lib.ReLU()]
    return [*layers, lib.Flatten(), lib.Linear(32 * 8 * 8, 64), lib.ReLU(), lib.Linear(64, 10)]


def _mobilenet_layers(lib: Any) -> list[Any]:
    """MobileNet-style depthwise-separable CNN at a browser size, for glcomp.nn and torch.nn
    (`lib`): 3x32x32, conv 3-16 3x3 stride 2 + BatchNorm + ReLU, then blocks of a depthwise 3x3
    conv (groups = channels) + BatchNorm + ReLU and a pointwise 1x1 conv + BatchNorm + ReLU,
    16-32 (stride 1), 32-64 (stride 2), 64-64 (stride 1), global average pool, Linear 64-10.
    Convolutions without bias (BatchNorm follows each). 9,322 parameters (BatchNorm's running
    statistics are buffers, not counted)."""

    def bn_relu(c: int) -> list[Any]:
        return [lib.BatchNorm2d(c), lib.ReLU()]

    layers = [lib.Conv2d(3, 16, 3, stride=2, padding=1, bias=False), *bn_relu(16)]
    for cin, cout, stride in ((16, 32, 1), (32, 64, 2), (64, 64, 1)):
        layers += [lib.Conv2d(cin, cin, 3, stride=stride, padding=1, groups=cin, bias=False), *bn_relu(cin)]
        layers += [lib.Conv2d(cin, cout, 1, bias=False), *bn_relu(cout)]
    return [*layers, lib.AdaptiveAvgPool2d(1), lib.Flatten(), lib.Linear(64, 10)]


def _resnet_layers(lib: Any) -> list[Any]:
    """ResNet-style residual CNN at a browser size (realistic.py's resnet at half its widths), for
    glcomp.nn and torch.nn (`lib`): 3x32x32, conv 3-16 3x3 + BatchNorm + ReLU, two basic blocks
    at 16 channels (32x32), a block 16-32 at stride 2 (1x1 stride-2 projection shortcut) and one
    at 32 (16x16), global average pool, Linear 32-10. 43,226 parameters."""
    block = _realistic()._residual_block  # realistic.py's basic block, at these widths
    stem = [lib.Conv2d(3, 16, 3, padding=1, bias=False), lib.BatchNorm2d(16), lib.ReLU()]
    blocks = [block(lib, 16, 16, 1), block(lib, 16, 16, 1), block(lib, 16, 32, 2), block(lib, 32, 32, 1)]
    return [*stem, *blocks, lib.AdaptiveAvgPool2d(1), lib.Flatten(), lib.Linear(32, 10)]


def _hourglass(lib: Any) -> Any:
    """An hourglass encoder-decoder at a browser size (realistic.py's hourglass at half its widths,
    with additive skips), for glcomp.nn and torch.nn (`lib`): 3x64x64, three stages down (conv
    3x3 stride 2 + BatchNorm + ReLU, 3-16 at 32x32, 16-32 at 16x16, 32-64 at 8x8), conv 64-64 3x3
    + ReLU, three stages up (ConvTranspose2d 4x4 stride 2 padding 1 + BatchNorm + ReLU, 64-32,
    32-16, 16-16), the first two each plus the encoder's output at its resolution, then a 1x1
    conv 16-16: 16 heat maps at 64x64. 106,256 parameters."""

    def down(cin: int, cout: int) -> Any:
        conv = lib.Conv2d(cin, cout, 3, stride=2, padding=1)
        return lib.Sequential(conv, lib.BatchNorm2d(cout), lib.ReLU())

    def up(cin: int, cout: int) -> Any:
        return lib.Sequential(
            lib.ConvTranspose2d(cin, cout, 4, stride=2, padding=1), lib.BatchNorm2d(cout), lib.ReLU()
        )

    class Hourglass(lib.Module):
        def __init__(self) -> None:
            super().__init__()
            self.down1, self.down2, self.down3 = down(3, 16), down(16, 32), down(32, 64)
            self.mid = lib.Sequential(lib.Conv2d(64, 64, 3, padding=1), lib.ReLU())
            self.up1, self.up2, self.up3 = up(64, 32), up(32, 16), up(16, 16)
            self.head = lib.Conv2d(16, 16, 1)

        def forward(self, x: Any) -> Any:
            d1 = self.down1(x)
            d2 = self.down2(d1)
            y = self.up1(self.mid(self.down3(d2))) + d2
            y = self.up2(y) + d1
            return self.head(self.up3(y))

    return Hourglass()


def _realistic() -> Any:
    """benchmarks/realistic.py as a module (its char_gpt runs examples/char_gpt.py's source)."""
    for key in ("realistic", "_glcomp_realistic"):
        if key in sys.modules:
            return sys.modules[key]
    import importlib.util

    path = Path(__file__).with_name("realistic.py")
    spec = importlib.util.spec_from_file_location("_glcomp_realistic", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# examples/char_gpt.py at a browser size: a glcomp.js step in SwiftShader takes about a second.
GPT_CONFIG = {"batch_size": 16, "block_size": 32, "n_embd": 64, "n_head": 4, "n_layer": 2, "dropout": 0.0}
# The same at realistic.py's gpt_small and gpt_medium sizes (issue 25's char-GPTs), for a browser on
# a GPU: in SwiftShader a gpt_medium step takes minutes.
GPT_CONFIGS = {
    "gpt": GPT_CONFIG,
    "gpt_small": {**GPT_CONFIG, "batch_size": 32, "block_size": 64, "n_embd": 128},
    "gpt_medium": {**GPT_CONFIG, "batch_size": 32, "block_size": 128, "n_embd": 256, "n_layer": 4},
}


def _char_gpt(library: str, name: str = "gpt", **config: Any) -> Any:
    """examples/char_gpt.py run with `library`'s imports ("glcomp" or "torch") at GPT_CONFIGS[name]."""
    return _realistic().char_gpt(library, **GPT_CONFIGS[name], **config)


def _gpt_model(name: str = "gpt") -> nn.Module:
    return _char_gpt("glcomp", name).GPTLanguageModel()


def _gpt_optimizer(name: str = "gpt") -> optim.Optimizer:
    return optim.AdamW(lr=_char_gpt("glcomp", name).learning_rate)  # the example's: lr 3e-3, decay 0.01


def _gpt_program(name: str = "gpt", **options: Any) -> glcomp.Program:
    """The example's model and optimizer as `build()` compiles them: int32 idx (batch, block),
    per-token int32 targets over the vocabulary, the cross-entropy computed in forward, AdamW."""
    g = _char_gpt("glcomp", name)
    model = g.GPTLanguageModel()
    shape = (g.batch_size, g.block_size)
    spec = {"shape": shape, "dtype": "int32", "num_classes": g.vocab_size}
    opt = g.torch.optim.AdamW(model.parameters(), lr=g.learning_rate)
    return glcomp.compile(
        model, {"idx": shape}, "forward", opt, target_name="targets", target_spec=spec, **options
    )


def _gpt_workload(name: str, description: str) -> Workload:
    """Workload `name`: examples/char_gpt.py at GPT_CONFIGS[name], token ids in, per-token
    next-character targets, AdamW."""
    c = GPT_CONFIGS[name]
    return Workload(
        name,
        f"char-GPT (examples/char_gpt.py) batch {c['batch_size']}, block {c['block_size']}, n_embd "
        f"{c['n_embd']}, {c['n_head']} heads, {c['n_layer']} layers, dropout 0, GELU MLP; {description}",
        functools.partial(_gpt_model, name),
        functools.partial(_gpt_optimizer, name),
        (c["batch_size"], c["block_size"]),
        classes=58,  # the vocabulary of examples/data/coriolanus.txt (checked in tests/benchmarks)
        tokens=True,
        input_name="idx",
        target_name="targets",
        program=functools.partial(_gpt_program, name),
    )


WORKLOADS = {
    "mlp": Workload(
        "mlp",
        "Linear 64-128-64-10, ReLU; batch 64; SGD lr 0.1",
        lambda: nn.Sequential(
            nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)
        ),
        lambda: optim.SGD(lr=0.1),
        (64, 64),
    ),
    "cnn": Workload(
        "cnn",
        "1x8x8; 2x (Conv 3x3 pad 1, ReLU, MaxPool 2), Linear 128-10; batch 64; Adam 1e-3",
        _cnn,
        lambda: optim.Adam(lr=1e-3),
        (64, 1, 8, 8),
    ),
    "conv_seed": Workload(
        "conv_seed",
        "3x32x32; Conv 3-16 5x5 stride 2 pad 2, ReLU, Linear 4096-10; batch 16; SGD lr 0.01",
        lambda: nn.Sequential(
            nn.Conv2d(3, 16, 5, stride=2, padding=2), nn.ReLU(), nn.Flatten(), nn.Linear(4096, 10)
        ),
        lambda: optim.SGD(lr=0.01),
        (16, 3, 32, 32),
    ),
    "lstm": Workload(
        "lstm",
        "LSTM(32, 128) over 10 steps, last output, Linear 128-10; batch 32; Adam 1e-3",
        lambda: LastStep(32, 128, 10),
        lambda: optim.Adam(lr=1e-3),
        (32, 10, 32),
    ),
    # A realistic recurrent size (the small workloads above are launch-bound): not in the
    # default run of bench_browser.py, run it with --workloads lstm256.
    "lstm256": Workload(
        "lstm256",
        "LSTM(64, 256) over 32 steps, last output, Linear 256-10; batch 32; Adam 1e-3",
        lambda: LastStep(64, 256, 10),
        lambda: optim.Adam(lr=1e-3),
        (32, 32, 64),
    ),
    # Realistic CNNs (issue 25), not in the default run of bench_browser.py either: run them with
    # --workloads vgg,mobilenet. In the browser on SwiftShader a step takes seconds.
    "vgg": Workload(
        "vgg",
        "VGG-style 3x32x32; Conv 16,16, MaxPool 2, Conv 32,32, MaxPool 2 (3x3 pad 1, ReLU), "
        "Linear 2048-64, ReLU, Linear 64-10; batch 32; Adam 1e-3",
        lambda: nn.Sequential(*_vgg_layers(nn)),
        lambda: optim.Adam(lr=1e-3),
        (32, 3, 32, 32),
    ),
    "mobilenet": Workload(
        "mobilenet",
        "MobileNet-style 3x32x32; Conv 3-16 stride 2, depthwise-separable blocks 16-32, 32-64 "
        "stride 2, 64-64 (BatchNorm, ReLU), global average pool, Linear 64-10; batch 32; Adam 1e-3",
        lambda: nn.Sequential(*_mobilenet_layers(nn)),
        lambda: optim.Adam(lr=1e-3),
        (32, 3, 32, 32),
    ),
    # A residual CNN and an encoder-decoder (realistic.py's resnet and hourglass at browser sizes),
    # not in the default run of bench_browser.py: run them with --workloads resnet,hourglass. The
    # ResNet's batch is 16: at 32 a step took 3.8 s in SwiftShader, 5x vgg's (2.8x vgg's multiply-
    # adds per image: four 3x3 convolutions at 16 channels run at 32x32, where vgg has two).
    "resnet": Workload(
        "resnet",
        "ResNet-style 3x32x32; Conv 3-16 (BatchNorm, ReLU), basic blocks 16, 16, 16-32 stride 2 "
        "(1x1 projection), 32 (BatchNorm), global average pool, Linear 32-10; batch 16; Adam 1e-3",
        lambda: nn.Sequential(*_resnet_layers(nn)),
        lambda: optim.Adam(lr=1e-3),
        (16, 3, 32, 32),
    ),
    "hourglass": Workload(
        "hourglass",
        "hourglass 3x64x64 -> 16 heat maps 64x64; Conv stride 2 down 16-32-64, ConvTranspose2d up "
        "32-16-16 with 2 additive skips (BatchNorm, ReLU), 1x1 head; batch 8; MSE; Adam 1e-3",
        lambda: _hourglass(nn),
        lambda: optim.Adam(lr=1e-3),
        (8, 3, 64, 64),
        target_shape=(8, 16, 64, 64),
    ),
    # examples/char_gpt.py itself (realistic.py's char_gpt: the example's source, glcomp's or
    # torch's imports) at a browser size, not in the default run of bench_browser.py either: run
    # it with --workloads gpt.
    "gpt": _gpt_workload(
        "gpt", "per-token cross-entropy over the 58 characters; AdamW lr 3e-3, weight decay 0.01"
    ),
    # realistic.py's char-GPTs, for a browser on a GPU (--workloads gpt_small,gpt_medium --gpu).
    "gpt_small": _gpt_workload("gpt_small", "realistic.py's gpt_small; AdamW"),
    "gpt_medium": _gpt_workload("gpt_medium", "realistic.py's gpt_medium; AdamW"),
}


def _batch(w: Workload) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    if w.tokens:  # random ids and the same sequences shifted by one token, both int32
        ids = rng.integers(0, w.classes, size=(w.x_shape[0], w.x_shape[1] + 1))
        return ids[:, :-1].astype(np.int32), ids[:, 1:].astype(np.int32)
    x = rng.standard_normal(w.x_shape).astype(np.float32)
    if w.target_shape is not None:
        return x, rng.random(w.target_shape, dtype=np.float32)
    y = rng.integers(0, w.classes, size=w.x_shape[0]).astype(np.int64)
    return x, y


def _time_steps(step: Callable[[], Any], warmup: int, steps: int) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds of each timed step. CPU time counts every thread of this process
    (llvmpipe's and torch's included), so it is less disturbed by other load on the machine."""
    for _ in range(warmup):
        step()
    wall, cpu = [], []
    for _ in range(steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        step()
        wall.append(1000 * (time.perf_counter() - start))
        cpu.append(1000 * (time.process_time() - start_cpu))
    return wall, cpu


def _summary(times: tuple[list[float], list[float]]) -> dict[str, float]:
    wall, cpu = times
    q = np.percentile(wall, [10, 90])
    return {
        "ms_median": statistics.median(wall),
        "ms_p10": float(q[0]),
        "ms_p90": float(q[1]),
        "cpu_ms_median": statistics.median(cpu),
    }


def bench_glcomp(
    w: Workload, runtime: str, passes: dict[str, bool], warmup: int, steps: int
) -> dict[str, Any]:
    """Compile `w` with `passes` and time `runtime`'s train_step."""
    glcomp.manual_seed(0)
    x, y = _batch(w)
    start = time.perf_counter()
    prog = w.compile(passes=dict(passes))
    rt = prog.runtime(runtime)
    setup = time.perf_counter() - start
    feeds = w.feeds(x, y)
    times = _time_steps(lambda: rt.train_step(**feeds), warmup, steps)
    record: dict[str, Any] = {"setup_s": setup} | _summary(times)
    if runtime == "gl":
        m = rt.manifest
        draws = m["entries"]["train_step"]["draws"]
        record |= {
            "draws": len(draws),
            "kernels": len({d["kernel"] for d in draws}),
            "programs": len({d["program"] for d in draws}),
            "render_targets": sum(len(d["targets"]) for d in draws),
            "texture_bytes": m["memory"]["texture_bytes"],
            "textures": m["memory"]["textures"],
            "passes_in_effect": m.get("passes", passes),
        }
        rt.release()
    return record


def _torch_model(name: str, device: str = "cpu") -> Any:
    """bench.py's torch twin of workload `name` and its optimizer (parameters -> optimizer);
    `device` is where the gpt twin's forward places its position ids."""
    import torch
    from torch import nn as tnn

    if name in GPT_CONFIGS:
        t = _char_gpt("torch", name, device=device)
        return t.GPTLanguageModel(), lambda p: torch.optim.AdamW(p, lr=t.learning_rate)
    if name == "mlp":
        return tnn.Sequential(
            tnn.Linear(64, 128), tnn.ReLU(), tnn.Linear(128, 64), tnn.ReLU(), tnn.Linear(64, 10)
        ), lambda p: torch.optim.SGD(p, lr=0.1)
    if name == "cnn":
        return tnn.Sequential(
            tnn.Conv2d(1, 16, 3, padding=1),
            tnn.ReLU(),
            tnn.MaxPool2d(2),
            tnn.Conv2d(16, 32, 3, padding=1),
            tnn.ReLU(),
            tnn.MaxPool2d(2),
            tnn.Flatten(),
            tnn.Linear(128, 10),
        ), lambda p: torch.optim.Adam(p, lr=1e-3)
    if name == "conv_seed":
        return tnn.Sequential(
            tnn.Conv2d(3, 16, 5, stride=2, padding=2), tnn.ReLU(), tnn.Flatten(), tnn.Linear(4096, 10)
        ), lambda p: torch.optim.SGD(p, lr=0.01)

    if name == "vgg":
        return tnn.Sequential(*_vgg_layers(tnn)), lambda p: torch.optim.Adam(p, lr=1e-3)
    if name == "mobilenet":
        return tnn.Sequential(*_mobilenet_layers(tnn)), lambda p: torch.optim.Adam(p, lr=1e-3)
    if name == "resnet":
        return tnn.Sequential(*_resnet_layers(tnn)), lambda p: torch.optim.Adam(p, lr=1e-3)
    if name == "hourglass":
        return _hourglass(tnn), lambda p: torch.optim.Adam(p, lr=1e-3)
    inputs, hidden = {"lstm": (32, 128), "lstm256": (64, 256)}[name]

    class TorchLastStep(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = tnn.LSTM(inputs, hidden, batch_first=True)
            self.fc = tnn.Linear(hidden, 10)

        def forward(self, x: Any) -> Any:
            return self.fc(self.lstm(x)[0][:, -1])

    return TorchLastStep(), lambda p: torch.optim.Adam(p, lr=1e-3)


def bench_torch(w: Workload, warmup: int, steps: int, device: str = "cpu") -> dict[str, Any]:
    """The same model and optimizer in PyTorch, eager, on the CPU (its default thread count) or
    on CUDA (FP32, TF32 off); each step reads its loss back, as glcomp's train_step does."""
    import torch

    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model, make_opt = _torch_model(w.name, device)
    model = model.to(device)
    opt = make_opt(model.parameters())
    loss_fn = w.loss(torch.nn)
    x, y = (torch.from_numpy(a if a.dtype.kind == "f" else a.astype(np.int64)).to(device) for a in _batch(w))

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)[1] if w.tokens else loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return float(loss.item())

    return _summary(_time_steps(step, warmup, steps)) | {"threads": torch.get_num_threads()}


def parse_passes(text: str) -> dict[str, bool]:
    """``default`` -> {}; ``memplan=off`` -> {"memplan": False}; a JSON object as is."""
    text = text.strip()
    if text in ("", "default"):
        return {}
    if text.startswith("{"):
        return {str(k): bool(v) for k, v in json.loads(text).items()}
    out = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        if value.lower() not in ("on", "off", "true", "false", "1", "0"):
            raise SystemExit(f"--passes {text!r}: expected NAME=on|off[,NAME=on|off]")
        out[key.strip()] = value.lower() in ("on", "true", "1")
    return out


def default_passes() -> list[dict[str, bool]]:
    """The default passes, then each pass the code generator exposes flipped on its own (off
    where it is on by default, on where it is opt-in)."""
    from glcomp.codegen import bundle

    names = list(getattr(bundle, "PASSES", ["memplan"]))
    opt_in = set(getattr(bundle, "OFF_BY_DEFAULT", ()))
    return [{}] + [{name: name in opt_in} for name in names]


def passes_label(passes: dict[str, bool]) -> str:
    return ",".join(f"{k}={'on' if v else 'off'}" for k, v in passes.items()) or "default"


def machine() -> dict[str, Any]:
    """CPU model, core count, OpenGL renderer and library versions."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cores": _cores(), "python": platform.python_version()}
    info["numpy"] = np.__version__
    info["glcomp"] = glcomp.__version__
    try:
        from glcomp.runtime.gl import context_info, create_context

        ctx = create_context()
        gl = context_info(ctx)
        ctx.release()
        info["gl_renderer"], info["gl_version"] = gl["renderer"], gl["version"]
    except glcomp.GlcompError as err:
        info["gl_renderer"] = f"unavailable ({err})"
    try:
        import torch

        info["torch"] = torch.__version__
    except ImportError:
        info["torch"] = None
    return info


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _fmt_ms(rec: dict[str, Any] | None, key: str = "ms_median") -> str:
    return "-" if not rec else f"{rec[key]:.1f}"


def markdown(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table, columns padded to their widest cell (every benchmark prints these)."""
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in rows]
    return "\n".join(lines)


def table(results: list[dict[str, Any]], settings: list[str], runtimes: list[str]) -> str:
    """Markdown tables, a row per workload: median ms per training step (GL: a column per pass
    setting), then draw calls, kernels and texture bytes per step for each GL pass setting."""
    gl_cols = list(settings) if "gl" in runtimes else []
    names = list(dict.fromkeys(r["workload"] for r in results))
    by = {(r["workload"], r["runtime"], r["passes"]): r for r in results}
    head = ["workload", "timed steps"] + [f"gl ({s})" for s in gl_cols]
    head += [r for r in runtimes if r != "gl"]
    text = ""
    for key, title in (("ms_median", "wall"), ("cpu_ms_median", "process CPU")):
        rows = []
        for name in names:
            steps = sorted({r["steps"] for r in results if r["workload"] == name})
            row = [name, "/".join(map(str, steps))]
            row += [_fmt_ms(by.get((name, "gl", s)), key) for s in gl_cols]
            row += [_fmt_ms(by.get((name, r, "-")), key) for r in runtimes if r != "gl"]
            rows.append(row)
        text += f"{title} ms per training step (median)\n\n" + markdown(head, rows) + "\n\n"
    text = text.rstrip("\n")
    if gl_cols:
        rows = []
        for name in names:
            row = [name]
            for s in gl_cols:
                g = by.get((name, "gl", s))
                row.append("-" if g is None else f"{g['draws']} / {g['kernels']} / {g['texture_bytes']:,}")
            rows.append(row)
        head = ["workload"] + [f"gl ({s})" for s in gl_cols]
        text += "\n\ndraws / kernels / texture bytes per train step (GL bundle)\n\n" + markdown(head, rows)
    return text


def _steps_for(items: list[str], names: list[str]) -> dict[str, int]:
    steps = dict.fromkeys(names, 30)
    for item in items:
        key, sep, value = item.rpartition("=")
        targets = [key] if sep else names
        if sep and key not in WORKLOADS:
            raise SystemExit(f"--steps {item!r}: unknown workload {key!r}")
        for t in targets:
            if t in steps:
                steps[t] = int(value)
    return steps


def main(argv: list[str] | None = None) -> int:
    """Run the benchmarks, print a table and optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset")
    parser.add_argument(
        "--steps", action="append", default=[], metavar="N|NAME=N", help="timed steps (default 30)"
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (default 3)")
    parser.add_argument(
        "--runtimes",
        default="gl,reference,torch",
        help="comma-separated subset of gl,reference,torch,torch_cuda",
    )
    parser.add_argument(
        "--passes",
        action="append",
        default=[],
        metavar="SETTING",
        help="compile passes for GL: 'default', 'memplan=off' or a JSON object; repeat for more columns "
        "(default: the defaults, then each pass flipped on its own)",
    )
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON")
    args = parser.parse_args(argv)

    names = [n.strip() for n in args.workloads.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}")
    runtimes = [r.strip() for r in args.runtimes.split(",") if r.strip()]
    if "torch" in runtimes:
        try:
            import torch  # noqa: F401
        except ImportError:
            print("torch is not installed: skipping the PyTorch column", file=sys.stderr)
            runtimes.remove("torch")
    settings = [parse_passes(p) for p in args.passes] if args.passes else default_passes()
    labels = [passes_label(p) for p in settings]
    steps = _steps_for(args.steps, names)

    info = machine()
    print(f"# {info['cpu']} ({info['cores']} cores), {info['gl_renderer']}", file=sys.stderr)
    results, skipped = [], []
    for name in names:
        w = WORKLOADS[name]
        for runtime in runtimes:
            for passes, label in zip(settings, labels) if runtime == "gl" else [({}, "-")]:
                print(f"  {name} / {runtime} / {label} ...", file=sys.stderr, flush=True)
                if runtime in ("torch", "torch_cuda"):
                    rec = bench_torch(
                        w, args.warmup, steps[name], "cuda" if runtime == "torch_cuda" else "cpu"
                    )
                else:
                    try:
                        rec = bench_glcomp(w, runtime, passes, args.warmup, steps[name])
                    except glcomp.GlcompError as err:
                        if not passes:
                            raise
                        # A pass switched off can leave a program no shader may run: hourglass's
                        # 524,288-value MSE is one fragment loop too long without split_reductions.
                        print(f"    skipped: {err}", file=sys.stderr, flush=True)
                        skipped.append({"workload": name, "passes": label, "error": str(err)})
                        continue
                results.append(
                    {"workload": name, "runtime": runtime, "passes": label, "steps": steps[name]} | rec
                )
    print(table(results, labels, runtimes))
    if args.json:
        report = {
            "machine": info,
            "date": time.strftime("%Y-%m-%d"),
            "warmup": args.warmup,
            "workloads": {n: WORKLOADS[n].description for n in names},
            "results": results,
            "skipped": skipped,
        }
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
