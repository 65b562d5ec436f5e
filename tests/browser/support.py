"""What the browser tests share: Chromium's flags, a served directory of bundles (`Site`), running
code in a page with glcomp.js imported (`_js`), WebGL hooks the pages are started with, the small
models the browser tests train and a plain HTTP GET. The `browser`, `site` and `page` fixtures
(tests/conftest.py) are built from these.

Chromium renders WebGL with SwiftShader (a CPU implementation), so these tests need no GPU, only
the Debian `chromium` package and the `playwright` Python package (its own browser downloads are
not used). They fail, never skip, when Chromium is missing.
"""

from __future__ import annotations

import http.client
import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import LastStep

import glcomp
from glcomp import nn, optim
from glcomp.codegen.bundle import load_bundle
from glcomp.errors import GlcompError
from glcomp.serve import make_server

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--use-angle=swiftshader",
    "--enable-unsafe-swiftshader",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
STEPS = 20

# Counts WebGL objects at the API level (created minus deleted), independently of the runtime's
# own bookkeeping, so the dispose test sees anything the runtime forgot to track.
COUNT_GL_OBJECTS = """
(() => {
  const live = {};
  window.__glLive = live;
  const pairs = { createTexture: "deleteTexture", createFramebuffer: "deleteFramebuffer",
    createProgram: "deleteProgram", createShader: "deleteShader", createBuffer: "deleteBuffer",
    createRenderbuffer: "deleteRenderbuffer", createVertexArray: "deleteVertexArray",
    fenceSync: "deleteSync", createQuery: "deleteQuery", createSampler: "deleteSampler" };
  for (const proto of [WebGLRenderingContext.prototype, WebGL2RenderingContext.prototype]) {
    for (const [make, drop] of Object.entries(pairs)) {
      if (!proto[make]) continue;
      const create = proto[make];
      const del = proto[drop];
      proto[make] = function (...args) {
        const obj = create.apply(this, args);
        if (obj) { live[make] = (live[make] || 0) + 1; obj.__testKind = make; }
        return obj;
      };
      proto[drop] = function (obj) {
        if (obj && obj.__testKind === make && !obj.__testDeleted) {
          obj.__testDeleted = true;
          live[make] -= 1;
        }
        return del.call(this, obj);
      };
    }
  }
})();
"""


# -- models ------------------------------------------------------------------------------------------
def _mlp(target: str) -> glcomp.Program:
    glcomp.manual_seed(3)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 16), nn.Tanh(), nn.Linear(16, 5))
    return glcomp.compile(
        model,
        inputs={"x": (8, 20)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.SGD(lr=0.1, momentum=0.9),
        target=target,
    )


def _cnn(target: str) -> glcomp.Program:
    glcomp.manual_seed(4)
    # no conv bias before BatchNorm: its gradient is rounding noise that Adam would amplify
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, bias=False),
        nn.BatchNorm2d(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(4, 6, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(6 * 4 * 4, 3),
    )
    return glcomp.compile(
        model,
        inputs={"x": (4, 1, 8, 8)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.Adam(lr=1e-2),
        target=target,
    )


def _lstm_blend(target: str) -> glcomp.Program:
    """With transposes pushed down, MRT and epilogue fusion off and the per-step products left as a
    sum (join_sums off), the compiler sums the recurrent weight's gradient with additive blending
    (draws with "blend": true) where the target blends float textures."""
    glcomp.manual_seed(5)
    return glcomp.compile(
        LastStep(3, 5, 2),
        inputs={"x": (4, 4, 3)},
        loss=nn.CrossEntropyLoss(),
        optimizer=optim.Adam(lr=1e-2),
        target=target,
        passes={"pushdown": True, "mrt": False, "epilogue": False, "join_sums": False},
    )


def _tiled(target: str) -> glcomp.Program:
    """A CNN whose convolution and Linear products all run register-blocked (the cost model's
    fixed cost of a blocked draw set to zero while it is planned), their bias and ReLU reading
    the products straight from the tiles."""
    from glcomp.codegen import cost
    from glcomp.codegen.families import conv

    glcomp.manual_seed(6)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 16),
        nn.ReLU(),
        nn.Linear(16, 3),
    )
    saved = cost.BLOCKED_DRAW, cost.GATHER_FETCHES, conv.CONV_CHANNELS
    cost.BLOCKED_DRAW, cost.GATHER_FETCHES, conv.CONV_CHANNELS = 0, 0, (4,)
    try:
        prog = glcomp.compile(
            model,
            inputs={"x": (4, 1, 8, 8)},
            loss=nn.CrossEntropyLoss(),
            optimizer=optim.Adam(lr=1e-2),
            target=target,
            max_draw_buffers=8,
        )
        shaders = prog.bundle().shaders.values()  # planned (and kept) with the blocked draws
    finally:
        cost.BLOCKED_DRAW, cost.GATHER_FETCHES, conv.CONV_CHANNELS = saved
    assert sum("register-blocked matmul:" in s for s in shaders) and sum(
        "register-blocked conv2d:" in s for s in shaders
    )
    assert sum("texelFetch(s" in s and "int tile = " in s and "register-blocked" not in s for s in shaders)
    return prog


MODELS = {
    "mlp": (_mlp, (8, 20), 5),
    "cnn": (_cnn, (4, 1, 8, 8), 3),
    "lstm_blend": (_lstm_blend, (4, 4, 3), 2),
    "tiled": (_tiled, (4, 1, 8, 8), 3),
}


def _batches(model: str, seed: int = 0, count: int = STEPS + 1) -> list[tuple[np.ndarray, np.ndarray]]:
    _, shape, classes = MODELS[model]
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=shape).astype(np.float32), rng.integers(0, classes, size=shape[0]))
        for _ in range(count)
    ]


def _save(prog: glcomp.Program, directory: Path) -> Path:
    """Write a bundle and check glcomp's own loader accepts it (the browser must too)."""
    prog.save(directory)
    problem = None
    try:
        load_bundle(directory)
    except GlcompError as err:
        problem = str(err)
    if problem is not None:
        pytest.fail(
            f"prog.save() wrote a bundle that glcomp.codegen.bundle.load_bundle rejects, so the "
            f"browser must reject it too; fix the bundle writer: {problem}",
            pytrace=False,
        )
    return directory


# -- Chromium and a served site ------------------------------------------------------------------------
def chromium_executable() -> str:
    """The system's `chromium`, or a test failure saying what to install."""
    exe = shutil.which("chromium")
    if exe is None:
        pytest.fail(
            "the browser tests need Chromium: `chromium` is not on PATH (Debian: apt-get install "
            "chromium). They fail rather than skip so that a run without the browser runtime "
            "never passes.",
            pytrace=False,
        )
    return exe


def sync_playwright() -> Any:
    """playwright's sync_playwright(), or a test failure saying what to install."""
    try:
        from playwright.sync_api import sync_playwright as start
    except ImportError as err:
        pytest.fail(
            f"the browser tests need the playwright package (pip install playwright): {err}", pytrace=False
        )
    return start()


class Site:
    """A directory of bundles served (with the runtime) on 127.0.0.1 by glcomp.serve's server."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.server = make_server(root)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _js(page: Any, body: str, arg: Any = None) -> Any:
    """Run an async function body with `g` (the glcomp module) and `arg` in scope."""
    return page.evaluate(f"async (arg) => {{ const g = await import('/glcomp.js'); {body} }}", arg)


HIDE = """
(() => {
  const hide = new Set(%s);
  const limits = %s;
  for (const proto of [WebGLRenderingContext.prototype, WebGL2RenderingContext.prototype]) {
    const getExtension = proto.getExtension;
    proto.getExtension = function (name) { return hide.has(name) ? null : getExtension.call(this, name); };
    const getParameter = proto.getParameter;
    proto.getParameter = function (p) {
      for (const [k, v] of Object.entries(limits)) if (this[k] === p) return v;
      return getParameter.call(this, p);
    };
  }
})();
"""


# -- the server -----------------------------------------------------------------------------------------
def _get(port: int, path: str, method: str = "GET", host: str | None = None) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest(method, path, skip_host=host is not None)
    if host is not None:
        conn.putheader("Host", host)
    conn.endheaders()
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, body, res.getheader("Content-Type") or ""
