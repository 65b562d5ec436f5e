"""Parity with torch: the same model written against torch.nn and glcomp.nn, torch's weights loaded
into glcomp, then outputs (eval and train mode), losses, gradients and running statistics compared.

torch runs in float64 on the float32 weights; glcomp runs its default float32 reference runtime.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.ir.interpret import evaluate

torch = pytest.importorskip("torch")

RTOL, ATOL = 1e-4, 1e-5


def is_torch(ns: ModuleType) -> bool:
    return ns is torch.nn


def ones(ns: ModuleType, n: int) -> Any:
    return torch.ones(n) if is_torch(ns) else np.ones(n, np.float32)


def functional(ns: ModuleType) -> Any:
    return torch.nn.functional if is_torch(ns) else nn.functional


# -- models, each written once for both namespaces -------------------------------------------------
def linear(ns: ModuleType) -> Any:
    return ns.Sequential(ns.Linear(5, 3))


def activations(ns: ModuleType) -> Any:
    return ns.Sequential(
        ns.Linear(5, 8), ns.LeakyReLU(0.1), ns.Linear(8, 8), ns.Sigmoid(),
        ns.Linear(8, 8), ns.Tanh(), ns.Linear(8, 8), ns.ReLU(), ns.Linear(8, 3),
    )  # fmt: skip


def conv_stride_padding(ns: ModuleType) -> Any:
    return ns.Sequential(
        ns.Conv2d(2, 3, 3, stride=2, padding=1), ns.Tanh(),
        ns.Conv2d(3, 4, (2, 3), stride=(1, 2), padding=(0, 1)), ns.Flatten(), ns.Linear(4 * 2 * 2, 3),
    )  # fmt: skip


def max_pool(ns: ModuleType) -> Any:
    return ns.Sequential(
        ns.Conv2d(1, 3, 3, padding=1), ns.MaxPool2d(2), ns.ReLU(),
        ns.MaxPool2d(3, stride=2, padding=1), ns.Flatten(), ns.Linear(3 * 2 * 2, 4),
    )  # fmt: skip


def avg_pool(ns: ModuleType) -> Any:
    return ns.Sequential(
        ns.Conv2d(1, 3, 3, padding=1), ns.AvgPool2d(2), ns.Tanh(),
        ns.AvgPool2d(3, stride=2, padding=1), ns.Flatten(start_dim=1), ns.Linear(3 * 2 * 2, 4),
    )  # fmt: skip


def batchnorm1d(ns: ModuleType) -> Any:
    return ns.Sequential(ns.Linear(4, 6), ns.BatchNorm1d(6), ns.ReLU(), ns.Linear(6, 3))


def batchnorm2d(ns: ModuleType) -> Any:
    return ns.Sequential(
        ns.Conv2d(2, 3, 3, padding=1),
        ns.BatchNorm2d(3, momentum=0.3),
        ns.Tanh(),
        ns.Flatten(),
        ns.Linear(3 * 4 * 4, 2),
    )


def lstm_last_step(ns: ModuleType) -> Any:
    class LastStep(ns.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lstm = ns.LSTM(3, 5, batch_first=True)
            self.fc = ns.Linear(5, 2)

        def forward(self, x: Any) -> Any:
            out, (h, c) = self.lstm(x)
            return self.fc(out[:, -1]) + (h[0] * c[0].tanh()).sum(1, keepdim=True)

    return LastStep()


def softmax_head(ns: ModuleType) -> Any:
    return ns.Sequential(ns.Linear(5, 4), ns.Softmax(dim=1))


def log_softmax_head(ns: ModuleType) -> Any:
    class LogSoftmax(ns.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = ns.Linear(5, 4)

        def forward(self, x: Any) -> Any:
            return functional(ns).log_softmax(self.fc(x), dim=1) * 0.5 + functional(ns).softmax(self.fc(x), 0)

    return LogSoftmax()


def nested(ns: ModuleType, conv_bias: bool = True) -> Any:
    class Block(ns.Module):
        def __init__(self, cin: int, cout: int) -> None:
            super().__init__()
            self.conv = ns.Conv2d(cin, cout, 3, padding=1, bias=conv_bias)
            self.bn = ns.BatchNorm2d(cout)

        def forward(self, x: Any) -> Any:
            return self.bn(self.conv(x)).relu()

    class Net(ns.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = ns.Sequential(Block(1, 2), ns.MaxPool2d(2), Block(2, 3))
            self.head = ns.Sequential(ns.Flatten(), ns.Linear(3 * 3 * 3, 4))
            self.scale = ns.Parameter(ones(ns, 4))

        def forward(self, x: Any) -> Any:
            return self.head(self.features(x)) * self.scale

    return Net()


CE = ("CrossEntropyLoss", {})
MSE = ("MSELoss", {})
CASES: dict[str, tuple[Callable[[ModuleType], Any], tuple[int, ...], tuple[str, dict[str, Any]]]] = {
    "linear-mse": (linear, (6, 5), MSE),
    "linear-mse-sum": (linear, (6, 5), ("MSELoss", {"reduction": "sum"})),
    "linear-ce": (linear, (6, 5), CE),
    "activations": (activations, (7, 5), CE),
    "conv2d-stride-padding": (conv_stride_padding, (3, 2, 5, 5), CE),
    "maxpool2d": (max_pool, (2, 1, 7, 6), CE),
    "avgpool2d": (avg_pool, (2, 1, 7, 6), MSE),
    "batchnorm1d": (batchnorm1d, (8, 4), CE),
    "batchnorm2d": (batchnorm2d, (5, 2, 4, 4), MSE),
    "lstm-last-step": (lstm_last_step, (3, 4, 3), MSE),
    "softmax": (softmax_head, (6, 5), MSE),
    "log-softmax": (log_softmax_head, (6, 5), CE),
    "nested-module": (nested, (4, 1, 6, 6), CE),
}


def pair(build: Callable[[ModuleType], Any]) -> tuple[Any, Any]:
    """The torch model (float64) and the glcomp model holding the same weights."""
    torch.manual_seed(0)
    tmodel = build(torch.nn)
    gmodel = build(nn)
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    assert list(state) == list(gmodel.state_dict()), "state_dict names or order differ from torch"
    gmodel.load_state_dict(state)
    return tmodel.double(), gmodel


def close(got: Any, want: Any, what: str) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert np.shape(got) == want.shape, what
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


@pytest.mark.parametrize("name", sorted(CASES))
def test_model_parity(name: str) -> None:
    build, shape, (loss_name, loss_kw) = CASES[name]
    tmodel, gmodel = pair(build)
    data = np.random.default_rng(5)
    x = data.normal(size=shape)
    tx = torch.tensor(x)

    tmodel.eval()
    want = tmodel(tx)
    prog = glcomp.compile(
        gmodel, {"x": shape}, loss=getattr(nn, loss_name)(**loss_kw), optimizer=optim.SGD(lr=0.0)
    )
    rt = prog.runtime("reference")
    close(rt.predict(x=x), want, "eval-mode output")

    if loss_name == "CrossEntropyLoss":
        y = data.integers(0, want.shape[1], size=want.shape[0])
        ty = torch.tensor(y)
    else:
        y = data.normal(size=tuple(want.shape))
        ty = torch.tensor(y)

    # Train mode: output of the traced train graph, loss and gradients.
    tmodel.train()
    tout = tmodel(tx)
    train_graph = glcomp.trace(gmodel, training=True, x=shape)
    feeds = {"x": x} | {k: v for k, v in gmodel.state_dict().items() if k in train_graph.inputs}
    close(evaluate(train_graph, feeds)["output"], tout, "train-mode output")
    tloss = getattr(torch.nn, loss_name)(**loss_kw)(tout, ty)
    tloss.backward()
    grads = rt.gradients(x=x, y=y)
    assert sorted(grads) == sorted(k for k, _ in tmodel.named_parameters())
    for k, p in tmodel.named_parameters():
        close(grads[k], p.grad, f"gradient of {k}")

    # A train step with lr 0: pre-update loss, unchanged parameters, updated running statistics.
    loss = rt.train_step(x=x, y=y)
    assert loss == pytest.approx(tloss.item(), rel=RTOL, abs=ATOL)
    state = rt.state_dict()
    for k, b in tmodel.named_buffers():
        close(state[k], b, f"buffer {k} after one train step")
    for k, p in tmodel.named_parameters():
        close(state[k], p, f"parameter {k} after a step with lr 0")

    # Eval mode after the update uses the new running statistics.
    tmodel.eval()
    close(rt.predict(x=x), tmodel(tx), "eval-mode output after a train step")


def test_training_converges_like_torch() -> None:
    """Five Adam steps on a batch-normalised CNN: losses and parameters follow torch.

    The convolutions have no bias: batch norm cancels it, its gradient is rounding noise and Adam
    would amplify that noise into full-size steps of arbitrary sign."""
    tmodel, gmodel = pair(lambda ns: nested(ns, conv_bias=False))
    data = np.random.default_rng(9)
    x = data.normal(size=(4, 1, 6, 6))
    y = np.array([0, 3, 1, 3])
    rt = glcomp.compile(gmodel, {"x": x.shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=0.01))
    rt = rt.runtime("reference")
    topt = torch.optim.Adam(tmodel.parameters(), lr=0.01)
    tmodel.train()
    for step in range(5):
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(x)), torch.tensor(y))
        tloss.backward()
        topt.step()
        assert rt.train_step(x=x, y=y) == pytest.approx(tloss.item(), rel=RTOL, abs=ATOL), f"step {step}"
    state = rt.state_dict()
    for k, v in tmodel.state_dict().items():
        np.testing.assert_allclose(state[k], v.detach().numpy(), rtol=1e-3, atol=1e-4, err_msg=k)


@pytest.mark.parametrize("batch_first", [True, False])
def test_lstm_outputs(batch_first: bool) -> None:
    def raw(ns: ModuleType) -> Any:
        class Raw(ns.Module):
            def __init__(self) -> None:
                super().__init__()
                self.lstm = ns.LSTM(3, 4, batch_first=batch_first)

            def forward(self, x: Any) -> Any:
                out, (h, c) = self.lstm(x)
                return out, h, c

        return Raw()

    tmodel, gmodel = pair(raw)
    x = np.random.default_rng(2).normal(size=(2, 5, 3))
    got = glcomp.compile(gmodel, {"x": x.shape}).runtime("reference").predict(x=x)
    out, (h, c) = tmodel.lstm(torch.tensor(x))
    close(got["output.0"], out, "output")
    close(got["output.1"], h, "h_n")
    close(got["output.2"], c, "c_n")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_functions(dim: int) -> None:
    x = np.random.default_rng(3).normal(size=(3, 4)) * 5

    class Both(nn.Module):
        def forward(self, x: Any) -> Any:
            return nn.functional.softmax(x, dim), nn.functional.log_softmax(x, dim)

    got = glcomp.compile(Both(), {"x": x.shape}).runtime("reference").predict(x=x)
    close(got["output.0"], torch.softmax(torch.tensor(x), dim), "softmax")
    close(got["output.1"], torch.log_softmax(torch.tensor(x), dim), "log_softmax")


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_loss_functions(reduction: str) -> None:
    data = np.random.default_rng(4)
    logits, labels, target = data.normal(size=(5, 3)), data.integers(0, 3, size=5), data.normal(size=(5, 3))

    class Losses(nn.Module):
        def forward(self, z: Any, y: Any, t: Any) -> Any:
            ce = nn.functional.cross_entropy(z, y, reduction)
            return ce, nn.functional.mse_loss(z, t, reduction)

    prog = glcomp.compile(Losses(), {"z": (5, 3), "y": (5,), "t": (5, 3)})
    got = prog.runtime("reference", dtype=np.float64).predict(z=logits, y=labels, t=target)
    tz = torch.tensor(logits)
    close(
        got["output.0"],
        torch.nn.functional.cross_entropy(tz, torch.tensor(labels), reduction=reduction),
        "ce",
    )
    close(got["output.1"], torch.nn.functional.mse_loss(tz, torch.tensor(target), reduction=reduction), "mse")
