"""What the browser's first training step costs: every program is compiled (and, in software
renderers, JIT-compiled at its first draw), so shaders hold no code that cannot run and the
bundle lists as few programs as sharing allows."""

from __future__ import annotations

import re

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle

# main()'s test of component c of a texel: `j0 + c < n` with j0 in 0, 4, ..., n - (n % 4 or 4), so
# for c >= n it is never true and for n % 4 == 0 or c < n % 4 always.
_COMPONENT = re.compile(r"t_ok && j0 \+ (\d) < (\d+)\b")


def _model() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 3), nn.Tanh(), nn.Linear(3, 8), nn.ReLU(), nn.Linear(8, 5))


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_main_tests_only_components_that_may_be_missing(target: str) -> None:
    """Rows of fewer than 4 elements (the loss, per-row sums, Adam's scalars, a 3-wide layer):
    main() computes only the components that exist; the others stay zero without a root call.
    A component that exists in every texel (rows of 4k elements) is not tested at all."""
    glcomp.manual_seed(0)
    prog = glcomp.compile(
        _model(), {"x": (4, 6)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2), target=target
    )
    bundle = build_bundle(prog)
    dead = []
    for pid, p in bundle.manifest["programs"].items():
        source = bundle.shaders[p["fragment"]]
        for m in _COMPONENT.finditer(source):
            c, n = int(m.group(1)), int(m.group(2))
            if c >= n or n % 4 == 0 or c < n % 4:
                dead.append((pid, m.group(0)))
    assert not dead, dead[:10]


def test_short_rows_train_like_the_reference(gl_runtime) -> None:
    """The same numbers as the reference runtime (outputs of widths 1, 3 and 5, Adam's scalars)."""
    glcomp.manual_seed(0)
    prog = glcomp.compile(_model(), {"x": (4, 6)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=1e-2))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    y = np.array([0, 4, 2, 1])
    ref = prog.runtime("reference")
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(gl.predict(x=x), ref.predict(x=x), rtol=1e-5, atol=1e-6)
        for _ in range(3):
            np.testing.assert_allclose(gl.train_step(x=x, y=y), ref.train_step(x=x, y=y), rtol=1e-5)
        for name, value in ref.state_dict().items():
            np.testing.assert_allclose(gl.state_dict()[name], value, rtol=1e-5, atol=1e-6)
