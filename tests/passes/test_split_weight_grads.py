"""split_weight_grads: a long convolution weight gradient as partial gradients over batch
chunks, added up."""

from __future__ import annotations

from glcomp.ir.graph import Graph


def _weight_grad(batch: int) -> Graph:
    g = Graph()
    x = g.add_input("x", (batch, 1, 34, 34), "data")
    dy = g.add_input("g", (batch, 2, 32, 32), "data")
    wg = g.add("conv2d_weight_grad", (x, dy), stride=(1, 1), padding=(0, 0), kernel_hw=(3, 3))
    g.outputs = {"output": wg}
    return g


def test_split_weight_grads_golden(graph_of, around, golden) -> None:
    _, after = around(graph_of(_weight_grad(2)), "split_weight_grads")  # 2048 terms, 2 images
    golden(
        after,
        """
        plan predict after split_weight_grads: 9 nodes, 0 stored, 0 kernels
        %0:f32[2,1,34,34] = input[name=x role=data shape=(2,1,34,34)]
        %1:f32[2,2,32,32] = input[name=g role=data shape=(2,2,32,32)]
        %3:f32[1,1,34,34] = slice[starts=(0,0,0,0) stops=(1,1,34,34)] %0
        %4:f32[1,2,32,32] = slice[starts=(0,0,0,0) stops=(1,2,32,32)] %1
        %5:f32[2,1,3,3] = conv2d_weight_grad[kernel_hw=(3,3) padding=(0,0) stride=(1,1)] %3 %4
        %6:f32[1,1,34,34] = slice[starts=(1,0,0,0) stops=(2,1,34,34)] %0
        %7:f32[1,2,32,32] = slice[starts=(1,0,0,0) stops=(2,2,32,32)] %1
        %8:f32[2,1,3,3] = conv2d_weight_grad[kernel_hw=(3,3) padding=(0,0) stride=(1,1)] %6 %7
        %9:f32[2,1,3,3] = add %5 %8
        return output=%9
        """,
    )
    assert [after.graph.node(n).get("parallel") for n in (5, 8)] == [2, 2]  # mrt keeps them apart


def test_split_weight_grads_leaves_one_image_and_off_alone(graph_of, around) -> None:
    single = _weight_grad(1)
    assert around(graph_of(single), "split_weight_grads")[1].graph is single
    graph = _weight_grad(2)
    _, after = around(graph_of(graph, passes={"split_weight_grads": False}), "split_weight_grads")
    assert after.graph is graph
