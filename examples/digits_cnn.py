"""A small CNN on scikit-learn's 8x8 handwritten digits, trained on the GPU through GLSL shaders.

    glcomp train examples/digits_cnn.py            # GL runtime (any WebGL-class GPU, or llvmpipe)
    python examples/digits_cnn.py --runtime reference

1797 images (8x8, 10 classes) scaled to [0, 1], split 80/20 (stratified, seed 0): 1437 training
and 360 test images. Conv(1->16) - ReLU - MaxPool - Conv(16->32) - ReLU - MaxPool - Linear(128->10),
Adam lr 1e-2, batch 64, 15 epochs (330 steps).

Measured with `glcomp train` on Mesa llvmpipe, 2 vCPUs of an AMD EPYC (2026-11-29): 97.22% test
accuracy (350/360) in 29 s of training, 33 s for the whole command; the reference runtime reaches
the same 97.22%.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

import glcomp
from glcomp import nn, optim

BATCH = 64


def model() -> nn.Module:
    """The network: two conv blocks and a linear classifier (8x8 -> 4x4 -> 2x2 -> 10 logits)."""
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10),
    )


def data(seed: int = 0) -> dict[str, np.ndarray]:
    """The digits as (N, 1, 8, 8) float32 in [0, 1] and int32 labels, split 80/20."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=seed, stratify=y)
    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}


def build() -> dict[str, Any]:
    """What ``glcomp train`` needs: model, input shapes, loss, optimizer, data, batch size, epochs."""
    glcomp.manual_seed(0)
    return {
        "model": model(),
        "inputs": {"x": (BATCH, 1, 8, 8)},
        "loss": nn.CrossEntropyLoss(),
        "optimizer": optim.Adam(lr=1e-2),
        "data": data(),
        "batch_size": BATCH,
        "epochs": 15,
        "seed": 0,
    }


if __name__ == "__main__":
    from glcomp.cli import main

    sys.exit(main(["train", __file__, *sys.argv[1:]]))
