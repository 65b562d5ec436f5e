"""Train examples/digits_cnn.py once per storage variant on the GL runtime and report, per variant,
the final test accuracy, the final and mean last-epoch losses, the texture memory and ms per
training step (the steps only: no compile, upload of the data or evaluation).

    python benchmarks/variants.py [--variants f32,f16,rgba8] [--epochs 15] [--json out.json]

Every variant sees the same initial weights and the same batches (one shuffle per epoch, seed 0).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import digits_cnn

import glcomp


def run(storage: str, epochs: int) -> dict[str, Any]:
    spec = digits_cnn.build()
    d, bs = spec["data"], spec["batch_size"]
    prog = glcomp.compile(spec["model"], spec["inputs"], spec["loss"], spec["optimizer"], storage=storage)
    rng = np.random.default_rng(spec["seed"])
    losses: list[float] = []
    seconds = 0.0
    steps = 0
    with prog.runtime("gl") as gl:
        renderer = gl.info()["renderer"]
        for _ in range(epochs):
            order = rng.permutation(len(d["x_train"]))
            batches = [
                {"x": d["x_train"][order[i : i + bs]], "y": d["y_train"][order[i : i + bs]]}
                for i in range(0, len(order) - bs + 1, bs)
            ]
            start = time.perf_counter()
            losses += gl.train_steps(batches, read_every=1)
            seconds += time.perf_counter() - start
            steps += len(batches)
        x, y = d["x_test"], d["y_test"]
        correct = 0
        for i in range(0, len(x), bs):
            chunk = x[i : i + bs]
            padded = np.zeros((bs, *chunk.shape[1:]), np.float32)
            padded[: len(chunk)] = chunk
            correct += int((gl.predict(x=padded)[: len(chunk)].argmax(1) == y[i : i + bs]).sum())
    per_epoch = steps // epochs
    return {
        "storage": storage,
        "renderer": renderer,
        "steps": steps,
        "ms_per_step": 1000 * seconds / steps,
        "final_loss": losses[-1],
        "last_epoch_mean_loss": float(np.mean(losses[-per_epoch:])),
        "test_correct": correct,
        "test_total": len(x),
        "accuracy": correct / len(x),
        "texture_bytes": prog.bundle().manifest["memory"]["texture_bytes"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--variants", default="f32,f16,rgba8")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    results = []
    for storage in args.variants.split(","):
        r = run(storage, args.epochs)
        results.append(r)
        print(
            f"{storage:6s} acc {r['test_correct']}/{r['test_total']} ({100 * r['accuracy']:.2f}%)  "
            f"final loss {r['final_loss']:.4f}  last-epoch mean {r['last_epoch_mean_loss']:.4f}  "
            f"{r['ms_per_step']:.1f} ms/step  {r['texture_bytes'] / 1e6:.2f} MB  ({r['renderer']})",
            flush=True,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
