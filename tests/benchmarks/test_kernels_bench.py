"""benchmarks/kernels.py's convolution cases: their FLOP counts, the split of a layer's `gradients`
draws into the input gradient's and the weight gradient's (from the manifest, no GL), and a tiny
timed run of its CLI on one small layer (GL: llvmpipe in CI)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import benchmark_module


def _kernels() -> Any:
    return benchmark_module("kernels")


def test_flop_counts_of_known_layers() -> None:
    k = _kernels()
    vgg = k.ConvCase(64, 3, 64, (32, 32), 3, 1, 1)
    assert vgg.out_hw == (32, 32)
    assert vgg.flop == 2 * 64 * 64 * 32 * 32 * 3 * 9
    strided = k.ConvCase(32, 32, 64, (32, 32), 3, 2, 1)
    assert strided.out_hw == (16, 16)
    assert strided.flop == 2 * 32 * 64 * 16 * 16 * 32 * 9
    depthwise = k.ConvCase(32, 32, 32, (32, 32), 3, 1, 1, groups=32)
    assert depthwise.flop == 2 * 32 * 32 * 32 * 32 * 9  # one input channel per output channel
    up = k.ConvCase(8, 128, 64, (12, 16), 4, 2, 1, transposed=True)
    assert up.out_hw == (24, 32)
    assert up.flop == 2 * 8 * 128 * 12 * 16 * 64 * 16  # every input pixel times the whole kernel


@pytest.mark.slow_only  # torch's import alone takes seconds
def test_flop_counts_agree_with_torch() -> None:
    """Every conv case's forward and input gradient, and the ungrouped cases' weight gradient, as
    torch's FlopCounterMode counts them (it counts a grouped weight gradient `groups` times over)."""
    torch = pytest.importorskip("torch")
    from torch.utils.flop_counter import FlopCounterMode

    for case in _kernels()._conv_cases(realistic=True, batch=1):
        for name, fn in case.torch_passes(torch, "cpu").items():
            if name == "dw" and case.groups > 1:
                continue
            with FlopCounterMode(display=False) as counter:
                fn()
            assert counter.get_total_flops() == case.flop, (case.name, name)


LAYERS = {
    "conv": (1, 16, 32, (8, 8), 3, 1, 1, 1, False),
    "stride2": (1, 8, 16, (8, 8), 3, 2, 1, 1, False),
    "shortcut1x1": (1, 8, 16, (8, 8), 1, 2, 0, 1, False),
    "depthwise": (1, 16, 16, (8, 8), 3, 1, 1, 16, False),
    "transposed": (1, 16, 8, (4, 6), 4, 2, 1, 1, True),
    "wider": (2, 32, 64, (16, 16), 3, 1, 1, 1, False),
    "merged": (1, 3, 16, (8, 8), 3, 1, 1, 1, False),  # mrt merges its dx and dw kernels
}


@pytest.mark.parametrize("layer", LAYERS)
def test_gradient_draws_split_into_disjoint_passes(layer: str) -> None:
    """dx and dw get disjoint, non-empty sets of draws, each holding its gradient's kernel and
    neither the forward's draw nor the upstream gradient's; every other draw is the loss's."""
    k = _kernels()
    case = k.ConvCase(*LAYERS[layer])
    prog, split, no_mrt = k.plan_conv(case)
    if layer in ("merged", "wider"):
        assert no_mrt == (layer == "merged")
    entry = prog.bundle().manifest["entries"]["gradients"]
    dx, dw = set(split["dx"]), set(split["dw"])
    assert dx and dw and not dx & dw
    ops = [k._root_op(d["kernel"]) for d in entry["draws"]]
    assert case.backward_ops["dx"] in {ops[i] for i in dx}, ops
    assert case.backward_ops["dw"] in {ops[i] for i in dw}, ops
    forward = "conv2d_input_grad" if case.transposed else "conv2d"
    rest = set(range(len(ops))) - dx - dw
    assert ops[0] == forward and 0 in rest
    # the loss's: its sum, its gradient (mul, sharing a draw with the bias gradient's sum where
    # MRT merges them) and the reshapes of the gradients
    loss = {ops[i] for i in rest}
    assert "reshape" in loss and loss <= {forward, "mul", "sum", "reshape"}, ops


def test_main_times_the_three_passes_of_one_small_layer(tmp_path: Path, gl_ctx: Any) -> None:
    """main() on its own context (`gl_ctx`: GL is there, and the test is marked gl)."""
    out = tmp_path / "rows.json"
    argv = ["--only", "conv 1x16x32x32", "--batch", "1", "--seconds", "0.01", "--ceiling", "1.0"]
    rows = _kernels().main([*argv, "--json", str(out)])
    assert [r["pass"] for r in rows] == ["fwd", "dx", "dw"]
    assert {r["case"] for r in rows} == {"conv 1x16x32x32 -> 32 k3 s1 p1"}
    for r in rows:
        assert r["draws"] > 0 and r["gl_ms"] > 0 and r["gl_gflops"] > 0
        assert r["pct_of_ceiling"] == pytest.approx(100 * r["gl_gflops"] / 1e3)
    record = json.loads(out.read_text())
    assert record["ceiling_tflops"] == 1.0 and record["target"] == "webgl2"
    assert record["rows"] == rows


def test_a_1x1_layer_lowered_to_products_splits_into_its_gradients() -> None:
    """On a target with a width (webgl2-gpu) the pointwise pass makes a 1x1 convolution and its
    gradients matmuls: dx and dw are still told apart, by the draws that write each gradient
    (kernels.py --realistic raised here once, on MobileNet's pointwise layer)."""
    k = _kernels()
    case = k.ConvCase(2, 32, 64, (8, 8), 1, 1, 0, 1, False)
    prog, split, no_mrt = k.plan_conv(case, "webgl2-gpu")
    entry = prog.bundle().manifest["entries"]["gradients"]
    ops = [k._root_op(d["kernel"]) for d in entry["draws"]]
    assert "conv2d_input_grad" not in ops and "conv2d_weight_grad" not in ops  # products, not convs
    dx, dw = set(split["dx"]), set(split["dw"])
    assert dx and dw and not dx & dw and not no_mrt
    for idx in (dx, dw):  # a product's draw (tiled: its block draw, "k4_reshape_mm") in each
        assert any(ops[i] == "matmul" or ops[i].endswith("_mm") for i in idx), ops
