"""Recurrent state carried across batches (``glcomp.compile(..., carry=...)``): torch's
word-language-model loop, ``hidden = model.init_hidden(B)`` then per batch
``hidden = repackage_hidden(hidden); output, hidden = model(data, hidden)``, with the state kept
on the GPU as buffers that train_step (and, with ``carry_predict=True``, predict) writes."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError

NTOKEN, NINP, NHID, BPTT, BATCH, LR, CLIP = 13, 6, 8, 5, 3, 2.0, 0.25
SHAPES = {"data": (BPTT, BATCH), "h0": (1, BATCH, NHID), "c0": (1, BATCH, NHID)}
CARRY = {"h0": "output.1.0", "c0": "output.1.1"}


class TorchRNNModel(torch.nn.Module):
    """The word-language-model example's RNNModel (LSTM, one layer, no dropout)."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Embedding(NTOKEN, NINP)
        self.rnn = torch.nn.LSTM(NINP, NHID)
        self.decoder = torch.nn.Linear(NHID, NTOKEN)

    def forward(self, data, hidden):
        output, hidden = self.rnn(self.encoder(data), hidden)
        decoded = self.decoder(output).view(-1, NTOKEN)
        return torch.nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        return (torch.zeros(1, bsz, NHID), torch.zeros(1, bsz, NHID))


class RNNModel(nn.Module):
    """The port: the state as one forward argument per tensor; the body as torch's."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Embedding(NTOKEN, NINP)
        self.rnn = nn.LSTM(NINP, NHID)
        self.decoder = nn.Linear(NHID, NTOKEN)

    def forward(self, data, h0, c0):
        output, hidden = self.rnn(self.encoder(data), (h0, c0))
        decoded = self.decoder(output).view(-1, NTOKEN)
        return nn.functional.log_softmax(decoded, dim=1), hidden


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [
        (
            torch.randint(0, NTOKEN, (BPTT, BATCH), generator=g),
            torch.randint(0, NTOKEN, (BPTT * BATCH,), generator=g),
        )
        for _ in range(n)
    ]


def _models() -> tuple[TorchRNNModel, RNNModel]:
    torch.manual_seed(1)
    tmodel, gmodel = TorchRNNModel(), RNNModel()
    gmodel.load_state_dict({k: v.detach().numpy() for k, v in tmodel.state_dict().items()})
    return tmodel, gmodel


def _compile(gmodel: RNNModel, **kw: Any) -> glcomp.Program:
    return glcomp.compile(
        gmodel, SHAPES, loss=nn.NLLLoss(), optimizer=optim.SGD(lr=LR), clip_grad_norm=CLIP, carry=CARRY, **kw
    )


def _torch_loop(tmodel: TorchRNNModel, batches: list) -> tuple[list[float], tuple[torch.Tensor, ...]]:
    """The example's train(): repackage_hidden, forward, NLL, backward, clip, SGD step."""
    opt = torch.optim.SGD(tmodel.parameters(), lr=LR)
    hidden = tmodel.init_hidden(BATCH)
    losses = []
    for data, targets in batches:
        hidden = repackage_hidden(hidden)
        opt.zero_grad()
        output, hidden = tmodel(data, hidden)
        loss = torch.nn.functional.nll_loss(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tmodel.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses, hidden


@pytest.fixture(scope="module")
def trained() -> dict[str, Any]:
    tmodel, gmodel = _models()
    batches = _batches(4)
    losses, hidden = _torch_loop(tmodel, batches)
    return {"gmodel": gmodel, "tmodel": tmodel, "batches": batches, "losses": losses, "hidden": hidden}


def _run(rt: Any, batches: list) -> list[float]:
    return [rt.train_step(data=data.numpy(), y=targets.numpy()) for data, targets in batches]


def _check_as_torch(rt: Any, trained: dict[str, Any], rtol: float, atol: float) -> dict[str, np.ndarray]:
    losses = _run(rt, trained["batches"])
    np.testing.assert_allclose(losses, trained["losses"], rtol=rtol)
    state = rt.state_dict()
    for k, v in trained["tmodel"].state_dict().items():
        np.testing.assert_allclose(state[k], v.numpy(), rtol=rtol, atol=atol, err_msg=k)
    h, c = trained["hidden"]
    np.testing.assert_allclose(state["h0"], h.detach().numpy(), rtol=rtol, atol=atol)
    np.testing.assert_allclose(state["c0"], c.detach().numpy(), rtol=rtol, atol=atol)
    return state


def test_carried_state_trains_as_torchs_word_language_model_loop(
    trained: dict[str, Any], gl_runtime: Any
) -> None:
    program = _compile(trained["gmodel"])
    assert list(program.inputs) == ["data"]  # the state is not fed
    reference = _check_as_torch(program.runtime("reference"), trained, rtol=2e-5, atol=1e-6)
    with gl_runtime(program) as rt:
        gl = _check_as_torch(rt, trained, rtol=1e-4, atol=1e-5)
    for k, v in reference.items():
        np.testing.assert_allclose(gl[k], v, rtol=1e-4, atol=1e-5, err_msg=k)
    # Without the carry (state reset to zeros every batch) torch's losses differ: the carry matters.
    fresh = program.runtime("reference")
    zeroed = []
    for data, targets in trained["batches"]:
        fresh.reset_state()
        zeroed.append(fresh.train_step(data=data.numpy(), y=targets.numpy()))
    assert zeroed[0] == pytest.approx(trained["losses"][0], rel=2e-5)
    assert abs(zeroed[-1] - trained["losses"][-1]) > 1e-4


def test_reset_state_and_load_state_dict_set_the_carried_state(
    trained: dict[str, Any], gl_runtime: Any
) -> None:
    program = _compile(trained["gmodel"])
    data, targets = trained["batches"][0]
    with gl_runtime(program) as gl:
        for rt in (program.runtime("reference"), gl):
            rt.train_step(data=data.numpy(), y=targets.numpy())
            assert np.abs(rt.state_dict()["h0"]).max() > 0
            rt.reset_state("h0")
            assert not rt.state_dict()["h0"].any() and rt.state_dict()["c0"].any()
            rt.reset_state()
            assert not rt.state_dict()["c0"].any()
            with pytest.raises(GlcompError, match=r"reset_state: \['rnn.weight_ih_l0'\].*\['h0', 'c0'\]"):
                rt.reset_state(["rnn.weight_ih_l0"])
            state = rt.state_dict()
            state["h0"] = np.full((1, BATCH, NHID), 0.5, np.float32)
            rt.load_state_dict(state)
            np.testing.assert_array_equal(rt.state_dict()["h0"], state["h0"])


def test_save_and_load_keep_the_carried_state(
    trained: dict[str, Any], gl_runtime: Any, tmp_path: Any
) -> None:
    program = _compile(trained["gmodel"])
    rt = program.runtime("reference")
    first, rest = trained["batches"][:2], trained["batches"][2:]
    _run(rt, first)
    carried = rt.state_dict()["c0"]
    assert np.abs(carried).max() > 0
    rt.save(tmp_path / "b")
    loaded = glcomp.load(tmp_path / "b")
    assert list(loaded.inputs) == ["data"]
    expected = _run(rt, rest)
    np.testing.assert_array_equal(loaded.runtime("reference").state_dict()["c0"], carried)
    resumed = loaded.runtime("reference")
    np.testing.assert_allclose(_run(resumed, rest), expected, rtol=1e-6)
    with gl_runtime(loaded) as gl:
        np.testing.assert_allclose(gl.state_dict()["c0"], carried, rtol=1e-6)
        np.testing.assert_allclose(_run(gl, rest), expected, rtol=1e-4)
        np.testing.assert_allclose(gl.state_dict()["h0"], resumed.state_dict()["h0"], rtol=1e-4, atol=1e-5)
        gl.reset_state()  # the carried names come with the bundle
        assert not gl.state_dict()["h0"].any()
    # save_weights is the model's state dict: torch loads it strictly, without the loop's state.
    from safetensors.torch import load_file

    path = rt.save_weights(tmp_path / "w.safetensors")
    TorchRNNModel().load_state_dict(load_file(str(path)), strict=True)


def test_predict_carries_the_state_only_with_carry_predict(trained: dict[str, Any], gl_runtime: Any) -> None:
    """Generation: predict in eval mode from the carried state, writing it with carry_predict."""
    tmodel, gmodel = _models()
    data = [d for d, _ in trained["batches"][:3]]
    hidden = tmodel.init_hidden(BATCH)
    expected = []
    with torch.no_grad():
        for d in data:
            out, hidden = tmodel(d, hidden)
            expected.append(out.numpy())
    plain = _compile(gmodel)
    writing = _compile(gmodel, carry_predict=True)
    with gl_runtime(writing) as gl:
        for rt in (writing.runtime("reference"), gl):
            for d, want in zip(data, expected, strict=True):
                got = rt.predict(data=d.numpy())
                assert sorted(got) == ["output.0", "output.1.0", "output.1.1"]
                np.testing.assert_allclose(got["output.0"], want, rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(rt.state_dict()["h0"], hidden[0].numpy(), rtol=1e-4, atol=1e-5)
    rt = plain.runtime("reference")
    first = rt.predict(data=data[0].numpy())
    second = rt.predict(data=data[0].numpy())
    np.testing.assert_array_equal(first["output.0"], second["output.0"])  # read, not written
    assert not rt.state_dict()["h0"].any()


def test_the_unchanged_program_without_carry_feeds_the_state() -> None:
    _, gmodel = _models()
    program = glcomp.compile(gmodel, SHAPES, loss=nn.NLLLoss(), optimizer=optim.SGD(lr=LR))
    assert list(program.inputs) == ["data", "h0", "c0"] and "h0" not in program.buffers
    assert "carry" not in program.options


@pytest.mark.parametrize(
    ("carry", "extra", "match"),
    [
        ({"hx": "output.1.0"}, {}, r"carry: 'hx' is not an input.*\['data', 'h0', 'c0'\]"),
        (
            {"h0": "output.0"},
            {},
            r"carry\['h0'\]: 'output.0' has shape \(15, 13\), the input 'h0' \(1, 3, 8\)",
        ),
        ({"h0": "output.2"}, {}, r"carry\['h0'\]: forward returns no 'output.2'.*output.1.0"),
        ({"h0": 1}, {}, r"carry\['h0'\] must name a forward result"),
        ([("h0", "output.1.0")], {}, "carry must be a non-empty dict"),
        (None, {"carry_predict": True}, "carry_predict=True needs carry="),
        (CARRY, {"carry_predict": "yes"}, "carry_predict must be True or False"),
    ],
)
def test_a_wrong_carry_is_a_clear_error(carry: Any, extra: dict[str, Any], match: str) -> None:
    _, gmodel = _models()
    with pytest.raises(GlcompError, match=match):
        glcomp.compile(gmodel, SHAPES, loss=nn.NLLLoss(), optimizer=optim.SGD(lr=LR), carry=carry, **extra)
