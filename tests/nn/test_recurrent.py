"""Recurrent layers against torch: RNN, LSTM, GRU (layers, directions, batch_first, initial states,
unbatched input, dropout between layers) and RNNCell, LSTMCell, GRUCell.

Each model is written once for both namespaces; torch's state_dict loads into glcomp by name, then
outputs and final states, parameter gradients of an MSE loss and three SGD steps are compared
(torch in float64 on the same float32 weights, glcomp on its float32 reference runtime). Two small
programs also run on GL and must match the reference runtime.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import GlcompError, nn, optim
from glcomp.nn import functional as F

torch = pytest.importorskip("torch")

RTOL, ATOL = 2e-4, 1e-5
TORCH = SimpleNamespace(nn=torch.nn, cat=torch.cat)
GLCOMP = SimpleNamespace(nn=nn, cat=glcomp.cat)
N, T, C, H = 2, 3, 3, 4


def pair(build: Any) -> tuple[Any, Any]:
    """The torch model (float64) and the glcomp model holding the same weights."""
    torch.manual_seed(0)
    tmodel = build(TORCH)
    gmodel = build(GLCOMP)
    state = {k: v.detach().numpy() for k, v in tmodel.state_dict().items()}
    assert list(state) == list(gmodel.state_dict()), "state_dict names or order differ from torch"
    gmodel.load_state_dict(state)
    return tmodel.double(), gmodel


def close(got: Any, want: Any, what: str) -> None:
    want = want.detach().numpy() if hasattr(want, "detach") else np.asarray(want)
    assert np.shape(got) == want.shape, what
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=what)


def flat(ns: Any, *tensors: Any) -> Any:
    """Everything the layer returns as one vector, so one MSE loss reaches all of it."""
    return ns.cat([t.flatten() for t in tensors])


# -- the layers, each as (build, input shapes, forward) -------------------------------------------
def layer(kind: str, **kw: Any) -> Any:
    def build(ns: Any) -> Any:
        class Net(ns.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.rnn = getattr(ns.nn, kind)(C, H, **kw)

            def forward(self, x: Any, h0: Any = None, c0: Any = None) -> Any:
                hx = None if h0 is None else (h0, c0) if kind == "LSTM" else h0
                out, hn = self.rnn(x, hx)
                return flat(ns, out, *(hn if kind == "LSTM" else (hn,)))

        return Net()

    return build


def cell_loop(kind: str, **kw: Any) -> Any:
    """A cell stepped over the T steps of x, as torch code writes it; returns every step's state."""

    def build(ns: Any) -> Any:
        class Net(ns.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.cell = getattr(ns.nn, kind)(C, H, **kw)

            def forward(self, x: Any, h0: Any = None, c0: Any = None) -> Any:
                hx = None if h0 is None else (h0, c0) if kind == "LSTMCell" else h0
                outs = []
                for t in range(x.shape[0]):
                    hx = self.cell(x[t], hx)
                    outs.extend(hx if kind == "LSTMCell" else (hx,))
                return flat(ns, *outs)

        return Net()

    return build


def shapes(kw: dict[str, Any], states: int, batched: bool = True) -> dict[str, tuple[int, ...]]:
    layers = kw.get("num_layers", 1) * (2 if kw.get("bidirectional") else 1)
    if not batched:
        x, h = (T, C), (layers, H)
    else:
        x, h = ((N, T, C) if kw.get("batch_first") else (T, N, C)), (layers, N, H)
    return {"x": x} | {name: h for name in ("h0", "c0")[:states]}


def layer_case(kind: str, states: int, batched: bool = True, **kw: Any) -> tuple[Any, dict[str, Any]]:
    if kind == "LSTM" and states:
        states = 2
    return layer(kind, **kw), shapes(kw, states, batched)


def cell_case(kind: str, states: int, batched: bool = True, **kw: Any) -> tuple[Any, dict[str, Any]]:
    x, h = ((T, N, C), (N, H)) if batched else ((T, C), (H,))
    count = (2 if kind == "LSTMCell" else 1) if states else 0
    return cell_loop(kind, **kw), {"x": x} | {name: h for name in ("h0", "c0")[:count]}


CASES = {
    "lstm": layer_case("LSTM", 0),
    "lstm-2-layers-bidirectional-batch-first-h0-c0": layer_case(
        "LSTM", 1, num_layers=2, bidirectional=True, batch_first=True
    ),
    "lstm-3-layers-no-bias-h0-c0": layer_case("LSTM", 1, num_layers=3, bias=False),
    "lstm-unbatched-2-layers-h0-c0": layer_case("LSTM", 1, batched=False, num_layers=2),
    "gru": layer_case("GRU", 0, batch_first=True),
    "gru-2-layers-bidirectional-h0": layer_case("GRU", 1, num_layers=2, bidirectional=True),
    "gru-bidirectional-no-bias": layer_case("GRU", 0, bias=False, bidirectional=True),
    "gru-unbatched-bidirectional-h0": layer_case("GRU", 1, batched=False, bidirectional=True),
    "rnn-tanh-2-layers-bidirectional-h0": layer_case("RNN", 1, num_layers=2, bidirectional=True),
    "rnn-relu-2-layers-batch-first": layer_case(
        "RNN", 0, num_layers=2, nonlinearity="relu", batch_first=True
    ),
    "lstm-cell-h-c": cell_case("LSTMCell", 1),
    "lstm-cell-unbatched": cell_case("LSTMCell", 0, batched=False),
    "gru-cell-h": cell_case("GRUCell", 1),
    "gru-cell-no-bias-unbatched-h": cell_case("GRUCell", 1, batched=False, bias=False),
    "rnn-cell-tanh-h": cell_case("RNNCell", 1),
    "rnn-cell-relu": cell_case("RNNCell", 0, nonlinearity="relu"),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_layer_matches_torch(name: str) -> None:
    """Outputs and final states, gradients of every parameter, then three SGD steps (momentum)."""
    build, inputs = CASES[name]
    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(len(name))
    feeds = {k: rng.normal(size=s).astype(np.float32) for k, s in inputs.items()}
    targs = [torch.tensor(v.astype(np.float64)) for v in feeds.values()]
    want = tmodel(*targs)
    y = rng.normal(size=tuple(want.shape)).astype(np.float32)
    prog = glcomp.compile(gmodel, inputs, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.3, momentum=0.9))
    rt = prog.runtime("reference")
    close(rt.predict(**feeds), want, "outputs and final states")

    topt = torch.optim.SGD(tmodel.parameters(), lr=0.3, momentum=0.9)
    for step in range(3):
        tloss = torch.nn.functional.mse_loss(tmodel(*targs), torch.tensor(y.astype(np.float64)))
        topt.zero_grad()
        tloss.backward()
        if step == 0:
            grads = rt.gradients(**feeds, y=y)
            assert sorted(grads) == sorted(k for k, _ in tmodel.named_parameters())
            for k, p in tmodel.named_parameters():
                close(grads[k], p.grad, f"gradient of {k}")
        assert rt.train_step(**feeds, y=y) == pytest.approx(tloss.item(), rel=RTOL), f"step {step}"
        topt.step()
    for k, v in tmodel.state_dict().items():
        close(rt.state_dict()[k], v, f"{k} after 3 SGD steps")


def test_parameter_names_shapes_and_init_follow_torch() -> None:
    glcomp.manual_seed(0)
    for kind, gates in (("LSTM", 4), ("GRU", 3), ("RNN", 1)):
        layer = getattr(nn, kind)(5, 20, num_layers=2, bidirectional=True)
        tlayer = getattr(torch.nn, kind)(5, 20, num_layers=2, bidirectional=True)
        want = {k: tuple(v.shape) for k, v in tlayer.state_dict().items()}
        assert {k: v.shape for k, v in layer.state_dict().items()} == want
        assert list(layer.state_dict()) == list(want)
        assert want["weight_ih_l1_reverse"] == (gates * 20, 40)
        for k, p in layer.named_parameters():
            assert np.abs(p.data).max() <= 1 / math.sqrt(20), k
            assert np.abs(p.data).max() > 0.8 / math.sqrt(20), k
        cell, tcell = getattr(nn, kind + "Cell")(5, 20), getattr(torch.nn, kind + "Cell")(5, 20)
        assert {k: v.shape for k, v in cell.state_dict().items()} == {
            k: tuple(v.shape) for k, v in tcell.state_dict().items()
        }
        assert all(np.abs(p.data).max() <= 1 / math.sqrt(20) for p in cell.parameters())


# -- dropout between layers ------------------------------------------------------------------------
class Probe(nn.Module):
    def forward(self, h: Any) -> Any:
        return F.dropout(h, 0.5)


def test_dropout_between_layers_like_torch() -> None:
    """predict is eval mode (no dropout, as torch's eval()); gradients and train_step drop the
    first layer's output with glcomp's mask: torch fed the same mask between its two layers gets the
    same loss, gradients and three SGD steps."""

    def build(ns: Any) -> Any:
        return layer("GRU", num_layers=2, bidirectional=True, batch_first=True, dropout=0.5)(ns)

    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(N, T, C)).astype(np.float32)
    tx = torch.tensor(x.astype(np.float64))
    tmodel.eval()
    want = tmodel(tx)
    y = rng.normal(size=tuple(want.shape)).astype(np.float32)
    prog = glcomp.compile(gmodel, {"x": x.shape}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.2))
    rt = prog.runtime("reference")
    close(rt.predict(x=x), want, "eval mode: no dropout")

    # torch's two layers as separate one-layer GRUs holding the same weights, glcomp's mask between.
    first = torch.nn.GRU(C, H, bidirectional=True, batch_first=True).double()
    second = torch.nn.GRU(2 * H, H, bidirectional=True, batch_first=True).double()
    split = {
        k: getattr(first if "_l0" in k else second, k.replace("_l1", "_l0"))
        for k, _ in tmodel.rnn.named_parameters()
    }
    for k, p in tmodel.rnn.named_parameters():
        split[k].data = p.data  # shared storage: the steps below update tmodel's weights
    params = list(split.values())
    topt = torch.optim.SGD(params, lr=0.2)
    dropped = glcomp.compile(Probe(), {"h": (N, T, 2 * H)}).runtime("reference")
    for step in range(3):
        dropped.load_state_dict(dropped.state_dict(), optimizer={"rng.step": np.float32(step)})
        mask = torch.tensor(dropped.predict(h=np.ones((N, T, 2 * H), np.float32)).astype(np.float64))
        assert 0 < (mask == 0).sum() < mask.numel()
        out0, h0 = first(tx)
        out1, h1 = second(out0 * mask)
        tloss = torch.nn.functional.mse_loss(flat(TORCH, out1, h0, h1), torch.tensor(y.astype(np.float64)))
        topt.zero_grad()
        tloss.backward()
        if step == 0:
            grads = rt.gradients(x=x, y=y)
            for k, p in split.items():
                close(grads["rnn." + k], p.grad, f"gradient of {k}")
        assert rt.train_step(x=x, y=y) == pytest.approx(tloss.item(), rel=RTOL), f"step {step}"
        topt.step()
    for k, v in tmodel.state_dict().items():
        close(rt.state_dict()[k], v, f"{k} after 3 SGD steps")


# -- a text model ----------------------------------------------------------------------------------
def test_gru_text_model_trains_like_torch() -> None:
    """Embedding -> GRU -> Linear on the last step's output, cross-entropy, three SGD steps."""

    def build(ns: Any) -> Any:
        class TextModel(ns.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.embed = ns.nn.Embedding(11, 5, padding_idx=0)
                self.gru = ns.nn.GRU(5, 6, num_layers=2, batch_first=True)
                self.head = ns.nn.Linear(6, 3)

            def forward(self, ids: Any) -> Any:
                out, _ = self.gru(self.embed(ids))
                return self.head(out[:, -1])

        return TextModel()

    tmodel, gmodel = pair(build)
    rng = np.random.default_rng(4)
    ids, y = rng.integers(0, 11, size=(4, 5)), rng.integers(0, 3, size=4)
    prog = glcomp.compile(gmodel, {"ids": ids.shape}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.5))
    rt = prog.runtime("reference")
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.5)
    for step in range(3):
        tloss = torch.nn.functional.cross_entropy(tmodel(torch.tensor(ids)), torch.tensor(y))
        topt.zero_grad()
        tloss.backward()
        assert rt.train_step(ids=ids, y=y) == pytest.approx(tloss.item(), rel=RTOL), f"step {step}"
        topt.step()
    for k, v in tmodel.state_dict().items():
        close(rt.state_dict()[k], v, f"{k} after 3 SGD steps")


# -- GL -------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kind", "kw"),
    [("GRU", {"num_layers": 2, "bidirectional": True}), ("LSTM", {"num_layers": 2, "batch_first": True})],
    ids=["gru-2-layers-bidirectional", "lstm-2-layers"],
)
def test_gl_matches_reference(gl_runtime: Any, kind: str, kw: dict[str, Any]) -> None:
    glcomp.manual_seed(3)
    states = 2 if kind == "LSTM" else 1
    inputs = shapes(kw, states)
    prog = glcomp.compile(layer(kind, **kw)(GLCOMP), inputs, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.3))
    rng = np.random.default_rng(5)
    feeds = {k: rng.normal(size=s).astype(np.float32) for k, s in inputs.items()}
    ref = prog.runtime("reference")
    y = rng.normal(size=ref.predict(**feeds).shape).astype(np.float32)
    with gl_runtime(prog) as gl:
        close(gl.predict(**feeds), ref.predict(**feeds), "outputs and final states")
        for step in range(2):
            assert gl.train_step(**feeds, y=y) == pytest.approx(ref.train_step(**feeds, y=y), rel=RTOL), step
        for k, v in ref.state_dict().items():
            close(gl.state_dict()[k], v, k)


# -- mistakes --------------------------------------------------------------------------------------
def test_bad_arguments_and_states_raise_glcomp_errors() -> None:
    with pytest.raises(GlcompError, match="proj_size"):
        nn.LSTM(3, 4, proj_size=2)
    with pytest.raises(GlcompError, match="nonlinearity"):
        nn.RNN(3, 4, nonlinearity="sigmoid")
    with pytest.raises(GlcompError, match="dropout"):
        nn.GRU(3, 4, num_layers=2, dropout=1.5)
    with pytest.raises(GlcompError, match="num_layers"):
        nn.GRU(3, 4, num_layers=0)
    with pytest.raises(GlcompError, match="RNN only"):
        nn.LSTM(3, 4, nonlinearity="relu")

    class Net(nn.Module):
        def __init__(self, rnn: nn.Module) -> None:
            super().__init__()
            self.rnn = rnn

        def forward(self, x: Any, h0: Any) -> Any:
            return self.rnn(x, h0)[0]

    bad_h0 = {"x": (T, N, C), "h0": (1, N, H)}  # the 2-layer GRU needs (2, N, H)
    with pytest.raises(GlcompError, match=r"rnn \(GRU\).*hx expected shape \(2, 2, 4\)"):
        glcomp.compile(Net(nn.GRU(C, H, num_layers=2)), bad_h0)
    with pytest.raises(GlcompError, match=r"rnn \(LSTM\).*tuple \(h0, c0\)"):
        glcomp.compile(Net(nn.LSTM(C, H)), {"x": (T, N, C), "h0": (1, N, H)})
    with pytest.raises(GlcompError, match=r"rnn \(GRU\).*input_size 3 but got \(3, 2, 5\)"):
        glcomp.compile(Net(nn.GRU(C, H)), {"x": (T, N, 5), "h0": (1, N, H)})
    with pytest.raises(GlcompError, match=r"rnn \(GRUCell\).*hx expected shape \(2, 4\)"):
        glcomp.compile(Net(nn.GRUCell(C, H)), {"x": (N, C), "h0": (N, 5)})
