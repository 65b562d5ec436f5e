"""Infinities and NaN on GL as in the reference (and torch): IEEE results where a shader compiler
would fold them away.

Before: with ``a = exp(100) = inf`` inside a kernel, ``a - a``, ``a + -a``, ``a * (x - x)`` and
``a*a - a*a`` gave 0.0 on GL (Mesa llvmpipe, both GLSL dialects) where the reference gives nan, and
everything downstream (relu, sums, the loss) followed: a model that overflowed trained on with
finite losses on GL and stopped with a nan loss on the reference. Mesa folds ``x - x`` to 0 unless
the computation is `precise`; the GL runtime now declares each fragment output `invariant`, which
Mesa takes as precise for everything the output depends on (docs/devices.md#infinities-and-nan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError
from glcomp.runtime.gl import exact_outputs


def _overflow(x: Any) -> Any:
    return x.exp()  # exp(100) and exp(89) overflow float32 to inf


EXPRESSIONS: dict[str, Callable[[Any], Any]] = {
    "a - a": lambda a, x: a - a,
    "a + (-a)": lambda a, x: a + (-a),
    "a - 2a": lambda a, x: a - 2 * a,
    "a*a - a*a": lambda a, x: a * a - a * a,
    "a * (x - x)": lambda a, x: a * (x - x),
    "relu(a - a)": lambda a, x: (a - a).relu(),
    "sum(a - a)": lambda a, x: (a - a).sum(dim=1, keepdim=True),
    "softmax(a)": lambda a, x: glcomp.functions.softmax(a, dim=1),
    "a @ ones": lambda a, x: glcomp.functions.matmul(a, (x * x + 1.0).transpose(0, 1)),
    "maximum(a - a, x)": lambda a, x: (a - a).maximum(x),
    "amax(a - 2a)": lambda a, x: (a - 2 * a).amax(dim=1, keepdim=True),
    "isnan(a - a) + a": lambda a, x: (a - a).isnan() + a,
    "exp(a - a)": lambda a, x: (a - a).exp(),
    "sigmoid(a - a)": lambda a, x: (a - a).sigmoid(),
}
X = np.array([[100.0, 1.0, -3.0, 0.0], [89.0, 88.0, 3.0, -1.0]], np.float32)


class Expression(nn.Module):
    def __init__(self, f: Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self.f = f

    def forward(self, x: Any) -> Any:
        return self.f(_overflow(x), x)


@pytest.mark.parametrize("name", sorted(EXPRESSIONS))
def test_inf_arithmetic_on_gl_matches_the_reference(name: str, dialect: str, gl_runtime: Any) -> None:
    prog = glcomp.compile(Expression(EXPRESSIONS[name]), inputs={"x": X.shape}, target=dialect)
    with np.errstate(all="ignore"):
        want = prog.runtime("reference").predict(x=X)
    with gl_runtime(prog) as rt:
        got = rt.predict(x=X)
    assert np.isnan(want).any() or np.isinf(want).any(), "the case must reach a non-finite value"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"nan positions of {name}")
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want), err_msg=f"inf positions of {name}")
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


class Overflowing(nn.Module):
    """A linear layer whose output overflows through exp, then cancels: finite only if x - x is
    folded to 0."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x: Any) -> Any:
        h = (self.lin(x) * 100.0).exp()
        return h - h + self.lin(x)


def test_overflowing_training_stops_at_the_same_step_on_gl_and_reference(dialect: str, gl_ctx: Any) -> None:
    glcomp.manual_seed(0)
    prog = glcomp.compile(
        Overflowing(), {"x": (2, 4)}, nn.CrossEntropyLoss(), optim.SGD(lr=0.1), target=dialect
    )
    batch = {"x": np.full((2, 4), 3.0, np.float32), "y": np.array([0, 1])}
    ref, gl = prog.runtime("reference"), prog.runtime("gl", ctx=gl_ctx)
    try:
        messages = []
        for rt in (ref, gl):
            with (
                np.errstate(all="ignore"),
                pytest.raises(GlcompError, match=r"loss is nan at step 1 ") as err,
            ):
                rt.train_steps([batch])
            messages.append(str(err.value))
        assert messages[0] == messages[1]
    finally:
        gl.release()


def test_exact_outputs_declares_every_output_invariant() -> None:
    es3 = (
        "#version 300 es\nprecision highp float;\nlayout(location = 0) out vec4 glc_out0;\n"
        "layout(location = 1) out vec4 glc_out1;\n"
        "void main() { glc_out0 = vec4(0.0); glc_out1 = vec4(1.0); }\n"
    )
    got = exact_outputs(es3)
    assert "out vec4 glc_out0;\ninvariant glc_out0;\n" in got
    assert "out vec4 glc_out1;\ninvariant glc_out1;\n" in got
    es1 = (
        "#version 100\n#extension GL_EXT_draw_buffers : require\nprecision highp float;\n"
        "void main() { gl_FragData[0] = vec4(0.0); }\n"
    )
    assert exact_outputs(es1).startswith(
        "#version 100\n#extension GL_EXT_draw_buffers : require\ninvariant gl_FragData;\nprecision"
    )
    es1 = "#version 100\nprecision highp float;\nvoid main() { gl_FragColor = vec4(0.0); }\n"
    assert exact_outputs(es1) == es1.replace("\nprecision", "\ninvariant gl_FragColor;\nprecision", 1)
