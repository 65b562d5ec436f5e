"""Optimizer updates of the compiled train step against torch's update rules.

The reference is a plain numpy transcription of torch.optim.SGD / torch.optim.Adam with a
hand-written backward pass of the test model, and, when torch is installed, torch itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim

X = np.random.default_rng(0).normal(size=(6, 3))
Y = np.random.default_rng(1).normal(size=(6, 2))
STEPS = 5


def make_model() -> nn.Sequential:
    glcomp.manual_seed(3)
    return nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2))


def loss_and_grads(p: dict[str, np.ndarray]) -> tuple[float, dict[str, np.ndarray]]:
    """MSE loss of Linear-Tanh-Linear and its gradients, by hand."""
    a = np.tanh(X @ p["0.weight"].T + p["0.bias"])
    out = a @ p["2.weight"].T + p["2.bias"]
    loss = float(np.mean((out - Y) ** 2))
    d_out = 2 * (out - Y) / out.size
    d_h = (d_out @ p["2.weight"]) * (1 - a**2)
    grads = {
        "2.weight": d_out.T @ a,
        "2.bias": d_out.sum(0),
        "0.weight": d_h.T @ X,
        "0.bias": d_h.sum(0),
    }
    return loss, grads


class NumpySGD:
    """torch.optim.SGD with dampening 0, as documented by torch."""

    def __init__(self, lr: float, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
        self.lr, self.momentum, self.weight_decay, self.nesterov = lr, momentum, weight_decay, nesterov
        self.buf: dict[str, np.ndarray] = {}

    def step(self, name: str, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            buf = g.copy() if name not in self.buf else self.momentum * self.buf[name] + g
            self.buf[name] = buf
            g = g + self.momentum * buf if self.nesterov else buf
        return p - self.lr * g


class NumpyAdam:
    """torch.optim.Adam (amsgrad off), as documented by torch."""

    def __init__(
        self, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay=0.0
    ):
        self.lr, self.betas, self.eps, self.weight_decay = lr, betas, eps, weight_decay
        self.m: dict[str, np.ndarray] = {}
        self.v: dict[str, np.ndarray] = {}
        self.t: dict[str, int] = {}

    def step(self, name: str, p: np.ndarray, g: np.ndarray) -> np.ndarray:
        b1, b2 = self.betas
        if self.weight_decay:
            g = g + self.weight_decay * p
        t = self.t[name] = self.t.get(name, 0) + 1
        m = self.m[name] = b1 * self.m.get(name, 0.0) + (1 - b1) * g
        v = self.v[name] = b2 * self.v.get(name, 0.0) + (1 - b2) * g * g
        denom = np.sqrt(v) / np.sqrt(1 - b2**t) + self.eps
        return p - self.lr / (1 - b1**t) * m / denom


CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("SGD", {"lr": 0.1}),
    "sgd-momentum": ("SGD", {"lr": 0.1, "momentum": 0.9}),
    "sgd-nesterov": ("SGD", {"lr": 0.05, "momentum": 0.8, "nesterov": True}),
    "sgd-weight-decay": ("SGD", {"lr": 0.1, "weight_decay": 0.05}),
    "sgd-all": ("SGD", {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.02, "nesterov": True}),
    "adam": ("Adam", {"lr": 0.01}),
    "adam-weight-decay": ("Adam", {"lr": 0.02, "weight_decay": 0.1}),
    "adam-betas": ("Adam", {"lr": 0.05, "betas": (0.8, 0.99), "eps": 1e-6}),
}


def numpy_optimizer(kind: str, kw: dict[str, Any]) -> NumpySGD | NumpyAdam:
    return NumpySGD(**kw) if kind == "SGD" else NumpyAdam(**kw)


def compile_train(model: nn.Module, optimizer: optim.Optimizer) -> Any:
    prog = glcomp.compile(model, {"x": X.shape}, loss=nn.MSELoss(), optimizer=optimizer)
    return prog.runtime("reference", dtype=np.float64)


def close(a: np.ndarray, b: np.ndarray, what: str) -> None:
    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=what)


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_matches_numpy_transcription(config: str) -> None:
    kind, kw = CONFIGS[config]
    model = make_model()
    rt = compile_train(model, getattr(optim, kind)(**kw))
    params = {k: p.data.astype(np.float64) for k, p in model.named_parameters()}
    reference = numpy_optimizer(kind, kw)
    for step in range(STEPS):
        before, grads = loss_and_grads(params)
        params = {k: reference.step(k, params[k], grads[k]) for k in params}
        loss = rt.train_step(x=X, y=Y)
        assert loss == pytest.approx(before, rel=1e-12), "train_step must return the pre-update loss"
        assert loss != pytest.approx(loss_and_grads(params)[0], rel=1e-9)
        for k in params:
            close(rt.params[k], params[k], f"{config}: {k} after step {step + 1}")
    if kind == "Adam":
        assert float(rt.opt_state["opt.step"]) == STEPS


def test_set_lr_changes_the_step() -> None:
    model = make_model()
    rt = compile_train(model, optim.SGD(lr=0.1))
    assert rt.lr == 0.1
    params = {k: p.data.astype(np.float64) for k, p in model.named_parameters()}
    rt.set_lr(0.0)
    rt.train_step(x=X, y=Y)
    for k in params:
        close(rt.params[k], params[k], k)
    rt.set_lr(0.3)
    rt.train_step(x=X, y=Y)
    _, grads = loss_and_grads(params)
    for k in params:
        close(rt.params[k], params[k] - 0.3 * grads[k], k)


def test_frozen_parameters_are_untouched() -> None:
    model = make_model()
    model[0].weight.requires_grad = False
    frozen = model[0].weight.data.copy()
    rt = compile_train(model, optim.SGD(lr=0.1, momentum=0.9))
    assert not any(k.startswith("opt.0.weight") for k in rt.opt_state)
    params = {k: p.data.astype(np.float64) for k, p in model.named_parameters()}
    reference = NumpySGD(lr=0.1, momentum=0.9)
    for _ in range(STEPS):
        _, grads = loss_and_grads(params)
        params = {k: v if k == "0.weight" else reference.step(k, v, grads[k]) for k, v in params.items()}
        rt.train_step(x=X, y=Y)
    np.testing.assert_array_equal(rt.params["0.weight"], frozen)
    for k in ("0.bias", "2.weight", "2.bias"):
        close(rt.params[k], params[k], k)
        assert not np.allclose(rt.params[k], model.state_dict()[k])


def test_optimizer_params_restrict_the_update() -> None:
    model = make_model()
    rt = compile_train(model, optim.Adam([model[2].weight], lr=0.05))
    start = model.state_dict()
    for _ in range(STEPS):
        rt.train_step(x=X, y=Y)
    assert not np.allclose(rt.params["2.weight"], start["2.weight"])
    for k in ("0.weight", "0.bias", "2.bias"):
        np.testing.assert_array_equal(rt.params[k], start[k])


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_matches_torch(config: str) -> None:
    torch = pytest.importorskip("torch")
    kind, kw = CONFIGS[config]
    model = make_model()
    rt = compile_train(model, getattr(optim, kind)(**kw))
    tmodel = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2)).double()
    tmodel.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in model.state_dict().items()})
    topt = getattr(torch.optim, kind)(tmodel.parameters(), **kw)
    x, y = torch.tensor(X), torch.tensor(Y)
    for step in range(STEPS):
        topt.zero_grad()
        tloss = torch.nn.functional.mse_loss(tmodel(x), y)
        tloss.backward()
        topt.step()
        loss = rt.train_step(x=X, y=Y)
        assert loss == pytest.approx(tloss.item(), rel=1e-10)
        for k, p in tmodel.named_parameters():
            close(rt.params[k], p.detach().numpy(), f"{config}: {k} after step {step + 1}")


def test_lbfgs_is_refused_naming_the_alternatives() -> None:
    """torch scripts construct ``optim.LBFGS(model.parameters(), lr=1)`` and call
    ``step(closure)``: glcomp refuses at construction, naming the optimizers it has."""
    with pytest.raises(glcomp.GlcompError, match=r"LBFGS.*closure.*Adam.*SGD"):
        optim.LBFGS(make_model().parameters(), lr=1.0)
    with pytest.raises(glcomp.GlcompError, match="closure-based"):
        optim.LBFGS()
