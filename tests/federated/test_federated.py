"""Federated training on Flower (glcomp.federated): update checks, GL/reference agreement of a
local update, and a real Flower simulation (flwr.simulation.run_simulation: a ServerApp and three
ClientApps in this process and Ray workers, loopback only) of a tiny MLP on two GL sites and one
reference site, plus a fourth site sending a malformed update, whose result must equal FedAvg
computed by hand over the same local updates; then the server is restarted and resumes."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError
from glcomp.federated import Site, check_update, federated_shapes, local_train

flwr = pytest.importorskip("flwr", reason="glcomp[federated] (Flower) is not installed")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    Metadata,
    MetricRecord,
    RecordDict,
)

from glcomp.federated import GlcompClient, GlcompServer, history  # noqa: E402
from glcomp.federated.server import _checked_strategy_class  # noqa: E402

BATCH = 8
SEED = 3
# GL sites' local update vs the reference runtime's on the same data and weights (max abs
# difference of the updated tensors after 4 Adam steps; measured about 1e-7).
GL_REF_TOL = 1e-5


def _program() -> glcomp.Program:
    glcomp.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 12), nn.ReLU(), nn.Linear(12, 3))
    return glcomp.compile(model, {"x": (BATCH, 6)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=0.05))


def _data(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6)).astype(np.float32)
    y = ((x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5)).astype(np.int32)
    return {"x": x, "y": y}


SITES = [
    Site("hospital-a", _data(24, 1), "gl"),
    Site("hospital-b", _data(16, 2), "gl"),
    Site("clinic-c", _data(32, 3), "reference"),
]
BAD_SITE = Site("mallory", _data(16, 4), "reference")


class TamperingClient(GlcompClient):
    """The honest client, except that the site named "mallory" sends NaN in one tensor."""

    def train(self, msg: Any, context: Any) -> Any:
        reply = super().train(msg, context)
        if self.site(context).name == "mallory":
            arrays = reply.content.array_records["arrays"]
            bad = arrays["2.weight"].numpy().copy()
            bad[0, 0] = np.nan
            arrays["2.weight"] = Array(bad)
        return reply


# -- checks of received tensors (no Flower run) --------------------------------------------------
def test_check_update_names_source_and_tensor() -> None:
    prog = _program()
    shapes = federated_shapes(prog)
    good = {k: np.zeros(s, np.float32) for k, s in shapes.items()}
    assert list(check_update(good, shapes, "site x")) == list(shapes)
    cases = {
        "missing tensors ['0.bias']": {k: v for k, v in good.items() if k != "0.bias"},
        "unexpected tensors ['evil']": good | {"evil": np.zeros(1, np.float32)},
        "'0.weight' has dtype float64": good | {"0.weight": np.zeros(shapes["0.weight"])},
        "'2.bias' has shape (4,), expected (3,)": good | {"2.bias": np.zeros(4, np.float32)},
        "'2.weight' holds 3 NaN or infinite values": good
        | {"2.weight": np.where(np.eye(3, 12) > 0.5, np.inf, 0).astype(np.float32)},
    }
    for expected, update in cases.items():
        with pytest.raises(GlcompError, match="update from site x rejected") as err:
            check_update(update, shapes, "site x")
        assert expected in str(err.value)


def test_check_array_record_refuses_what_it_cannot_trust() -> None:
    from glcomp.federated import check_array_record

    prog = _program()
    shapes = federated_shapes(prog)
    good = {k: Array(np.zeros(s, np.float32)) for k, s in shapes.items()}
    assert set(check_array_record(ArrayRecord(good), shapes, "n")) == set(shapes)
    big = np.zeros(shapes["2.bias"], np.float32)
    padded = Array(dtype="float32", shape=big.shape, stype="numpy.ndarray", data=b"\0" * 10**6)
    liar = Array(dtype="float32", shape=(3,), stype="numpy.ndarray", data=Array(np.zeros(5, np.float32)).data)
    cases = {
        "'2.bias' carries 1000000 bytes": padded,
        "'2.bias' has dtype 'float64'": Array(np.zeros(3)),
        "'2.bias' has serialization 'torch'": Array(dtype="float32", shape=(3,), stype="torch", data=b""),
        "'2.bias' has shape (5,), expected (3,)": liar,  # declared (3,), decoded (5,)
    }
    for expected, arr in cases.items():
        with pytest.raises(GlcompError, match="update from n rejected") as err:
            check_array_record(ArrayRecord(good | {"2.bias": arr}), shapes, "n")
        assert expected in str(err.value)


def _reply(arrays: dict[str, np.ndarray], n: int, site: str, node: int = 7) -> Message:
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "metrics": MetricRecord({"num-examples": n, "train-loss-mean": 1.0}),
            "site": ConfigRecord({"name": site}),
        }
    )
    meta = Metadata(
        run_id=1,
        message_id="",
        src_node_id=node,
        dst_node_id=0,
        reply_to_message_id="m",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type=MessageType.TRAIN,
    )
    return Message(content=content, metadata=meta)


def test_strategy_leaves_a_bad_update_out_or_fails_clearly() -> None:
    from flwr.serverapp.strategy import FedAvg

    prog = _program()
    shapes = federated_shapes(prog)
    rng = np.random.default_rng(0)
    a = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    b = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    nan = a | {"0.bias": np.full(shapes["0.bias"], np.nan, np.float32)}
    cls = _checked_strategy_class()
    strategy = cls(FedAvg(), shapes)
    replies = [_reply(a, 10, "a"), _reply(nan, 10**6, "evil"), _reply(b, 30, "b")]
    agg, _ = strategy.aggregate_train(1, replies)
    for k in shapes:
        np.testing.assert_allclose(agg[k].numpy(), (10 * a[k] + 30 * b[k]) / 40, rtol=1e-6, atol=1e-7)
    (rejected,) = strategy.rounds[1]["rejected"]
    assert rejected["site"] == "evil"
    assert "site 'evil'" in rejected["error"] and "'0.bias' holds" in rejected["error"]
    wrong_weight = _reply(a, 0, "zero")  # a weight of 0 (or negative, or nan) is refused too
    assert strategy.aggregate_train(2, [wrong_weight]) == (None, None)
    assert "'num-examples' must be a number" in strategy.rounds[2]["rejected"][0]["error"]

    failing = cls(FedAvg(), shapes, on_reject="fail")
    with pytest.raises(GlcompError, match=r"update from node 7 \(site 'evil'\) in round 1 rejected"):
        failing.aggregate_train(1, [_reply(a, 10, "a"), _reply(nan, 10, "evil")])


def test_a_failed_site_does_not_block_the_round() -> None:
    from flwr.app import Error
    from flwr.serverapp.strategy import FedAvg

    prog = _program()
    shapes = federated_shapes(prog)
    a = {k: np.full(s, 0.5, np.float32) for k, s in shapes.items()}
    dead = _reply(a, 10, "dead")
    failed = Message(error=Error(code=1, reason="the site's worker died"), metadata=dead.metadata)
    strategy = _checked_strategy_class()(FedAvg(), shapes)
    agg, _ = strategy.aggregate_train(3, [failed, _reply(a, 10, "alive")])
    assert all(np.array_equal(agg[k].numpy(), a[k]) for k in shapes)
    assert strategy.rounds[3]["failed"] == [{"node": 7, "reason": "the site's worker died"}]


def test_importing_glcomp_federated_does_not_import_flower() -> None:
    code = "import sys, glcomp.federated; print('flwr' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# -- GL and reference sites agree ------------------------------------------------------------------
def test_gl_and_reference_give_the_same_local_update(gl_ctx: Any) -> None:
    prog = _program()
    start = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    site = SITES[0]
    results = {}
    for kind, options in (("gl", {"ctx": gl_ctx}), ("reference", {})):
        with prog.runtime(kind, **options) as rt:
            results[kind] = local_train(
                rt, prog, site.data, start, site=site.name, epochs=2, seed=SEED, server_round=1
            )
    gl, ref = results["gl"], results["reference"]
    assert gl.steps == ref.steps == 2 * (24 // BATCH)
    diff = max(float(np.abs(gl.weights[k] - ref.weights[k]).max()) for k in start)
    print(f"GL vs reference local update: max abs difference {diff:.3g} over {gl.steps} Adam steps")
    assert diff < GL_REF_TOL
    np.testing.assert_allclose(gl.losses, ref.losses, rtol=1e-5, atol=1e-6)
    assert abs(gl.update_norm - ref.update_norm) < 1e-4 * max(1.0, ref.update_norm)


# -- a Flower simulation --------------------------------------------------------------------------------
def _hand_fedavg(prog: glcomp.Program, start: dict[str, np.ndarray], server_round: int, gl_ctx: Any) -> Any:
    """The round's local updates of the honest sites, trained here, and their FedAvg (float64)."""
    updates = []
    for site in SITES:
        options = {"ctx": gl_ctx} if site.runtime == "gl" else {}
        with prog.runtime(site.runtime, **options) as rt:
            r = local_train(
                rt, prog, site.data, start, site=site.name, epochs=1, seed=SEED, server_round=server_round
            )
        updates.append(r)
    total = sum(r.num_examples for r in updates)
    avg = {k: sum(r.num_examples * r.weights[k].astype(np.float64) for r in updates) / total for k in start}
    return avg, updates


def test_simulation_fedavg_matches_hand_computation_rejects_and_resumes(tmp_path: Path, gl_ctx: Any) -> None:
    import ray.cloudpickle

    from glcomp.federated import RoundStore, run_simulation

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/
    prog = _program()
    out = tmp_path / "federation"
    sites = [*SITES, BAD_SITE]
    lines: list[str] = []

    def server(rounds: int) -> GlcompServer:
        return GlcompServer(
            prog, out, num_rounds=rounds, min_clients=4, eval_data=_data(20, 9), progress=lines.append
        )

    client = TamperingClient(prog, sites, epochs=1, seed=SEED)
    t0 = time.perf_counter()
    run_simulation(server(1), client, num_supernodes=4)
    first = time.perf_counter() - t0
    store = RoundStore(out, prog)
    assert store.rounds() == [0, 1]
    round1_mtime = (out / "round-0001" / "round.json").stat().st_mtime_ns

    t0 = time.perf_counter()
    resumed = server(2)
    run_simulation(resumed, client, num_supernodes=4)
    second = time.perf_counter() - t0
    print(f"simulation: 1 round in {first:.1f} s, the resumed round in {second:.1f} s (Ray start included)")
    assert resumed.started_at == 1
    assert store.rounds() == [0, 1, 2]
    assert (out / "round-0001" / "round.json").stat().st_mtime_ns == round1_mtime  # not redone
    assert any("resuming after round 1" in line for line in lines)
    assert lines[-1].startswith("federated: 2 rounds, 4 clients, test accuracy ")

    worst = 0.0
    for r in (1, 2):
        before, after = store.load(r - 1), store.load(r)
        expected, updates = _hand_fedavg(prog, before.weights, r, gl_ctx)
        for k, v in expected.items():
            worst = max(worst, float(np.abs(after.weights[k] - v).max()))
        info = after.info
        assert info["answered"] == 3
        (rejected,) = info["rejected"]
        assert "site 'mallory'" in rejected["error"] and "'2.weight' holds 1 NaN" in rejected["error"]
        by_name = {s["name"]: s for s in info["sites"]}
        assert sorted(by_name) == sorted(s.name for s in SITES)
        assert by_name["clinic-c"]["renderer"] == "numpy" and by_name["hospital-a"]["runtime"] == "gl"
        for site, u in zip(SITES, updates):
            got = by_name[site.name]["metrics"]
            assert got["num-examples"] == u.num_examples and got["steps"] == u.steps
            assert abs(got["update-norm"] - u.update_norm) < 1e-4 * max(1.0, u.update_norm)
            np.testing.assert_allclose(by_name[site.name]["loss_curve"], u.losses, rtol=1e-5, atol=1e-6)
        assert 0.0 <= info["global"]["accuracy"] <= 1.0
    print(f"federated result vs FedAvg by hand: max abs difference {worst:.3g}")
    assert worst < 1e-5

    # the saved global model is an ordinary bundle
    final = glcomp.load(out / "round-0002" / "model")
    np.testing.assert_array_equal(final.params["0.weight"], store.load(2).weights["0.weight"])
    assert [h["round"] for h in history(out)] == [0, 1, 2]
    assert json.loads((out / "federation.json").read_text())["format"] == "glcomp-federation"


def test_round_store_refuses_another_models_directory(tmp_path: Path) -> None:
    from glcomp.federated import RoundStore

    prog = _program()
    RoundStore(tmp_path / "f", prog).open()
    glcomp.manual_seed(0)
    other = glcomp.compile(nn.Linear(6, 2), {"x": (BATCH, 6)}, loss=nn.MSELoss(), optimizer=optim.SGD(lr=0.1))
    with pytest.raises(GlcompError, match="federation of another model"):
        RoundStore(tmp_path / "f", other).open()
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "notes.txt").write_text("mine")
    with pytest.raises(GlcompError, match="not empty and not a federation directory"):
        RoundStore(tmp_path / "g", prog).open()


# -- FedProx, FedAdam, the site's checks, the round store (no Flower run) ----------------------------
def test_fedprox_proximal_step_keeps_the_site_near_the_global_model() -> None:
    prog = _program()
    start = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    norms = {}
    for mu in (0.0, 5.0):
        with prog.runtime("reference") as rt:
            r = local_train(rt, prog, SITES[2].data, start, site="c", epochs=2, seed=SEED, proximal_mu=mu)
        norms[mu] = r.update_norm
    assert 0 < norms[5.0] < 0.8 * norms[0.0]
    with (
        pytest.raises(GlcompError, match="proximal-mu must be a finite number"),
        prog.runtime("reference") as rt,
    ):
        local_train(rt, prog, SITES[2].data, start, site="c", proximal_mu=float("nan"))


def test_fedadam_aggregate_is_float32_and_its_state_is_restored() -> None:
    from flwr.serverapp.strategy import FedAdam

    prog = _program()
    shapes = federated_shapes(prog)
    rng = np.random.default_rng(1)
    current = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    cls = _checked_strategy_class()
    strategy = cls(FedAdam(eta=0.1), shapes)
    strategy.inner.current_arrays = dict(current)  # what configure_train records
    update = {k: v + 0.01 for k, v in current.items()}
    agg, _ = strategy.aggregate_train(1, [_reply(update, 5, "a"), _reply(update, 5, "b")])
    assert all(agg[k].numpy().dtype == np.float32 for k in shapes)  # Flower's FedAdam returns float64
    state = strategy.strategy_state()
    assert sorted(state) == sorted([f"m_t/{k}" for k in shapes] + [f"v_t/{k}" for k in shapes])
    fresh = cls(FedAdam(eta=0.1), shapes)
    fresh.load_strategy_state(state)
    for k in shapes:
        np.testing.assert_array_equal(fresh.inner.m_t[k], strategy.inner.m_t[k])


def _instruction(arrays: dict[str, np.ndarray]) -> Message:
    meta = Metadata(
        run_id=1,
        message_id="m",
        src_node_id=0,
        dst_node_id=7,
        reply_to_message_id="",
        group_id="1",
        created_at=time.time(),
        ttl=60.0,
        message_type=MessageType.TRAIN,
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord({k: Array(v) for k, v in arrays.items()}),
            "config": ConfigRecord({"server-round": 1}),
        }
    )
    return Message(content=content, metadata=meta)


def test_a_site_checks_the_global_weights_it_receives() -> None:
    from flwr.app import Context

    prog = _program()
    client = GlcompClient(prog, SITES, epochs=1)
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 2}, state=RecordDict(), run_config={})
    good = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    reply = client.train(_instruction(good), context)
    assert reply.content["metrics"]["num-examples"] == 32
    assert reply.content["site"]["name"] == "clinic-c" and reply.content["site"]["renderer"] == "numpy"
    bad = good | {"0.weight": np.zeros((2, 2), np.float32)}
    with pytest.raises(
        GlcompError, match=r"update from the server rejected: .*'0.weight' has shape \(2, 2\)"
    ):
        client.train(_instruction(bad), context)
    odd = _instruction(good)
    odd.content["config"]["lr"] = "fast"
    with pytest.raises(GlcompError, match="the server's config 'lr' must be a finite number, got 'fast'"):
        client.train(odd, context)
    lost = Context(run_id=1, node_id=7, node_config={"partition-id": 5}, state=RecordDict(), run_config={})
    with pytest.raises(GlcompError, match="partition-id 5 names none of the 3 sites"):
        client.train(_instruction(good), lost)


def test_round_store_keeps_only_whole_rounds(tmp_path: Path) -> None:
    from glcomp.federated import RoundStore

    prog = _program()
    store = RoundStore(tmp_path / "f", prog, keep=2)
    store.open()
    half = tmp_path / "f" / ".round-0002.abc.partial"  # a server killed while saving round 2
    (half / "model").mkdir(parents=True)
    with prog.runtime("reference") as rt:
        for r in range(3):
            assert store.rounds() == list(range(r))[-2:]  # the newest two (keep=2)
            store.save(r, rt, {"round": r}, {"m_t/x": np.ones(2, np.float32)})
    assert store.rounds() == [1, 2] and not half.exists()
    latest = store.latest()
    assert latest is not None and latest.round == 2 and latest.info == {"round": 2}
    np.testing.assert_array_equal(latest.strategy_state["m_t/x"], np.ones(2, np.float32))


# -- secure aggregation (SecAgg+) ---------------------------------------------------------------------
def _wire_bytes(msg: Any) -> int:
    """The bytes of a message's content as Flower ships it (its deduplicated object tree)."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(msg.content).values())


class ByteCounter:
    """A Flower client mod writing the size of every reply a site sends (one JSON line each)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, msg: Any, context: Any, call_next: Any) -> Any:
        out = call_next(msg, context)
        line = {"site": int(context.node_config["partition-id"]), "bytes": _wire_bytes(out)}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")
        return out


def test_simulation_secure_aggregation_matches_fedavg(tmp_path: Path, gl_ctx: Any) -> None:
    import ray.cloudpickle
    from flwr.app import Context

    from glcomp.federated import RoundStore, run_simulation

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    prog = _program()
    out = tmp_path / "secure"
    # max_weight: SecAgg+ scales each site's weights by num-examples / max_weight before quantizing
    # them to 2**22 levels over [-8, 8]; a max_weight near the largest site keeps that precise.
    secure = {"max_weight": 64.0}
    server = GlcompServer(prog, out, num_rounds=1, min_clients=3, eval_data=_data(20, 9), secure=secure)
    client = GlcompClient(prog, SITES, epochs=1, seed=SEED)
    counter = ByteCounter(tmp_path / "bytes.jsonl")
    run_simulation(server, client.app(mods=[counter], secure=True), num_supernodes=3)
    store = RoundStore(out, prog)
    assert store.rounds() == [0, 1]
    info = store.load(1).info
    assert info["secure"] is True and info["answered"] == 3 and info["sites"] == []  # nothing per site

    expected, _ = _hand_fedavg(prog, store.load(0).weights, 1, gl_ctx)
    got = store.load(1).weights
    diff = max(float(np.abs(got[k] - expected[k]).max()) for k in expected)
    # Each site's scaled weights are rounded (stochastically) to within one quantization level of
    # 16 / 2**22; the sum of three is divided by the sum of the scale factors (72 examples / 64):
    # the aggregate is within 3 such levels of FedAvg's, whatever the random rounding did.
    level = 16 / 2**22 * 64 / 72
    print(f"SecAgg+ vs plain FedAvg: max abs difference {diff:.3g} (quantization level {level:.2g})")
    assert diff < 3 * level + 1e-7

    sent: dict[int, int] = {}
    for line in (tmp_path / "bytes.jsonl").read_text().splitlines():
        rec = json.loads(line)
        sent[rec["site"]] = sent.get(rec["site"], 0) + rec["bytes"]
    context = Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    weights = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    plain = _wire_bytes(GlcompClient(prog, SITES, epochs=1).train(_instruction(weights), context))
    print(f"bytes sent per site in a round: {plain} plain, {sorted(sent.values())} with SecAgg+")
    assert len(sent) == 3 and all(v > plain for v in sent.values())


def test_a_site_keeps_its_optimizer_state_between_rounds_when_asked() -> None:
    from flwr.app import Context

    prog = _program()
    good = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    second = {}
    for mode in ("reset", "keep"):
        client = GlcompClient(prog, SITES, epochs=1, optimizer=mode)
        context = Context(
            run_id=1, node_id=7, node_config={"partition-id": 2}, state=RecordDict(), run_config={}
        )
        client.train(_instruction(good), context)
        assert ("glcomp.optimizer" in context.state.array_records) == (mode == "keep")
        reply = client.train(_instruction(good), context)  # the same global weights again
        second[mode] = reply.content["arrays"]["0.weight"].numpy()
    assert not np.allclose(second["reset"], second["keep"])  # Adam's moments and step carried over
    with pytest.raises(GlcompError, match="optimizer must be one of"):
        GlcompClient(prog, SITES, optimizer="forget")
