"""A tiny digits classifier for federated runs: ``glcomp federated simulate`` deals its data out.

    glcomp federated simulate examples/federated_digits.py --clients 4 --rounds 10 \
        --partition dirichlet:0.5 --seed 0 [--secure]
    glcomp train examples/federated_digits.py      # the same model trained centrally

scikit-learn's 8x8 digits split 80/20 as in examples/digits_cnn.py (1437 training, 360 test
images); the model is a small MLP (64 -> 32 -> 10, 2,410 weights, 9.6 kB a site sends a round),
Adam lr 1e-2, batch 32, so a federated round of a few sites costs little next to Flower's own
overheads. See docs/federated.md for what it reaches (rounds to 90% on non-IID sites, time per
round, bytes sent, the centralized comparison).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import glcomp
from glcomp import nn, optim

BATCH = 32


def model() -> nn.Module:
    """Flatten the 8x8 image, one hidden layer of 32, 10 logits."""
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def build() -> dict[str, Any]:
    """What ``glcomp train`` and ``glcomp federated simulate`` need (data as digits_cnn.data())."""
    from digits_cnn import data

    glcomp.manual_seed(0)
    return {
        "model": model(),
        "inputs": {"x": (BATCH, 1, 8, 8)},
        "loss": nn.CrossEntropyLoss(),
        "optimizer": optim.Adam(lr=1e-2),
        "data": data(),
        "batch_size": BATCH,
        "epochs": 10,
        "seed": 0,
    }


if __name__ == "__main__":
    from glcomp.cli import main

    sys.exit(main(["federated", "simulate", __file__, *sys.argv[1:]]))
