"""Reverse-mode autodiff: random composite graphs, fan-out, un-broadcasting, pruning, second order."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import networkx as nx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import glcomp
from glcomp import nn
from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.ops import REGISTRY
from glcomp.ir.passes import autodiff
from glcomp.ir.tensor import Tensor, prim
from glcomp.testing import (
    GradientCheckError,
    GraphCase,
    check_gradients,
    check_graph_gradients,
    random_graphs,
)

rng = np.random.default_rng(1234)


def new_graph(**inputs: tuple[tuple[int, ...], str]) -> tuple[Graph, dict[str, Tensor]]:
    g = Graph()
    return g, {name: Tensor(g, g.add_input(name, shape, role)) for name, (shape, role) in inputs.items()}


def grads_of(g: Graph, loss: Tensor, wrt: list[str], feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    g.outputs["loss"] = loss.node
    out = evaluate(autodiff(g, "loss", wrt), feeds, np.float64)
    return {name: out[f"grad:{name}"] for name in wrt}


# -- random composite graphs -----------------------------------------------------------------------
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graph_gradients(case: GraphCase) -> None:
    reports = check_graph_gradients(case.graph, case.loss, case.wrt, case.feeds)
    assert sorted(reports) == sorted(case.wrt)

    grads = autodiff(case.graph, case.loss, case.wrt)
    grads.validate()
    # Data inputs get no gradient output; backward nodes are labelled as such.
    assert all(f"grad:{name}" not in grads.outputs for name in case.data)
    forward = set(case.graph.nodes())
    for n in grads.nodes():
        if n not in forward and nx.ancestors(grads.g, n) & forward:  # not a constant seed or zero
            assert grads.node(n)["origin"].endswith("[grad]"), grads.node(n)
    # The forward graph is left untouched.
    assert set(case.graph.outputs) == {case.loss}


def test_checker_rejects_a_wrong_gradient_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = dataclasses.replace(REGISTRY["tanh"], grad=lambda g, out, a: (g * out,))
    monkeypatch.setitem(REGISTRY, "tanh", wrong)
    g, t = new_graph(p=((2, 3), "param"), w=((2, 3), "data"))
    g.outputs["loss"] = (t["p"].tanh() * t["w"]).sum().node
    feeds = {"p": rng.normal(size=(2, 3)), "w": rng.normal(size=(2, 3))}
    with pytest.raises(GradientCheckError, match=r"'p'.*worst element p\[\d, \d\]"):
        check_graph_gradients(g, "loss", ["p"], feeds)


# -- fan-out ---------------------------------------------------------------------------------------
def test_square_is_two_edges_and_gradient_doubles() -> None:
    g, t = new_graph(x=((3, 4), "param"), w=((3, 4), "data"))
    y = t["x"] * t["x"]
    assert g.operands(y.node) == [t["x"].node, t["x"].node]
    x, w = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    got = grads_of(g, (y * t["w"]).sum(), ["x"], {"x": x, "w": w})["x"]
    np.testing.assert_allclose(got, 2 * x * w, rtol=1e-12)


@pytest.mark.parametrize(
    ("build", "derivative"),
    [
        (lambda x: x + x + x, lambda x: 3 + 0 * x),
        (lambda x: x * x * x, lambda x: 3 * x**2),
        (lambda x: x * x.tanh() + x, lambda x: np.tanh(x) + x * (1 - np.tanh(x) ** 2) + 1),
        (lambda x: (x - x.mean()) * x, lambda x: 2 * x - x.mean() - x.sum() / x.size),
    ],
    ids=["x+x+x", "x*x*x", "x*tanh(x)+x", "(x-mean)*x"],
)
def test_fan_out_contributions_are_summed(
    build: Callable[[Tensor], Tensor], derivative: Callable[[np.ndarray], np.ndarray]
) -> None:
    g, t = new_graph(x=((5,), "param"))
    x = rng.normal(size=5)
    got = grads_of(g, build(t["x"]).sum(), ["x"], {"x": x})["x"]
    # d/dx_i sum_j f(x)_j; the last case couples elements through the mean.
    np.testing.assert_allclose(got, derivative(x), rtol=1e-10, atol=1e-12)


# -- un-broadcasting -------------------------------------------------------------------------------
def test_bias_gradients_are_summed_over_broadcast_axes() -> None:
    g, t = new_graph(
        x=((6, 3), "data"),
        W=((3, 4), "param"),
        b=((4,), "param"),
        b_row=((1, 4), "param"),
        s=((), "param"),
        col=((6, 1), "param"),
        w=((6, 4), "data"),
    )
    y = t["x"] @ t["W"] + t["b"] + t["b_row"] + t["s"] + t["col"]
    feeds = {k: rng.normal(size=g.shape(g.inputs[k])) for k in g.inputs}
    grads = grads_of(g, (y * t["w"]).sum(), ["W", "b", "b_row", "s", "col"], feeds)
    w = feeds["w"]
    np.testing.assert_allclose(grads["W"], feeds["x"].T @ w, rtol=1e-12)
    np.testing.assert_allclose(grads["b"], w.sum(0), rtol=1e-12)
    np.testing.assert_allclose(grads["b_row"], w.sum(0, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(grads["s"], w.sum(), rtol=1e-12)
    np.testing.assert_allclose(grads["col"], w.sum(1, keepdims=True), rtol=1e-12)
    for name, value in grads.items():
        assert value.shape == feeds[name].shape


def test_outer_broadcast_of_both_operands() -> None:
    g, t = new_graph(a=((3, 1), "param"), b=((1, 4), "param"), w=((3, 4), "data"))
    feeds = {"a": rng.normal(size=(3, 1)), "b": rng.normal(size=(1, 4)), "w": rng.normal(size=(3, 4))}
    grads = grads_of(g, (t["a"] * t["b"] * t["w"]).sum(), ["a", "b"], feeds)
    np.testing.assert_allclose(grads["a"], (feeds["b"] * feeds["w"]).sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(grads["b"], (feeds["a"] * feeds["w"]).sum(0, keepdims=True), rtol=1e-12)


# -- only the needed backward work -----------------------------------------------------------------
def backward_matmuls(graph: Graph) -> int:
    return sum(1 for n in graph.nodes() if graph.op(n) == "matmul" and "[grad]" in graph.node(n)["origin"])


def mlp() -> nn.Module:
    glcomp.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3))


def test_no_gradient_work_for_data_inputs() -> None:
    prog = glcomp.compile(mlp(), {"x": (8, 4)}, loss=nn.MSELoss())
    grads = prog.graphs["gradients"]
    assert "grad:x" not in grads.outputs
    assert set(grads.outputs) == {"loss", "grad:0.weight", "grad:0.bias", "grad:2.weight", "grad:2.bias"}
    # dW2, dh1 and dW1 are the only products the backward pass needs; dx would be a fourth.
    assert backward_matmuls(grads) == 3

    naive = autodiff(grads, "loss", [*prog.trainable, "x"])
    naive.outputs = {k: v for k, v in naive.outputs.items() if k == "loss" or k.startswith("grad:")}
    naive = naive.prune()
    assert backward_matmuls(naive) == 4
    assert grads.g.number_of_nodes() < naive.g.number_of_nodes()


def test_frozen_parameters_cost_no_backward_work() -> None:
    model = mlp()
    model[0].weight.requires_grad = False
    prog = glcomp.compile(model, {"x": (8, 4)}, loss=nn.MSELoss())
    grads = prog.graphs["gradients"]
    assert "grad:0.weight" not in grads.outputs and "grad:0.bias" in grads.outputs
    assert backward_matmuls(grads) == 2  # dW2 and dh1; no dW1


def test_unreachable_input_gets_a_zero_gradient() -> None:
    g, t = new_graph(x=((2, 3), "param"), unused=((4,), "param"))
    feeds = {"x": rng.normal(size=(2, 3)), "unused": rng.normal(size=4)}
    grads = grads_of(g, t["x"].tanh().sum(), ["x", "unused"], feeds)
    assert grads["unused"].shape == (4,) and not np.any(grads["unused"])


def test_autodiff_errors() -> None:
    g, t = new_graph(x=((2, 3), "param"))
    g.outputs["vector"] = t["x"].sum(0).node
    g.outputs["loss"] = t["x"].sum().node
    with pytest.raises(GlcompError, match="scalar"):
        autodiff(g, "vector", ["x"])
    with pytest.raises(GlcompError, match="'nope'"):
        autodiff(g, "loss", ["nope"])
    with pytest.raises(GlcompError, match="'missing'"):
        autodiff(g, "missing", ["x"])


def test_max_pool_has_no_second_derivative() -> None:
    g, t = new_graph(x=((1, 1, 4, 4), "param"))
    y = prim("max_pool2d", t["x"], kernel=(2, 2), stride=(2, 2), padding=(0, 0))
    g.outputs["loss"] = y.sum().node
    first = autodiff(g, "loss", ["x"])
    first.outputs["loss2"] = Tensor(first, first.outputs["grad:x"]).sum().node
    with pytest.raises(GlcompError, match="max_pool2d_grad"):
        autodiff(first, "loss2", ["x"])


# -- second order ----------------------------------------------------------------------------------
def tanh_fn(t: dict[str, Tensor]) -> Tensor:
    return t["a"].tanh()


def matmul_fn(t: dict[str, Tensor]) -> Tensor:
    return (t["a"] @ t["b"]).tanh()


def conv_fn(t: dict[str, Tensor]) -> Tensor:
    return prim("conv2d", t["a"], t["b"], stride=(2, 1), padding=(1, 1)).tanh()


def avg_pool_fn(t: dict[str, Tensor]) -> Tensor:
    y = prim("avg_pool2d", t["a"].sigmoid(), kernel=(3, 2), stride=(2, 2), padding=(1, 0))
    return y * y


def softmax_fn(t: dict[str, Tensor]) -> Tensor:
    return nn.functional.log_softmax(t["a"] @ t["b"], dim=1)


SECOND_ORDER = {
    "tanh": (tanh_fn, {"a": (3, 4)}),
    "matmul": (matmul_fn, {"a": (3, 4), "b": (4, 2)}),
    "conv2d": (conv_fn, {"a": (2, 2, 5, 4), "b": (3, 2, 3, 2)}),
    "avg_pool2d": (avg_pool_fn, {"a": (1, 2, 5, 4)}),
    "log_softmax": (softmax_fn, {"a": (3, 4), "b": (4, 5)}),
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER))
def test_second_order_gradients(name: str) -> None:
    """loss2 = sum(grad(loss1) * u) differentiated again, checked by finite differences."""
    fn, shapes = SECOND_ORDER[name]
    g, t = new_graph(**{k: (s, "param") for k, s in shapes.items()})
    out = fn(t)
    w = Tensor(g, g.add_input("w", out.shape, "data"))
    g.outputs["loss"] = (out * w).sum().node
    first = autodiff(g, "loss", list(shapes))
    loss2 = None
    for k, s in shapes.items():
        u = Tensor(first, first.add_input(f"u_{k}", s, "data"))
        term = (Tensor(first, first.outputs[f"grad:{k}"]) * u).sum()
        loss2 = term if loss2 is None else loss2 + term
    first.outputs["loss2"] = loss2.node
    local = np.random.default_rng(7)
    feeds = {k: local.normal(size=s) for k, s in shapes.items()}
    feeds |= {f"u_{k}": local.normal(size=s) for k, s in shapes.items()}
    feeds["w"] = local.normal(size=out.shape)
    reports = check_graph_gradients(first, "loss2", list(shapes), feeds)
    assert all(r.checked == np.prod(shapes[k]) for k, r in reports.items())


def test_second_order_tanh_closed_form() -> None:
    g, t = new_graph(a=((6,), "param"), w=((6,), "data"))
    g.outputs["loss"] = (t["a"].tanh() * t["w"]).sum().node
    first = autodiff(g, "loss", ["a"])
    first.outputs["loss2"] = Tensor(first, first.outputs["grad:a"]).sum().node
    a, w = rng.normal(size=6), rng.normal(size=6)
    second = evaluate(autodiff(first, "loss2", ["a"]), {"a": a, "w": w}, np.float64)["grad:a"]
    th = np.tanh(a)
    np.testing.assert_allclose(second, w * (-2 * th * (1 - th**2)), rtol=1e-10)


# -- whole models through glcomp.testing.check_gradients -----------------------------------------------
class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, stride=2, padding=1)
        self.pool = nn.AvgPool2d(2, stride=1)
        self.bn = nn.BatchNorm1d(12)
        self.fc = nn.Linear(12, 4)

    def forward(self, x: Any) -> Any:
        h = self.pool(self.conv(x).sigmoid()).flatten(1)
        return self.fc(self.bn(h).tanh())


class Recurrent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(3, 4, batch_first=True)
        self.fc = nn.Linear(4, 2)

    def forward(self, x: Any) -> Any:
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def test_check_gradients_on_models() -> None:
    glcomp.manual_seed(0)
    data = np.random.default_rng(3)
    model = ConvNet()
    model.fc.bias.requires_grad = False
    reports = check_gradients(
        model, {"x": data.normal(size=(3, 2, 5, 5))}, np.array([0, 3, 1]), nn.CrossEntropyLoss()
    )
    assert sorted(reports) == sorted(k for k, p in model.named_parameters() if p.requires_grad)
    assert "fc.bias" not in reports
    assert reports["conv.weight"].checked == 2 * 3 * 3 * 3
    reports = check_gradients(
        Recurrent(),
        {"x": data.normal(size=(2, 3, 3))},
        data.normal(size=(2, 2)),
        nn.MSELoss(),
        max_elements=10,
    )
    assert reports["lstm.weight_hh_l0"].checked == 10


def test_check_gradients_names_the_parameter(monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = dataclasses.replace(REGISTRY["sigmoid"], grad=lambda g, out, a: (g * out,))
    monkeypatch.setitem(REGISTRY, "sigmoid", wrong)
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 2))
    x, y = np.random.default_rng(0).normal(size=(5, 3)), np.random.default_rng(1).normal(size=(5, 2))
    with pytest.raises(GradientCheckError, match=r"w\.r\.t\. '0\.weight'.*worst element 0\.weight\[\d, \d\]"):
        check_gradients(model, {"x": x}, y, nn.MSELoss())
