"""Camera fine-tuning in the page: a small CNN pretrained in Python learns the user's own classes
from a few seconds of camera frames, in the browser (glcomp/pages/camera.html).

    python examples/camera_finetune.py --no-serve      # pretrain, write runs/camera_finetune/bundle/
    glcomp serve runs/camera_finetune/bundle           # then open http://127.0.0.1:8000/camera.html
    python examples/camera_finetune.py                 # both: build, then serve the page

1. Pretraining (`pretrain`) teaches the convolutions generic features on synthetic 64x48 frames
   (stripes of four orientations, checkerboards, discs and rings in random colours, with noise),
   fed as uint8 frames through the same image input as the page's camera, and writes
   ``pretrained.safetensors`` (torch parameter names).
2. The fine-tuning bundle (`finetune_program`) starts from those convolutions, freezes the first
   two (``requires_grad_(False)``) and trains the third and a new classifier of `CLASSES` outputs
   with Adam. Its input is a batch of camera frames: ``Preprocess`` resizes them to 32x32 RGB in
   [0, 1] in a shader, and in the train step only the augmentations (`augmentations`: small random
   affine moves, brightness and contrast jitter, Gaussian noise) vary each frame; `predict` sees the
   frame as it is.
3. ``camera.html`` (served by ``glcomp serve``) records frames for 2 to `CLASSES` classes from the
   camera (getUserMedia), fine-tunes, shows live predictions on the video and exports the weights as
   a safetensors file with torch's names for `CameraNet` (`load_finetuned` reads it back; so does
   the same architecture in PyTorch: the preprocessing and augmentation modules hold no weights).

Measured by tests/pages/test_camera_demo.py in headless Chromium (SwiftShader) with a fake camera.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

import glcomp
from glcomp import nn, optim
from glcomp.transforms import ColorJitter, Compose, GaussianNoise, Preprocess, RandomAffine

SOURCE = (48, 64)  # camera frames (height, width): getUserMedia is asked for 64x48
SIZE = (32, 32)  # the network's input
CLASSES = 5  # the most classes the page records; fewer leave the extra outputs untrained
BATCH = 16  # frames per train step (sampled with replacement from the recorded ones)
PRETRAIN_CLASSES = 8  # the synthetic patterns of `synthetic_frames`


def augmentations() -> Compose:
    """The train step's augmentations of the preprocessed frames (identity in predict). No flips:
    a gesture and its mirror image may be different classes."""
    return Compose(
        [
            RandomAffine(degrees=8, translate=(0.08, 0.08), scale=(0.9, 1.1)),
            ColorJitter(brightness=0.25, contrast=0.25),
            GaussianNoise(sigma=0.03),
        ]
    )


class CameraNet(nn.Module):
    """Frames (N, 48, 64, 4) bytes -> class logits: Preprocess, augmentations (train step only),
    three conv blocks (32 -> 16 -> 8 -> 4 pixels) and a linear classifier. Weights are named
    ``features.{0,3,6}.{weight,bias}`` and ``head.{weight,bias}`` as torch names them."""

    def __init__(self, classes: int = CLASSES) -> None:
        super().__init__()
        self.pre = Preprocess(size=SIZE, source=SOURCE, mode="resize", channels="rgb", scale=1 / 255)
        self.augment = augmentations()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.flatten = nn.Flatten()
        self.head = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x: glcomp.Tensor) -> glcomp.Tensor:
        return self.head(self.flatten(self.features(self.augment(self.pre(x)))))


FROZEN = ("features.0", "features.3")  # the early convolutions the page does not train


def synthetic_frames(count: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """`count` RGB frames (count, 48, 64, 3) uint8 of PRETRAIN_CLASSES patterns and their labels:
    stripes at 0, 45, 90 and 135 degrees, checkerboards, discs, rings and smooth gradients, each
    with two random colours, a random period, phase and centre, and pixel noise."""
    rng = np.random.default_rng(seed)
    h, w = SOURCE
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    labels = rng.integers(0, PRETRAIN_CLASSES, count)
    frames = np.empty((count, h, w, 3), np.uint8)
    for i, label in enumerate(labels):
        period = rng.uniform(6, 16)
        phase = rng.uniform(0, 2 * np.pi)
        cy, cx = rng.uniform(0.3 * h, 0.7 * h), rng.uniform(0.3 * w, 0.7 * w)
        r = np.hypot(yy - cy, xx - cx)
        if label < 4:
            angle = label * np.pi / 4
            t = np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period + phase) > 0
        elif label == 4:
            t = (np.sin(2 * np.pi * xx / period + phase) > 0) ^ (np.sin(2 * np.pi * yy / period) > 0)
        elif label == 5:
            t = r < rng.uniform(8, 18)
        elif label == 6:
            t = np.abs(r - rng.uniform(10, 18)) < rng.uniform(2, 4)
        else:
            t = (xx * np.cos(phase) + yy * np.sin(phase)) / w + 0.5
        a, b = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
        t = np.asarray(t, np.float32)[..., None]
        img = a * (1 - t) + b * t + rng.normal(0, 12, (h, w, 3))
        frames[i] = np.clip(np.rint(img), 0, 255).astype(np.uint8)
    return frames, labels


def pretrain(out: Path, steps: int = 150, runtime: str = "gl", seed: int = 0) -> Path:
    """Train `CameraNet(PRETRAIN_CLASSES)` on synthetic frames; write its weights (torch names) to
    ``out/pretrained.safetensors`` and return the path."""
    from safetensors.numpy import save_file

    glcomp.manual_seed(seed)
    net = CameraNet(PRETRAIN_CLASSES)
    batch = 32
    prog = glcomp.compile(
        net, {"x": net.pre.input(batch)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=3e-3)
    )
    frames, labels = synthetic_frames(steps * batch // 4 + batch, seed)
    rng = np.random.default_rng(seed)
    with prog.runtime(runtime) as rt:
        for _ in range(steps):
            idx = rng.choice(len(frames), batch, replace=False)
            rt.train_step(x=frames[idx], y=labels[idx])
        weights = rt.state_dict()
    out.mkdir(parents=True, exist_ok=True)
    path = out / "pretrained.safetensors"
    tmp = path.with_name(path.name + ".tmp")
    save_file({k: np.ascontiguousarray(v, dtype=np.float32) for k, v in weights.items()}, str(tmp))
    tmp.replace(path)
    return path


def finetune_program(
    weights: Path | str, classes: int = CLASSES, lr: float = 1e-2, batch: int = BATCH, target: str = "webgl2"
) -> glcomp.Program:
    """The page's program: the pretrained convolutions (those of FROZEN frozen), a new classifier
    of `classes` outputs, Adam, batches of `batch` camera frames."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        state = load_file(str(weights))
    except (OSError, SafetensorError) as err:
        raise glcomp.GlcompError(f"{weights}: not a readable safetensors file ({err})") from None
    net = CameraNet(classes)
    features = {k: v for k, v in state.items() if k.startswith("features.")}
    if not features:
        raise glcomp.GlcompError(f"{weights}: holds no features.* tensors (CameraNet's convolutions)")
    net.load_state_dict(features, strict=False)  # the head stays freshly initialised
    for path, module in net.named_modules():
        if path in FROZEN:
            module.requires_grad_(False)
    return glcomp.compile(
        net,
        {"x": net.pre.input(batch)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.Adam(lr=lr),
        target=target,
    )


def build(
    out: Path,
    weights: Path | str | None = None,
    pretrain_steps: int = 150,
    seed: int = 0,
    runtime: str = "gl",
    batch: int = BATCH,
) -> Path:
    """Write ``out/bundle/`` (the fine-tuning bundle camera.html loads, batches of `batch`
    frames); return its path. Without `weights`, pretrain first (`pretrain`)."""
    if weights is None:
        weights = pretrain(out, steps=pretrain_steps, seed=seed, runtime=runtime)
    glcomp.manual_seed(seed + 1)
    return finetune_program(weights, batch=batch).save(out / "bundle")


def load_finetuned(weights: Path | str, classes: int = CLASSES) -> CameraNet:
    """The model with the weights the page exported (``camera-finetuned.safetensors``)."""
    from safetensors.numpy import load_file

    net = CameraNet(classes)
    net.load_state_dict(load_file(str(weights)))
    return net


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/camera_finetune", help="output folder (default: %(default)s)")
    p.add_argument("--weights", help="start from this safetensors state_dict instead of pretraining")
    p.add_argument("--steps", type=int, default=150, help="pretraining steps (default 150)")
    p.add_argument("--port", type=int, default=8000, help="port of the page (default 8000)")
    p.add_argument("--no-serve", action="store_true", help="write the bundle, do not serve it")
    args = p.parse_args(argv)
    try:
        bundle = build(Path(args.out), args.weights, args.steps)
        print(f"wrote {bundle}")
        if not args.no_serve:
            from glcomp.serve import serve

            print("open /camera.html to record classes and fine-tune in the page")
            serve(bundle, args.port)
    except glcomp.GlcompError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
