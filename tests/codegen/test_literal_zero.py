"""Multiplying by a literal zero keeps IEEE's nan on GL and in the browser, as in the reference
and torch (inf * 0, nan * 0 and 0 / 0 are nan).

Before: a constant zero was written into the shader as the literal ``0.0``, and shader compilers
fold ``x * 0.0`` to 0 whatever x is: Mesa's GLSL front end even for `invariant` (precise) outputs,
SwiftShader too. ``exp(x) * 0.0`` gave 0.0 on llvmpipe and in Chromium for x = 100 where the
reference gives nan. A zero constant that reaches a product now reads an integer uniform that
every draw sets to 0 (the draw's ``{"int": 0}``), which no compiler can see as a constant; other
constants, and zeros that are only added, compared or selected, stay literals.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import glcomp
from glcomp import nn
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.families.movement import ZERO_UNIFORM

X = np.array([[100.0, 1.0, -3.0, 0.0], [89.0, 88.0, 3.0, -1.0]], np.float32)


class Exp(nn.Module):
    """`f(exp(x), x)`: exp(100) and exp(89) overflow float32 to inf."""

    def __init__(self, f: Callable[[Any, Any], Any]) -> None:
        super().__init__()
        self.f = f

    def forward(self, x: Any) -> Any:
        return self.f(x.exp(), x)


class LeakyZero(nn.Module):
    """A layer multiplying by zero inside: LeakyReLU(0) is relu(x) - 0 * relu(-x), nan at -inf
    as in torch."""

    def __init__(self) -> None:
        super().__init__()
        self.act = nn.LeakyReLU(0.0)

    def forward(self, x: Any) -> Any:
        return self.act(-x.exp())


class TorchZero(torch.nn.Module):
    """A torch module multiplying by zero, imported through ONNX."""

    def forward(self, x: Any) -> Any:
        return torch.exp(x) * 0.0 + x


def _onnx(tmp: Path) -> Any:
    path = tmp / "zero.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            TorchZero(),
            (torch.from_numpy(X),),
            str(path),
            input_names=["x"],
            output_names=["y"],
            opset_version=17,
            dynamo=False,
        )
    return glcomp.onnx.load(str(path))


def _torch(f: Callable[[Any, Any], Any]) -> Callable[[np.ndarray], np.ndarray]:
    def run(x: np.ndarray) -> np.ndarray:
        t = torch.from_numpy(x)
        return f(t.exp(), t).numpy()

    return run


# name -> (glcomp model factory, torch's function of x or None)
CASES: dict[str, tuple[Callable[[Path], Any], Callable[[np.ndarray], np.ndarray] | None]] = {
    "exp(x) * 0.0": (lambda _: Exp(lambda a, x: a * 0.0), _torch(lambda a, x: a * 0.0)),
    "0.0 * exp(x)": (lambda _: Exp(lambda a, x: 0.0 * a), _torch(lambda a, x: 0.0 * a)),
    "exp(x) * -0.0": (lambda _: Exp(lambda a, x: a * -0.0), _torch(lambda a, x: a * -0.0)),
    "0.0 / x": (lambda _: Exp(lambda a, x: 0.0 / x + a), _torch(lambda a, x: 0.0 / x + a)),
    "exp(x) @ zeros": (
        lambda _: Exp(lambda a, x: glcomp.functions.matmul(a, glcomp.functions.zeros(4, 3))),
        _torch(lambda a, x: a @ torch.zeros(4, 3)),
    ),
    "LeakyReLU(0)(-exp(x))": (
        lambda _: LeakyZero(),
        lambda x: torch.nn.LeakyReLU(0.0)(-torch.exp(torch.from_numpy(x))).numpy(),
    ),
    "torch exp(x) * 0 (ONNX)": (_onnx, lambda x: TorchZero()(torch.from_numpy(x)).numpy()),
}


def _kinds(values: np.ndarray) -> str:
    return "".join("n" if np.isnan(v) else "i" if np.isinf(v) else "f" for v in np.ravel(values))


def _check(name: str, got: np.ndarray, want: np.ndarray) -> None:
    assert _kinds(got) == _kinds(want), f"{name}: {got} where the reference gives {want}"
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6, err_msg=name)


def _program(name: str, target: str, tmp: Path) -> Any:
    return glcomp.compile(CASES[name][0](tmp), inputs={"x": X.shape}, target=target)


@pytest.mark.parametrize("name", sorted(CASES))
def test_products_with_a_literal_zero_match_the_reference_on_gl(
    name: str, dialect: str, gl_runtime: Any, tmp_path: Path
) -> None:
    prog = _program(name, dialect, tmp_path)
    with np.errstate(all="ignore"):
        want = np.asarray(prog.runtime("reference").predict(x=X))
        expected = CASES[name][1]
        if expected is not None:  # the reference agrees with torch
            assert _kinds(want) == _kinds(expected(X)), name
    assert np.isnan(want).any(), "the case must reach a nan"
    with gl_runtime(prog) as rt:
        got = np.asarray(rt.predict(x=X))
    _check(name, got, want)


def test_only_zeros_that_reach_a_product_read_the_uniform() -> None:
    def shaders(f: Callable[[Any, Any], Any]) -> str:
        bundle = build_bundle(glcomp.compile(Exp(f), inputs={"x": X.shape}))
        return "".join(bundle.shaders.values())

    assert ZERO_UNIFORM in shaders(lambda a, x: a * 0.0)
    assert ZERO_UNIFORM in shaders(lambda a, x: (a + 1.0) * glcomp.functions.zeros(2, 4))  # via expand
    for added in (lambda a, x: a + 0.0, lambda a, x: a * 2.0, lambda a, x: (a - 0.0).maximum(x)):
        assert ZERO_UNIFORM not in shaders(added)
    bundle = build_bundle(glcomp.compile(Exp(lambda a, x: a * 0.0), inputs={"x": X.shape}))
    (program,) = (p for p in bundle.manifest["programs"].values() if ZERO_UNIFORM in p["uniforms"])
    draws = [d for d in bundle.manifest["entries"]["predict"]["draws"] if ZERO_UNIFORM in d["uniforms"]]
    assert draws and all(d["uniforms"][ZERO_UNIFORM] == {"int": 0} for d in draws)
    assert program["fragment"] in bundle.shaders


# The browser test runs in headless Chromium through conftest's fixtures (browser, site, page).
PREDICT_JS = """
const out = {};
for (const [name, url] of Object.entries(arg.urls)) {
  const rt = await g.Runtime.load(url, { quiet: true });
  out[name] = Array.from((await rt.predict({ x: arg.x })).data, String);
  rt.dispose();
}
return out;
"""


@pytest.mark.parametrize("target", ["webgl2", "webgl1"])
def test_products_with_a_literal_zero_match_the_reference_in_the_browser(
    page: Any, site: Any, target: str, tmp_path: Path
) -> None:
    urls, want = {}, {}
    for i, name in enumerate(sorted(CASES)):
        prog = _program(name, target, tmp_path)
        d: Path = prog.save(site.root / f"zero_{target}_{i}")
        urls[name] = f"/bundle/{d.name}/"
        with np.errstate(all="ignore"):
            want[name] = np.asarray(prog.runtime("reference").predict(x=X))
    body = f"async (arg) => {{ const g = await import('/glcomp.js'); {PREDICT_JS} }}"
    got = page.evaluate(body, {"urls": urls, "x": X.ravel().tolist()})
    for name, ref in want.items():
        _check(name, np.array([float(v) for v in got[name]], np.float32).reshape(ref.shape), ref)
