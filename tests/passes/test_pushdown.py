"""pushdown: a transpose of a product becomes the product of the transposed operands."""

from __future__ import annotations

from glcomp.ir.graph import Graph


def _transposed_product() -> Graph:
    g = Graph()
    a = g.add_input("a", (2, 3), "data")
    b = g.add_input("b", (3, 4), "param")
    g.outputs = {"output": g.add("permute", [g.add("matmul", (a, b))], perm=(1, 0))}
    return g


def test_pushdown_golden(graph_of, around, golden) -> None:
    _, after = around(graph_of(_transposed_product(), passes={"pushdown": True}), "pushdown")
    golden(
        after,
        """
        plan predict after pushdown: 5 nodes, 0 stored, 0 kernels
        %0:f32[2,3] = input[name=a role=data shape=(2,3)]
        %1:f32[3,4] = input[name=b role=param shape=(3,4)]
        %4:f32[4,3] = permute[perm=(1,0)] %1
        %5:f32[3,2] = permute[perm=(1,0)] %0
        %6:f32[4,2] = matmul %4 %5
        return output=%6
        """,
    )


def test_pushdown_is_off_by_default(graph_of, around) -> None:
    graph = _transposed_product()
    before, after = around(graph_of(graph), "pushdown")
    assert after.graph is graph and after.replace(done=()) == before.replace(done=())
