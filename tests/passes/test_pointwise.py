"""pointwise: 1x1 convolutions and their gradients as matrix products on GPU targets (the IR
rewrite glcomp/ir/passes/pointwise.py), the same values as the convolutions they replace."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.passes import pointwise


def _graph(n: int, c: int, o: int, hw: tuple[int, int], stride: int = 1, groups: int = 1) -> Graph:
    g = Graph()
    x = g.add_input("x", (n, c, *hw), "data")
    w = g.add_input("w", (o, c // groups, 1, 1), "param")
    gy = g.add_input("g", (n, o, hw[0] // stride, hw[1] // stride), "data")
    attrs = {"stride": (stride, stride), "padding": (0, 0), "groups": groups}
    g.outputs["y"] = g.add("conv2d", [x, w], **attrs)
    g.outputs["dx"] = g.add("conv2d_input_grad", [gy, w], input_hw=hw, **attrs)
    g.outputs["dw"] = g.add("conv2d_weight_grad", [x, gy], kernel_hw=(1, 1), **attrs)
    return g


def test_pointwise_golden(graph_of, around, golden) -> None:
    g = Graph()
    x = g.add_input("x", (1, 2, 2, 2), "data")
    w = g.add_input("w", (3, 2, 1, 1), "param")
    g.outputs["output"] = g.add("conv2d", [x, w], stride=(1, 1), padding=(0, 0), groups=1)
    before, after = around(graph_of(g), "pointwise")  # webgl2: no width, nothing rewritten
    assert after.graph is before.graph
    _, after = around(graph_of(g, parallel_fragments=1 << 14), "pointwise")
    golden(
        after,
        """
        plan predict after pointwise: 10 nodes, 0 stored, 0 kernels
        %0:f32[1,2,2,2] = input[name=x role=data shape=(1,2,2,2)]
        %1:f32[3,2,1,1] = input[name=w role=param shape=(3,2,1,1)]
        %3:f32[3,2] = reshape[shape=(3,2)] %1
        %4:f32[1,2,4] = reshape[shape=(1,2,4)] %0
        %5:f32[2,1,4] = permute[perm=(1,0,2)] %4
        %6:f32[2,4] = reshape[shape=(2,4)] %5
        %7:f32[3,4] = matmul %3 %6
        %8:f32[3,1,4] = reshape[shape=(3,1,4)] %7
        %9:f32[1,3,4] = permute[perm=(1,0,2)] %8
        %10:f32[1,3,2,2] = reshape[shape=(1,3,2,2)] %9
        return output=%10
        """,
    )


def _values(g: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {name: rng.normal(size=g.shape(n)) for name, n in g.inputs.items()}
    return evaluate(g, feeds, np.float64)


@pytest.mark.parametrize("n, c, o, hw", [(2, 3, 5, (4, 4)), (1, 8, 4, (2, 6)), (3, 5, 7, (3, 4))])
def test_products_compute_the_convolutions(n: int, c: int, o: int, hw: tuple[int, int]) -> None:
    g = _graph(n, c, o, hw)
    out = pointwise(g)
    out.validate()
    ops = {out.op(v) for v in out.nodes()}
    assert "matmul" in ops and not ops & {"conv2d", "conv2d_input_grad", "conv2d_weight_grad"}
    # x's and g's (channels, pixels) views are built once for the products that read them
    assert sum(out.op(v) == "permute" and len(out.shape(v)) == 3 for v in out.nodes()) == 2 + 2
    want, got = _values(g), _values(out)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-12, err_msg=name)


@pytest.mark.parametrize(
    "case",
    [dict(stride=2), dict(groups=2), dict(hw=(3, 3))],  # strided, grouped, H*W not whole texels
    ids=["stride2", "grouped", "odd-pixels"],
)
def test_other_convolutions_are_left_alone(case: dict[str, Any]) -> None:
    hw = case.pop("hw", (4, 4))
    g = _graph(2, 4, 4, hw, **case)
    assert pointwise(g) is g


def test_the_gpu_target_runs_pointwise_layers_as_blocked_products(gl_runtime: Any) -> None:
    """A MobileNet-style block compiled for webgl2-gpu: its 1x1 convolutions become register-
    blocked products (forward, input and weight gradients) and three SGD steps on GL (llvmpipe)
    match the reference; webgl2 (no width) keeps the convolutions. (SGD: the biases of the two
    convolutions before BatchNorm have no gradient but rounding, which Adam would scale to lr.)"""
    glcomp.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(8, 8, 3, padding=1, groups=8),
        nn.Conv2d(8, 16, 1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.Conv2d(16, 12, 1),
        nn.Flatten(),
        nn.Linear(12 * 64, 5),
    )
    kw = {"loss": nn.CrossEntropyLoss(), "optimizer": optim.SGD(lr=0.1, momentum=0.9)}
    gpu = glcomp.compile(model, {"x": (4, 3, 8, 8)}, target="webgl2-gpu", **kw)
    plan = gpu.explain(dump_after="pointwise")
    assert "conv2d_weight_grad" in plan  # the 3x3 and depthwise layers' gradients stay convolutions
    cpu = glcomp.compile(model, {"x": (4, 3, 8, 8)}, target="webgl2", **kw)
    same = cpu.explain(dump_after="pointwise").replace("after pointwise", "after split_reductions")
    assert same == cpu.explain(dump_after="split_reductions")
    # train_step: the two 1x1 layers' forward products, input gradients and weight gradients
    # (six products), beside the Linear's
    count = plan.split("plan train_step after pointwise")[1].count("= matmul")
    assert count == cpu.explain(dump_after="pointwise").split("plan train_step")[1].count("= matmul") + 6
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 3, 8, 8)).astype(np.float32)
    y = rng.integers(0, 5, size=(4,)).astype(np.int32)
    ref = gpu.runtime("reference")
    with gl_runtime(gpu) as gl:
        for _ in range(3):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-4)
        want = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, want[name], rtol=1e-3, atol=1e-5, err_msg=name)
