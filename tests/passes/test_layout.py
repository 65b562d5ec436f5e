"""layout: the order, operands and texture layout of every node, computed once."""

from __future__ import annotations

from glcomp import nn


def test_layout_golden(plan_of, around, golden) -> None:
    before, after = around(plan_of(nn.Linear(4, 3), {"x": (2, 4)}), "layout")
    golden(
        after,
        """
        plan predict after layout: 8 nodes, 0 stored, 0 kernels
        2x1 %0:f32[2,4] = input[name=x role=data shape=(2,4)]
        2x2 %1:f32[3,4] = input[name=weight role=param shape=(3,4)]
        1x1 %2:f32[3] = input[name=bias role=param shape=(3)]
        2x2 %3:f32[4,3] = permute[perm=(1,0)] %1                         # (Linear)
        2x1 %4:f32[2,3] = matmul %0 %3                                   # (Linear)
        1x1 %5:f32[1,3] = reshape[shape=(1,3)] %2                        # (Linear)
        2x1 %6:f32[2,3] = expand[shape=(2,3)] %5                         # (Linear)
        2x1 %7:f32[2,3] = add %4 %6                                      # (Linear)
        return output=%7
        """,
    )
    assert after.graph is before.graph and after.order == tuple(before.graph.topo())
    assert set(after.operands) == set(after.layouts) == set(after.graph.nodes())


def test_layout_pages_of_a_tensor_past_the_texture_size(plan_of, around) -> None:
    _, after = around(plan_of(nn.Linear(4, 3), {"x": (40, 4)}, max_texture_size=4), "layout")
    assert "4x4x3 %0:f32[40,4] = input" in str(after)  # 40 texels in pages of 16
