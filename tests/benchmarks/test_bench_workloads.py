"""The realistic CNN workloads of benchmarks/bench.py (vgg, mobilenet, resnet, hourglass) and their
twins: the glcomp model, the torch model of ``--runtimes torch`` and the TensorFlow.js model of
benchmarks/bench_browser.py ``--peers tfjs`` (benchmarks/peers/tfjs_workloads.js) have the same
trainable parameters, and torch's and tfjs's the same weight layers, layer by layer: output shape
(NCHW against NHWC), parameters and kernel size, hence the same multiply-adds (a transposed
convolution's count per output pixel is its kernel's over stride squared, the same in both). tfjs
lists a functional model's layers by their depth in the graph, torch's hooks fire in execution order:
where the branches of a residual block interleave differently, the layers are compared as sorted
lists. The char-GPT (gpt, examples/char_gpt.py) is compared weight by weight: glcomp's, torch's and
the hand-written tfjs transformer's parameters have the same names and shapes in the same order.
No model is compiled or trained (bench.py's CLI does that);
the tfjs check runs Node.js on tfjs's CPU backend, with ``--slow`` (it needs ``cd benchmarks/peers
&& npm ci``, which the default test run does not install; without them it fails)."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import benchmark_module

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
PEERS = BENCHMARKS / "peers"
# Trainable parameters (BatchNorm's running statistics are buffers, not counted).
PARAMS = {
    "mlp": 17226,
    "cnn": 6090,
    "conv_seed": 42186,
    "vgg": 148442,
    "mobilenet": 9322,
    "resnet": 43226,
    "hourglass": 106256,
    "gpt": 109242,
    "gpt_small": 419130,
    "gpt_medium": 3219002,
}
GPTS = {  # name -> (batch, block), (n_embd, n_head, n_layer): realistic.py's gpt_small and gpt_medium
    "gpt": ((16, 32), (64, 4, 2)),
    "gpt_small": ((32, 64), (128, 4, 2)),
    "gpt_medium": ((32, 128), (256, 4, 4)),
}
REALISTIC = ("vgg", "mobilenet", "resnet", "hourglass")


def _bench() -> Any:
    return benchmark_module("bench")


def _torch_layers(name: str) -> list[dict[str, Any]]:
    """The torch twin's modules with parameters, in order: output shape without the batch (channels
    last, as tfjs reports it), trainable parameters and the kernel's weight count."""
    torch = pytest.importorskip("torch")
    model, _ = _bench()._torch_model(name)
    rows: list[dict[str, Any]] = []

    def hook(module: Any, _inputs: Any, out: Any) -> None:
        shape = list(out.shape[1:])
        if len(shape) == 3:  # C, H, W -> H, W, C
            shape = shape[1:] + shape[:1]
        weight = getattr(module, "weight", None)
        is_kernel = weight is not None and not isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
        rows.append(
            {
                "outputShape": shape,
                "params": sum(p.numel() for p in module.parameters(recurse=False)),
                "kernel": weight.numel() if is_kernel else 0,
            }
        )

    for module in model.modules():
        if any(True for _ in module.parameters(recurse=False)):
            module.register_forward_hook(hook)
    with torch.no_grad():
        model(torch.zeros(_bench().WORKLOADS[name].x_shape))
    return rows


def _macs(layers: list[dict[str, Any]]) -> int:
    """Forward multiply-adds of the convolutions and Linear layers: every output position (the
    output shape without its channels) uses every weight of the kernel once."""
    return sum(math.prod(r["outputShape"][:-1]) * r["kernel"] for r in layers)


@pytest.mark.parametrize("name", REALISTIC)
def test_glcomp_and_torch_models_have_the_same_parameters(name: str) -> None:
    w = _bench().WORKLOADS[name]
    ours = [tuple(p.shape) for p in w.model().parameters()]
    assert sum(math.prod(s) for s in ours) == PARAMS[name]
    torch = pytest.importorskip("torch")
    model, _ = _bench()._torch_model(name)
    assert ours == [tuple(p.shape) for p in model.parameters()]
    out = w.target_shape if w.target_shape is not None else (w.x_shape[0], w.classes)
    assert model(torch.zeros(w.x_shape)).shape == out


def test_realistic_workloads_are_named_in_the_cli() -> None:
    bench = _bench()
    assert all(n in bench.WORKLOADS for n in REALISTIC)
    assert bench.WORKLOADS["vgg"].x_shape == bench.WORKLOADS["mobilenet"].x_shape == (32, 3, 32, 32)
    assert bench.WORKLOADS["resnet"].x_shape == (16, 3, 32, 32)
    # hourglass regresses 16 heat maps at its input's resolution: MSE against a float target.
    hourglass = bench.WORKLOADS["hourglass"]
    assert hourglass.x_shape == (8, 3, 64, 64) and hourglass.target_shape == (8, 16, 64, 64)
    assert type(hourglass.loss()).__name__ == "MSELoss"
    assert type(bench.WORKLOADS["resnet"].loss()).__name__ == "CrossEntropyLoss"
    x, y = bench._batch(hourglass)
    assert x.shape == hourglass.x_shape and y.shape == hourglass.target_shape and y.dtype == np.float32
    # bench.py's torch twin of each LSTM workload has that workload's sizes.
    for name in ("lstm", "lstm256"):
        ours = sum(int(np.prod(p.shape)) for p in bench.WORKLOADS[name].model().parameters())
        if importlib.util.find_spec("torch") is not None:
            model, _ = bench._torch_model(name)
            assert sum(p.numel() for p in model.parameters()) == ours


def _torch_weights(name: str) -> list[tuple[str, list[int]]]:
    """The torch twin's parameters by name, in model.parameters()'s order."""
    pytest.importorskip("torch")
    model, _ = _bench()._torch_model(name)
    return [(n, list(p.shape)) for n, p in model.named_parameters()]


@pytest.mark.parametrize("name", GPTS)
def test_gpt_is_the_example_with_the_same_weights_in_glcomp_and_torch(name: str) -> None:
    """bench.py's gpt is examples/char_gpt.py at its browser size, gpt_small and gpt_medium at
    realistic.py's: glcomp's model and the torch twin (the same source, torch's imports) have
    the same parameters by name and shape, the batch is int32 ids and per-token targets in the
    vocabulary, and the twin's loss is the cross-entropy over every token (near ln(vocab) at the
    example's init)."""
    bench = _bench()
    w = bench.WORKLOADS[name]
    g = bench._char_gpt("glcomp", name)
    shape, sizes = GPTS[name]
    assert w.classes == g.vocab_size and w.x_shape == shape == (g.batch_size, g.block_size)
    assert (g.n_embd, g.n_head, g.n_layer, g.dropout) == (*sizes, 0.0)
    ours = [(n, list(p.shape)) for n, p in w.model().named_parameters()]
    assert sum(math.prod(s) for _, s in ours) == PARAMS[name]
    x, y = bench._batch(w)
    assert x.shape == y.shape == w.x_shape and x.dtype == y.dtype == np.int32
    assert (x[:, 1:] == y[:, :-1]).all() and 0 <= x.min() and max(x.max(), y.max()) < w.classes
    assert set(w.feeds(x, y)) == {"idx", "targets"}
    torch = pytest.importorskip("torch")
    assert ours == _torch_weights(name)
    model, make_opt = bench._torch_model(name)
    assert type(make_opt(model.parameters())).__name__ == "AdamW"
    logits, loss = model(torch.from_numpy(x).long(), torch.from_numpy(y).long())
    assert logits.shape == (w.x_shape[0] * w.x_shape[1], w.classes)  # the example's view(B * T, C)
    assert abs(loss.item() - math.log(w.classes)) < 0.1


def _tfjs_describe(names: tuple[str, ...]) -> dict[str, Any]:
    node = shutil.which("node")
    if node is None or not (PEERS / "node_modules" / "@tensorflow" / "tfjs").is_dir():
        pytest.fail("node or tfjs is not installed: cd benchmarks/peers && npm ci (a --slow test)")
    # tfjs_workloads.js is an ES module with no imports of its own: loaded from its source as a
    # data: URL, tfjs itself resolved from benchmarks/peers.
    script = (
        'import * as tf from "@tensorflow/tfjs";\n'
        'import { readFileSync } from "node:fs";\n'
        'const src = readFileSync("tfjs_workloads.js", "utf8");\n'
        'const m = await import("data:text/javascript," + encodeURIComponent(src));\n'
        'tf.setBackend("cpu");\n'
        f"const names = {json.dumps(list(names))};\n"
        "const out = Object.fromEntries(names.map((n) => [n, m.describe(tf, n)]));\n"
        'console.log("@@" + JSON.stringify(out));\n'
    )
    done = subprocess.run(
        [node, "--input-type=module", "-e", script],
        cwd=PEERS,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(x for x in done.stdout.splitlines() if x.startswith("@@"))
    return json.loads(line[2:])


@pytest.mark.slow_only
def test_tfjs_twins_match_torch_layer_by_layer() -> None:
    names = ("mlp", "cnn", "conv_seed", *REALISTIC)
    described = _tfjs_describe(names)
    for name in names:
        tfjs = described[name]
        assert tfjs["params"] == PARAMS[name], name
        weighted = [
            {k: r[k] for k in ("outputShape", "params", "kernel")} for r in tfjs["layers"] if r["params"]
        ]
        torch_layers = _torch_layers(name)
        if any(r["className"] == "Add" for r in tfjs["layers"]):  # branches: tfjs's order is by depth
            weighted, torch_layers = (sorted(rows, key=json.dumps) for rows in (weighted, torch_layers))
        assert weighted == torch_layers, name
        assert _macs(weighted) == _macs(torch_layers)
    kinds = {n: [r["className"] for r in described[n]["layers"]] for n in REALISTIC}
    counts = {n: {k: kinds[n].count(k) for k in set(kinds[n])} for n in kinds}
    assert counts["mobilenet"]["DepthwiseConv2D"] == 3 and counts["mobilenet"]["BatchNormalization"] == 7
    assert counts["resnet"]["Add"] == 4 and counts["resnet"]["BatchNormalization"] == 10
    assert counts["hourglass"]["Conv2DTranspose"] == 3 and counts["hourglass"]["Add"] == 2


@pytest.mark.slow_only
def test_tfjs_gpt_matches_torch_weight_by_weight() -> None:
    """The hand-written tfjs transformer has the torch twin's weights at each of bench.py's GPT
    sizes: the same names, shapes (a Linear's [out, in]) and order, hence the same parameter
    count."""
    described = _tfjs_describe(tuple(GPTS))
    for name in GPTS:
        tfjs = described[name]
        assert tfjs["params"] == PARAMS[name], name
        assert [(r["name"], r["shape"]) for r in tfjs["weights"]] == _torch_weights(name), name
