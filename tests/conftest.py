"""Shared fixtures for the GL tests: one OpenGL context for the whole session, GL runtimes that are
released after use, and the small test models the GL, GLSL and bundle tests run; and the browser
tests' fixtures: headless Chromium (`browser`), a served directory of bundles (`site`) and a page
with the WebGL object counter (`page`), whose helpers are in tests/browser/support.py.

GL tests must not be skipped silently: when no context can be created (no Mesa EGL/llvmpipe),
every test that asks for `gl_ctx` fails with a message saying what to install.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError

pytest_plugins = ["pytester"]  # test_gl_errors checks that GL tests fail (not skip) without GL

DIALECTS = ("webgl2", "webgl1")


# -- the shared GL context -------------------------------------------------------------------------
@pytest.fixture(scope="session")
def gl_ctx() -> Iterator[Any]:
    """One headless moderngl context (Mesa llvmpipe in CI), shared by every GL test."""
    from glcomp.runtime.gl import create_context

    try:
        ctx = create_context()
    except GlcompError as err:
        pytest.fail(
            "GL tests need an OpenGL context and none could be created. Install Mesa's EGL and "
            "llvmpipe (apt-get install libegl1 libgl1-mesa-dri) or run on a machine with a GPU "
            f"driver; these tests fail rather than skip so CI never passes without GL.\n{err}",
            pytrace=False,
        )
    yield ctx
    ctx.release()


@pytest.fixture(scope="session")
def gl_runtime(gl_ctx: Any) -> Callable[..., contextlib.AbstractContextManager[Any]]:
    """``with gl_runtime(prog) as rt:`` -> a GLRuntime on the shared context, released afterwards.

    Accepts a Program (``prog.runtime("gl", ctx=...)``) or a Bundle (``GLRuntime(bundle, ctx=...)``).
    Session-scoped so that Hypothesis tests may use it.
    """
    from glcomp.codegen.bundle import Bundle
    from glcomp.runtime.gl import GLRuntime

    @contextlib.contextmanager
    def make(source: Any) -> Iterator[Any]:
        if isinstance(source, Bundle):
            runtime = GLRuntime(source, ctx=gl_ctx)
        else:
            runtime = source.runtime("gl", ctx=gl_ctx)
        try:
            yield runtime
        finally:
            runtime.release()

    return make


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses the GL context with the `gl` marker (``-m gl`` / ``-m 'not gl'``);
    without `--slow`, deselect the tests marked `slow_only` (heavier cases of a property that a
    smaller test of the quick profile checks too)."""
    for item in items:
        if "gl_ctx" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.gl)
    if not config.getoption("--slow"):
        slow_only = [item for item in items if item.get_closest_marker("slow_only")]
        if slow_only:
            config.hook.pytest_deselected(items=slow_only)
            items[:] = [item for item in items if not item.get_closest_marker("slow_only")]


# -- the browser fixtures (headless Chromium; the helpers are tests/browser/support.py) ----------------
@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium (WebGL on SwiftShader), one per test module; fails, never skips, without it."""
    from browser.support import CHROMIUM_ARGS, chromium_executable, sync_playwright

    exe = chromium_executable()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A directory of bundles served with the runtime on 127.0.0.1 (a `Site`), one per test module."""
    from browser.support import Site

    s = Site(tmp_path_factory.mktemp("site"))
    yield s
    s.close()


@pytest.fixture
def page(browser: Any, site: Any) -> Iterator[Any]:
    """A fresh page of `site` counting its WebGL objects; `page.errors` collects page errors and
    WebGL console messages."""
    from browser.support import COUNT_GL_OBJECTS

    context = browser.new_context()
    pg = context.new_page()
    pg.add_init_script(COUNT_GL_OBJECTS)
    errors: list[str] = []
    pg.on("pageerror", lambda err: errors.append(str(err)))
    # WebGL errors and performance warnings reach the console only
    pg.on(
        "console", lambda msg: errors.append(msg.text) if "GL" in msg.text or "warning" in msg.text else None
    )
    pg.goto(site.url + "glcomp.js")  # any same-origin document will do to import the module
    pg.errors = errors
    yield pg
    context.close()


# -- the test models -------------------------------------------------------------------------------
@dataclass
class ModelCase:
    """A tiny model with its input shapes, loss and a deterministic batch."""

    name: str
    build: Callable[[], nn.Module]
    inputs: dict[str, tuple[int, ...]]
    loss: Callable[[], nn.Module]
    classes: int | None  # class labels for CrossEntropyLoss, None for a float target
    out_shape: tuple[int, ...]
    # Target limits small enough that some tensors span several texture pages and loops split,
    # yet large enough that no kernel needs more than 16 texture units.
    shrunk: dict[str, int]

    def batch(self, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
        rng = np.random.default_rng(seed)
        feeds = {k: rng.normal(size=s).astype(np.float32) for k, s in self.inputs.items()}
        if self.classes is not None:
            y = rng.integers(0, self.classes, size=self.out_shape[:1])
        else:
            y = rng.normal(size=self.out_shape).astype(np.float32)
        return feeds, y

    def compile(self, target: str, optimizer: optim.Optimizer | None = None, **limits: Any) -> glcomp.Program:
        glcomp.manual_seed(7)
        model = self.build()
        return glcomp.compile(
            model, inputs=self.inputs, loss=self.loss(), optimizer=optimizer, target=target, **limits
        )


class LastStep(nn.Module):
    """LSTM(batch_first=True), the last time step's output, then a Linear head (its backward sums
    over time steps)."""

    def __init__(self, features: int = 3, hidden: int = 4, classes: int = 2) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: Any) -> Any:
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


def _cnn() -> nn.Module:
    # No conv bias before BatchNorm: its gradient is zero up to rounding noise, which Adam would
    # amplify into lr-sized steps of random sign on either runtime.
    return nn.Sequential(
        nn.Conv2d(1, 3, 3, padding=1, bias=False),
        nn.BatchNorm2d(3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.AvgPool2d(2),
        nn.Flatten(),
        nn.Linear(3 * 2 * 2, 3),
    )


MODELS: dict[str, ModelCase] = {
    case.name: case
    for case in [
        ModelCase(
            "mlp",
            lambda: nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3)),
            {"x": (6, 5)},
            nn.CrossEntropyLoss,
            3,
            (6, 3),
            {"max_texture_size": 2, "max_loop_iterations": 4},
        ),
        ModelCase(
            "cnn",
            _cnn,
            {"x": (4, 1, 8, 8)},
            nn.CrossEntropyLoss,
            3,
            (4, 3),
            {"max_texture_size": 8, "max_loop_iterations": 4},
        ),
        ModelCase(
            "lstm",
            LastStep,
            {"x": (4, 3, 3)},
            nn.MSELoss,
            None,
            (4, 2),
            {"max_texture_size": 4, "max_loop_iterations": 4},
        ),
        ModelCase(
            "activations",
            lambda: nn.Sequential(
                nn.Linear(4, 6), nn.LeakyReLU(0.1), nn.Linear(6, 6), nn.Sigmoid(), nn.Linear(6, 2), nn.Tanh()
            ),
            {"x": (5, 4)},
            nn.MSELoss,
            None,
            (5, 2),
            {"max_texture_size": 2, "max_loop_iterations": 4},
        ),
    ]
}


@pytest.fixture(scope="session")
def models() -> dict[str, ModelCase]:
    """The test models by name."""
    return MODELS


@pytest.fixture(scope="session", params=sorted(MODELS))
def model_case(request: pytest.FixtureRequest) -> ModelCase:
    """Each of the test models in turn."""
    return MODELS[request.param]


@pytest.fixture(scope="session", params=DIALECTS)
def dialect(request: pytest.FixtureRequest) -> str:
    """Each GLSL dialect in turn: "webgl2" (GLSL ES 3.00) and "webgl1" (GLSL ES 1.00)."""
    return request.param


# -- Hypothesis profiles ---------------------------------------------------------------------------
# "default" keeps property tests that do not set their own example count (the GL fuzzer,
# tests/codegen/test_fuzz_gl.py) quick; `pytest --slow` loads "slow", which runs thousands of examples.
_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("default", max_examples=6, deadline=None, suppress_health_check=_HEALTH)
settings.register_profile("slow", max_examples=3000, deadline=None, suppress_health_check=_HEALTH)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow", action="store_true", default=False, help="run property tests with the 'slow' profile"
    )


# Mesa's llvmpipe compiles every shader with LLVM the first time it is drawn; with a cold shader
# cache (a fresh CI machine) that JIT is most of the suite's time. The quick profile compiles
# without LLVM's optimization passes and for 4-wide (SSE) instead of 8-wide (AVX) vectors: shaders
# compile faster and compute the same float32 results (the suite passes with and without).
QUICK_LLVMPIPE = {"GALLIVM_PERF": "nopt", "LP_NATIVE_VECTOR_WIDTH": "128"}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow_only: runs with `--slow` only (a heavier duplicate)")
    slow = config.getoption("--slow")
    settings.load_profile("slow" if slow else "default")
    if not slow:
        # Set here, in every process (xdist workers included), before any GL context exists;
        # `--slow` keeps llvmpipe's defaults, and a value the user set (even an empty one:
        # `GALLIVM_PERF= pytest ...`) is left alone.
        for name, value in QUICK_LLVMPIPE.items():
            os.environ.setdefault(name, value)


class SumLoss(nn.Module):
    """sum(out * y): a loss whose gradient is y, for tests of single products and maps."""

    def forward(self, out: Any, y: Any) -> Any:
        return (out * y).sum()

    def target_spec(self, output_shape: tuple[int, ...]) -> dict[str, Any]:
        return {"shape": output_shape, "dtype": "float32"}


def train_both(
    case: Any,
    prog: glcomp.Program,
    gl: Any,
    steps: int,
    state_rtol: float,
    rtol: float = 1e-7,
    atol: float = 0.0,
    atol_rel: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """`steps` train steps of `case`'s batches on `gl` and on the reference runtime: the final
    states agree within `state_rtol` of each array's largest magnitude, and predictions within
    `rtol` and `atol` plus `atol_rel` of the reference prediction's largest magnitude. Returns
    both runtimes' losses."""
    ref = prog.runtime("reference")
    got, want = [], []
    for step in range(steps):
        feeds, y = case.batch(step % 3)
        got.append(gl.train_step(**feeds, y=y))
        want.append(ref.train_step(**feeds, y=y))
    final, expected = gl.state_dict(), ref.state_dict()
    for name, w in expected.items():
        scale = float(np.abs(w).max()) or 1.0
        err = float(np.abs(np.asarray(final[name], np.float64) - w).max()) / scale
        assert err <= state_rtol, f"{name}: deviates by {err:.2e} of its largest element"
    feeds, _ = case.batch(0)
    out, out_ref = gl.predict(**feeds), ref.predict(**feeds)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, out_ref, rtol=rtol, atol=atol + atol_rel * float(np.abs(out_ref).max()))
    return np.array(got), np.array(want)


# -- bundles of an older format ---------------------------------------------------------------------
def stored_path(directory: Any, path: str) -> Any:
    """Where the file `path` (weights.safetensors, shaders.json, program.json) of the bundle in
    `directory` is: under the name its manifest gives it (format 4: the name carries its sha256),
    or `path` itself (formats 1-3)."""
    import json
    from pathlib import Path

    from glcomp.format import stored_name

    directory = Path(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    name = stored_name(manifest.get("version"), path, manifest.get("files", {}).get(path))
    return directory / (name or path)


def as_format_3(directory: Any) -> Any:
    """Rewrite the bundle in `directory`, format 4 as saves write it, in place as format 3 stored
    bundles: every file under its plain name (weights.safetensors, shaders.json, program.json) and
    ``version`` 3, without the save lock file: the layout of bundles saved before format 4, which
    loaders must keep reading, and the one tamper tests edit by file name. Returns `directory`."""
    import json
    import os
    from pathlib import Path

    directory = Path(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["version"] == 4, manifest["version"]
    for path in manifest["files"]:
        os.rename(stored_path(directory, path), directory / path)
    manifest["version"] = 3
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    (directory / ".glcomp.lock").unlink(missing_ok=True)
    return directory


def as_format_2(directory: Any) -> Any:
    """Rewrite the (format 3 or 4) bundle in `directory` in place as format 2 wrote bundles: one
    file per shader under shaders/, ``version`` 2 and a sha256 per shader file in ``files`` (the
    layout of bundles saved before shaders.json, which loaders must keep reading). Returns
    `directory`."""
    import hashlib
    import json
    from pathlib import Path

    directory = Path(directory)
    if json.loads((directory / "manifest.json").read_text())["version"] == 4:
        as_format_3(directory)
    manifest = json.loads((directory / "manifest.json").read_text())
    shaders = json.loads((directory / "shaders.json").read_text())
    assert manifest["version"] == 3, manifest["version"]
    (directory / "shaders.json").unlink()
    (directory / "shaders").mkdir()
    files = {k: v for k, v in manifest["files"].items() if k != "shaders.json"}
    for name, source in shaders.items():
        data = source.encode("utf-8")
        (directory / "shaders" / name).write_bytes(data)
        files[f"shaders/{name}"] = hashlib.sha256(data).hexdigest()
    manifest["version"] = 2
    manifest["files"] = dict(sorted(files.items()))
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True))
    return directory


@pytest.fixture
def force(monkeypatch: pytest.MonkeyPatch) -> Any:
    """force((R, C)): tile every eligible matmul with that block shape, whatever its size (the
    block and gather draws cost nothing). Modules that force otherwise define their own."""

    def apply(shape: tuple[int, int]) -> None:
        from glcomp.codegen import cost
        from glcomp.codegen.passes import tiling

        monkeypatch.setattr(tiling, "SHAPES", (shape,))
        monkeypatch.setattr(cost, "BLOCKED_DRAW", 0)
        monkeypatch.setattr(cost, "GATHER_FETCHES", 0)

    return apply


def benchmark_module(name: str) -> Any:
    """benchmarks/<name>.py as a module, loaded once under the key bench_browser.py's `_sibling`
    uses (so a test and the benchmark it drives share one copy)."""
    import importlib.util
    import sys
    from pathlib import Path

    key = f"_glcomp_{name}"
    if key not in sys.modules:
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
        spec = importlib.util.spec_from_file_location(key, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[key] = module
        spec.loader.exec_module(module)
    return sys.modules[key]
