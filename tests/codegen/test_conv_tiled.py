"""Register-blocked convolutions (glcomp.codegen.families.conv: ConvTiling for conv2d and input
gradients at stride 1 or 2, WeightGradTiling for weight gradients): R output channels (of C texels along a row
for ConvTiling) a fragment into R * C render targets, gathered into the product's layout.
GL against the reference runtime over strides, paddings, kernel sizes, channel counts that R
does not divide and rows that C texels a fragment do not divide; the bias and activation epilogue
split off after the gather; WebGL 1 and grouped convolutions keep the texel kernel; the cost model
tiles large convolutions only."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen import cost
from glcomp.codegen.families import conv as conv_family


@pytest.fixture
def force(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Tile every eligible convolution with R channels of C texels a fragment (draws free)."""

    def use(channels: int, texels: int = 1, inputs: int = 1) -> None:
        monkeypatch.setattr(conv_family, "CONV_CHANNELS", (channels,))
        monkeypatch.setattr(conv_family, "CONV_TEXELS", (texels,))
        monkeypatch.setattr(conv_family, "WEIGHT_GRAD_INPUTS", (inputs,))
        monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)
        monkeypatch.setattr(cost, "GATHER_FETCHES", 0)

    return use


def _program(
    c: int, o: int, k: int, stride: int, pad: int, size: int, target: str = "webgl2", groups: int = 1
) -> glcomp.Program:
    """Two convolutions (the second reads the first's stored ReLU), a Tanh and a Linear head."""
    out = size
    for _ in range(2):
        out = (out + 2 * pad - k) // stride + 1
    glcomp.manual_seed(1)
    model = nn.Sequential(
        nn.Conv2d(c, o, k, stride=stride, padding=pad, groups=groups),
        nn.ReLU(),
        nn.Conv2d(o, o, k, stride=stride, padding=pad, groups=groups),
        nn.Tanh(),  # its gradient is stored: both the input and the weight gradient read it
        nn.Flatten(),
        nn.Linear(o * out * out, 3),
    )
    return glcomp.compile(
        model,
        {"x": (2, c, size, size)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(lr=0.05),
        target=target,
        max_draw_buffers=8,
    )


def _tiled(prog: glcomp.Program, entry: str, template: str = "conv2d") -> list[str]:
    """The plan lines of `entry`'s register-blocked kernels of `template`."""
    text = prog.explain(dump_after="tiling").split(f"plan {entry} after tiling")[1].split("\nplan ")[0]
    return [line for line in text.splitlines() if " tiled " in line and f" {template} " in line]


CASES = [
    # (in channels, out channels, kernel, stride, padding, size, channels, texels a fragment)
    (3, 8, 3, 1, 1, 9, 4, 1),
    (4, 6, 3, 1, 0, 10, 4, 1),  # 6 channels: the last group of 4 clamps
    (2, 5, 5, 2, 2, 13, 2, 1),  # stride 2, a 5x5 window
    (3, 8, 1, 1, 0, 7, 8, 1),  # pointwise
    (2, 3, 2, 2, 1, 6, 2, 1),  # even kernel, padding past a texel
    (3, 4, 3, 1, 1, 33, 4, 1),  # weight gradients in 3 partial sums (2 * 33 * 33 terms)
    # several texels of a row a fragment: the taps of 4 * C columns share the source's fetches
    (3, 8, 3, 1, 1, 9, 4, 2),  # rows of 3 texels in blocks of 2: the last block half past the row
    (4, 6, 3, 1, 0, 10, 2, 2),
    (2, 5, 5, 2, 2, 29, 2, 2),  # stride 2, a 5x5 window
    (3, 8, 1, 1, 0, 16, 2, 4),  # pointwise
    (3, 4, 3, 1, 1, 33, 2, 4),  # rows of 9 texels in blocks of 4
    (2, 3, 2, 2, 1, 30, 2, 4),  # even kernel, stride 2
    # stride-2 input gradients: R channels of one texel, the taps of the texel's parity
    (3, 8, 3, 2, 1, 11, 8, 1),  # odd rows: the last texel's columns half past the row
    (3, 6, 3, 2, 1, 11, 4, 1),  # 6 channels: the last group of 4 clamps
    (4, 8, 1, 2, 0, 12, 4, 1),  # a 1x1 shortcut: its input gradient keeps the texel kernel
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_tiled_conv_matches_reference(case: tuple[int, ...], force: Any, gl_runtime: Any) -> None:
    c, o, k, stride, pad, size, r, cb = case
    force(r, cb)
    prog = _program(c, o, k, stride, pad, size)
    assert _tiled(prog, "train_step"), prog.explain(dump_after="tiling")
    assert any(f" tiled {r}x{cb}" in line for line in _tiled(prog, "train_step")), _tiled(prog, "train_step")
    # the first convolution's bias and ReLU read its product straight from the tiles (no gather)
    assert any("reader gathers" in line for line in _tiled(prog, "predict")), prog.explain(dump_after="mrt")
    # the second convolution's input gradient (stride 1, or 2: one texel a fragment; not a 1x1 at
    # stride 2) runs blocked too
    blocked = _tiled(prog, "train_step", "conv2d_input_grad")
    assert bool(blocked) == (stride == 1 or k > 1), prog.explain(dump_after="tiling")
    assert stride == 1 or all(f" tiled {r}x1" in line for line in blocked), blocked
    assert len(_tiled(prog, "train_step", "conv2d_weight_grad")) == 2  # both weight gradients
    rng = np.random.default_rng(2)
    x, y = rng.normal(size=(2, c, size, size)).astype(np.float32), rng.integers(0, 3, size=2)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=1e-4, atol=1e-5)
        for _ in range(3):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-4)
        state = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, state[name], rtol=1e-4, atol=1e-5, err_msg=name)


WEIGHT_GRAD_CASES = [
    # (in channels, out channels, kernel, stride, padding, size, output channels, input channels)
    (4, 4, 3, 1, 1, 9, 2, 2),  # the window slides one texel along g's row
    (3, 6, 3, 1, 0, 10, 4, 2),  # 3 input channels in pairs: the last pair clamps
    (5, 3, 5, 2, 2, 21, 2, 4),  # stride 2: two texels enter the window each step
    (4, 8, 1, 1, 0, 16, 2, 4),  # pointwise: a window of one texel, nothing kept
    (2, 3, 2, 2, 1, 14, 2, 2),  # even kernel, padding past a texel
    (3, 4, 3, 1, 1, 33, 2, 2),  # 3 partial sums (2 * 33 * 33 terms)
    (4, 2, 3, 3, 1, 25, 2, 4),  # stride 3 over rows of 2 texels
    (4, 8, 1, 2, 0, 12, 2, 2),  # a 1x1 shortcut at stride 2: its one tap's window spans two texels
]


@pytest.mark.parametrize("case", WEIGHT_GRAD_CASES, ids=[str(c) for c in WEIGHT_GRAD_CASES])
def test_weight_grads_blocked_over_input_channels(case: tuple[int, ...], force: Any, gl_runtime: Any) -> None:
    """R output x C input channels a fragment, x's window sliding along g's row: the texel
    kernel's sums, so the weights after three SGD steps match the reference."""
    c, o, k, stride, pad, size, r, ci = case
    force(r, 1, ci)
    prog = _program(c, o, k, stride, pad, size)
    lines = _tiled(prog, "train_step", "conv2d_weight_grad")
    assert len(lines) == 2, prog.explain(dump_after="tiling")
    # the first convolution has `c` input channels, the second `o`: each blocked by min(ci, ...)
    assert {line.split(" tiled ")[1].split()[0] for line in lines} == {
        f"{r}x{min(ci, c)}",
        f"{r}x{min(ci, o)}",
    }
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=(2, c, size, size)).astype(np.float32), rng.integers(0, 3, size=2)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(3):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-4)
        state = ref.state_dict()
        for name, value in gl.state_dict().items():
            np.testing.assert_allclose(value, state[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_weight_grad_fetches_follow_the_window() -> None:
    """The cost model's fetch count: R texels of g per texel of g's row, and per input channel
    the D texels of x's first window, then SW a step (all D where SW >= D)."""
    # 3x3, stride 1, padding 1: D = 3; rows of 8 texels
    d = conv_family.weight_grad_texels(1, 1)
    assert d == (-1, 1)
    assert conv_family.weight_grad_fetches(8, 1, 3, 1, 8) == 8 * 8 + (2 + 8)
    assert conv_family.weight_grad_fetches(4, 2, 3, 1, 8) == 4 * 8 + 2 * (2 + 8)
    assert conv_family.weight_grad_fetches(2, 1, 2, 3, 4) == 2 * 4 + 2 * 4  # stride 3 >= D = 2
    # a kernel narrower than a texel reads only its taps' texels: a 1x1 one texel of x, a 3x3 (pad 1) 3
    assert conv_family.weight_grad_texels(1, 0, 1) == (0, 0)
    assert conv_family.weight_grad_texels(1, 1, 3) == (-1, 1)
    assert conv_family.weight_grad_texels(2, 0, 1) == (0, 1)  # stride 2: the texel after too


def test_webgl1_and_grouped_convolutions_keep_the_texel_kernel(force: Any, gl_runtime: Any) -> None:
    force(4)
    assert not _tiled(_program(3, 8, 3, 1, 1, 9, target="webgl1"), "train_step")
    assert not _tiled(_program(4, 8, 3, 1, 1, 9, groups=2), "train_step")


def test_cost_model_tiles_large_convolutions_only() -> None:
    small = _program(3, 8, 3, 1, 1, 9)
    assert not _tiled(small, "train_step")
    glcomp.manual_seed(0)
    big = glcomp.compile(
        nn.Sequential(
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.Flatten(),
            nn.Linear(64 * 256, 2),
        ),
        {"x": (16, 64, 16, 16)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(lr=0.01),
    )
    lines = _tiled(big, "train_step")
    # 4 draw buffers: 2 channels x 2 texels read 6 texels per 4 output texels a kernel row (the
    # source's 4 and 2 weight texels), 4 channels x 1 texel 7
    assert len(lines) == 2 and all(" tiled 2x2" in line for line in lines), lines


def test_tiled_conv_with_half_float_storage(force: Any, gl_runtime: Any) -> None:
    """Tiles are textures of the bundle's storage: with f16 each blocked step stays within f16's
    tolerance of the reference's step from the same state (over several steps the two trajectories
    part by f16's rounding of every update, whatever the kernels)."""
    force(4)
    glcomp.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 3))
    prog = glcomp.compile(
        model, {"x": (2, 3, 8, 8)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.05), storage="f16"
    )
    assert _tiled(prog, "train_step")
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(2, 3, 8, 8)).astype(np.float32), rng.integers(0, 3, size=2)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=5e-3, atol=5e-3)
        for _ in range(3):
            ref.load_state_dict(gl.state_dict())
            np.testing.assert_allclose(
                float(gl.train_step(x=x, y=y)), float(ref.train_step(x=x, y=y)), rtol=5e-3
            )
