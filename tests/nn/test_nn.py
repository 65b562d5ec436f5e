"""The torch.nn-style front-end without torch: names, initialisation, seeding, symbolic tensor ops."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn

rng = np.random.default_rng(42)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 2, 3, padding=1)
        self.bn = nn.BatchNorm2d(2)

    def forward(self, x: Any) -> Any:
        return self.bn(self.conv(x)).relu()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * 4 * 4, 3, bias=False))
        self.scale = nn.Parameter(np.ones(3))

    def forward(self, x: Any) -> Any:
        return self.head(self.block(x)) * self.scale


# -- names and traversal ---------------------------------------------------------------------------
def test_sequential_state_dict_names() -> None:
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    state = model.state_dict()
    assert list(state) == ["0.weight", "0.bias", "2.weight", "2.bias"]
    assert state["0.weight"].shape == (3, 4) and state["2.bias"].shape == (2,)
    assert all(v.dtype == np.float32 for v in state.values())
    state["0.weight"][:] = 7  # a copy, not a view of the parameter
    assert not np.any(model[0].weight.data == 7)


def test_nested_module_names() -> None:
    net = Net()
    assert list(net.state_dict()) == [
        "scale",
        "block.conv.weight",
        "block.conv.bias",
        "block.bn.weight",
        "block.bn.bias",
        "block.bn.running_mean",
        "block.bn.running_var",
        "block.bn.num_batches_tracked",
        "head.1.weight",
    ]
    assert [name for name, _ in net.named_modules()] == [
        "",
        "block",
        "block.conv",
        "block.bn",
        "head",
        "head.0",
        "head.1",
    ]
    assert net.state_dict()["block.bn.num_batches_tracked"].dtype == np.int64


def test_lstm_parameter_names() -> None:
    names = [k for k, _ in nn.LSTM(3, 5, batch_first=True).named_parameters()]
    assert names == ["weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"]


def test_parameters_and_named_parameters_agree() -> None:
    net = Net()
    named = list(net.named_parameters())
    params = list(net.parameters())
    assert len(named) == len(params) == 6
    assert all(p is q for (_, p), q in zip(named, params))
    assert dict(named)["block.conv.weight"] is net.block.conv.weight
    net.requires_grad_(False)
    assert not any(p.requires_grad for p in net.parameters())
    net.head.requires_grad_(True)
    assert [k for k, p in net.named_parameters() if p.requires_grad] == ["head.1.weight"]


def test_load_state_dict_round_trip() -> None:
    glcomp.manual_seed(1)
    a = Net()
    glcomp.manual_seed(2)
    b = Net()
    b.load_state_dict(a.state_dict())
    for (k, va), (_, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(va, vb, err_msg=k)
        assert va.dtype == vb.dtype


def test_train_eval_modes_propagate() -> None:
    net = Net()
    assert all(m.training for m in net.modules())
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    assert all(m.training for m in net.modules())


# -- initialisation --------------------------------------------------------------------------------
def assert_uniform(values: np.ndarray, bound: float, what: str) -> None:
    assert values.dtype == np.float32
    assert np.all(np.abs(values) <= bound), f"{what} exceeds +-{bound}"
    assert np.max(np.abs(values)) > 0.5 * bound, f"{what} does not fill +-{bound}"
    if values.size >= 500:  # U(-b, b) has mean 0 and standard deviation b / sqrt(3)
        assert abs(values.mean()) < 0.1 * bound
        assert values.std() == pytest.approx(bound / math.sqrt(3), rel=0.1)


@pytest.mark.parametrize(
    ("build", "fan_in"),
    [
        (lambda: nn.Linear(20, 30), 20),
        (lambda: nn.Linear(1, 600), 1),
        (lambda: nn.Conv2d(3, 40, (3, 5)), 45),
    ],
    ids=["linear", "linear-fan-in-1", "conv2d"],
)
def test_default_init_follows_torch(build: Callable[[], nn.Module], fan_in: int) -> None:
    glcomp.manual_seed(0)
    layer = build()
    bound = 1 / math.sqrt(fan_in)
    assert_uniform(layer.weight.data, bound, "weight")
    assert_uniform(layer.bias.data, bound, "bias")


def test_lstm_and_batchnorm_init() -> None:
    glcomp.manual_seed(0)
    lstm = nn.LSTM(6, 25)
    for name, p in lstm.named_parameters():
        assert_uniform(p.data, 1 / math.sqrt(25), name)
    bn = nn.BatchNorm1d(5)
    np.testing.assert_array_equal(bn.weight.data, np.ones(5))
    np.testing.assert_array_equal(bn.bias.data, np.zeros(5))
    state = bn.state_dict()
    np.testing.assert_array_equal(state["running_mean"], np.zeros(5))
    np.testing.assert_array_equal(state["running_var"], np.ones(5))
    assert int(state["num_batches_tracked"]) == 0


def test_manual_seed_reproducibility() -> None:
    glcomp.manual_seed(5)
    first = [Net().state_dict() for _ in range(2)]
    glcomp.manual_seed(5)
    again = [Net().state_dict() for _ in range(2)]
    glcomp.manual_seed(6)
    other = Net().state_dict()
    for a, b in zip(first, again):
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    assert not np.array_equal(first[0]["block.conv.weight"], first[1]["block.conv.weight"])
    assert not np.array_equal(first[0]["block.conv.weight"], other["block.conv.weight"])


# -- symbolic tensor operations against numpy ------------------------------------------------------
class Fn1(nn.Module):
    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: Any) -> Any:
        return self.fn(x)


class Fn2(Fn1):
    def forward(self, x: Any, y: Any) -> Any:
        return self.fn(x, y)


def run(fn: Callable[..., Any], *arrays: np.ndarray) -> np.ndarray:
    model = Fn1(fn) if len(arrays) == 1 else Fn2(fn)
    names = ["x", "y"][: len(arrays)]
    prog = glcomp.compile(model, {n: a.shape for n, a in zip(names, arrays)})
    prog.graphs["predict"].validate()
    return prog.runtime("reference", dtype=np.float64).predict(**dict(zip(names, arrays)))


UNARY_CASES: dict[str, tuple[tuple[int, ...], Callable[..., Any], Callable[..., Any]]] = {
    # name: (shape, glcomp function, numpy function)
    "x+2": ((3, 4), lambda x: x + 2, lambda x: x + 2),
    "2+x": ((3, 4), lambda x: 2 + x, lambda x: 2 + x),
    "x-1.5": ((3, 4), lambda x: x - 1.5, lambda x: x - 1.5),
    "3-x": ((3, 4), lambda x: 3 - x, lambda x: 3 - x),
    "x*0.5": ((3, 4), lambda x: x * 0.5, lambda x: x * 0.5),
    "np2*x": ((3, 4), lambda x: np.float64(2.0) * x, lambda x: 2.0 * x),
    "x/4": ((3, 4), lambda x: x / 4, lambda x: x / 4),
    "1/(x*x+1)": ((3, 4), lambda x: 1 / (x * x + 1), lambda x: 1 / (x * x + 1)),
    "-x": ((3, 4), lambda x: -x, lambda x: -x),
    "x**2": ((3, 4), lambda x: x**2, lambda x: x**2),
    "x**-1": ((3, 4), lambda x: (x * x + 1) ** -1, lambda x: 1 / (x * x + 1)),
    "sqrt": ((3, 4), lambda x: (x * x + 1).sqrt(), lambda x: np.sqrt(x * x + 1)),
    "exp-log": ((3, 4), lambda x: x.exp() + (x * x + 1).log(), lambda x: np.exp(x) + np.log(x * x + 1)),
    "tanh-sigmoid-relu": (
        (3, 4),
        lambda x: x.tanh() + x.sigmoid() + x.relu(),
        lambda x: np.tanh(x) + 1 / (1 + np.exp(-x)) + np.maximum(x, 0),
    ),
    "mean": ((3, 4), lambda x: x.mean(), lambda x: x.mean()),
    "mean(1)": ((3, 4, 2), lambda x: x.mean(1), lambda x: x.mean(1)),
    "mean(0,keepdim)": ((3, 4), lambda x: x.mean(dim=0, keepdim=True), lambda x: x.mean(0, keepdims=True)),
    "sum": ((3, 4), lambda x: x.sum(), lambda x: x.sum()),
    "sum((0,2))": ((3, 4, 2), lambda x: x.sum((0, 2)), lambda x: x.sum((0, 2))),
    "sum(-1,keepdim)": ((3, 4), lambda x: x.sum(-1, keepdim=True), lambda x: x.sum(-1, keepdims=True)),
    "amax(1)": ((3, 4), lambda x: x.amax(1), lambda x: x.max(1)),
    "reshape": ((3, 4), lambda x: x.reshape(6, -1), lambda x: x.reshape(6, -1)),
    "view(-1)": ((3, 4), lambda x: x.view(-1), lambda x: x.reshape(-1)),
    "view(tuple)": ((2, 3, 4), lambda x: x.view((4, 6)), lambda x: x.reshape(4, 6)),
    "transpose": ((2, 3, 4), lambda x: x.transpose(0, 2), lambda x: np.swapaxes(x, 0, 2)),
    "T": ((3, 4), lambda x: x.T, lambda x: x.T),
    "permute": ((2, 3, 4), lambda x: x.permute(2, 0, 1), lambda x: np.transpose(x, (2, 0, 1))),
    "flatten(1)": ((2, 3, 4), lambda x: x.flatten(1), lambda x: x.reshape(2, 12)),
    "flatten": ((2, 3, 4), lambda x: x.flatten(), lambda x: x.reshape(-1)),
    "unsqueeze-squeeze": ((3, 4), lambda x: x.unsqueeze(1).squeeze(), lambda x: x),
    "unsqueeze(-1)": ((3, 4), lambda x: x.unsqueeze(-1), lambda x: x[..., None]),
    "expand": ((3, 1), lambda x: x.expand(3, 5), lambda x: np.broadcast_to(x, (3, 5))),
    "[:,-1]": ((2, 3, 4), lambda x: x[:, -1], lambda x: x[:, -1]),
    "[1]": ((3, 4), lambda x: x[1], lambda x: x[1]),
    "[...,1:3]": ((2, 3, 4), lambda x: x[..., 1:3], lambda x: x[..., 1:3]),
    "[0,1:]": ((3, 4), lambda x: x[0, 1:], lambda x: x[0, 1:]),
    "[-2:,:-1]": ((3, 4), lambda x: x[-2:, :-1], lambda x: x[-2:, :-1]),
    "cat(x,2x,0)": ((3, 4), lambda x: glcomp.cat([x, x * 2], 0), lambda x: np.concatenate([x, x * 2], 0)),
    "stack": ((3, 4), lambda x: glcomp.stack([x, -x], 1), lambda x: np.stack([x, -x], 1)),
    "fan-out": ((5,), lambda x: x * x + x.tanh() * x, lambda x: x * x + np.tanh(x) * x),
}

BINARY_CASES: dict[str, tuple[tuple[int, ...], tuple[int, ...], Callable[..., Any], Callable[..., Any]]] = {
    "x+y bias": ((3, 4), (4,), lambda x, y: x + y, lambda x, y: x + y),
    "x*y outer": ((3, 1), (1, 4), lambda x, y: x * y, lambda x, y: x * y),
    "x-y rank3": ((2, 3, 4), (3, 1), lambda x, y: x - y, lambda x, y: x - y),
    "y-x": ((2, 3, 4), (4,), lambda x, y: y - x, lambda x, y: y - x),
    "x/(y*y+1)": ((3, 4), (3, 1), lambda x, y: x / (y * y + 1), lambda x, y: x / (y * y + 1)),
    "matmul": ((3, 4), (4, 5), lambda x, y: x @ y, lambda x, y: x @ y),
    "batched matmul": ((2, 3, 4), (4, 5), lambda x, y: x @ y, lambda x, y: x @ y),
    "matrix@vector": ((3, 4), (4,), lambda x, y: x @ y, lambda x, y: x @ y),
    "vector@matrix": ((4,), (4, 5), lambda x, y: x @ y, lambda x, y: x @ y),
    "cat dim 1": (
        (3, 4),
        (3, 2),
        lambda x, y: glcomp.cat([x, y], dim=1),
        lambda x, y: np.concatenate([x, y], 1),
    ),
    "cat dim -1": (
        (2, 1, 3),
        (2, 1, 1),
        lambda x, y: glcomp.cat([y, x, y], -1),
        lambda x, y: np.concatenate([y, x, y], -1),
    ),
}


@pytest.mark.parametrize("name", sorted(UNARY_CASES))
def test_unary_tensor_ops_match_numpy(name: str) -> None:
    shape, fn, ref = UNARY_CASES[name]
    x = rng.normal(size=shape)
    got = run(fn, x)
    want = np.asarray(ref(x))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(BINARY_CASES))
def test_binary_tensor_ops_match_numpy(name: str) -> None:
    sx, sy, fn, ref = BINARY_CASES[name]
    x, y = rng.normal(size=sx), rng.normal(size=sy)
    got = run(fn, x, y)
    want = np.asarray(ref(x, y))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_tensor_metadata_during_tracing() -> None:
    seen: dict[str, Any] = {}

    def probe(x: Any) -> Any:
        seen.update(shape=x.shape, ndim=x.ndim, dim=x.dim(), size=x.size(), size1=x.size(-1))
        seen.update(numel=x.numel(), len=len(x))
        return x

    run(probe, np.zeros((2, 3, 5)))
    assert seen == {
        "shape": (2, 3, 5),
        "ndim": 3,
        "dim": 3,
        "size": (2, 3, 5),
        "size1": 5,
        "numel": 30,
        "len": 2,
    }


def test_tuple_outputs_are_numbered() -> None:
    x = rng.normal(size=(3, 4))
    got = run(lambda x: (x + 1, (x * 2, x.sum())), x)
    assert sorted(got) == ["output.0", "output.1.0", "output.1.1"]
    np.testing.assert_allclose(got["output.0"], x + 1)
    np.testing.assert_allclose(got["output.1.0"], x * 2)
    np.testing.assert_allclose(got["output.1.1"], x.sum())


def test_predict_float32_close_to_float64() -> None:
    glcomp.manual_seed(0)
    net = Net()
    net.eval()
    prog = glcomp.compile(net, {"x": (2, 1, 4, 4)})
    x = rng.normal(size=(2, 1, 4, 4))
    out32 = prog.runtime("reference").predict(x=x)
    out64 = prog.runtime("reference", dtype=np.float64).predict(x=x)
    assert out32.dtype == np.float32 and out64.dtype == np.float64
    assert out32.shape == (2, 3)
    np.testing.assert_allclose(out32, out64, rtol=1e-4, atol=1e-5)
