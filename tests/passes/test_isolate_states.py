"""isolate_states: every written-back state gets a node of its own."""

from __future__ import annotations

import dataclasses

from glcomp.ir.graph import Graph


def test_isolate_states_golden(graph_of, around, golden) -> None:
    """Two states returned as the same input node: each gets an identity copy, and the graph
    given to the pass is not changed."""
    g = Graph()
    p = g.add_input("p", (2,), "param")
    g.outputs = {"param:p": p, "param:q": p}
    plan = dataclasses.replace(graph_of(g, entry="train_step"), states=frozenset("pq"))
    _, after = around(plan, "isolate_states")
    golden(
        after,
        """
        plan train_step after isolate_states: 3 nodes, 0 stored, 0 kernels
        %0:f32[2] = input[name=p role=param shape=(2)]
        %1:f32[2] = stop_gradient %0
        %2:f32[2] = stop_gradient %0
        return param:p=%1, param:q=%2
        """,
    )
    assert g.outputs == {"param:p": p, "param:q": p}


def test_isolated_states_are_handed_on(graph_of, around) -> None:
    g = Graph()
    p = g.add_input("p", (2,), "param")
    g.outputs = {"param:p": g.add("neg", [p])}
    plan = dataclasses.replace(graph_of(g, entry="train_step"), states=frozenset("p"))
    assert around(plan, "isolate_states")[1].graph is g
