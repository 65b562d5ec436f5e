"""Three "hospitals" train one digits classifier together without sharing their images (Flower).

    pip install 'glcomp[federated,examples]'
    python examples/federated_hospitals.py [--rounds 5] [--epochs 2] [--strategy fedavg|fedprox|fedadam]
                                           [--split iid|dirichlet:0.5] [--out runs/federated_hospitals]
                                           [--secure]

scikit-learn's 8x8 digits are split 80/20 as in examples/digits_cnn.py (1437 training, 360 test
images); the training images are dealt out to three hospitals in disjoint parts (at random, or
label-skewed with a Dirichlet prior). hospital-a and hospital-b train on the GL runtime (GLSL
shaders; Mesa llvmpipe is enough), clinic-c on the numpy reference runtime, all in Flower's
simulation engine on this machine. Every round the server (FedAvg by default) sends the global
weights, each hospital trains `--epochs` local epochs on its own images and sends back only its
weights, the server checks and averages them, evaluates the global model on the held-out 360
images and saves it as a glcomp bundle in OUT/round-NNNN/model. Running the command again
resumes after the last saved round (`--rounds` counts the whole federation); `glcomp run
OUT/round-0005/model --input x=...` runs the result. Each hospital's audit log (what it computed
and sent, per round) is OUT/audit/<hospital>.jsonl. With --secure the server aggregates with
Flower's SecAgg+ and sees only the sum of the hospitals' weights, never one hospital's.

Measured on 2 shared vCPUs of an AMD EPYC (llvmpipe, load average 5 to 10), 2 local epochs (28
steps of 32 images per hospital per round), IID split: global test accuracy 71.1% after round 1,
92.5% after round 2, 95.3% after round 5 (96.1% after a resumed 6th round); rounds 2-5 took 5 to
8 s each, round 1 68 s (Ray workers starting, GL shaders compiling); each hospital sends 24.4 kB
of weights a round (25.1 kB with the .npy headers). See docs/federated.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import glcomp
from glcomp import nn, optim

BATCH = 32
HOSPITALS = (("hospital-a", "gl"), ("hospital-b", "gl"), ("clinic-c", "reference"))


def split(y: np.ndarray, parts: int, how: str, seed: int) -> list[np.ndarray]:
    """Disjoint index sets of the training set, one per hospital: ``iid`` (a random deal) or
    ``dirichlet:ALPHA`` (each class's images shared out in Dirichlet(ALPHA) proportions)."""
    rng = np.random.default_rng(seed)
    if how == "iid":
        return [np.sort(p) for p in np.array_split(rng.permutation(len(y)), parts)]
    if not how.startswith("dirichlet:"):
        raise SystemExit(f"--split: expected iid or dirichlet:ALPHA, got {how!r}")
    alpha = float(how.split(":", 1)[1])
    out: list[list[int]] = [[] for _ in range(parts)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        cuts = (np.cumsum(rng.dirichlet([alpha] * parts))[:-1] * len(idx)).astype(int)
        for p, chunk in enumerate(np.split(idx, cuts)):
            out[p].extend(chunk.tolist())
    return [np.sort(np.array(p, np.int64)) for p in out]


def build(lr: float = 1e-2) -> glcomp.Program:
    """The digits CNN of examples/digits_cnn.py, compiled for batches of BATCH with Adam."""
    from digits_cnn import model

    glcomp.manual_seed(0)
    return glcomp.compile(
        model(), {"x": (BATCH, 1, 8, 8)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=lr)
    )


def main(argv: list[str] | None = None) -> Any:
    from digits_cnn import data

    from glcomp.federated import GlcompClient, GlcompServer, Site, run_simulation

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2, help="local epochs per round")
    parser.add_argument("--strategy", default="fedavg", choices=["fedavg", "fedprox", "fedadam"])
    parser.add_argument("--split", default="iid", help="iid or dirichlet:ALPHA")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/federated_hospitals")
    parser.add_argument("--secure", action="store_true", help="secure aggregation (Flower's SecAgg+, FedAvg)")
    args = parser.parse_args(argv)

    d = data()
    prog = build()
    parts = split(d["y_train"], len(HOSPITALS), args.split, args.seed)
    sites = []
    for (name, kind), idx in zip(HOSPITALS, parts):
        sites.append(Site(name, {"x": d["x_train"][idx], "y": d["y_train"][idx]}, kind))
        counts = np.bincount(d["y_train"][idx], minlength=10)
        print(f"{name} ({kind}): {len(idx)} images, per class {counts.tolist()}")
    options = {"fedprox": {"proximal_mu": 0.01}, "fedadam": {"eta": 1e-2, "eta_l": 1e-2}}.get(args.strategy)
    server = GlcompServer(
        prog,
        args.out,
        num_rounds=args.rounds,
        strategy=args.strategy,
        strategy_options=options,
        min_clients=len(sites),
        eval_data={"x": d["x_test"], "y": d["y_test"]},
        secure=args.secure,
    )
    client = GlcompClient(
        prog, sites, epochs=args.epochs, seed=args.seed, audit_dir=Path(args.out).resolve() / "audit"
    )
    return run_simulation(server, client, num_supernodes=len(sites))


if __name__ == "__main__":
    main()
