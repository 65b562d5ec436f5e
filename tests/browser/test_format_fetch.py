"""glcomp.js caps the weights file by the manifest as it arrives: a weights file far beyond the
manifest's states is refused from its Content-Length before any byte is read, or as soon as a
stream without a length passes the cap, with read_bundle's message; it is never held whole nor
waited for to its end. The server here holds each weights response open after its bytes: a
loader that reads the whole body before checking it never returns (the test's timeout)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import glcomp
from browser.support import _js
from glcomp import GlcompError, nn, optim
from glcomp.format.bundle import load_bundle
from glcomp.format.store import weights_limit

LOAD = """
const opts = { allowOrigins: [new URL(arg).origin] };
const t0 = performance.now();
try { await g.loadBundle(arg, opts); return ["loaded", performance.now() - t0]; }
catch (err) { return [`${err.name}: ${err.message}`, performance.now() - t0]; }
"""


class _Stalling(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root, self.mode, self.release = root, mode, threading.Event()
        self.sent = 0  # bytes of weights written


class _Handler(BaseHTTPRequestHandler):
    server: _Stalling

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        name = self.path.rsplit("/", 1)[-1]
        path = self.server.root / name
        if "/" in self.path[1:].split("/", 1)[-1] or not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        weights = name.startswith("weights.")
        self.send_response(200)
        self.send_header("Access-Control-Allow-Origin", "*")
        if not weights:
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        limit = weights_limit(load_bundle(self.server.root).manifest)
        if self.server.mode == "length":  # declares far more than the cap, sends what it has
            self.send_header("Content-Length", str(1 << 34))
            self.end_headers()
            self.wfile.write(data)
        else:  # no length: a stream of the real bytes and then zeros, one byte past the cap
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            body = data + b"\0" * (limit + 1 - len(data))
            for i in range(0, len(body), 1 << 20):
                chunk = body[i : i + (1 << 20)]
                self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        self.wfile.flush()
        self.server.sent += len(data)
        self.server.release.wait(60)  # the response never ends while the test runs


@pytest.fixture(scope="module")
def bundle_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    glcomp.manual_seed(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    prog = glcomp.compile(model, {"x": (2, 3)}, loss=nn.CrossEntropyLoss(), optimizer=optim.SGD(lr=0.1))
    return prog.save(tmp_path_factory.mktemp("fetch") / "b")


@pytest.fixture(params=["length", "stream"])
def stalling(request: pytest.FixtureRequest, bundle_dir: Path) -> Iterator[_Stalling]:
    server = _Stalling(bundle_dir, request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.release.set()
        server.shutdown()
        server.server_close()


def test_weights_beyond_the_manifest_are_refused_as_they_arrive(
    page: Any,
    stalling: _Stalling,
    bundle_dir: Path,
) -> None:
    limit = weights_limit(load_bundle(bundle_dir).manifest)
    url = f"http://127.0.0.1:{stalling.server_address[1]}/b/"
    page.set_default_timeout(30_000)
    message, ms = _js(page, LOAD, url)
    assert message == f"GlcompError: bundle weights.safetensors: larger than {limit} bytes", message
    assert ms < 20_000, ms


def test_python_refuses_an_oversized_weights_file_before_reading_it(bundle_dir: Path, tmp_path: Path) -> None:
    """The same bound in read_bundle (from the file's size, before it is read)."""
    import shutil

    copy = Path(shutil.copytree(bundle_dir, tmp_path / "b"))
    weights = next(copy.glob("weights.*.safetensors"))
    limit = weights_limit(load_bundle(copy).manifest)
    with open(weights, "r+b") as f:
        f.truncate(limit + 1)  # sparse: no disk used
    with pytest.raises(GlcompError, match=rf"^bundle weights\.safetensors: larger than {limit} bytes$"):
        load_bundle(copy)
