"""Average-pool input gradients visit only the taps that can land on a position
(families/avg_pool2d_grad.frag.j2): ceil(KH / SH) x ceil(KW / SW) of them, one for a global
average pool, against the reference over overlapping, strided, padded and global windows in both
dialects; and the loop count the plan states for a global pool's gradient."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import SumLoss

import glcomp
from glcomp import nn

RTOL, ATOL = 1e-5, 1e-6


class Pooled(nn.Module):
    """A per-channel scale (so there is something to train), then the pool under test."""

    def __init__(self, channels: int, pool: Any) -> None:
        super().__init__()
        self.w = nn.Parameter(np.linspace(0.5, 1.5, channels, dtype=np.float32).reshape(channels, 1, 1))
        self.pool = pool

    def forward(self, x: Any) -> Any:
        return self.pool(x * self.w)


@pytest.mark.parametrize(
    "pool, size",
    [
        (lambda: nn.AvgPool2d(2), 8),  # non-overlapping: one tap
        (lambda: nn.AvgPool2d(3, stride=1, padding=1), 7),  # overlapping: all nine
        (lambda: nn.AvgPool2d(3, stride=2, padding=1), 9),  # two of three taps per axis
        (lambda: nn.AvgPool2d(4, stride=3), 11),  # windows that miss positions
        (lambda: nn.AdaptiveAvgPool2d(1), 6),  # global
    ],
)
def test_avg_pool_gradient_matches_reference(pool: Any, size: int, dialect: str, gl_runtime: Any) -> None:
    prog = glcomp.compile(Pooled(3, pool()), {"x": (2, 3, size, size)}, loss=SumLoss(), target=dialect)
    rng = np.random.default_rng(size)
    x = rng.normal(size=(2, 3, size, size)).astype(np.float32)
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        out = ref.predict(x=x)
        np.testing.assert_allclose(gl.predict(x=x), out, rtol=RTOL, atol=ATOL)
        y = rng.normal(size=out.shape).astype(np.float32)
        got, want = gl.gradients(x=x, y=y), ref.gradients(x=x, y=y)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def test_global_average_pool_gradient_loops_once_per_element() -> None:
    """A ResNet's global average pool over 16 x 16 (its gradient looped over all 256 taps of the
    window for each of the 16 x 16 positions)."""
    prog = glcomp.compile(Pooled(4, nn.AdaptiveAvgPool2d(1)), {"x": (2, 4, 16, 16)}, loss=SumLoss())
    plan = prog.explain(dump_after="fusion").split("plan gradients")[1].split("\nplan ")[0]
    (line,) = [ln for ln in plan.splitlines() if " avg_pool2d_grad " in ln]
    assert line.endswith(" loops 4"), line  # one tap for each of a texel's 4 elements (was 1024)
