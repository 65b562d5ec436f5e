"""glcomp.transforms: each augmentation against its semantics (numpy expectations on known
images), GL == reference bit for bit in both dialects, identity in predict, new draws each train
step, reproducible under glcomp.manual_seed, a CNN trained with augmentation (GL, reference and
Chromium alike), and arguments refused naming the transform."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from browser.support import _js

import glcomp
from glcomp import nn, optim
from glcomp import transforms as T
from glcomp.ir.graph import Graph
from glcomp.ir.interpret import evaluate
from glcomp.ir.tensor import Tensor
from glcomp.nn.functional import RNG_STEP
from glcomp.transforms import _fixed as fx


class Apply(nn.Module):
    """The transforms' train-mode maps as the model's outputs (so predict runs them)."""

    def __init__(self, *ts: Any) -> None:
        super().__init__()
        self.ts = nn.ModuleList(list(ts))

    def forward(self, x: Any) -> Any:
        outs = tuple(t.augment(x) for t in self.ts)
        return outs[0] if len(outs) == 1 else outs


def run(t: Any, x: np.ndarray, step: int = 0, seed: int = 0) -> np.ndarray:
    """The transform in train mode on `x` at RNG step `step` (reference interpreter)."""
    glcomp.manual_seed(seed)
    graph = glcomp.trace(t, training=True, x=x.shape)
    feeds = {"x": x}
    if RNG_STEP in graph.inputs:
        feeds[RNG_STEP] = np.float32(step)
    return evaluate(graph, feeds)["output"]


def images(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random(shape).astype(np.float32)


# -- semantics -------------------------------------------------------------------------------------
def test_flips_flip_and_p_extremes():
    x = images((6, 2, 5, 7))
    np.testing.assert_array_equal(run(T.RandomHorizontalFlip(1.0), x), x[..., ::-1])
    np.testing.assert_array_equal(run(T.RandomVerticalFlip(1.0), x), x[:, :, ::-1])
    np.testing.assert_array_equal(run(T.RandomHorizontalFlip(0.0), x), x)
    x = images((64, 1, 3, 4))
    out = run(T.RandomHorizontalFlip(0.5), x)
    flipped = [np.array_equal(o, f[..., ::-1]) for o, f in zip(out, x)]
    kept = [np.array_equal(o, f) for o, f in zip(out, x)]
    assert all(a != b for a, b in zip(flipped, kept))  # each image one or the other
    assert 16 < sum(flipped) < 48  # per image, about half


def test_fixed_point_cosine_and_sine():
    g = Graph()
    angle = Tensor(g, g.add_input("a", (4 * fx.RIGHT + 1,), "data"))
    cos, sin = fx.cos_sin(angle)
    g.outputs["c"], g.outputs["s"] = cos.node, sin.node
    a = np.arange(-2 * fx.RIGHT, 2 * fx.RIGHT + 1, dtype=np.float32)
    out = evaluate(g, {"a": a})
    phi = a.astype(np.float64) * math.pi / (2 * fx.RIGHT)
    assert np.abs(out["c"] - fx.ONE * np.cos(phi)).max() <= 2
    assert np.abs(out["s"] - fx.ONE * np.sin(phi)).max() <= 2
    right = a % fx.RIGHT == 0
    np.testing.assert_array_equal(out["c"][right], np.round(fx.ONE * np.cos(phi[right])))


def test_affine_right_angle_translation_and_fill():
    x = images((3, 2, 6, 6))
    # torchvision's angles are clockwise: 90 degrees is np.rot90 with k=-1.
    np.testing.assert_array_equal(run(T.RandomAffine((90, 90)), x), np.rot90(x, -1, (2, 3)))
    np.testing.assert_array_equal(run(T.RandomAffine((180, 180)), x), x[:, :, ::-1, ::-1])
    out = run(T.RandomAffine(0, translate=(0.34, 0.0), fill=0.5), images((40, 1, 4, 6)))
    x = images((40, 1, 4, 6))
    shifts = set()
    for o, img in zip(out, x):
        match = [
            d for d in range(-2, 3)
            if np.array_equal(o[0], np.roll(img[0], d, 1) * _keep(6, d) + 0.5 * (1 - _keep(6, d)))
        ]  # fmt: skip
        assert len(match) == 1
        shifts.add(match[0])
    assert shifts == {-2, -1, 0, 1, 2}


def _keep(w: int, d: int) -> np.ndarray:
    """1 where column j of an image shifted right by d still comes from inside the image."""
    j = np.arange(w)
    return ((j - d >= 0) & (j - d < w)).astype(np.float32)


def test_affine_is_close_to_the_real_rotation():
    h = w = 16
    yy, xx = np.mgrid[0:h, 0:w]
    x = (yy * w + xx).astype(np.float32)[None, None].repeat(2, 0)
    out = run(T.RandomAffine((30, 30), scale=(1.25, 1.25)), x)[0, 0]
    th = math.radians(30)
    px, py = xx + 0.5 - w / 2, yy + 0.5 - h / 2  # torchvision: the inverse map of the output pixel
    sx = (math.cos(th) * px + math.sin(th) * py) / 1.25 + w / 2
    sy = (-math.sin(th) * px + math.cos(th) * py) / 1.25 + h / 2
    inside = (sx >= 0) & (sx < w) & (sy >= 0) & (sy < h)
    want = np.where(inside, np.floor(sy).clip(0, h - 1) * w + np.floor(sx).clip(0, w - 1), 0)
    assert np.mean(out == want) > 0.9  # differs only where the source lies on a pixel edge


def test_resized_crop_geometry():
    x = images((4, 3, 8, 8))
    whole = T.RandomResizedCrop((4, 4), scale=(1.0, 1.0), ratio=(1.0, 1.0))
    np.testing.assert_array_equal(run(whole, x), x[:, :, 1::2, 1::2])  # nearest-exact: 2i + 1
    h, w = 12, 10
    yy, xx = np.mgrid[0:h, 0:w]
    x = np.stack([yy * 100 + xx] * 2).astype(np.float32)[:, None].repeat(16, 0)
    out = run(T.RandomResizedCrop((5, 6), scale=(0.2, 0.6)), x)
    for o in out[:, 0]:
        rows, cols = np.unique(o // 100), np.unique(o % 100)
        assert 0.2 * h * w * 0.5 <= (np.ptp(rows) + 1) * (np.ptp(cols) + 1) <= h * w
        assert np.all(np.diff(o // 100, axis=0) >= 0) and np.all(np.diff(o % 100, axis=1) >= 0)
    assert out.shape == (32, 1, 5, 6)


def test_color_jitter_factors():
    x = images((4, 3, 5, 6))
    q = np.floor(x * 2**15) / 2**15
    np.testing.assert_array_equal(run(T.ColorJitter(brightness=(2, 2)), x), np.minimum(q * 2, 1))
    flat = run(T.ColorJitter(contrast=(0, 0)), x)  # every pixel the image's grey mean
    grey = (0.2989 * x[:, 0] + 0.587 * x[:, 1] + 0.114 * x[:, 2]).mean((1, 2))
    np.testing.assert_allclose(flat, np.broadcast_to(grey[:, None, None, None], x.shape), atol=2e-3)
    np.testing.assert_array_equal(run(T.ColorJitter(contrast=(1, 1)), x), q)
    out = run(T.ColorJitter(brightness=0.5, contrast=0.5), x)
    assert out.min() >= 0 and out.max() <= 1 and not np.array_equal(out, q)


def test_noise_statistics():
    x = np.full((4, 2, 32, 32), 0.5, np.float32)
    noise = run(T.GaussianNoise(mean=0.05, sigma=0.1, clip=False), x) - 0.5
    assert abs(noise.mean() - 0.05) < 0.003 and abs(noise.std() - 0.1) < 0.003
    assert np.abs(noise - 0.05).max() < 3.5 * 0.1
    clipped = run(T.GaussianNoise(sigma=1.0), x)
    assert clipped.min() == 0 and clipped.max() == 1
    out = run(T.SaltAndPepperNoise(p=0.2, salt_vs_pepper=0.25), x)
    assert np.array_equal(out[:, 0], out[:, 1])  # per pixel, all channels
    salt, pepper = np.mean(out[:, 0] == 1), np.mean(out[:, 0] == 0)
    assert abs(salt - 0.05) < 0.015 and abs(pepper - 0.15) < 0.02
    assert np.mean(out[:, 0] == 0.5) == pytest.approx(1 - salt - pepper)


# -- random draws -----------------------------------------------------------------------------------
ALL = (
    T.RandomHorizontalFlip(),
    T.RandomVerticalFlip(),
    T.RandomAffine(40, (0.2, 0.1), (0.7, 1.3), (-15, 15, -10, 10), fill=0.25),
    T.RandomResizedCrop((6, 5)),
    T.ColorJitter(0.5, 0.5),
    T.GaussianNoise(0.01, 0.2),
    T.SaltAndPepperNoise(0.3),
)


@pytest.mark.parametrize("t", ALL, ids=lambda t: type(t).__name__)
def test_new_draws_each_step_and_reproducible_seeds(t: Any):
    x = images((8, 3, 9, 8), seed=1)
    first = run(t, x, step=0, seed=3)
    assert not np.array_equal(first, run(t, x, step=1, seed=3))
    assert not np.array_equal(first, run(t, x, step=0, seed=4))
    np.testing.assert_array_equal(first, run(t, x, step=0, seed=3))


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
@pytest.mark.parametrize("seed", [0, pytest.param(1, marks=pytest.mark.slow_only)])
def test_gl_equals_reference_bit_for_bit(target: str, seed: int):
    glcomp.manual_seed(seed)
    x = images((3, 3, 9, 8), seed=seed)
    prog = glcomp.compile(Apply(*ALL), {"x": x.shape}, target=target)
    want = prog.runtime("reference").predict(x=x)
    got = prog.runtime("gl").predict(x=x)
    for i, t in enumerate(ALL):
        a, b = (np.asarray(out[f"output.{i}"], np.float32) for out in (want, got))
        assert a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)), type(t).__name__


# -- in a model ---------------------------------------------------------------------------------------
def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 8 * 8, 3))


AUG = [T.RandomAffine(15, (0.1, 0.1)), T.RandomHorizontalFlip(), T.GaussianNoise(sigma=0.05)]


def _program(target: str = "webgl2") -> glcomp.Program:
    glcomp.manual_seed(0)
    return glcomp.compile(
        _cnn(), {"x": (6, 1, 8, 8)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), target=target, transforms=AUG
    )


def _batch() -> tuple[np.ndarray, np.ndarray]:
    return images((6, 1, 8, 8), seed=2), np.array([0, 1, 2, 0, 1, 2])


def test_identity_in_predict_and_augmented_train_step():
    prog = _program()
    ops = {name: {g.op(n) for n in g.nodes()} for name, g in prog.graphs.items()}
    assert "affine_gather" not in ops["predict"] and "hash_uniform" not in ops["predict"]
    assert "affine_gather" in ops["train_step"] and "affine_gather" in ops["gradients"]
    glcomp.manual_seed(0)
    plain = glcomp.compile(_cnn(), {"x": (6, 1, 8, 8)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1))
    x, y = _batch()
    ref, base = prog.runtime("reference"), plain.runtime("reference")
    np.testing.assert_array_equal(ref.predict(x=x), base.predict(x=x))
    assert sorted(ref.state_dict()) == sorted(base.state_dict())  # parameter names unchanged
    assert ref.train_step(x=x, y=y) != base.train_step(x=x, y=y)


def test_cnn_trains_alike_on_gl_and_reference():
    prog = _program()
    x, y = _batch()
    ref, gl = prog.runtime("reference"), prog.runtime("gl")
    want = [ref.train_step(x=x, y=y) for _ in range(4)]
    got = [gl.train_step(x=x, y=y) for _ in range(4)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert len(set(want)) == 4


TRAIN_JS = """
const { base, x, y, steps } = arg;
const rt = await g.Runtime.load(base, { quiet: true });
const losses = [];
for (let i = 0; i < steps; i++) losses.push(await rt.trainStep({ x, y }));
rt.dispose();
return losses;
"""


@pytest.mark.browser
def test_browser_trains_with_augmentation_like_gl(page: Any, site: Any):
    prog = _program()
    prog.save(site.root / "augmented")
    x, y = _batch()
    gl = prog.runtime("gl")
    want = [gl.train_step(x=x, y=y) for _ in range(3)]
    arg = {"base": "/bundle/augmented/", "x": x.ravel().tolist(), "y": y.tolist(), "steps": 3}
    got = _js(page, TRAIN_JS, arg)
    np.testing.assert_allclose(got, want, rtol=1e-5)


# -- bad arguments ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: T.RandomAffine(degrees=-5), ("RandomAffine", "degrees")),
        (lambda: T.RandomAffine(10, translate=(0.5, 2)), ("RandomAffine", "translate")),
        (lambda: T.RandomAffine(10, scale=(2, 1)), ("RandomAffine", "scale")),
        (lambda: T.RandomAffine(10, shear=60), ("RandomAffine", "shear")),
        (lambda: T.RandomAffine(10, interpolation="bilinear"), ("RandomAffine", "interpolation")),
        (lambda: T.RandomHorizontalFlip(p=1.5), ("RandomHorizontalFlip", "p")),
        (lambda: T.RandomVerticalFlip(p="x"), ("RandomVerticalFlip", "p")),
        (lambda: T.RandomResizedCrop(0), ("RandomResizedCrop", "size")),
        (lambda: T.RandomResizedCrop(4, ratio=(2, 1)), ("RandomResizedCrop", "ratio")),
        (lambda: T.ColorJitter(brightness=-1), ("ColorJitter", "brightness")),
        (lambda: T.ColorJitter(saturation=0.3), ("ColorJitter", "saturation")),
        (lambda: T.GaussianNoise(sigma=-0.1), ("GaussianNoise", "sigma")),
        (lambda: T.SaltAndPepperNoise(p=2), ("SaltAndPepperNoise", "p")),
        (lambda: T.SaltAndPepperNoise(salt_vs_pepper=-1), ("SaltAndPepperNoise", "salt_vs_pepper")),
    ],
)
def test_bad_arguments_name_the_transform(make: Any, words: tuple[str, str]):
    with pytest.raises(glcomp.GlcompError) as err:
        make()
    assert all(w in str(err.value) for w in words), str(err.value)


def test_bad_inputs_and_transforms_arguments():
    class Late(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = nn.Conv2d(1, 1, 3, padding=1)
            self.flip = T.RandomHorizontalFlip()

        def forward(self, x: Any) -> Any:
            return self.flip(self.conv(x)).flatten(1)

    with pytest.raises(glcomp.GlcompError, match=r"RandomHorizontalFlip: .*parameter 'conv.weight'"):
        glcomp.compile(Late(), {"x": (2, 1, 4, 4)}, nn.MSELoss(), optim.SGD(lr=0.1))
    with pytest.raises(glcomp.GlcompError, match=r"RandomAffine: expects images \(N, C, H, W\)"):
        glcomp.compile(nn.Linear(4, 2), {"x": (2, 4)}, nn.MSELoss(), transforms=[T.RandomAffine(5)])
    with pytest.raises(glcomp.GlcompError, match="no model input named 'z'"):
        glcomp.compile(_cnn(), {"x": (6, 1, 8, 8)}, nn.CrossEntropyLoss(), transforms={"z": AUG})
    with pytest.raises(glcomp.GlcompError, match="transforms\\['x'\\]"):
        glcomp.compile(_cnn(), {"x": (6, 1, 8, 8)}, nn.CrossEntropyLoss(), transforms={"x": "flip"})
