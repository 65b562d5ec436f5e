"""``glcomp federated simulate``: a real Flower federation (simulation engine, Ray workers on this
machine, nothing on a network) of examples/federated_digits.py dealt out to four non-IID sites
(Dirichlet 0.5 over the labels); a site that crashes in the middle of a round;
the accuracy target and the comparison with centralized training on the pooled data; the deployment
engine (SuperLink and SuperNode processes) with a SuperNode killed in the middle of a round."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from glcomp.errors import GlcompError
from glcomp.federated.partition import MAX_DRAWS, parse_partition, partition

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "federated_digits.py")
ROUND_LINE = re.compile(
    r"^round (\d+)/(\d+): (\d+) clients answered(?:, (\d+) rejected, (\d+) failed)?, "
    r"mean local loss ([0-9.]+), global test accuracy ([0-9.]+)%$"
)
FINAL_LINE = re.compile(r"^federated: (\d+) rounds, (\d+) clients, test accuracy ([0-9.]+)%$")


def _rounds(lines: list[str]) -> dict[int, tuple[int, int, float, float]]:
    """round -> (answered, failed, mean local loss, accuracy %) from the printed round lines."""
    out = {}
    for line in lines:
        m = ROUND_LINE.match(line)
        if m:
            out[int(m[1])] = (int(m[3]), int(m[5] or 0), float(m[6]), float(m[7]))
    return out


# -- the split ----------------------------------------------------------------------------------------
def test_partition_deals_disjoint_sets_skewed_by_alpha() -> None:
    y = np.repeat(np.arange(10, dtype=np.int32), 50)
    for how in ("iid", "dirichlet:0.5", "dirichlet:100"):
        parts = partition(y, 4, how, seed=1, min_rows=32)
        joined = np.concatenate(parts)
        assert len(joined) == len(y) and len(np.unique(joined)) == len(y)  # disjoint, complete
        assert min(len(p) for p in parts) >= 32
    assert partition(y, 4, "dirichlet:0.5", 1)[0].tolist() == partition(y, 4, "dirichlet:0.5", 1)[0].tolist()

    def skew(how: str) -> float:  # mean share of a site's most frequent class
        return float(np.mean([np.bincount(y[p]).max() / len(p) for p in partition(y, 4, how, seed=2)]))

    assert skew("dirichlet:0.1") > 0.3 > skew("dirichlet:100")
    for bad in ("dirichlet", "dirichlet:0", "dirichlet:-1", "dirichlet:x", "zipf:2"):
        with pytest.raises(GlcompError, match="--partition"):
            parse_partition(bad)
    with pytest.raises(GlcompError, match=f"{MAX_DRAWS} draws"):
        partition(y, 10, "dirichlet:0.01", seed=0, min_rows=49)
    with pytest.raises(GlcompError, match="--clients 20"):
        partition(y, 20, "iid", seed=0, min_rows=32)


def test_cli_lists_federated_simulate_and_refuses_bad_arguments(capsys: Any) -> None:
    from glcomp.cli import main

    assert main(["federated", "simulate", "--help"]) == 0
    assert "--partition" in capsys.readouterr().out
    assert main(["federated", "simulate", EXAMPLE, "--partition", "dirichlet:zero"]) == 2
    assert "dirichlet:ALPHA" in capsys.readouterr().err
    assert main(["federated", "simulate", "no_such_example.py"]) == 2
    assert "no_such_example.py" in capsys.readouterr().err


# -- a live federation ----------------------------------------------------------------------------------
pytest.importorskip("flwr", reason="glcomp[federated] (Flower) is not installed")
pytest.importorskip("ray", reason="Flower's simulation engine needs Ray")

from glcomp.federated import GlcompClient, history  # noqa: E402
from glcomp.federated.cli import load_example, simulate  # noqa: E402

KILLED_SITE, KILLED_ROUND = "site-3", 2


class CrashingClient(GlcompClient):
    """The honest client, except that site-3 crashes in the middle of round 2, after receiving the
    round's weights: its ClientApp raises, it sends nothing, and Flower's engine reports the
    failure to the server. It rejoins round 3. (Killing the worker process itself, os._exit, is
    not survivable under Flower 1.42's simulation engine: the dead Ray actor stays in its pool and
    the next round's messages routed to it fail too; see docs/federated.md.)"""

    def train(self, msg: Any, context: Any) -> Any:
        config = msg.content.config_records.get("config", {})
        if self.site(context).name == KILLED_SITE and int(config.get("server-round", 0)) == KILLED_ROUND:
            raise RuntimeError(f"{KILLED_SITE} lost power in round {KILLED_ROUND}")
        return super().train(msg, context)


def test_simulate_non_iid_sites_survive_a_site_crashing_mid_round(tmp_path: Path) -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    lines: list[str] = []
    out = tmp_path / "fed"
    server = simulate(
        EXAMPLE,
        clients=4,
        rounds=3,
        partition="dirichlet:0.5",
        seed=0,
        epochs=3,
        runtime="reference",
        out=out,
        client_class=CrashingClient,
        progress=lines.append,
    )
    rounds = _rounds(lines)
    assert sorted(rounds) == [1, 2, 3], lines
    assert rounds[1][:2] == (4, 0)
    assert rounds[KILLED_ROUND][:2] == (3, 1)  # the round completed with the other three
    assert rounds[3][:2] == (4, 0)  # and the killed site rejoined the next one
    start = history(out)[0]["global"]["accuracy"]
    accs = [rounds[r][3] for r in (1, 2, 3)]
    assert 100 * start < 20 < accs[0] < accs[2], (start, accs)  # it learns, despite the failure
    assert rounds[1][2] > rounds[3][2]  # the mean local loss falls
    final = FINAL_LINE.match(lines[-1])
    assert final and final.groups() == ("3", "4", f"{accs[2]:.2f}")
    saved = history(server.out_dir)
    assert [r["round"] for r in saved] == [0, 1, 2, 3]
    assert len(saved[2]["failed"]) == 1 and sorted(s["name"] for s in saved[2]["sites"]) == [
        "site-0",
        "site-1",
        "site-2",
    ]
    audited = (out / "audit" / f"{KILLED_SITE}.jsonl").read_text().splitlines()
    assert len(audited) == 2  # rounds 1 and 3: it computed and sent nothing in round 2


# -- the target, and centralized training ----------------------------------------------------------------
def _centralized(epochs: int) -> tuple[float, float]:
    """Accuracy (%) and seconds of training the example centrally on the pooled training data,
    for `epochs` epochs on the reference runtime (the same batch order rule as a site)."""
    import time

    import glcomp
    from glcomp.federated import evaluate, federated_shapes, local_train

    spec = load_example(EXAMPLE)
    prog = glcomp.compile(spec.model, spec.inputs, spec.loss, spec.optimizer)
    rt = prog.runtime("reference")
    start = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    assert set(start) == set(federated_shapes(prog))
    t0 = time.perf_counter()
    local_train(rt, prog, {"x": spec.x_train, "y": spec.y_train}, start, site="pooled", epochs=epochs)
    seconds = time.perf_counter() - t0
    return 100 * evaluate(rt, prog, {"x": spec.x_test, "y": spec.y_test})["accuracy"], seconds


def test_simulate_reaches_90_percent_on_non_iid_sites_and_compares_with_centralized(
    tmp_path: Path, capsys: Any
) -> None:
    from glcomp.cli import main

    rounds, epochs = 10, 3
    argv = ["federated", "simulate", EXAMPLE, "--clients", "4", "--rounds", str(rounds)]
    argv += ["--partition", "dirichlet:0.5", "--seed", "0", "--epochs", str(epochs)]
    assert main([*argv, "--runtime", "mixed", "--out", str(tmp_path / "fed")]) == 0
    lines = capsys.readouterr().out.splitlines()
    got = _rounds(lines)
    assert sorted(got) == list(range(1, rounds + 1)) and all(v[:2] == (4, 0) for v in got.values())
    first = min((r for r, v in got.items() if v[3] >= 90.0), default=None)
    final = [FINAL_LINE.match(line) for line in lines if FINAL_LINE.match(line)]
    assert final and final[-1].groups()[:2] == (str(rounds), "4")
    federated = float(final[-1][3])
    central, seconds = _centralized(rounds * epochs)
    times = [r["seconds"] for r in history(tmp_path / "fed") if r["round"] > 1]
    print(
        f"non-IID federated: 90% first at round {first}, {federated:.2f}% after {rounds} rounds "
        f"(rounds 2..{rounds}: {min(times):.2f} to {max(times):.2f} s); centralized on the pooled "
        f"data, {rounds * epochs} epochs: {central:.2f}% ({seconds:.1f} s)"
    )
    assert first is not None and first <= rounds, got
    assert federated >= 90.0 and central >= 90.0
    assert federated >= central - 5.0  # non-IID FedAvg stays within 5 points of pooled training


# -- the deployment engine: processes on 127.0.0.1, one killed mid-federation --------------------------
def test_deployment_engine_survives_a_killed_supernode(tmp_path: Path) -> None:
    """A SuperLink and three SuperNode processes; site-2's SuperNode (and its ClientApp process)
    is SIGKILLed as round 2 starts: round 2 completes without it after the round timeout, and
    site-2's restarted SuperNode (a new Flower node, same partition-id) rejoins round 3. Which of
    the survivors answer in time is the machine's load, not the engine's: under the parallel suite
    on 2 cores site-0 once missed a 30 s round 2 (only site-1 answered), so the timeout is 60 s and
    the rounds are checked for the killed site's absence and return, not for every survivor."""
    import time

    from glcomp.federated.deploy import run_deployment

    lines: list[str] = []
    events: list[str] = []

    def on_round(fed: Any, info: dict[str, Any]) -> None:
        if info["round"] == 1:  # round 2 has just been sent out
            fed.kill(2)
            events.append("killed")
            time.sleep(1.0)
            # Back during round 2 (which waits for the dead node until the round timeout), so the
            # new node is registered when round 3 samples the nodes.
            fed.restart(2)
            events.append("restarted")

    out = tmp_path / "fed"
    result = run_deployment(
        EXAMPLE,
        out,
        clients=3,
        rounds=3,
        partition="dirichlet:0.5",
        seed=0,
        epochs=3,
        strategy="fedavg",
        runtime="reference",
        progress=lines.append,
        round_timeout=60.0,
        min_clients=2,
        total_timeout=400.0,
        on_round=on_round,
    )
    assert events == ["killed", "restarted"]
    rounds = _rounds(lines)
    names = {r["round"]: sorted(s["name"] for s in r["sites"]) for r in result.history}
    assert names[1] == ["site-0", "site-1", "site-2"], lines
    # the round went on without the killed site, with the survivors that answered in time
    assert names[2] and set(names[2]) <= {"site-0", "site-1"}, lines
    assert "site-2" in names[3], lines  # which rejoined
    assert rounds[1][3] < rounds[3][3]
    times = [r["seconds"] for r in result.history]
    print(f"deployment engine: seconds per round {[round(t, 1) for t in times]}; {lines[-1]}")
    assert FINAL_LINE.match(lines[-1])
