"""The split_weight_grads pass: long convolution weight gradients computed as partial sums side by
side in one draw (P times the fragments, loops about P times shorter), with the same values (up to
rounding) on the GL runtime, and the same draws at every batch size."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.passes import split_weight_grads
from glcomp.ir.passes.split_weight_grads import CHUNK, FEW, MAX_PARTS, PER_IMAGE, parts

# (batch, channels, size, out channels, kernel, stride, padding): long reductions, small outputs.
# Parts of unequal and equal size; stride 2 and padding 0/2 included.
CASES = {
    "odd-batch-stride2-pad1": (7, 3, 36, 4, 3, 2, 1),
    "batch9-stride1-pad0": (9, 2, 18, 4, 3, 1, 0),
    "batch5-5x5-stride2-pad2": (5, 3, 44, 8, 5, 2, 2),
}
CONV_SEED = (16, 3, 32, 16, 5, 2, 2)  # benchmarks/bench.py's conv_seed layer


def _model(case: tuple[int, ...]) -> tuple[nn.Module, tuple[int, ...]]:
    n, c, size, o, k, stride, pad = case
    glcomp.manual_seed(3)
    out = (size + 2 * pad - k) // stride + 1
    model = nn.Sequential(
        nn.Conv2d(c, o, k, stride=stride, padding=pad), nn.ReLU(), nn.Flatten(), nn.Linear(o * out * out, 3)
    )
    return model, (n, c, size, size)


def _compile(case: tuple[int, ...], target: str, **passes: bool) -> glcomp.Program:
    model, shape = _model(case)
    return glcomp.compile(
        model, {"x": shape}, nn.CrossEntropyLoss(), optim.SGD(lr=0.05), target=target, passes=passes
    )


def _batch(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1)
    return rng.normal(size=shape).astype(np.float32), rng.integers(0, 3, size=shape[0])


def _weight_grad_draws(prog: glcomp.Program, entry: str) -> list[dict[str, Any]]:
    """The draws of `entry` that compute (a part of) the first convolution's weight gradient."""
    b = prog.bundle()
    m = b.manifest
    # The models have one convolution and no input gradient: only the weight gradient's vec4
    # kernel (glcomp/codegen/families/conv2d_weight_grad.frag.j2) reads g a texel at a time into `G`.
    return [
        d | {"loop_iterations": m["programs"][d["program"]]["loop_iterations"]}
        for d in m["entries"][entry]["draws"]
        if "vec4 G = glc_texel(" in b.shaders[m["programs"][d["program"]]["fragment"]]
    ]


def _loops(draws: list[dict[str, Any]]) -> int:
    return max(d["loop_iterations"] for d in draws)


# -- the IR pass -------------------------------------------------------------------------------------
def _graph(n: int, c: int, size: int, o: int, k: int, stride: int, pad: int) -> Graph:
    g = Graph()
    x = g.add_input("x", (n, c, size, size), "data")
    out = (size + 2 * pad - k) // stride + 1
    gy = g.add_input("g", (n, o, out, out), "data")
    g.outputs["gw"] = g.add(
        "conv2d_weight_grad", [x, gy], stride=(stride, stride), padding=(pad, pad), kernel_hw=(k, k)
    )
    return g


@pytest.mark.parametrize("case", sorted(CASES))
def test_pass_same_values_and_parts(case: str) -> None:
    n, c, size, o, k, stride, pad = CASES[case]
    g = _graph(n, c, size, o, k, stride, pad)
    out = split_weight_grads(g)
    out.validate()
    rng = np.random.default_rng(0)
    feeds = {name: rng.normal(size=g.shape(i)) for name, i in g.inputs.items()}
    want = evaluate(g, feeds, np.float64)["gw"]
    np.testing.assert_allclose(evaluate(out, feeds, np.float64)["gw"], want, rtol=1e-12, atol=1e-12)
    (grad,) = [v for v in out.nodes() if out.op(v) == "conv2d_weight_grad"]
    oh, ow = g.shape(g.inputs["g"])[2:]
    count = out.attrs(grad)["parts"]
    assert count == parts(n * oh, n * oh * ow) >= 2
    assert out.shape(grad) == (count * o, c, k, k)


def test_parts_as_documented() -> None:
    assert parts(16 * 32, 16 * 32 * 32) == 16 and parts(64 * 8, 64 * 8 * 8) == 4  # about CHUNK terms a part
    assert parts(3, 100 * CHUNK) == 3 and parts(1000, 1000 * CHUNK) == MAX_PARTS
    assert parts(1, 10) == 1


def test_small_images_or_wide_gradients_are_left_alone() -> None:
    for args in [(2, 3, 9, 4, 3, 1, 0), (2, 256, 16, 128, 3, 1, 1)]:
        g = _graph(*args)
        gw, gy = g.outputs["gw"], g.inputs["g"]
        assert math.prod(g.shape(gw)) > FEW or g.shape(gy)[2] * g.shape(gy)[3] < PER_IMAGE
        assert split_weight_grads(g) is g, args


def test_one_image_is_split_like_many() -> None:
    """The decision is the layer's: one image gives the same nodes as 64 (one part)."""
    ops = []
    for n in (1, 64):
        out = split_weight_grads(_graph(n, 3, 16, 4, 3, 1, 1))
        ops.append(sorted(out.op(v) for v in out.nodes()))
    assert ops[0] == ops[1] and "conv2d_weight_grad" in ops[0]


# -- GL runtime -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", sorted(CASES))
def test_gl_matches_reference_with_and_without_split(gl_runtime: Any, dialect: str, case: str) -> None:
    x, y = _batch(_model(CASES[case])[1])
    for on in (True, False):
        prog = _compile(CASES[case], dialect, split_weight_grads=on)
        ref = prog.runtime("reference")
        want = ref.gradients(x=x, y=y)
        with gl_runtime(prog) as gl:
            got = gl.gradients(x=x, y=y)
            for name, value in want.items():
                np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=f"{name} {on}")
            if not on:
                continue
            for _ in range(2):
                np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-4)
            state = ref.state_dict()
            for name, value in gl.state_dict().items():
                np.testing.assert_allclose(value, state[name], rtol=1e-4, atol=1e-5, err_msg=f"{name} {on}")


@pytest.mark.parametrize("case", [*sorted(CASES), "conv_seed"])
def test_split_shortens_loops(case: str) -> None:
    """Evidence in the bundle: one weight-gradient draw either way (it may share its draw with
    the bias gradient's first stage, a short loop); split in P parts, each fragment loops about P
    times less."""
    spec = CONV_SEED if case == "conv_seed" else CASES[case]
    # the texel kernel's loops (the tiling pass may block a long weight gradient instead)
    off = _compile(spec, "webgl2", split_weight_grads=False, tiling=False)
    on = _compile(spec, "webgl2", tiling=False)
    for entry in ("gradients", "train_step"):
        (before,), (after,) = _weight_grad_draws(off, entry), _weight_grad_draws(on, entry)
        split = split_weight_grads(on.graphs[entry])
        (count,) = [split.attrs(v)["parts"] for v in split.nodes() if split.op(v) == "conv2d_weight_grad"]
        assert 2 <= count <= MAX_PARTS
        assert after["loop_iterations"] * count <= before["loop_iterations"] + 100 * count
        assert after["loop_iterations"] < before["loop_iterations"]
    assert f" {after['loop_iterations']} " in on.explain()  # explain() lists the loop iterations per fragment


def test_draws_are_the_same_at_every_batch() -> None:
    """Splitting adds no draws that grow with the batch. Tiling is off: the cost model blocks the
    weight gradient at batch 32 only (a block draw and its gather where one draw sufficed, a
    choice by size, tests/benchmarks/test_draws_batch.py)."""
    counts = set()
    for n in (2, 8, 32):
        prog = _compile((n, 3, 18, 4, 3, 1, 1), "webgl2", tiling=False)
        counts.add(tuple(len(e["draws"]) for e in prog.bundle().manifest["entries"].values()))
    assert len(counts) == 1, counts


def test_gl_weight_gradient_matches_torch(gl_runtime: Any) -> None:
    """The split gradient against torch's (float64): within the torch-parity tolerances."""
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    case = CASES["odd-batch-stride2-pad1"]
    stride, pad = case[5], case[6]
    model, shape = _model(case)
    x, y = _batch(shape)
    prog = _compile(case, "webgl2", tiling=False)  # the split texel kernel (blocked: test_conv_tiled.py)
    assert len(_weight_grad_draws(prog, "gradients")) == 1
    with gl_runtime(prog) as gl:
        got = gl.gradients(x=x, y=y)
    p = {
        key: torch.tensor(v, dtype=torch.float64, requires_grad=True) for key, v in model.state_dict().items()
    }
    h = f.conv2d(torch.tensor(x, dtype=torch.float64), p["0.weight"], p["0.bias"], stride, pad)
    f.cross_entropy(torch.relu(h).flatten(1) @ p["3.weight"].T + p["3.bias"], torch.tensor(y)).backward()
    for name in ("0.weight", "0.bias"):
        np.testing.assert_allclose(got[name], p[name].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
