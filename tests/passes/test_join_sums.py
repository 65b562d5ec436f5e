"""join_sums: a sum of products (a recurrent weight's per-step gradients) as one product over
operands concatenated along K."""

from __future__ import annotations

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate


def _steps(steps: int, batch: int = 3, hidden: int = 4, gates: int = 8, extra: bool = True) -> Graph:
    """grad(W) = sum_t (h_t^T g_t)^T (+ a bias-like term), the shape of an RNN's recurrent
    weight gradient."""
    g = Graph()
    hs = [g.add_input(f"h{t}", (batch, hidden), "data") for t in range(steps)]
    gs = [g.add_input(f"g{t}", (batch, gates), "data") for t in range(steps)]
    total = None
    for h, d in zip(hs, gs, strict=True):
        term = g.add("permute", [g.add("matmul", [g.add("permute", [h], perm=(1, 0)), d])], perm=(1, 0))
        total = term if total is None else g.add("add", [total, term])
    if extra:
        total = g.add("add", [total, g.add_input("w", (gates, hidden), "data")])
    g.outputs = {"output": total}
    return g


def _feeds(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=graph.shape(n)).astype(np.float32) for name, n in graph.inputs.items()}


def test_join_sums_golden(graph_of, around, golden) -> None:
    _, after = around(graph_of(_steps(3)), "join_sums")
    golden(
        after,
        """
        plan predict after join_sums: 13 nodes, 0 stored, 0 kernels
        %0:f32[3,4] = input[name=h0 role=data shape=(3,4)]
        %1:f32[3,4] = input[name=h1 role=data shape=(3,4)]
        %2:f32[3,4] = input[name=h2 role=data shape=(3,4)]
        %3:f32[3,8] = input[name=g0 role=data shape=(3,8)]
        %4:f32[3,8] = input[name=g1 role=data shape=(3,8)]
        %5:f32[3,8] = input[name=g2 role=data shape=(3,8)]
        %17:f32[8,4] = input[name=w role=data shape=(8,4)]
        %19:f32[9,4] = concat[axis=0] %0 %1 %2
        %20:f32[4,9] = permute[perm=(1,0)] %19
        %21:f32[9,8] = concat[axis=0] %3 %4 %5
        %22:f32[4,8] = matmul %20 %21
        %23:f32[8,4] = permute[perm=(1,0)] %22
        %24:f32[8,4] = add %23 %17
        return output=%24
        """,
    )


def _matmuls(graph: Graph) -> list[int]:
    return [n for n in graph.g if graph.op(n) == "matmul"]


def test_join_sums_computes_the_same_sum(graph_of, around) -> None:
    for steps, extra in ((2, False), (5, True), (33, True)):
        graph = _steps(steps, extra=extra)
        _, after = around(graph_of(graph), "join_sums")
        assert len(_matmuls(after.graph)) == 1, steps
        feeds = _feeds(graph, steps)
        want = evaluate(graph, feeds, np.float64)["output"]
        got = evaluate(after.graph, feeds, np.float64)["output"]
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_join_sums_leaves_shared_products_single_terms_and_off_alone(graph_of, around) -> None:
    shared = _steps(3)
    shared.outputs["also"] = _matmuls(shared)[0]  # read elsewhere: not folded into the sum
    _, after = around(graph_of(shared), "join_sums")
    assert len(_matmuls(after.graph)) == 2  # that one, and the other two joined
    feeds = _feeds(shared)
    for name, want in evaluate(shared, feeds, np.float64).items():
        np.testing.assert_allclose(evaluate(after.graph, feeds, np.float64)[name], want, rtol=1e-12)

    single = _steps(1)
    assert around(graph_of(single), "join_sums")[1].graph is single
    many = _steps(4)
    assert around(graph_of(many, passes={"join_sums": False}), "join_sums")[1].graph is many


class _Last(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(4, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        return self.fc(self.rnn(x)[0][:, -1])


def test_an_lstm_recurrent_weight_gradient_is_one_product(plan_of, around) -> None:
    """The T - 1 per-step products of grad(weight_hh) (K = N each) become one with K = (T - 1) * N."""
    batch, steps = 3, 6
    plan = plan_of(_Last(), {"x": (batch, steps, 4)}, "gradients", loss=nn.CrossEntropyLoss())
    before, after = around(plan, "join_sums")

    def reductions(graph: Graph) -> list[int]:  # K of every product
        return sorted(graph.shape(graph.operands(n)[1])[0] for n in _matmuls(graph))

    assert reductions(before.graph).count(batch) - reductions(after.graph).count(batch) == steps - 1
    assert (steps - 1) * batch in reductions(after.graph)
    assert len(_matmuls(after.graph)) == len(_matmuls(before.graph)) - (steps - 2)


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_a_joined_recurrent_gradient_trains_on_gl_like_the_reference(gl_runtime, target: str) -> None:
    """20 steps: the joined operands concatenate 19 textures, more than a target samples in one
    draw (split_wide gathers them in a tree). GL with the pass, GL without it and the reference
    runtime take the same SGD steps."""
    glcomp.manual_seed(1)
    model, shape = _Last(), (3, 20, 4)
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=shape).astype(np.float32), rng.integers(0, 3, size=3).astype(np.float32)
    results = []
    for on in (True, False):
        prog = glcomp.compile(
            model,
            {"x": shape},
            nn.CrossEntropyLoss(),
            optim.SGD(lr=0.5),
            target=target,
            passes={"join_sums": on},
        )
        ref = prog.runtime("reference")
        with gl_runtime(prog) as gl:
            for _ in range(2):
                assert gl.train_step(x=x, y=y) == pytest.approx(ref.train_step(x=x, y=y), rel=1e-5)
            results.append({k: np.asarray(v) for k, v in gl.state_dict().items()})
            for k, v in ref.state_dict().items():
                np.testing.assert_allclose(results[-1][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
    for k, v in results[1].items():
        np.testing.assert_allclose(results[0][k], v, rtol=1e-5, atol=1e-6, err_msg=k)
