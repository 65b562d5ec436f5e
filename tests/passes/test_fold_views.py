"""fold_views: a transpose of a transpose is folded away, so the matmul reads W itself."""

from __future__ import annotations

from glcomp.ir.graph import Graph


def _double_transpose() -> Graph:
    g = Graph()
    x = g.add_input("x", (2, 4), "data")
    w = g.add_input("w", (4, 3), "param")
    back = g.add("permute", [g.add("permute", [w], perm=(1, 0))], perm=(1, 0))
    g.outputs = {"output": g.add("matmul", (x, back))}
    return g


def test_fold_views_golden(graph_of, around, golden) -> None:
    before, after = around(graph_of(_double_transpose()), "fold_views")
    assert "%3:f32[4,3] = permute[perm=(1,0)] %2" in str(before)
    golden(
        after,
        """
        plan predict after fold_views: 3 nodes, 0 stored, 0 kernels
        %0:f32[2,4] = input[name=x role=data shape=(2,4)]
        %1:f32[4,3] = input[name=w role=param shape=(4,3)]
        %4:f32[2,3] = matmul %0 %1
        return output=%4
        """,
    )


def test_fold_views_off_keeps_the_views(graph_of, around) -> None:
    graph = _double_transpose()
    _, after = around(graph_of(graph, passes={"fold_views": False}), "fold_views")
    assert after.graph is graph
