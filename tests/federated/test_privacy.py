"""Client-side clipping and Gaussian noise of a site's update (glcomp.federated.privacy.ClipAndNoise):
the mod on hand-built Flower messages, both record forms (the Message API of a plain round and the
legacy FitIns/FitRes of a SecAgg+ round), its place among a ClientApp's mods, the CLI's flags, and
one short simulation whose sites send clipped updates."""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glcomp.errors import GlcompError

pytest.importorskip("flwr", reason="glcomp[federated] (Flower) is not installed")

from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)

from glcomp.federated.privacy import ClipAndNoise, as_dp

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "federated_digits.py")
NODE = 7


def _request(content: RecordDict, message_type: str = MessageType.TRAIN) -> Message:
    meta = Metadata(
        run_id=1,
        message_id="m",
        src_node_id=0,
        dst_node_id=NODE,
        reply_to_message_id="",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type=message_type,
    )
    return Message(content=content, metadata=meta)


def _context() -> Context:
    return Context(run_id=1, node_id=NODE, node_config={}, state=RecordDict(), run_config={})


def _global() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {
        "w": rng.normal(size=(30, 20)).astype(np.float32),
        "b": rng.normal(size=(20,)).astype(np.float32),
        "steps": np.array([5], np.int32),
    }


def _train_msg(weights: dict[str, np.ndarray]) -> Message:
    return _request(
        RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in weights.items()}),
                "config": ConfigRecord({"server-round": 3}),
            }
        )
    )


def _trainer(delta: float, calls: list[Message] | None = None) -> Any:
    """An inner app: adds `delta` to every float weight, 1 to the int counter."""

    def inner(msg: Message, ctxt: Context) -> Message:
        if calls is not None:
            calls.append(msg)
        w = {k: v.numpy() for k, v in msg.content.array_records["arrays"].items()}
        new = {k: (v + np.float32(delta) if v.dtype.kind == "f" else v + 1) for k, v in w.items()}
        norm = float(np.sqrt(sum(np.sum((new[k] - w[k]) ** 2) for k in w if w[k].dtype.kind == "f")))
        content = RecordDict(
            {
                "arrays": ArrayRecord({k: Array(v) for k, v in new.items()}),
                "metrics": MetricRecord({"num-examples": 10, "update-norm": norm}),
            }
        )
        return Message(content=content, reply_to=msg)

    return inner


def _sent(out: Message, received: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], float]:
    w = {k: v.numpy() for k, v in out.content.array_records["arrays"].items()}
    norm = float(np.sqrt(sum(np.sum((w[k].astype(np.float64) - received[k]) ** 2) for k in ("w", "b"))))
    return w, norm


def test_options_are_checked() -> None:
    for bad in (0, -1.0, float("nan"), float("inf"), "1", True, None):
        with pytest.raises(GlcompError, match="clipping norm"):
            ClipAndNoise(bad)  # type: ignore[arg-type]
    for bad in (-0.1, float("nan"), float("inf"), "0"):
        with pytest.raises(GlcompError, match="noise multiplier"):
            ClipAndNoise(1.0, bad)  # type: ignore[arg-type]
    with pytest.raises(GlcompError, match="seed"):
        ClipAndNoise(1.0, 0.0, seed=-1)
    with pytest.raises(GlcompError, match="dp must be"):
        as_dp(1.0)
    dp = as_dp((0.5, 2.0))
    assert (
        isinstance(dp, ClipAndNoise)
        and dp.std == pytest.approx(1.0)
        and dp.describe() == "DP clip 0.5, noise 2"
    )


def test_a_large_update_is_clipped_to_the_norm_and_a_small_one_is_unchanged() -> None:
    g = _global()
    n_float = 30 * 20 + 20
    # every float coordinate +0.1: the update's norm is 0.1 * sqrt(620) ~ 2.49 > 1
    out = ClipAndNoise(1.0)(_train_msg(g), _context(), _trainer(0.1))
    w, norm = _sent(out, g)
    assert norm == pytest.approx(1.0, rel=1e-5)
    # the direction is kept: every coordinate moved by 1/sqrt(620)
    np.testing.assert_allclose(w["w"] - g["w"], 1 / np.sqrt(n_float), rtol=1e-3)
    assert w["w"].dtype == np.float32 and w["steps"].tolist() == [6]  # the counter as the site made it
    assert out.content.metric_records["metrics"]["update-norm"] == pytest.approx(norm, rel=1e-6)
    assert out.content.metric_records["metrics"]["num-examples"] == 10

    small = ClipAndNoise(10.0)(_train_msg(g), _context(), _trainer(0.1))
    expected = _trainer(0.1)(_train_msg(g), _context())
    for k in g:
        np.testing.assert_array_equal(
            small.content.array_records["arrays"][k].numpy(),
            expected.content.array_records["arrays"][k].numpy(),
        )
    # no update at all: nothing to divide by, sent as it is
    zero = ClipAndNoise(1.0)(_train_msg(g), _context(), _trainer(0.0))
    assert _sent(zero, g)[1] == 0.0


def test_the_noise_has_std_noise_times_clip_and_follows_the_seed() -> None:
    g = {"w": np.zeros((200, 100), np.float32)}
    dp = ClipAndNoise(0.5, noise_multiplier=2.0, seed=11)
    out = dp(_train_msg(g), _context(), _trainer(0.0))
    dev = out.content.array_records["arrays"]["w"].numpy()
    assert abs(float(dev.mean())) < 0.05
    assert float(dev.std()) == pytest.approx(1.0, rel=0.03)  # 2.0 * 0.5
    again = dp(_train_msg(g), _context(), _trainer(0.0)).content.array_records["arrays"]["w"].numpy()
    np.testing.assert_array_equal(dev, again)  # the same seed, node and round
    fresh = ClipAndNoise(0.5, 2.0)(_train_msg(g), _context(), _trainer(0.0))
    assert not np.array_equal(fresh.content.array_records["arrays"]["w"].numpy(), dev)
    # the noise comes after the clipping: a big update is clipped to 0.5, then noised
    big = dp(_train_msg(g), _context(), _trainer(1.0)).content.array_records["arrays"]["w"].numpy()
    assert float(big.mean()) == pytest.approx(0.5 / np.sqrt(g["w"].size), abs=0.02)


def test_other_messages_and_error_replies_pass_through() -> None:
    g = _global()
    dp = ClipAndNoise(1e-3)
    evaluate = _request(RecordDict({"arrays": ArrayRecord({k: Array(v) for k, v in g.items()})}), "evaluate")
    reply = Message(RecordDict({"metrics": MetricRecord({"accuracy": 0.5})}), reply_to=evaluate)
    assert dp(evaluate, _context(), lambda m, c: reply) is reply

    msg = _train_msg(g)
    failed = Message(error=Error(code=1, reason="the site's training failed"), reply_to=msg)
    out = dp(msg, _context(), lambda m, c: failed)
    assert out is failed and out.has_error()

    no_weights = _request(RecordDict({"config": ConfigRecord({"stage": "setup"})}))
    calls: list[Message] = []
    dp(no_weights, _context(), lambda m, c: calls.append(m) or Message(RecordDict(), reply_to=m))
    assert calls == [no_weights]  # a SecAgg+ key exchange, say: nothing to clip


def _legacy_msg(weights: dict[str, np.ndarray]) -> Message:
    from flwr.common import FitIns, ndarrays_to_parameters
    from flwr.compat.common.recorddict_compat import fitins_to_recorddict

    fitins = FitIns(ndarrays_to_parameters(list(weights.values())), {"server-round": 2})
    return _request(fitins_to_recorddict(fitins, keep_input=True))


def _legacy_trainer(delta: float) -> Any:
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict, recorddict_to_fitins

    def inner(msg: Message, ctxt: Context) -> Message:
        params = parameters_to_ndarrays(recorddict_to_fitins(msg.content, keep_input=True).parameters)
        new = [p + np.asarray(delta, p.dtype) if p.dtype.kind == "f" else p + 1 for p in params]
        fitres = FitRes(Status(Code.OK, "ok"), ndarrays_to_parameters(new), 10, {})
        return Message(fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)

    return inner


def test_the_legacy_records_of_a_secure_round_are_clipped() -> None:
    from flwr.common import parameters_to_ndarrays
    from flwr.compat.common.recorddict_compat import recorddict_to_fitres

    g = _global()
    out = ClipAndNoise(1.0)(_legacy_msg(g), _context(), _legacy_trainer(0.1))
    fitres = recorddict_to_fitres(out.content, keep_input=True)
    assert fitres.num_examples == 10
    sent = parameters_to_ndarrays(fitres.parameters)
    norm = np.sqrt(sum(np.sum((s.astype(np.float64) - r) ** 2) for s, r in zip(sent[:2], [g["w"], g["b"]])))
    assert norm == pytest.approx(1.0, rel=1e-5)
    assert sent[2].tolist() == [6] and sent[0].dtype == np.float32

    # placed outside secaggplus_mod, the reply it sees is already masked (its arrays cleared)
    def masked(msg: Message, ctxt: Context) -> Message:
        reply = _legacy_trainer(0.1)(msg, ctxt)
        for record in reply.content.array_records.values():
            record.clear()
        return reply

    with pytest.raises(GlcompError, match="secaggplus_mod"):
        ClipAndNoise(1.0)(_legacy_msg(g), _context(), masked)


def test_flowers_local_dp_mod_fails_on_a_message_api_reply() -> None:
    """The finding: Flower 1.42's LocalDpMod reads FitIns records, which a plain glcomp round
    does not carry."""
    from flwr.client.mod import LocalDpMod

    with pytest.raises(KeyError):
        LocalDpMod(1.0, 1.0, 1.0, 1e-5)(_train_msg(_global()), _context(), _trainer(0.1))


def test_the_client_puts_the_mod_innermost_after_secaggplus() -> None:
    from flwr.client.mod import secaggplus_mod

    from glcomp.federated import GlcompClient, Site

    # a stand-in program (a dataclass with params and runtime): the client only keeps it here
    prog = dataclasses.make_dataclass("P", [("params", dict), ("optimizer", Any), ("runtime", Any)])(
        {}, None, 0
    )
    client = GlcompClient(prog, [Site("a", {}, "reference")], dp=(1.0, 0.5))
    assert isinstance(client.dp, ClipAndNoise) and client.dp.std == 0.5
    first = object()
    app = client.app(mods=[first], secure=True)
    assert app._mods == [first, secaggplus_mod, client.dp]
    assert GlcompClient(prog, [Site("a", {}, "reference")]).app()._mods == []
    with pytest.raises(GlcompError, match="clipping norm"):
        GlcompClient(prog, [Site("a", {}, "reference")], dp=(0.0, 1.0))


# -- the command line -----------------------------------------------------------------------------------
def test_cli_refuses_bad_dp_flags(capsys: Any) -> None:
    from glcomp.cli import main

    assert main(["federated", "simulate", "--help"]) == 0
    assert "--dp-clip" in capsys.readouterr().out
    for args, err in (
        (["--dp-noise", "1.0"], "--dp-noise needs --dp-clip"),
        (["--dp-clip", "0"], "positive finite"),
        (["--dp-clip", "nan"], "positive finite"),
        (["--dp-clip", "1", "--dp-noise", "-1"], "noise multiplier"),
        (["--dp-clip", "1", "--dp-noise", "inf"], "noise multiplier"),
    ):
        assert main(["federated", "simulate", EXAMPLE, *args]) == 2, args
        assert err in capsys.readouterr().err, args
    assert main(["federated", "site", EXAMPLE, "--superlink", "127.0.0.1:9", "--dp-noise", "1"]) == 2
    assert "--dp-noise needs --dp-clip" in capsys.readouterr().err


# -- one short federation -------------------------------------------------------------------------------
def test_simulated_sites_send_updates_clipped_to_the_norm(tmp_path: Path, capsys: Any) -> None:
    pytest.importorskip("ray", reason="Flower's simulation engine needs Ray")
    from glcomp.cli import main
    from glcomp.federated import RoundStore, history
    from glcomp.federated.cli import prepare

    clip = 0.05
    out = tmp_path / "fed"
    argv = ["federated", "simulate", EXAMPLE, "--clients", "3", "--rounds", "1", "--runtime", "reference"]
    argv += ["--out", str(out), "--dp-clip", str(clip), "--dp-noise", "0"]
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(
        re.search(r"3 clients, 1 rounds, .*DP clip 0\.05, noise 0; Flower simulation", x) for x in lines
    )
    rounds = history(out)
    sites = rounds[1]["sites"]
    assert len(sites) == 3
    for site in sites:
        # what the site computed (its own audit) was larger than the clip; what it sent is the clip
        audit = json.loads((out / "audit" / f"{site['name']}.jsonl").read_text().splitlines()[-1])
        assert audit["metrics"]["update-norm"] > 2 * clip
        assert site["metrics"]["update-norm"] == pytest.approx(clip, rel=1e-3)
    # and independently of what the sites report: FedAvg of updates of norm <= clip moves the
    # global model by at most clip
    _, prog, _ = prepare(EXAMPLE, 3, "iid", 0, "reference")
    store = RoundStore(out, prog)
    w0, w1 = store.load(0).weights, store.load(1).weights
    moved = float(np.sqrt(sum(np.sum((w1[k].astype(np.float64) - w0[k]) ** 2) for k in w0)))
    assert 0.5 * clip < moved <= clip * (1 + 1e-4)


def test_the_deployment_app_clips_when_the_node_or_run_config_asks() -> None:
    from glcomp.federated.deploy import _dp_when_asked

    g = _global()

    def norm(node: dict[str, Any], run: dict[str, Any]) -> float:
        ctxt = Context(run_id=1, node_id=NODE, node_config=node, state=RecordDict(), run_config=run)
        return _sent(_dp_when_asked(_train_msg(g), ctxt, _trainer(0.1)), g)[1]

    assert norm({}, {}) == pytest.approx(0.1 * np.sqrt(620), rel=1e-5)  # no DP asked for
    assert norm({}, {"dp-clip": 0.5, "dp-noise": 0.0}) == pytest.approx(0.5, rel=1e-5)
    assert norm({"dp-clip": 0.25}, {"dp-clip": 0.5}) == pytest.approx(0.25, rel=1e-5)  # the site's own wins
