"""split_weight_grads: a long convolution weight gradient as partial gradients side by side in
one primitive, summed; the decision depends on the layer, not the batch."""

from __future__ import annotations

import numpy as np

from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate


def _weight_grad(batch: int, size: int = 34, outputs: int = 2) -> Graph:
    g = Graph()
    x = g.add_input("x", (batch, 1, size, size), "data")
    dy = g.add_input("g", (batch, outputs, size - 2, size - 2), "data")
    wg = g.add("conv2d_weight_grad", (x, dy), stride=(1, 1), padding=(0, 0), kernel_hw=(3, 3))
    g.outputs = {"output": wg}
    return g


def test_split_weight_grads_golden(graph_of, around, golden) -> None:
    _, after = around(graph_of(_weight_grad(2)), "split_weight_grads")  # 2048 terms: 2 parts
    golden(
        after,
        """
        plan predict after split_weight_grads: 6 nodes, 0 stored, 0 kernels
        %0:f32[2,1,34,34] = input[name=x role=data shape=(2,1,34,34)]
        %1:f32[2,2,32,32] = input[name=g role=data shape=(2,2,32,32)]
        %3:f32[4,1,3,3] = conv2d_weight_grad[kernel_hw=(3,3) padding=(0,0) parts=2 stride=(1,1)] %0 %1
        %4:f32[2,2,1,3,3] = reshape[shape=(2,2,1,3,3)] %3
        %5:f32[1,2,1,3,3] = sum[axes=(0)] %4
        %6:f32[2,1,3,3] = reshape[shape=(2,1,3,3)] %5
        return output=%6
        """,
    )


def test_split_weight_grads_is_the_same_at_every_batch(graph_of, around) -> None:
    """One image or 64: the same nodes (only the parts grow), and the sum of the parts is the
    gradient."""
    ops = []
    for batch in (1, 64):
        _, after = around(graph_of(_weight_grad(batch, size=10)), "split_weight_grads")
        ops.append(sorted(after.graph.op(n) for n in after.graph.g))
        (part,) = [n for n in after.graph.g if after.graph.op(n) == "conv2d_weight_grad"]
        assert after.graph.attrs(part)["parts"] == (1 if batch == 1 else 4)
    assert ops[0] == ops[1]
    graph = _weight_grad(3, size=10)
    _, after = around(graph_of(graph), "split_weight_grads")
    rng = np.random.default_rng(0)
    feeds = {"x": rng.normal(size=(3, 1, 10, 10)).astype(np.float32)}
    feeds["g"] = rng.normal(size=(3, 2, 8, 8)).astype(np.float32)
    want = evaluate(graph, feeds)["output"]
    np.testing.assert_allclose(evaluate(after.graph, feeds)["output"], want, rtol=1e-5, atol=1e-5)


def test_split_weight_grads_leaves_small_images_large_outputs_and_off_alone(graph_of, around) -> None:
    small = _weight_grad(8, size=9)  # 7x7 = 49 terms per image
    assert around(graph_of(small), "split_weight_grads")[1].graph is small
    wide = _weight_grad(2, outputs=40000)  # 360,000 outputs
    assert around(graph_of(wide), "split_weight_grads")[1].graph is wide
    graph = _weight_grad(2)
    _, after = around(graph_of(graph, passes={"split_weight_grads": False}), "split_weight_grads")
    assert after.graph is graph
