"""The split_reductions pass: same values, and long reductions with few outputs split in two."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.passes import split_reductions
from glcomp.ir.passes.split_reductions import FEW, LONG


def _graph(shape: tuple[int, ...], axes: tuple[int, ...], op: str) -> Graph:
    g = Graph()
    x = g.add_input("x", shape, "data")
    g.outputs["out"] = g.add(op, [g.add("exp", [x])], axes=axes)
    return g


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.sampled_from([1, 2, 3, 4, 8, 16, 24, 64]), min_size=1, max_size=4).map(tuple),
    data=st.data(),
    op=st.sampled_from(["sum", "max"]),
)
def test_same_values_and_guarantee(shape: tuple[int, ...], data: st.DataObject, op: str) -> None:
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), min_size=1))))
    g = _graph(shape, axes, op)
    out = split_reductions(g)
    out.validate()
    x = np.random.default_rng(0).normal(size=shape).astype(np.float64)
    want = evaluate(g, {"x": x}, np.float64)["out"]
    got = evaluate(out, {"x": x}, np.float64)["out"]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.shape == want.shape
    for n in out.nodes():
        if out.op(n) in ("sum", "max"):
            (src,) = out.operands(n)
            extent = math.prod(out.shape(src)[a] for a in out.attrs(n)["axes"])
            splittable = len(out.attrs(n)["axes"]) > 1 or out.attrs(n)["axes"][0] != len(out.shape(src)) - 1
            long_and_few = extent >= LONG and math.prod(out.shape(n)) <= FEW
            # Only nodes the pass created may remain long: the originals were all replaced.
            assert not (long_and_few and splittable and n in g.g), out


@pytest.mark.parametrize(
    "shape, axes, first",
    [((64, 32, 4, 4), (0, 2, 3), (2, 3)), ((512, 10, 3), (0,), None), ((16, 8, 8, 8), (0, 1, 2, 3), (2, 3))],
)
def test_splits_as_documented(shape, axes, first) -> None:
    out = split_reductions(_graph(shape, axes, "sum"))
    sums = [n for n in out.topo() if out.op(n) == "sum"]
    assert len(sums) == 2
    if first is not None:
        assert tuple(out.attrs(sums[0])["axes"]) == first
    else:  # one axis: split through a reshape into about sqrt(L) x sqrt(L)
        assert any(out.op(n) == "reshape" for n in out.nodes())


def test_short_or_wide_reductions_are_left_alone() -> None:
    for shape, axes in [((8, 8), (0,)), ((2048, 64), (1,)), ((300, 2000), (0,)), ((257, 3), (0,))]:
        g = _graph(shape, axes, "sum")
        out = split_reductions(g)
        assert sum(out.op(n) == "sum" for n in out.nodes()) == 1, (shape, axes)
