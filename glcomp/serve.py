"""Serve a bundle to the browser: the demo page trains it with WebGL on data shipped beside it.

``glcomp serve DIR [--port N]`` binds 127.0.0.1 only and serves nothing but the pages
(glcomp/pages/: demo, fine-tuning, camera) and the browser runtime (glcomp/runtime/js/), side by
side under ``/`` (a page imports ``./glcomp.js``), and the bundle's files under ``/bundle/``:
plain files inside those folders with known suffixes, no listings, no dot-files, no links that
lead outside, no ``..``. One thread runs an event loop over non-blocking sockets (`DemoServer`):
files are streamed in chunks (memory stays flat however large a file or however many readers), a
request head must arrive whole within a deadline (per request, not per read), a stalled download
is dropped, and beyond a bounded number of open connections a client gets ``503``, so slow or
idle clients can neither starve the others nor pile up threads or memory. Training data is a
``data.safetensors`` holding x_train, y_train, x_test and y_test, written by `export_data`.
"""

from __future__ import annotations

import argparse
import contextlib
import email.utils
import http
import os
import selectors
import socket
import sys
import threading
import time
import urllib.parse
import webbrowser
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

JS_DIR = Path(__file__).resolve().parent / "runtime" / "js"  # the browser runtime, the library
PAGES_DIR = Path(__file__).resolve().parent / "pages"  # the pages, served beside the runtime's modules
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
WORKERS = 8  # unused (make_server's `workers`, kept for compatibility): the server is one event loop
MAX_CONNECTIONS = 256  # open at once; a connection beyond them is answered 503 and closed
LISTEN_BACKLOG = 128  # connections the kernel queues before the loop accepts them
TIMEOUT = 15.0  # seconds for a request head to arrive whole, and for a stalled download
DRAIN_SECONDS = 2.0  # after a response, how long the client's leftover bytes are read before closing
MAX_HEAD = 16384  # bytes of a request line and headers
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


def _resolve(target: str, bundle_dir: Path, data_file: Path | None) -> Path | None:
    """The file a request target names, or None (404)."""
    raw = urllib.parse.urlsplit(target).path
    if "%2f" in raw.lower() or "%5c" in raw.lower():
        return None
    path = urllib.parse.unquote(raw)
    if path in ("/", "/index.html"):
        path = "/demo.html"
    parts = path.split("/")[1:]
    if parts and parts[0] == "bundle":
        parts = parts[1:]
        if parts == [DATA_FILE] and data_file is not None:
            return data_file
        return _safe_file(bundle_dir, parts, _BUNDLE_SUFFIXES)
    if len(parts) == 1:  # a page, or a module of the runtime (their names never clash)
        return _safe_file(PAGES_DIR, parts, _JS_SUFFIXES) or _safe_file(JS_DIR, parts, _JS_SUFFIXES)
    if len(parts) == 2 and parts[0] == "format":  # format/: the bundle format's modules
        return _safe_file(JS_DIR, parts, _JS_SUFFIXES)
    return None


def _host_ok(host: str) -> bool:
    host = host.rsplit(":", 1)[0].strip("[]").lower()
    return host in ("127.0.0.1", "localhost", "")


def _head(status: int, headers: dict[str, str]) -> bytes:
    reason = http.HTTPStatus(status).phrase
    lines = [f"HTTP/1.0 {status} {reason}", "Server: glcomp", f"Date: {email.utils.formatdate(usegmt=True)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines += ["Cache-Control: no-store", "X-Content-Type-Options: nosniff", "Connection: close", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def _error(status: int, message: str, body: bool = True) -> bytes:
    text = f"{status} {http.HTTPStatus(status).phrase}: {message}\n".encode()
    head = _head(status, {"Content-Type": "text/plain; charset=utf-8", "Content-Length": str(len(text))})
    return head + text if body else head


_OVERLOADED = _error(503, "the server is busy; try again")


class _Conn:
    """One connection: reading its request head, writing the response, or draining after it."""

    __slots__ = ("addr", "deadline", "file", "inbuf", "last", "out", "remaining", "sock", "state")

    def __init__(self, sock: socket.socket, addr: Any, deadline: float) -> None:
        self.sock, self.addr, self.deadline = sock, addr, deadline
        self.state = "read"  # -> "write" -> "drain"
        self.inbuf = b""
        self.out = b""
        self.file: Any = None
        self.remaining = 0
        self.last = time.monotonic()


class DemoServer:
    """The demo's HTTP server: one thread, an event loop over non-blocking sockets.

    A request's head must arrive whole within `timeout` seconds of the connection (a deadline
    per request, not per read, so a client sending a header line every few seconds is dropped
    like an idle one); a response whose client stops reading for `timeout` seconds is dropped
    too. Slow or idle clients cost a socket and at most one CHUNK of memory each and never block
    others: the loop serves whichever socket is ready. At most `max_connections` are open at
    once; a connection beyond that is answered ``503 Service Unavailable`` and closed. With as
    many again open (503s and responses still draining), the loop stops accepting until one
    closes: later clients wait in the kernel's queue (LISTEN_BACKLOG), never closed without a
    response. Files are streamed in CHUNK-sized pieces, never read whole.
    """

    def __init__(
        self,
        address: tuple[str, int],
        bundle_dir: Path,
        data_file: Path | None,
        quiet: bool = True,
        timeout: float = TIMEOUT,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.bundle_dir, self.data_file, self.quiet = bundle_dir, data_file, quiet
        self.timeout, self.max_connections = float(timeout), int(max_connections)
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind(address)
            self.socket.listen(LISTEN_BACKLOG)
            self.socket.setblocking(False)
        except BaseException:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.socket, selectors.EVENT_READ, None)
        self._accepting = True
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._conns: dict[int, _Conn] = {}
        self._stop = False
        self._running = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._closed = False

    # -- the loop -----------------------------------------------------------------------------
    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until `shutdown()` (from another thread) or KeyboardInterrupt."""
        self._done.clear()
        self._running.set()
        try:
            while not self._stop:
                self._listen(len(self._conns) < 2 * self.max_connections)
                now = time.monotonic()
                wait = min([poll_interval] + [max(0.0, c.deadline - now) for c in self._conns.values()])
                for key, events in self._sel.select(wait):
                    if key.data == "wake":
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                    elif key.data is None:
                        self._accept()
                    else:
                        self._step(key.data, events)
                self._expire(time.monotonic())
        finally:
            self._stop = False
            self._running.clear()
            self._done.set()

    def shutdown(self) -> None:
        """Stop `serve_forever` and wait until it has returned."""
        if not self._running.is_set():
            return
        self._stop = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        self._done.wait()

    def server_close(self) -> None:
        """Close the listening socket and every connection (after `shutdown`)."""
        if self._closed:
            return
        self._closed = True
        for conn in list(self._conns.values()):
            self._close(conn)
        self._sel.close()
        for sock in (self.socket, self._wake_r, self._wake_w):
            sock.close()

    def __enter__(self) -> DemoServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
        self.server_close()

    def connections(self) -> int:
        """How many client connections are open now."""
        return len(self._conns)

    # -- connections --------------------------------------------------------------------------
    def _listen(self, on: bool) -> None:
        """Accept new connections (on) or leave them in the kernel's queue (at the hard bound)."""
        if on != self._accepting:
            if on:
                self._sel.register(self.socket, selectors.EVENT_READ, None)
            else:
                self._sel.unregister(self.socket)
            self._accepting = on

    def _accept(self) -> None:
        for _ in range(64):  # a burst at a time, then serve the others
            if len(self._conns) >= 2 * self.max_connections:
                return  # even the 503s are at their bound: the rest wait in the kernel's queue
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of file descriptors, say: leave it in the kernel's queue a while
                time.sleep(0.01)
                return
            sock.setblocking(False)
            busy = sum(c.state != "drain" for c in self._conns.values()) >= self.max_connections
            conn = _Conn(sock, addr, time.monotonic() + self.timeout)
            self._conns[sock.fileno()] = conn
            if busy:
                self._log(conn, "- 503 (busy)")
                self._respond(conn, _OVERLOADED)
            else:
                self._sel.register(sock, selectors.EVENT_READ, conn)

    def _step(self, conn: _Conn, events: int) -> None:
        try:
            if conn.state == "read" and events & selectors.EVENT_READ:
                data = conn.sock.recv(MAX_HEAD)
                if not data:
                    self._close(conn)
                    return
                conn.inbuf += data
                end = conn.inbuf.find(b"\r\n\r\n")
                end = end if end >= 0 else conn.inbuf.find(b"\n\n")
                if end >= 0:
                    self._respond(conn, *self._handle(conn, conn.inbuf[:end]))
                elif len(conn.inbuf) > MAX_HEAD:
                    self._respond(conn, _error(431, "request head too large"))
            elif conn.state == "write" and events & selectors.EVENT_WRITE:
                self._send(conn)
            elif conn.state == "drain" and events & selectors.EVENT_READ:
                if not conn.sock.recv(MAX_HEAD):
                    self._close(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:  # reset by the client, or a file that became unreadable
            self._close(conn)

    def _respond(self, conn: _Conn, out: bytes, file: Any = None, size: int = 0) -> None:
        conn.state, conn.out, conn.file, conn.remaining = "write", out, file, size
        conn.last = time.monotonic()
        conn.deadline = conn.last + self.timeout
        self._watch(conn, selectors.EVENT_WRITE)
        try:
            self._send(conn)
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._close(conn)

    def _send(self, conn: _Conn) -> None:
        while True:
            if not conn.out and conn.file is not None and conn.remaining > 0:
                conn.out = conn.file.read(min(CHUNK, conn.remaining))
                conn.remaining -= len(conn.out)
                if not conn.out:  # the file shrank while it was sent: the response is cut short
                    self._close(conn)
                    return
            if not conn.out:
                self._finish(conn)
                return
            sent = conn.sock.send(conn.out)
            conn.out = conn.out[sent:]
            conn.last = time.monotonic()
            conn.deadline = conn.last + self.timeout  # a stall, not the whole download, is bounded
            if conn.out:
                return  # the socket's buffer is full: wait until it is writable

    def _finish(self, conn: _Conn) -> None:
        """The response is sent: half-close, then read what the client still sends until it
        closes (a close with unread data would reset the connection and could lose the response)."""
        if conn.file is not None:
            conn.file.close()
            conn.file = None
        try:
            conn.sock.shutdown(socket.SHUT_WR)
        except OSError:
            self._close(conn)
            return
        conn.state = "drain"
        conn.deadline = time.monotonic() + min(self.timeout, DRAIN_SECONDS)
        self._watch(conn, selectors.EVENT_READ)

    def _watch(self, conn: _Conn, events: int) -> None:
        try:
            self._sel.modify(conn.sock, events, conn)
        except KeyError:
            self._sel.register(conn.sock, events, conn)

    def _expire(self, now: float) -> None:
        for conn in [c for c in self._conns.values() if c.deadline <= now]:
            if conn.state == "read" and conn.inbuf:
                self._log(conn, "- 408 (request head not complete in time)")
                self._respond(conn, _error(408, "the request head did not arrive in time"))
            else:
                self._close(conn)

    def _close(self, conn: _Conn) -> None:
        if self._conns.pop(conn.sock.fileno(), None) is None:
            return
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn.sock)
        if conn.file is not None:
            conn.file.close()
        conn.sock.close()

    # -- requests -----------------------------------------------------------------------------
    def _handle(self, conn: _Conn, head: bytes) -> tuple[bytes, Any, int]:
        """The response (head bytes, file to stream, its size) to a request head."""
        lines = head.decode("latin-1").replace("\r\n", "\n").split("\n")
        words = lines[0].split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            self._log(conn, f"{lines[0][:80]!r} 400")
            return _error(400, "bad request line"), None, 0
        method, target, _ = words
        headers = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep:
                self._log(conn, f"{lines[0]!r} 400")
                return _error(400, "bad header line"), None, 0
            headers[name.strip().lower()] = value.strip()
        body = method == "GET"
        status, result = 200, None
        if method not in ("GET", "HEAD"):
            status, result = 501, (_error(501, f"unsupported method {method!r}"), None, 0)
        elif not _host_ok(headers.get("host", "")):
            status, result = 403, (_error(403, "unexpected Host header", body), None, 0)
        else:
            path = _resolve(target, self.bundle_dir, self.data_file)
            f = None
            with contextlib.suppress(OSError):
                f = open(path, "rb") if path is not None else None  # closed once sent; streamed
            if f is None or path is None:
                status, result = 404, (_error(404, "not found", body), None, 0)
            else:
                size = os.fstat(f.fileno()).st_size
                kind = _TYPES.get(path.suffix, "application/octet-stream")
                out = _head(200, {"Content-Type": kind, "Content-Length": str(size)})
                if not body:
                    f.close()
                    f, size = None, 0
                result = (out, f, size)
        self._log(conn, f"{lines[0]!r} {status}")
        return result

    def _log(self, conn: _Conn, text: str) -> None:
        if not self.quiet:
            when = time.strftime("%d/%b/%Y %H:%M:%S")
            print(f"{conn.addr[0]} - - [{when}] {text}", file=sys.stderr)


def _check_port(port: Any) -> int:
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise GlcompError(f"port must be an integer from 0 to 65535 (0: any free port), got {port!r}")
    return port


def make_server(
    bundle_dir: str | Path,
    port: int = 0,
    data: Any = None,
    quiet: bool = True,
    workers: int = WORKERS,
    timeout: float = TIMEOUT,
    max_connections: int = MAX_CONNECTIONS,
) -> DemoServer:
    """An HTTP server on 127.0.0.1:`port` (0: any free port) for `bundle_dir` and the demo page.

    `data`: None (serve ``bundle_dir/data.safetensors`` if there is one), a path to a
    data.safetensors file, or a tuple (x_train, y_train, x_test, y_test) written into
    `bundle_dir` with `export_data`. Call ``serve_forever()`` (or run it in a thread) and
    ``shutdown()`` then ``server_close()`` when done. A request must arrive within `timeout`
    seconds of its connection and a client may stall a response for at most `timeout` seconds;
    at most `max_connections` are open at once, further ones are answered 503 (see DemoServer).
    `workers` is accepted for compatibility and unused: the server runs on one thread.
    OSError when the port cannot be bound (taken, say).
    """
    del workers
    port = _check_port(port)
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
    return DemoServer(
        (HOST, port),
        bundle.resolve(),
        data_file,
        quiet=quiet,
        timeout=timeout,
        max_connections=max_connections,
    )


def serve(
    bundle_dir: str | Path,
    port: int = 8000,
    data: Any = None,
    open_browser: bool = False,
    quiet: bool = False,
) -> None:
    """Check the bundle, then serve it with the demo page until interrupted (Ctrl-C)."""
    from glcomp.format.bundle import load_bundle

    bundle = load_bundle(bundle_dir)  # fail here, not in the browser, on a broken bundle
    if "train_step" not in bundle.manifest["entries"]:
        print("note: the bundle has no train_step (compile with a loss and an optimizer to train it)")
    try:
        server = make_server(bundle_dir, _check_port(port), data, quiet=quiet)
    except OSError as err:
        hint = " (give another --port, or --port 0 for any free port)" if port else ""
        raise GlcompError(f"cannot listen on port {port} of {HOST}: {err.strerror or err}{hint}") from None
    url = f"http://{HOST}:{server.server_address[1]}/"
    has_data = server.data_file is not None or (Path(bundle_dir) / DATA_FILE).is_file()
    note = "" if has_data else f" (no {DATA_FILE}: nothing to train on)"
    print(f"serving {Path(bundle_dir)} at {url}{note}", flush=True)
    print("press Ctrl-C to stop", flush=True)
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
