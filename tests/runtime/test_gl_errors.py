"""Errors from the GL side: shaders that fail to compile, no OpenGL at all, bad inputs to a GL
runtime. Each is a GlcompError that says what went wrong and where."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import build_bundle
from glcomp.errors import GlcompError
from glcomp.runtime.gl import GLRuntime, create_context

BROKEN = "  float glc_broken = glc_undefined_name;"


def test_shader_compile_error_names_kernel_origin_and_driver_message(
    models: dict[str, Any], dialect: str, gl_ctx: Any
):
    prog = models["cnn"].compile(dialect)
    bundle = build_bundle(prog)
    m = bundle.manifest
    draw = next(d for d in m["entries"]["predict"]["draws"] if "conv" in d["kernel"])
    fragment = m["programs"][draw["program"]]["fragment"]
    lines = bundle.shaders[fragment].splitlines()
    origins = [line for line in lines if line.startswith("// from ")]
    assert origins and any("Conv2d" in o for o in origins), lines[:8]
    at = lines.index("void main() {") + 1
    lines.insert(at, BROKEN)
    bundle.shaders[fragment] = "\n".join(lines) + "\n"

    with pytest.raises(GlcompError) as info:
        GLRuntime(bundle, ctx=gl_ctx)
    msg = str(info.value)
    # Node ids stay out of shaders (kernels differing only in them share a program); the draw's
    # kernel name and the origin comments say where the failing shader came from.
    assert f"kernel {draw['kernel']}" in msg
    for line in origins:  # and the model parts they came from
        assert line in msg
    assert f"GLSL line {at + 1}: {BROKEN.strip()}" in msg
    driver = msg.split("driver:", 1)[1]
    assert "glc_undefined_name" in driver and re.search(r"error", driver, re.IGNORECASE), driver


def test_other_shaders_still_compile_on_the_shared_context(models: dict[str, Any], gl_runtime: Any):
    """A failed construction above must not break later runtimes on the same context."""
    case = models["mlp"]
    prog = case.compile("webgl2")
    feeds, _ = case.batch(0)
    with gl_runtime(prog) as gl:
        np.testing.assert_allclose(
            gl.predict(**feeds), prog.runtime("reference").predict(**feeds), rtol=1e-4, atol=1e-5
        )


def test_no_gl_backend_points_to_the_reference_runtime():
    with pytest.raises(GlcompError) as info:
        create_context(backends=("nonexistent",))
    msg = str(info.value)
    assert "runtime('reference')" in msg
    assert "nonexistent" in msg  # which backend was tried, and why it failed


def test_missing_moderngl_points_to_the_reference_runtime(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "moderngl", None)  # makes `import moderngl` fail
    with pytest.raises(GlcompError, match=r"moderngl is not installed.*runtime\('reference'\)"):
        create_context()


def test_gl_tests_fail_rather_than_skip_without_gl(pytester: pytest.Pytester):
    """The conftest turns a missing GL context into errors, never into skips."""
    conftest = (Path(__file__).parents[1] / "conftest.py").read_text()
    pytester.makeconftest(
        conftest
        + """

import glcomp.runtime.gl as _gl


@pytest.fixture(scope="session", autouse=True)
def _no_gl():
    def refuse(*args, **kwargs):
        raise GlcompError("no OpenGL context could be created (simulated)")

    saved, _gl.create_context = _gl.create_context, refuse
    yield
    _gl.create_context = saved
"""
    )
    pytester.makepyfile(test_needs_gl="def test_draw(gl_ctx):\n    pass\n\ndef test_other():\n    pass\n")
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["*GL tests need an OpenGL context*", "*simulated*"])


@pytest.mark.parametrize(
    ("preset", "args", "want"),
    [
        (None, [], "'nopt' '128'"),
        (None, ["--slow"], "None None"),
        ("", [], "'' '128'"),
        ("nopt,no_filter_hacks", [], "'nopt,no_filter_hacks' '128'"),
    ],
)
def test_llvm_shader_optimization_is_off_for_the_quick_profile_only(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, preset: str | None, args: list[str], want: str
):
    """The quick profile compiles llvmpipe's shaders without LLVM's optimization passes and for
    4-wide vectors, set before any GL context exists; `--slow` keeps llvmpipe's defaults and a
    value the user set stays."""
    monkeypatch.delenv("LP_NATIVE_VECTOR_WIDTH", raising=False)
    if preset is None:
        monkeypatch.delenv("GALLIVM_PERF", raising=False)
    else:
        monkeypatch.setenv("GALLIVM_PERF", preset)
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    show = "print('LLVMPIPE', repr(env.get('GALLIVM_PERF')), repr(env.get('LP_NATIVE_VECTOR_WIDTH')))"
    pytester.makepyfile(test_env=f"from os import environ as env\n\ndef test_env():\n    {show}\n")
    result = pytester.runpytest("-p", "no:cacheprovider", "-s", *args)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"*LLVMPIPE {want}"])


def test_slow_only_cases_run_with_slow_alone(pytester: pytest.Pytester):
    """Tests marked `slow_only` are deselected (reported, never skipped) without `--slow`."""
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(
        test_cases="import pytest\n\n"
        "@pytest.mark.parametrize('n', [1, pytest.param(2, marks=pytest.mark.slow_only)])\n"
        "def test_case(n):\n    assert n\n"
    )
    quick = pytester.runpytest("-p", "no:cacheprovider")
    quick.assert_outcomes(passed=1, deselected=1)
    pytester.runpytest("-p", "no:cacheprovider", "--slow").assert_outcomes(passed=2)


# -- bad inputs to a GL runtime -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def trained(models: dict[str, Any]) -> Any:
    return models["mlp"].compile("webgl1", optim.SGD(lr=0.1))


BAD_CALLS: dict[str, tuple[str, dict[str, Any], str]] = {
    "wrong shape": (
        "predict",
        {"x": np.zeros((5, 6))},
        r"input 'x' expected shape \(6, 5\) but got \(5, 6\)",
    ),
    "wrong rank": ("predict", {"x": np.zeros(30)}, r"input 'x' expected shape \(6, 5\)"),
    "unknown name": ("predict", {"x": np.zeros((6, 5)), "z": np.zeros(3)}, r"unknown input names \['z'\]"),
    "misspelled name": ("predict", {"X": np.zeros((6, 5))}, r"unknown input names \['X'\]"),
    "missing input": ("predict", {}, r"missing inputs \['x'\]"),
    "missing target": ("gradients", {"x": np.zeros((6, 5))}, r"missing inputs \['y'\]"),
    "label out of range": (
        "train_step",
        {"x": np.zeros((6, 5)), "y": np.array([0, 1, 2, 3, 0, 1])},
        r"class labels must lie in \[0, 3\)",
    ),
    "fractional label": (
        "train_step",
        {"x": np.zeros((6, 5)), "y": np.full(6, 0.5)},
        r"class labels must be integers",
    ),
    "NaN input": ("predict", {"x": np.full((6, 5), np.nan)}, r"input 'x' holds NaN"),
    "strings": ("predict", {"x": np.full((6, 5), "a")}, r"input 'x' must hold numbers"),
}


@pytest.mark.parametrize("call", sorted(BAD_CALLS))
def test_bad_inputs_raise_and_change_nothing(call: str, trained: Any, gl_runtime: Any):
    entry, given, message = BAD_CALLS[call]
    feeds = np.random.default_rng(0).normal(size=(6, 5)).astype(np.float32)
    with gl_runtime(trained) as gl:
        before = gl.state_dict()
        with pytest.raises(GlcompError, match=message):
            getattr(gl, entry)(**given)
        after = gl.state_dict()
        for name in before:
            np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        np.testing.assert_allclose(
            gl.predict(x=feeds), trained.runtime("reference").predict(x=feeds), rtol=1e-4, atol=1e-5
        )


def test_entry_point_not_compiled(models: dict[str, Any], gl_runtime: Any):
    prog = models["mlp"].compile("webgl2")  # a loss but no optimizer: no train_step
    with gl_runtime(prog) as gl:
        with pytest.raises(GlcompError, match="train_step"):
            gl.train_step(x=np.zeros((6, 5)), y=np.zeros(6, int))
    glcomp.manual_seed(0)
    predict_only = glcomp.compile(nn.Linear(5, 3), inputs={"x": (6, 5)})
    with gl_runtime(predict_only) as gl:
        with pytest.raises(GlcompError, match="gradients"):
            gl.gradients(x=np.zeros((6, 5)), y=np.zeros((6, 3)))


def test_load_state_dict_checks_names_and_shapes(trained: Any, gl_runtime: Any):
    with gl_runtime(trained) as gl:
        state = gl.state_dict()
        with pytest.raises(GlcompError, match=r"'0\.weight' expected shape \(8, 5\) but got \(5, 8\)"):
            gl.load_state_dict(state | {"0.weight": np.zeros((5, 8))})
        with pytest.raises(GlcompError, match=r"missing keys \['2\.bias'\]"):
            gl.load_state_dict({k: v for k, v in state.items() if k != "2.bias"})
        with pytest.raises(GlcompError, match=r"unexpected keys \['extra'\]"):
            gl.load_state_dict(state | {"extra": np.zeros(2)})
        for name, value in gl.state_dict().items():  # nothing was loaded
            np.testing.assert_array_equal(value, state[name], err_msg=name)


def test_device_with_fewer_texture_units_refuses_the_bundle(
    models: dict[str, Any], gl_ctx: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bundle whose shaders read more textures than the GPU's MAX_TEXTURE_IMAGE_UNITS is refused by
    name (the program, its kernel, both numbers and the compile option that fits), not run."""
    import glcomp.runtime.gl as gl_runtime

    bundle = build_bundle(models["cnn"].compile("webgl2"))
    programs = bundle.manifest["programs"]
    widest = max(programs, key=lambda pid: len(programs[pid]["samplers"]))
    units = len(programs[widest]["samplers"]) - 1
    real = gl_runtime._info_of
    monkeypatch.setattr(gl_runtime, "_info_of", lambda ctx: {**real(ctx), "max_texture_units": units})
    with pytest.raises(GlcompError) as info:
        GLRuntime(bundle, ctx=gl_ctx)
    msg = str(info.value)
    assert f"has {units} texture units (MAX_TEXTURE_IMAGE_UNITS)" in msg, msg
    assert re.search(r"program p\d+ \(kernel k\d+", msg) and f"max_texture_units={units}" in msg, msg
    fits = build_bundle(models["cnn"].compile("webgl2", max_texture_units=units))
    with GLRuntime(fits, ctx=gl_ctx) as rt:
        assert np.isfinite(rt.predict(x=models["cnn"].batch()[0]["x"])).all()
