"""The split_reductions pass: same values, and long reductions with few outputs split in two."""

from __future__ import annotations

import math
from typing import Any

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


def test_a_wider_device_splits_the_first_stage_again() -> None:
    """BatchNorm's per-channel sum over (N, H, W) at N = 32, C = 64, 32 x 32: its first stage has
    N x C = 2048 outputs of 1024 elements each. With FEW it stays so (2048 fragments looping 256
    texels: 1.21 ms of a MobileNet step on the H200); with a GPU's few (a quarter of
    parallel_fragments) it is split again, over W then H, each loop 32 long."""
    shape, axes = (32, 64, 32, 32), (0, 2, 3)
    g = _graph(shape, axes, "sum")
    two = split_reductions(g)
    assert [tuple(two.attrs(n)["axes"]) for n in two.topo() if two.op(n) == "sum"] == [(2, 3), (0,)]
    three = split_reductions(g, few=(1 << 14) // 4)
    sums = [n for n in three.topo() if three.op(n) == "sum"]
    assert [tuple(three.attrs(n)["axes"]) for n in sums] == [(3,), (2,), (0,)]
    assert [math.prod(three.shape(n)) for n in sums] == [32 * 64 * 32, 32 * 64, 64]
    x = np.random.default_rng(1).normal(size=shape)
    want = evaluate(g, {"x": x}, np.float64)["out"]
    np.testing.assert_allclose(evaluate(three, {"x": x}, np.float64)["out"], want, rtol=1e-12)


def test_the_gpu_target_splits_batchnorm_sums_and_trains_like_the_reference(gl_runtime: Any) -> None:
    """Compiled for webgl2-gpu (a width of 2^14 fragments), a BatchNorm's sums are reduced in
    three stages; the GL run (llvmpipe) matches the reference."""
    import glcomp
    from glcomp import nn, optim

    glcomp.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 256, 4)
    )
    kw = {"loss": nn.CrossEntropyLoss(), "optimizer": optim.SGD(lr=0.05)}
    gpu = glcomp.compile(model, {"x": (32, 3, 16, 16)}, target="webgl2-gpu", **kw)

    def sums(target: str) -> int:  # each reduction its own draw
        prog = glcomp.compile(model, {"x": (32, 3, 16, 16)}, target=target, passes={"mrt": False}, **kw)
        draws = prog.bundle().manifest["entries"]["train_step"]["draws"]
        return sum(d["kernel"].split("_", 1)[1] == "sum" for d in draws)

    assert sums("webgl2-gpu") > sums("webgl2")  # the extra stages
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3, 16, 16)).astype(np.float32)
    y = rng.integers(0, 4, size=(32,)).astype(np.int32)
    ref = gpu.runtime("reference")
    with gl_runtime(gpu) as gl:
        for _ in range(2):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-4)
        for name, value in ref.state_dict().items():
            np.testing.assert_allclose(gl.state_dict()[name], value, rtol=1e-3, atol=1e-5, err_msg=name)
