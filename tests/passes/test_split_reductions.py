"""split_reductions: a long sum into few values runs in two stages."""

from __future__ import annotations

from glcomp.ir.graph import Graph


def _long_sum() -> Graph:
    g = Graph()
    x = g.add_input("x", (16, 4, 16), "data")
    g.outputs = {"output": g.add("sum", [x], axes=(0, 2))}  # 256 terms into 4 values
    return g


def test_split_reductions_golden(graph_of, around, golden) -> None:
    _, after = around(graph_of(_long_sum()), "split_reductions")
    golden(
        after,
        """
        plan predict after split_reductions: 3 nodes, 0 stored, 0 kernels
        %0:f32[16,4,16] = input[name=x role=data shape=(16,4,16)]
        %2:f32[16,4,1] = sum[axes=(2)] %0
        %3:f32[1,4,1] = sum[axes=(0)] %2
        return output=%3
        """,
    )


def test_split_reductions_off_keeps_one_sum(graph_of, around) -> None:
    graph = _long_sum()
    _, after = around(graph_of(graph, passes={"split_reductions": False}), "split_reductions")
    assert after.graph is graph
