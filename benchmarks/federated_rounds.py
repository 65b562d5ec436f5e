"""Federated training of examples/federated_digits.py on Flower: rounds to a target accuracy, time
per round, bytes per site per round with and without SecAgg+, and centralized training on the
pooled data for comparison.

Runs a real Flower federation on this machine (Flower's simulation engine) of N sites with a
label-skewed split (Dirichlet ALPHA over the labels, as ``glcomp federated simulate``), once with
plain FedAvg and once with secure aggregation (SecAgg+, FedAvg), on the reference runtime by
default. A Flower client mod counts the bytes of every train message a site receives and every
reply it sends, as Flower serializes them (the message's deduplicated object tree: weights,
metrics, the loss curve, the site record, and in a secure round the four protocol stages' keys,
shares and masked vector). Then trains the same model centrally on the pooled training data for
rounds x epochs epochs. Prints one table per run, the comparison, and the load average before and
after.

    python benchmarks/federated_rounds.py [--clients 4] [--rounds 10] [--alpha 0.5] [--epochs 3]
        [--secure-rounds 3] [--runtime reference|gl|mixed] [--target 90]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "federated_digits.py")


def _wire_bytes(content: Any) -> int:
    """Bytes of a message content as Flower ships it (its deduplicated object tree)."""
    from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects

    return sum(len(obj.deflate()) for obj in get_all_nested_objects(content).values())


class ByteCounter:
    """A Flower client mod appending, for every train message, the site, the bytes received and
    the bytes of the reply sent (one JSON line each) to `path`."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __call__(self, msg: Any, context: Any, call_next: Any) -> Any:
        received = _wire_bytes(msg.content)
        out = call_next(msg, context)
        if msg.metadata.message_type.startswith("train"):
            line = {
                "site": int(context.node_config["partition-id"]),
                "received": received,
                "sent": _wire_bytes(out.content) if not out.has_error() else 0,
            }
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(line) + "\n")
        return out


def _run(args: argparse.Namespace, rounds: int, secure: bool, work: Path) -> dict[str, Any]:
    from glcomp.federated import GlcompClient, GlcompServer, history, run_simulation
    from glcomp.federated.cli import prepare

    out = work / ("secure" if secure else "plain")
    counts = work / f"bytes-{'secure' if secure else 'plain'}.jsonl"
    spec, prog, sites = prepare(EXAMPLE, args.clients, f"dirichlet:{args.alpha}", args.seed, args.runtime)
    name = next(iter(spec.inputs))
    server = GlcompServer(
        prog,
        out,
        num_rounds=rounds,
        min_clients=args.clients,
        eval_data={name: spec.x_test, spec.target_name: spec.y_test},
        secure=secure,
        progress=None,
    )
    client = GlcompClient(prog, sites, epochs=args.epochs, seed=args.seed)
    t0 = time.perf_counter()
    run_simulation(server, client.app(mods=[ByteCounter(counts)], secure=secure), num_supernodes=args.clients)
    seconds = time.perf_counter() - t0
    per_site: dict[int, dict[str, int]] = {}
    for line in counts.read_text().splitlines():
        rec = json.loads(line)
        site = per_site.setdefault(rec["site"], {"sent": 0, "received": 0})
        site["sent"] += rec["sent"]
        site["received"] += rec["received"]
    return {"history": [r for r in history(out) if r["round"] > 0], "bytes": per_site, "seconds": seconds}


def _centralized(epochs: int) -> tuple[float, float]:
    import glcomp
    from glcomp.federated import evaluate, local_train
    from glcomp.federated.cli import load_example

    spec = load_example(EXAMPLE)
    prog = glcomp.compile(spec.model, spec.inputs, spec.loss, spec.optimizer)
    rt = prog.runtime("reference")
    start = {k: np.asarray(v, np.float32) for k, v in (prog.params | prog.buffers).items()}
    t0 = time.perf_counter()
    local_train(rt, prog, {"x": spec.x_train, "y": spec.y_train}, start, site="pooled", epochs=epochs)
    seconds = time.perf_counter() - t0
    return 100 * evaluate(rt, prog, {"x": spec.x_test, "y": spec.y_test})["accuracy"], seconds


def _table(title: str, run: dict[str, Any], rounds: int) -> None:
    print(f"\n{title}")
    print(f"{'round':>5}  {'answered':>8}  {'accuracy %':>10}  {'seconds':>7}")
    for r in run["history"]:
        acc = 100 * r["global"]["accuracy"]
        print(f"{r['round']:>5}  {r.get('answered', len(r['sites'])):>8}  {acc:>10.2f}  {r['seconds']:>7.2f}")
    sent = [v["sent"] / rounds for v in run["bytes"].values()]
    got = [v["received"] / rounds for v in run["bytes"].values()]
    print(
        f"bytes per site per round: sent {min(sent):,.0f} to {max(sent):,.0f} (mean {np.mean(sent):,.0f}), "
        f"received {min(got):,.0f} to {max(got):,.0f} (mean {np.mean(got):,.0f}); "
        f"{run['seconds']:.1f} s for the run"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--secure-rounds", type=int, default=3, help="rounds of the SecAgg+ run (0: none)")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runtime", default="reference", choices=("reference", "gl", "mixed"))
    p.add_argument("--target", type=float, default=90.0, help="accuracy (%%) whose first round is reported")
    args = p.parse_args(argv)
    load0 = os.getloadavg()
    print(
        f"examples/federated_digits.py: {args.clients} sites, Dirichlet({args.alpha}) split "
        f"(seed {args.seed}), "
        f"{args.epochs} local epoch(s) a round, {args.runtime} runtime; {os.cpu_count()} cores, "
        f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        plain = _run(args, args.rounds, False, work)
        _table(f"FedAvg, {args.rounds} rounds", plain, args.rounds)
        if args.secure_rounds:
            secure = _run(args, args.secure_rounds, True, work)
            _table(f"SecAgg+ (FedAvg), {args.secure_rounds} rounds", secure, args.secure_rounds)
    accs = [100 * r["global"]["accuracy"] for r in plain["history"]]
    first = next((i + 1 for i, a in enumerate(accs) if a >= args.target), None)
    central, seconds = _centralized(args.rounds * args.epochs)
    print(
        f"\nfirst round at or above {args.target:g}%: {first if first else 'none'}; "
        f"after {args.rounds} rounds {accs[-1]:.2f}%; centralized on the pooled data, "
        f"{args.rounds * args.epochs} epochs: {central:.2f}% "
        f"({seconds:.1f} s); federated - centralized: {accs[-1] - central:+.2f} points"
    )
    later = [r["seconds"] for r in plain["history"][1:]]
    if later:
        first_s = plain["history"][0]["seconds"]
        print(f"seconds per round: round 1 {first_s:.1f}, later {min(later):.2f} to {max(later):.2f}")
    load1 = os.getloadavg()
    print(f"load average after: {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
