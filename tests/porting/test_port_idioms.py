"""PyTorch tutorial idioms that ports trip on, each as a tutorial-style snippet: what works as torch
writes it, and where glcomp needs another spelling, the GlcompError that names the idiom and says
what to write instead.

- ``DataLoader(TensorDataset(x, y), batch_size=B)``: torch's loader feeds glcomp's runtimes
  directly (torch tensors are inputs); a partial last batch is refused, naming ``drop_last=True``
  (programs have fixed shapes).
- ``nn.Dropout2d`` on a 2-D input: drops single elements as torch does (with its warning).
- ``output.argmax(dim=1)``: inside forward (a predict program that returns class ids) as torch
  writes it; on the numpy arrays predict returns, numpy spells it ``argmax(axis=1)``.
- a hidden state passed into forward and carried across batches: ``forward(x, (h0, c0))`` takes
  one compile input per tensor (``forward(x, h0, c0)``; the tuple form is refused saying so), and
  ``forward`` may return ``(output, (h, c))``: predict returns the state, which the next batch
  takes as its input (torch's ``hidden = tuple(h.detach() for h in hidden)``)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError


def _copy(tmodel: torch.nn.Module, gmodel: nn.Module) -> None:
    gmodel.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})


# -- DataLoader / TensorDataset and the partial last batch ------------------------------------------
def _data(n: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=g), torch.randint(0, 3, (n,), generator=g)


def test_dataloader_batches_train_as_torch_and_a_partial_batch_names_drop_last() -> None:
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    gmodel = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
    _copy(tmodel, gmodel)
    program = glcomp.compile(gmodel, {"x": (4, 6)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1))
    rt = program.runtime("reference")
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.1)
    x, y = _data()
    loader = DataLoader(TensorDataset(x, y), batch_size=4, drop_last=True)
    steps = 0
    for xb, yb in loader:  # the tutorial's loop, torch tensors fed as they come
        topt.zero_grad()
        tloss = torch.nn.functional.cross_entropy(tmodel(xb), yb)
        tloss.backward()
        topt.step()
        assert rt.train_step(x=xb, y=yb) == pytest.approx(tloss.item(), rel=1e-5)
        steps += 1
    assert steps == 2  # 10 samples: two full batches, the last 2 dropped
    *_, (xb, yb) = DataLoader(TensorDataset(x, y), batch_size=4)  # without drop_last: 4, 4, 2
    assert xb.shape[0] == 2
    with pytest.raises(
        GlcompError, match=r"input 'x' .*a batch of 2 where the program was compiled for 4.*drop_last=True"
    ):
        rt.train_step(x=xb, y=yb)
    with pytest.raises(GlcompError, match=r"partial batch of a DataLoader"):
        rt.predict(x=xb)


# -- Dropout2d on a 2-D input -------------------------------------------------------------------------
def test_dropout2d_on_a_2d_input_drops_elements_as_torch() -> None:
    """torch's Dropout2d on (N, features) drops single elements (and warns): so does glcomp's.
    Through an identity Linear on ones, d(sum out)/dW[i, j] = sum_n mask[n, i] / (1 - p): the
    count of kept elements of feature i, which varies over i (per-sample masks would not)."""
    model = nn.Sequential(nn.Linear(32, 32, bias=False), nn.Dropout2d(0.5))
    model[0].weight = nn.Parameter(np.eye(32, dtype=np.float32))
    with pytest.warns(UserWarning, match="dropout2d: received a 2-D input"):
        program = glcomp.compile(
            model, {"x": (64, 32)}, loss=lambda out, y: (out * y).sum(), target_spec=(64, 32)
        )
    rt = program.runtime("reference")
    ones = np.ones((64, 32), np.float32)
    np.testing.assert_array_equal(rt.predict(x=ones), ones)  # eval mode: the identity
    grad = rt.gradients(x=ones, y=ones)["0.weight"]
    np.testing.assert_array_equal(grad, np.repeat(grad[:, :1], 32, axis=1))  # the same for every j
    kept = grad[:, 0] / 2.0
    assert np.all(kept == np.round(kept)) and len(set(kept.tolist())) > 3
    assert 0.35 < kept.mean() / 64 < 0.65
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.nn.Dropout2d(0.5)(torch.ones(4, 3))
    assert any("dropout2d" in str(w.message) for w in caught)  # torch accepts it the same way


# -- argmax(dim=) on outputs --------------------------------------------------------------------------
class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 16), nn.Linear(16, 5)

    def forward(self, x):
        return self.fc2(nn.functional.relu(self.fc1(x)))


class Predictor(nn.Module):
    """The tutorial's evaluation, ``pred = model(data).argmax(dim=1, keepdim=True)``, compiled."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).argmax(dim=1, keepdim=True)


@pytest.mark.parametrize("runtime", ["reference", "gl"])
def test_argmax_dim_on_the_outputs(runtime: str, gl_runtime) -> None:
    torch.manual_seed(1)
    tmodel = torch.nn.Module()
    tmodel.fc1, tmodel.fc2 = torch.nn.Linear(6, 16), torch.nn.Linear(16, 5)
    gmodel = Classifier()
    _copy(tmodel, gmodel)
    x = torch.randn(8, 6)
    with torch.no_grad():
        logits = tmodel.fc2(torch.relu(tmodel.fc1(x)))
    expected = logits.argmax(dim=1, keepdim=True).numpy()
    program = glcomp.compile(Predictor(gmodel), {"x": (8, 6)})
    if runtime == "gl":
        with gl_runtime(program) as rt:
            pred = rt.predict(x=x)
    else:
        pred = program.runtime("reference").predict(x=x)
    np.testing.assert_array_equal(pred, expected)  # class ids (as floats) of torch's dtype-free value
    logits_out = glcomp.compile(gmodel, {"x": (8, 6)}).runtime("reference").predict(x=x)
    np.testing.assert_array_equal(logits_out.argmax(axis=1), expected[:, 0])  # numpy spells dim axis


# -- a hidden state carried across batches ------------------------------------------------------------
class TorchTagger(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = torch.nn.LSTM(4, 8, batch_first=True)
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x, hidden):
        out, hidden = self.lstm(x, hidden)
        return self.fc(out[:, -1]), hidden


class TupleTagger(nn.Module):
    """The torch model as written: the state passed as one (h0, c0) argument."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(4, 8, batch_first=True)
        self.fc = nn.Linear(8, 3)

    def forward(self, x, hidden):
        out, hidden = self.lstm(x, hidden)
        return self.fc(out[:, -1]), hidden


class Tagger(TupleTagger):
    """The port: one forward argument per state tensor, the same body."""

    def forward(self, x, h0, c0):
        return super().forward(x, (h0, c0))


def test_a_tuple_state_argument_is_refused_naming_the_rewrite() -> None:
    with pytest.raises(GlcompError, match=r"inputs\['hidden'\].*\(h0, c0\).*one argument per tensor"):
        glcomp.compile(TupleTagger(), {"x": (2, 5, 4), "hidden": ((1, 2, 8), (1, 2, 8))})


def test_a_hidden_state_carried_across_batches_trains_as_torch() -> None:
    """torch's truncated-BPTT loop (the state detached between batches) and its port: predict
    gives the batch's output and new state, train_step trains on the batch from the same state
    (train_step returns the loss only, so the state comes from predict, with the weights before
    the step as torch's forward has them)."""
    torch.manual_seed(2)
    tmodel, gmodel = TorchTagger(), Tagger()
    _copy(tmodel, gmodel)
    shapes = {"x": (2, 5, 4), "h0": (1, 2, 8), "c0": (1, 2, 8)}
    program = glcomp.compile(gmodel, shapes, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.5))
    rt = program.runtime("reference")
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.5)
    g = torch.Generator().manual_seed(3)
    hidden = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    h, c = np.zeros((1, 2, 8), np.float32), np.zeros((1, 2, 8), np.float32)
    for _ in range(3):
        x, y = torch.randn(2, 5, 4, generator=g), torch.randint(0, 3, (2,), generator=g)
        hidden = tuple(t.detach() for t in hidden)
        topt.zero_grad()
        out, hidden = tmodel(x, hidden)
        tloss = torch.nn.functional.cross_entropy(out, y)
        tloss.backward()
        topt.step()
        got = rt.predict(x=x, h0=h, c0=c)  # {"output.0": logits, "output.1.0": h, "output.1.1": c}
        np.testing.assert_allclose(got["output.0"], out.detach().numpy(), rtol=1e-4, atol=1e-5)
        assert rt.train_step(x=x, h0=h, c0=c, y=y) == pytest.approx(tloss.item(), rel=1e-4)
        h, c = got["output.1.0"], got["output.1.1"]
        np.testing.assert_allclose(h, hidden[0].detach().numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(c, hidden[1].detach().numpy(), rtol=1e-4, atol=1e-5)
