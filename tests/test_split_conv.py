"""The split_weight_grads pass: long convolution weight gradients computed as parallel partial
sums over batch chunks, with the same values (up to rounding) on the GL runtime, fewer loop
iterations per fragment, and the parts accumulated by blending where the target blends floats."""

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
from glcomp.ir.passes.split_weight_grads import CHUNK, FEW, LONG, MAX_PARTS, chunks, parts

# (batch, channels, size, out channels, kernel, stride, padding): long reductions, small outputs.
# Batch 7 and 9 split into chunks of unequal and equal size; stride 2 and padding 0/2 included.
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
    grads = [v for v in out.nodes() if out.op(v) == "conv2d_weight_grad"]
    extent = n * g.shape(g.inputs["g"])[2] * g.shape(g.inputs["g"])[3]
    assert extent >= LONG and len(grads) == parts(n, extent) >= 2
    sizes = sorted(out.shape(out.operands(v)[0])[0] for v in grads)
    assert sum(sizes) == n and sizes[-1] - sizes[0] <= 1
    assert all(out.node(v)["parallel"] is not None for v in grads)


def test_parts_and_chunks_as_documented() -> None:
    assert parts(16, 4096) == 4 and parts(64, 4096) == 4  # about CHUNK terms a part
    assert parts(3, 100 * CHUNK) == 3 and parts(1000, 100 * CHUNK) == MAX_PARTS
    assert chunks(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert chunks(9, 3) == [(0, 3), (3, 6), (6, 9)]


def test_short_wide_or_single_image_gradients_are_left_alone() -> None:
    for args in [(2, 3, 16, 4, 3, 1, 1), (1, 3, 64, 4, 3, 1, 1), (8, 16, 16, 128, 3, 1, 1)]:
        g = _graph(*args)
        gw = g.outputs["gw"]
        assert g.shape(gw)[0] * math.prod(g.shape(gw)[1:]) > FEW or args[0] == 1 or args[0] * 256 < LONG
        out = split_weight_grads(g)
        assert sum(out.op(v) == "conv2d_weight_grad" for v in out.nodes()) == 1, args


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
    """Evidence in the bundle: S weight-gradient draws instead of one, each looping about S
    times less per fragment (MRT fusion keeps the parts in separate draws; a part may share its
    draw with the bias gradient's first stage, a short loop)."""
    spec = CONV_SEED if case == "conv_seed" else CASES[case]
    n = spec[0]
    off = _compile(spec, "webgl2", split_weight_grads=False)
    on = _compile(spec, "webgl2")
    for entry in ("gradients", "train_step"):
        before, after = _weight_grad_draws(off, entry), _weight_grad_draws(on, entry)
        assert len(before) == 1
        count = len(after)
        assert 2 <= count <= min(n, MAX_PARTS)
        # Each part loops over its batch chunk: at most ceil(n / count) of n images.
        assert _loops(after) * n <= _loops(before) * -(-n // count) + 100 * n
        assert _loops(after) < _loops(before)
        assert _loops(after) * count <= _loops(before) + 100 * count
    assert f" {_loops(after)} " in on.explain()  # explain() lists the loop iterations per fragment


def test_blend_accumulates_the_parts_where_it_saves_a_draw(gl_runtime: Any) -> None:
    """Without epilogue fusion the sum of the parts is a draw of its own: on a float-blend target
    the parts render into one texture instead (the first unblended, even from an MRT group that
    also writes the bias gradient), which saves that draw; the values stay those of the reference."""
    case = CONV_SEED
    blended = _compile(case, "webgl2", epilogue=False)
    summed = _compile(case, "webgl2", epilogue=False, blend=False)
    draws = blended.bundle().manifest["entries"]["gradients"]["draws"]
    parts_drawn = _weight_grad_draws(blended, "gradients")
    first, *rest = parts_drawn
    assert not first["blend"] and rest and all(d["blend"] and len(d["targets"]) == 1 for d in rest)
    assert all(d["targets"][0] == rest[0]["targets"][0] for d in rest)
    assert rest[0]["targets"][0] in first["targets"]  # the first part overwrites the sum's texture
    assert len(draws) == len(summed.bundle().manifest["entries"]["gradients"]["draws"]) - 1
    x, y = _batch(_model(case)[1])
    want = blended.runtime("reference").gradients(x=x, y=y)
    with gl_runtime(blended) as gl:
        got = gl.gradients(x=x, y=y)
    for name, value in want.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


def test_gl_weight_gradient_matches_torch(gl_runtime: Any) -> None:
    """The split gradient against torch's (float64): within the torch-parity tolerances."""
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    case = CASES["odd-batch-stride2-pad1"]
    stride, pad = case[5], case[6]
    model, shape = _model(case)
    x, y = _batch(shape)
    prog = _compile(case, "webgl2")
    assert len(_weight_grad_draws(prog, "gradients")) >= 2
    with gl_runtime(prog) as gl:
        got = gl.gradients(x=x, y=y)
    p = {
        key: torch.tensor(v, dtype=torch.float64, requires_grad=True) for key, v in model.state_dict().items()
    }
    h = f.conv2d(torch.tensor(x, dtype=torch.float64), p["0.weight"], p["0.bias"], stride, pad)
    f.cross_entropy(torch.relu(h).flatten(1) @ p["3.weight"].T + p["3.bias"], torch.tensor(y)).backward()
    for name in ("0.weight", "0.bias"):
        np.testing.assert_allclose(got[name], p[name].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=name)
