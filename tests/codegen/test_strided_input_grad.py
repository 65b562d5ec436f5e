"""Input gradients at stride 2 along W as vec4 kernels (families/conv2d_input_grad.frag.j2
`_root4_strided`, families/conv.py `strided_columns`) and register-blocked (R channels a fragment,
conv2d_tiled.frag.j2's strided block): a stride-2 convolution's backward and a
ConvTranspose2d's forward read g's rows texel-wise, each tap of the four output columns at a
texel and component fixed by the output texel's parity, against the reference: odd and even
kernels, paddings, sizes whose rows end mid-texel, stride 2 along H too or not, grouped
(depthwise) convolutions, loops split by a small limit, both dialects.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SumLoss

import glcomp
from glcomp import nn
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.families.conv import strided_columns

RTOL, ATOL = 1e-4, 1e-5


def _texel_wise(prog: glcomp.Program) -> bool:
    """Whether some shader holds the strided vec4 input gradient (its parity select)."""
    return any("bool odd = imod(t4, 2) == 1;" in s for s in build_bundle(prog).shaders.values())


def _check(prog: glcomp.Program, gl_runtime: Any, x_shape: tuple[int, ...], seed: int) -> None:
    rng = np.random.default_rng(seed)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        for _ in range(2):
            x = rng.normal(size=x_shape).astype(np.float32)
            want_out = ref.predict(x=x)
            np.testing.assert_allclose(gl.predict(x=x), want_out, rtol=RTOL, atol=ATOL)
            y = rng.normal(size=want_out.shape).astype(np.float32)
            got, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
            for name in want:
                np.testing.assert_allclose(got[name], want[name], rtol=RTOL, atol=ATOL, err_msg=name)


class TwoConvs(nn.Module):
    """conv, tanh, then the strided conv whose input gradient is tested (fused into tanh's)."""

    def __init__(self, k: int, stride: tuple[int, int], pad: int, groups: int = 1) -> None:
        super().__init__()
        self.a = nn.Conv2d(2, 4, 3, padding=1)
        self.b = nn.Conv2d(4, 4, k, stride=stride, padding=pad, groups=groups)

    def forward(self, x: Any) -> Any:
        return self.b(self.a(x).tanh())


@pytest.mark.parametrize(
    "k, stride, pad, size, groups",
    [
        (3, (2, 2), 1, 9, 1),  # a stride-2 3x3 conv (ResNet, the hourglass): rows end mid-texel
        (3, (2, 2), 0, 12, 1),
        (4, (2, 2), 1, 16, 1),  # even kernel
        (5, (2, 2), 2, 11, 1),
        (1, (2, 2), 0, 10, 1),  # 1x1 stride 2 (a ResNet shortcut)
        (3, (1, 2), 1, 9, 1),  # stride 2 along W only
        (3, (2, 2), 1, 10, 4),  # depthwise (MobileNet)
    ],
)
def test_strided_input_gradient_matches_reference(
    k, stride, pad, size, groups, dialect: str, gl_runtime: Any
):
    glcomp.manual_seed(k + size)
    prog = glcomp.compile(
        TwoConvs(k, stride, pad, groups), {"x": (2, 2, size, size)}, loss=SumLoss(), target=dialect
    )
    assert _texel_wise(prog)
    _check(prog, gl_runtime, (2, 2, size, size), seed=size)


@pytest.mark.parametrize("k, pad, size", [(4, 1, 7), (3, 1, 6), (2, 0, 5)])
def test_conv_transpose_forward_matches_reference(k, pad, size, dialect: str, gl_runtime: Any):
    """ConvTranspose2d (the hourglass's upsampling) is conv2d_input_grad in its forward."""
    glcomp.manual_seed(size)
    model = nn.Sequential(nn.ConvTranspose2d(3, 5, k, stride=2, padding=pad), nn.ReLU())
    prog = glcomp.compile(model, {"x": (2, 3, size, size)}, loss=SumLoss(), target=dialect)
    assert _texel_wise(prog)
    _check(prog, gl_runtime, (2, 3, size, size), seed=k)


def test_strided_input_gradient_with_split_loops(gl_runtime: Any):
    glcomp.manual_seed(3)
    prog = glcomp.compile(
        TwoConvs(3, (2, 2), 1), {"x": (1, 2, 9, 9)}, loss=SumLoss(), target="webgl2", max_loop_iterations=2
    )
    assert _texel_wise(prog)
    _check(prog, gl_runtime, (1, 2, 9, 9), seed=2)


@pytest.mark.parametrize("pw, kw", [(1, 3), (1, 4), (0, 3), (2, 5), (0, 1), (0, 2)])
def test_strided_columns_are_the_scalar_loops_taps(pw: int, kw: int) -> None:
    """For every output column x0 + c (x0 = 4t) and tap kj, the plan reads g's column
    (x0 + c + pw - kj) / 2 exactly where the scalar loop's tap lands."""
    dmin, cols = strided_columns(pw, kw)
    for t in range(6):
        b, p = divmod(t, 2)
        for kj in range(kw):
            for c in range(4):
                u = 4 * t + c + pw - kj
                pick = cols[kj][c]
                if u % 2:
                    assert pick is None
                    continue
                d, comp = (pick[2], pick[3]) if p else (pick[0], pick[1])
                assert 4 * (b + dmin + d) + comp == u // 2


def _blocked(prog: glcomp.Program) -> bool:
    """Whether some shader holds the register-blocked strided input gradient."""
    return any("of the stride-2 adjoint" in s for s in build_bundle(prog).shaders.values())


@pytest.mark.parametrize(
    "k, stride, pad, size, channels",
    [
        (3, (2, 2), 1, 9, 4),  # rows end mid-texel
        (4, (2, 2), 1, 16, 2),  # even kernel
        (5, (2, 2), 2, 11, 4),  # a 5x5 window
        (3, (1, 2), 1, 9, 2),  # stride 2 along W only
    ],
)
def test_blocked_strided_input_gradient_matches_reference(
    k, stride, pad, size, channels, gl_runtime: Any, monkeypatch: pytest.MonkeyPatch
):
    """Forced register blocking (R channels a fragment, the taps of g's row fetched once for
    them): the same sums as the texel kernel, against the reference."""
    from glcomp.codegen import cost
    from glcomp.codegen.families import conv as conv_family

    monkeypatch.setattr(conv_family, "CONV_CHANNELS", (channels,))
    monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)
    monkeypatch.setattr(cost, "GATHER_FETCHES", 0)
    glcomp.manual_seed(k + size)
    prog = glcomp.compile(
        TwoConvs(k, stride, pad),
        {"x": (2, 2, size, size)},
        loss=SumLoss(),
        target="webgl2",
        max_draw_buffers=8,
    )
    assert _blocked(prog)
    _check(prog, gl_runtime, (2, 2, size, size), seed=size)


def test_blocked_conv_transpose_forward_matches_reference(gl_runtime: Any, monkeypatch: pytest.MonkeyPatch):
    """The hourglass's upsampling (ConvTranspose2d 4x4, stride 2, padding 1), blocked: its forward
    (a stride-2 input gradient) against the reference."""
    from glcomp.codegen import cost
    from glcomp.codegen.families import conv as conv_family

    monkeypatch.setattr(conv_family, "CONV_CHANNELS", (4,))
    monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)
    monkeypatch.setattr(cost, "GATHER_FETCHES", 0)
    glcomp.manual_seed(7)
    model = nn.Sequential(nn.ConvTranspose2d(3, 6, 4, stride=2, padding=1), nn.ReLU())
    prog = glcomp.compile(model, {"x": (2, 3, 7, 7)}, loss=SumLoss(), target="webgl2", max_draw_buffers=8)
    assert _blocked(prog)
    _check(prog, gl_runtime, (2, 3, 7, 7), seed=4)
