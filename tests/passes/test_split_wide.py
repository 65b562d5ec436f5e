"""split_wide: a slice of a concat reads only what it overlaps; a concat reading more pages than
the target has texture units becomes a tree of concats within the limit."""

from __future__ import annotations

from glcomp.ir.graph import Graph


def _stacked() -> Graph:
    g = Graph()
    xs = [g.add_input(f"x{i}", (2, 4), "data") for i in range(3)]
    cat = g.add("concat", xs, axis=0)
    g.outputs = {"output": cat, "last": g.add("slice", [cat], starts=(4, 0), stops=(6, 4))}
    return g


def test_split_wide_golden(graph_of, around, golden) -> None:
    _, after = around(graph_of(_stacked(), max_texture_units=2), "split_wide")
    golden(
        after,
        """
        plan predict after split_wide: 5 nodes, 0 stored, 0 kernels
        %0:f32[2,4] = input[name=x0 role=data shape=(2,4)]
        %1:f32[2,4] = input[name=x1 role=data shape=(2,4)]
        %2:f32[2,4] = input[name=x2 role=data shape=(2,4)]
        %5:f32[4,4] = concat[axis=0] %0 %1
        %6:f32[6,4] = concat[axis=0] %5 %2
        return output=%6, last=%2
        """,
    )


def test_split_wide_hands_on_a_graph_that_fits(graph_of, around) -> None:
    g = Graph()
    xs = [g.add_input(f"x{i}", (2, 4), "data") for i in range(3)]
    g.outputs = {"output": g.add("concat", xs, axis=0)}
    assert around(graph_of(g), "split_wide")[1].graph is g  # 3 pages, 16 units
