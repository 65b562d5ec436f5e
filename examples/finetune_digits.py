"""Fine-tuning in the page: pretrain a digits CNN in Python, then teach it new classes in the browser.

    python examples/finetune_digits.py                 # pretrain, build the bundle, serve the page
    python examples/finetune_digits.py --no-serve      # only write runs/finetune_digits/
    python examples/finetune_digits.py --weights pretrained.safetensors   # start from your own weights

The workflow glcomp is built for: a model is trained where compute is (here: Python, on the 8x8
digits 0-4 only), and its last layer is fine-tuned where the data is (a web page, on digits the
user draws or uploads, which never leave the device).

1. Pretraining writes ``pretrained.safetensors``: a state_dict under torch's parameter names, the
   file ``safetensors.torch.save_file(model.state_dict(), ...)`` writes for the same architecture
   in PyTorch, so ``--weights`` accepts weights trained with torch as well.
2. The fine-tuning bundle is compiled from the same model with both convolutions frozen
   (``requires_grad_(False)``): its train step updates only the classifier (draws, memory and
   texture uploads shrink accordingly) and starts from the pretrained weights.
3. ``finetune.html`` (served by ``glcomp serve``, see `serve`) lets the user draw digits on an 8x8
   pad (or upload pictures), label them, fine-tune, check predictions and export the result as a
   safetensors file that `load_finetuned` (or torch) reads back. ``data.safetensors`` beside the
   bundle holds held-out test digits (all classes) and a few examples of the new classes, which the
   page can use instead of drawn ones.

Measured in headless Chromium (SwiftShader) by tests/pages/test_finetune_example.py (120 pretraining steps,
60 sample examples, 80 fine-tuning steps of batch 16): held-out accuracy on the new classes 0% -> 81%,
on all ten 84%; freezing the convolutions cuts the train step from 31 draws to 17.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import digits_cnn
import numpy as np

import glcomp
from glcomp import nn, optim

PRETRAIN_CLASSES = (0, 1, 2, 3, 4)
NEW_CLASSES = (5, 6, 7, 8, 9)
BATCH = 16  # the page's batches: a user's few examples, sampled with replacement


def model() -> nn.Module:
    """The network of examples/digits_cnn.py: two conv blocks and a linear classifier over 10 classes."""
    return digits_cnn.model()


def digits(seed: int = 0) -> dict[str, np.ndarray]:
    """scikit-learn's 8x8 digits as (N, 1, 8, 8) float32 in [0, 1] and integer labels, split 80/20
    (examples/digits_cnn.py's split)."""
    return digits_cnn.data(seed)


def evaluate(runtime: object, x: np.ndarray, y: np.ndarray, batch: int) -> float:
    """Accuracy of a runtime compiled for `batch` rows (the last batch padded, padding ignored)."""
    good = 0
    for start in range(0, len(x), batch):
        xb = x[start : start + batch]
        real = len(xb)
        if real < batch:
            xb = np.concatenate([xb, np.repeat(xb[:1], batch - real, axis=0)])
        logits = runtime.predict(x=xb)[:real]  # type: ignore[attr-defined]
        good += int(np.sum(np.argmax(logits, axis=1) == y[start : start + real]))
    return good / len(x)


def pretrain(out: Path, steps: int = 240, runtime: str = "gl", seed: int = 0) -> Path:
    """Train on the digits 0-4 only; write their weights (torch names) to ``out/pretrained.safetensors``."""
    from safetensors.numpy import save_file

    data = digits(seed)
    keep = np.isin(data["y_train"], PRETRAIN_CLASSES)
    x, y = data["x_train"][keep], data["y_train"][keep]
    glcomp.manual_seed(seed)
    batch = 64
    prog = glcomp.compile(
        model(), {"x": (batch, 1, 8, 8)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2)
    )
    rng = np.random.default_rng(seed)
    with prog.runtime(runtime) as rt:
        for _ in range(steps):
            idx = rng.choice(len(x), batch, replace=False)
            rt.train_step(x=x[idx], y=y[idx])
        weights = rt.state_dict()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pretrained.safetensors"
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, str(tmp))
    tmp.replace(path)
    return path


def finetune_program(weights: Path | str, lr: float = 1e-2, batch: int = BATCH) -> glcomp.Program:
    """The fine-tuning program: the pretrained model, convolutions frozen, Adam on the classifier."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    net = model()
    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as err:
        raise glcomp.GlcompError(f"{weights}: not a readable safetensors file ({err})") from None
    net.load_state_dict(state)  # a GlcompError names any missing, extra or misshaped tensor
    net[0].requires_grad_(False)
    net[3].requires_grad_(False)
    return glcomp.compile(
        net, {"x": (batch, 1, 8, 8)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=lr)
    )


def build(out: Path, weights: Path | str | None = None, pretrain_steps: int = 240, seed: int = 0) -> Path:
    """Write ``out/bundle/`` (the fine-tuning bundle and its data.safetensors); return the bundle path.

    data.safetensors: ``x_train``/``y_train`` hold 8 examples of each new class (what a user would
    draw) and 4 of each pretrained class (a few old examples keep the classifier from forgetting
    them), ``x_test``/``y_test`` the held-out test digits of all ten classes."""
    from glcomp.serve import export_data

    if weights is None:
        weights = pretrain(out, steps=pretrain_steps, seed=seed)
    prog = finetune_program(weights)
    bundle = prog.save(out / "bundle")
    data = digits(seed)
    rng = np.random.default_rng(seed)
    counts = {**{c: 4 for c in PRETRAIN_CLASSES}, **{c: 8 for c in NEW_CLASSES}}
    picks = [rng.choice(np.flatnonzero(data["y_train"] == c), n, replace=False) for c, n in counts.items()]
    idx = np.concatenate(picks)
    export_data(bundle, data["x_train"][idx], data["y_train"][idx], data["x_test"], data["y_test"])
    return bundle


def load_finetuned(weights: Path | str) -> nn.Module:
    """The model with weights exported by the page (``finetuned.safetensors``)."""
    from safetensors.numpy import load_file

    net = model()
    net.load_state_dict(load_file(str(weights)))
    return net


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/finetune_digits", help="output folder (default: %(default)s)")
    p.add_argument("--weights", help="start from this safetensors state_dict instead of pretraining")
    p.add_argument("--steps", type=int, default=240, help="pretraining steps (default 240)")
    p.add_argument("--port", type=int, default=8000, help="port of the page (default 8000)")
    p.add_argument("--no-serve", action="store_true", help="write the bundle, do not serve it")
    args = p.parse_args(argv)
    out = Path(args.out)
    try:
        bundle = build(out, args.weights, args.steps)
        data = digits()
        with finetune_program(args.weights or out / "pretrained.safetensors").runtime("gl") as rt:
            for name, classes in (("pretrained (0-4)", PRETRAIN_CLASSES), ("new (5-9)", NEW_CLASSES)):
                keep = np.isin(data["y_test"], classes)
                acc = evaluate(rt, data["x_test"][keep], data["y_test"][keep], BATCH)
                print(f"test accuracy on the {name} classes before fine-tuning: {100 * acc:.1f}%")
        print(f"wrote {bundle}")
        if not args.no_serve:
            from glcomp.serve import serve

            print("open /finetune.html to fine-tune in the page")
            serve(bundle, args.port)
    except glcomp.GlcompError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
