"""Infinities and NaN in glcomp.js (headless Chromium, SwiftShader through ANGLE): each case of
tests/codegen/test_nonfinite.py gives the reference's nan and inf positions in the browser, except the
ones docs/devices.md#infinities-and-nan lists as differing there (checked to be exactly those, so
the note cannot go stale)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from codegen.test_nonfinite import EXPRESSIONS, Expression, X

import glcomp
from browser.support import _js

# What SwiftShader computes otherwise (docs/devices.md): nothing since exp propagates NaN in the
# generated code (glc_exp; SwiftShader's own exp of a NaN is +inf, which made a softmax over a row
# holding inf nan at the inf and 0 elsewhere, and a sigmoid of NaN 0).
DIFFER_IN_CHROMIUM: set[str] = set()

PREDICT_JS = """
const out = {};
for (const [name, url] of Object.entries(arg.urls)) {
  const rt = await g.Runtime.load(url, { quiet: true });
  out[name] = Array.from((await rt.predict({ x: arg.x })).data, String);
  rt.dispose();
}
return out;
"""


def _kinds(values: np.ndarray) -> str:
    return "".join("n" if np.isnan(v) else "i" if np.isinf(v) else "f" for v in values.ravel())


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_inf_arithmetic_in_the_browser_matches_the_reference(page: Any, site: Any, target: str) -> None:
    urls, want = {}, {}
    for i, (name, f) in enumerate(sorted(EXPRESSIONS.items())):
        prog = glcomp.compile(Expression(f), inputs={"x": X.shape}, target=target)
        d: Path = prog.save(site.root / f"inf_{target}_{i}")
        urls[name] = f"/bundle/{d.name}/"
        with np.errstate(all="ignore"):
            want[name] = np.asarray(prog.runtime("reference").predict(x=X))
    got = _js(page, PREDICT_JS, {"urls": urls, "x": X.ravel().tolist()})
    differ = set()
    for name, ref in want.items():
        js = np.array([float(v) for v in got[name]], np.float32).reshape(ref.shape)
        if _kinds(js) != _kinds(ref):
            differ.add(name)
            continue
        finite = np.isfinite(ref)
        np.testing.assert_allclose(js[finite], ref[finite], rtol=1e-5, atol=1e-6, err_msg=name)
    assert differ == DIFFER_IN_CHROMIUM
