"""Serve a bundle to the browser: the demo page trains it with WebGL on data shipped beside it.

``glcomp serve DIR [--port N]`` binds 127.0.0.1 only and serves nothing but the demo page and the
browser runtime (glcomp/runtime/js/) under ``/`` and the bundle's files under ``/bundle/``:
plain files inside those folders with known suffixes, no listings, no dot-files, no links that
lead outside, no ``..``. Files are streamed in chunks (memory stays flat however large a file or
however many readers), requests are handled by a fixed pool of worker threads with a bounded
queue, and every connection has a socket timeout, so slow or idle clients cannot pile up threads
or memory. Training data is a ``data.safetensors`` holding x_train, y_train, x_test
and y_test, written by `export_data`.
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import threading
import urllib.parse
import webbrowser
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

JS_DIR = Path(__file__).resolve().parent / "runtime" / "js"
DATA_FILE = "data.safetensors"
DATA_KEYS = ("x_train", "y_train", "x_test", "y_test")
HOST = "127.0.0.1"
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".json": "application/json",
    ".frag": "text/plain; charset=utf-8",
    ".vert": "text/plain; charset=utf-8",
    ".safetensors": "application/octet-stream",
}
_JS_SUFFIXES = (".html", ".js", ".css")
WORKERS = 8  # requests served at once
BACKLOG = 64  # connections accepted but waiting for a worker; beyond this they are closed
TIMEOUT = 15.0  # seconds a connection may sit idle (or a client stall) before it is closed
CHUNK = 1 << 16
_BUNDLE_SUFFIXES = (".json", ".frag", ".vert", ".safetensors")


def export_data(
    directory: str | Path,
    x_train: Any,
    y_train: Any,
    x_test: Any,
    y_test: Any,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``data.safetensors`` (x_* as float32, integer labels as int64) for the demo page.

    `extra` adds more named arrays of numbers (integers as int64, the rest float32), such as a
    character model's ``vocab`` (the characters' code points) that the demo decodes samples with."""
    from safetensors.numpy import save_file

    extra = dict(extra or {})
    clash = sorted(set(extra) & set(DATA_KEYS))
    if clash:
        raise GlcompError(f"export_data: extra arrays may not be named {', '.join(clash)}")
    arrays = {}
    values = (x_train, y_train, x_test, y_test, *extra.values())
    for key, value in zip((*DATA_KEYS, *extra), values, strict=True):
        arr = np.asarray(value)
        if not np.issubdtype(arr.dtype, np.number) and arr.dtype != np.bool_:
            raise GlcompError(f"export_data: {key} must hold numbers, got dtype {arr.dtype}")
        integral = np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)
        if (key.startswith("y") or key not in DATA_KEYS) and integral:
            arr = arr.astype(np.int64)
        else:
            arr = arr.astype(np.float32)
            if not np.all(np.isfinite(arr)):
                raise GlcompError(f"export_data: {key} holds NaN or infinite values")
        if arr.ndim == 0:
            raise GlcompError(f"export_data: {key} must have a sample axis")
        arrays[key] = np.ascontiguousarray(arr)
    if len(arrays["x_train"]) != len(arrays["y_train"]) or len(arrays["x_test"]) != len(arrays["y_test"]):
        raise GlcompError("export_data: x and y must hold the same number of samples")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / DATA_FILE
    save_file(arrays, str(path))
    return path


def _safe_file(root: Path, parts: list[str], suffixes: tuple[str, ...]) -> Path | None:
    """The regular file `root/parts...`, or None when the request could leave `root`."""
    if not parts:
        return None
    for part in parts:
        if part in ("", ".", "..") or part.startswith(".") or any(ch in part for ch in "\\\0:"):
            return None
    if not parts[-1].endswith(suffixes):
        return None
    root = root.resolve()
    path = root.joinpath(*parts)
    try:
        resolved = path.resolve(strict=True)
    except (OSError, RuntimeError):
        return None
    if root not in resolved.parents or not resolved.is_file():
        return None
    return resolved


class _Handler(http.server.BaseHTTPRequestHandler):
    """GET/HEAD of the demo page, the runtime and the bundle's files; nothing else."""

    server_version = "glcomp"
    sys_version = ""
    protocol_version = "HTTP/1.0"  # one request per connection: no idle keep-alive workers
    timeout = TIMEOUT  # StreamRequestHandler applies it to the socket
    bundle_dir: Path
    data_file: Path | None
    quiet = True

    def _resolve(self) -> Path | None:
        raw = urllib.parse.urlsplit(self.path).path
        if "%2f" in raw.lower() or "%5c" in raw.lower():
            return None
        path = urllib.parse.unquote(raw)
        if path in ("/", "/index.html"):
            path = "/demo.html"
        parts = path.split("/")[1:]
        if parts and parts[0] == "bundle":
            parts = parts[1:]
            if parts == [DATA_FILE] and self.data_file is not None:
                return self.data_file
            return _safe_file(self.bundle_dir, parts, _BUNDLE_SUFFIXES)
        if len(parts) == 1:
            return _safe_file(JS_DIR, parts, _JS_SUFFIXES)
        return None

    def _host_ok(self) -> bool:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        return host in ("127.0.0.1", "localhost", "")

    def _serve(self, body: bool) -> None:
        if not self._host_ok():
            self.send_error(403, "unexpected Host header")
            return
        path = self._resolve()
        if path is None:
            self.send_error(404, "not found")
            return
        try:
            f = open(path, "rb")  # closed by the with below; streamed, never read whole
        except OSError:
            self.send_error(404, "not found")
            return
        with f:
            self.send_response(200)
            self.send_header("Content-Type", _TYPES.get(path.suffix, "application/octet-stream"))
            self.send_header("Content-Length", str(os.fstat(f.fileno()).st_size))
            self.send_header("Cache-Control", "no-store")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            if body:
                shutil.copyfileobj(f, self.wfile, CHUNK)

    def do_GET(self) -> None:
        self._serve(True)

    def do_HEAD(self) -> None:
        self._serve(False)

    def log_message(self, format: str, *args: Any) -> None:
        if not self.quiet:
            super().log_message(format, *args)


class PooledHTTPServer(http.server.HTTPServer):
    """An HTTP server whose requests run on `workers` threads. At most `backlog` accepted
    connections wait for a worker; further ones are closed at once, so a flood of clients costs
    neither threads nor memory beyond those bounds."""

    daemon_threads = True

    def __init__(self, address: Any, handler: Any, workers: int = WORKERS, backlog: int = BACKLOG) -> None:
        super().__init__(address, handler)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="glcomp-serve")
        self._slots = threading.BoundedSemaphore(workers + backlog)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        self._pool.submit(self._work, request, client_address)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:  # includes TimeoutError
            pass  # a client that went away or stalled past the timeout
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self._slots.release()

    def server_close(self) -> None:
        super().server_close()
        self._pool.shutdown(wait=False, cancel_futures=True)


def make_server(
    bundle_dir: str | Path,
    port: int = 0,
    data: Any = None,
    quiet: bool = True,
    workers: int = WORKERS,
    timeout: float = TIMEOUT,
) -> PooledHTTPServer:
    """An HTTP server on 127.0.0.1:`port` (0: any free port) for `bundle_dir` and the demo page.

    `data`: None (serve ``bundle_dir/data.safetensors`` if there is one), a path to a
    data.safetensors file, or a tuple (x_train, y_train, x_test, y_test) written into
    `bundle_dir` with `export_data`. Call ``serve_forever()`` (or run it in a thread) and
    ``server_close()`` when done. `workers` requests are served at once; a connection idle for
    `timeout` seconds is closed.
    """
    bundle = Path(bundle_dir)
    if not bundle.is_dir():
        raise GlcompError(f"{bundle}: not a directory")
    data_file = None
    if isinstance(data, tuple | list):
        data_file = export_data(bundle, *data)
    elif data is not None:
        data_file = Path(data).resolve()
        if not data_file.is_file():
            raise GlcompError(f"{data}: no such data file")
    handler = type(
        "GlcompHandler",
        (_Handler,),
        {"bundle_dir": bundle.resolve(), "data_file": data_file, "quiet": quiet, "timeout": timeout},
    )
    return PooledHTTPServer((HOST, port), handler, workers=workers)


def serve(
    bundle_dir: str | Path,
    port: int = 8000,
    data: Any = None,
    open_browser: bool = False,
    quiet: bool = False,
) -> None:
    """Check the bundle, then serve it with the demo page until interrupted (Ctrl-C)."""
    from glcomp.codegen.bundle import load_bundle

    bundle = load_bundle(bundle_dir)  # fail here, not in the browser, on a broken bundle
    if "train_step" not in bundle.manifest["entries"]:
        print("note: the bundle has no train_step (compile with a loss and an optimizer to train it)")
    try:
        server = make_server(bundle_dir, port, data, quiet=quiet)
    except OSError as err:
        raise GlcompError(f"cannot listen on {HOST}:{port} ({err.strerror or err})") from None
    url = f"http://{HOST}:{server.server_address[1]}/"
    has_data = server.RequestHandlerClass.data_file is not None or (Path(bundle_dir) / DATA_FILE).is_file()
    note = "" if has_data else f" (no {DATA_FILE}: nothing to train on)"
    print(f"serving {Path(bundle_dir)} at {url}{note}")
    print("press Ctrl-C to stop")
    if open_browser:
        threading.Timer(0.3, webbrowser.open, args=(url,)).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def cmd_serve(args: argparse.Namespace) -> int:
    """``glcomp serve DIR [--port N] [--data FILE] [--open]``."""
    serve(args.bundle, args.port, data=args.data, open_browser=args.open)
    return 0


def add_serve_command(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``serve`` to the ``glcomp`` command's subparsers (its handler is ``args.func``)."""
    p = subparsers.add_parser("serve", help="serve a bundle with a demo page that trains it in the browser")
    p.add_argument("bundle", metavar="DIR", help="bundle directory (with data.safetensors)")
    p.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (default 8000, 0: any)")
    p.add_argument("--data", metavar="FILE", help="a data.safetensors (x_train, y_train, x_test, y_test)")
    p.add_argument("--open", action="store_true", help="open the page in the default browser")
    p.set_defaults(func=cmd_serve)
    return p
