"""A minimal Chromium driver over the Chrome DevTools Protocol, standard library only.

The browser is started with ``--remote-debugging-pipe``: it reads protocol commands from its file
descriptor 3 and writes replies and events to its descriptor 4, each message one JSON object
followed by a NUL byte. Every page is a target of its own browser context
(``Target.createBrowserContext``, ``Target.createTarget``), attached with ``flatten`` so that its
commands and events carry the session id. The API is the subset of Playwright's synchronous one
that benchmarks/bench_browser.py uses::

    with launch("/usr/bin/chromium", args=["--headless", "--no-sandbox"]) as browser:
        page = browser.new_page()
        page.set_default_timeout(60_000)
        page.add_init_script("globalThis.answer = 42")
        page.goto("http://127.0.0.1:8000/")
        page.evaluate("async (arg) => answer + arg.n", {"n": 1})  # 43
        page.close()

``evaluate`` takes the source of a JavaScript function (sync or async), calls it with the argument
(sent as JSON) and returns its awaited result by value (JSON-like: nested NaN and Infinity come back
as None, a top-level one as a float); a JavaScript exception raises `EvaluationError` with the
exception's text. Console calls are collected in ``page.console`` (and printed to stderr with
``print_console=True``), uncaught page errors in ``page.errors``. Every wait has a timeout, and a
browser that exits raises `BrowserClosedError` with its exit status and the tail of its stderr.
"""

from __future__ import annotations

import collections
import fcntl
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Browser",
    "BrowserClosedError",
    "CDPError",
    "CDPTimeoutError",
    "ConsoleMessage",
    "EvaluationError",
    "Page",
    "launch",
]

_SLICE = 0.25  # seconds between checks that the browser still runs while waiting


class CDPError(RuntimeError):
    """A protocol command failed (its error reply), or the page went away."""


class BrowserClosedError(CDPError):
    """The browser process exited or closed its end of the pipe."""


class CDPTimeoutError(CDPError, TimeoutError):
    """A command or a wait did not finish in time."""


class EvaluationError(CDPError):
    """`Page.evaluate`'s function threw (or its promise rejected); the message is the JS error's text."""


@dataclass(frozen=True)
class ConsoleMessage:
    """One console call of a page: its type (log, warning, error, ...) and its arguments as text."""

    type: str
    text: str

    def __str__(self) -> str:
        return f"[console.{self.type}] {self.text}"


def _unserializable(text: str) -> Any:
    if text in ("NaN", "Infinity", "-Infinity", "-0"):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf, "-0": -0.0}[text]
    if text.endswith("n"):  # a BigInt
        return int(text[:-1])
    return text


def _remote_text(obj: dict[str, Any]) -> str:
    """A RemoteObject (a console argument) as the text the console would show."""
    if "value" in obj:
        value = obj["value"]
        return value if isinstance(value, str) else json.dumps(value)
    if "unserializableValue" in obj:
        return str(obj["unserializableValue"])
    return str(obj.get("description", obj.get("type", "")))


def _exception_text(details: dict[str, Any]) -> str:
    """The text of a thrown exception: an Error's description (message and stack), a thrown
    value's text, or the protocol's summary."""
    exc = details.get("exception") or {}
    if exc.get("description"):
        return str(exc["description"])
    if "value" in exc:
        return f"Uncaught {_remote_text(exc)}"
    return str(details.get("text", "JavaScript exception"))


class _Call:
    __slots__ = ("done", "error", "result")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None


class _Connection:
    """The pipe to one browser process: numbered commands, their replies and the events, routed
    by session id."""

    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int, read_fd: int, stderr: Any) -> None:
        self.proc = proc
        self._write_fd = write_fd
        self._read_fd = read_fd
        self._stderr = stderr
        self._lock = threading.Lock()
        self._next_id = 0
        self._pending: dict[int, _Call] = {}
        self.handlers: dict[str | None, Any] = {}
        self.closed: str | None = None  # why, once the pipe is gone
        self._reader = threading.Thread(target=self._read_loop, name="cdp-reader", daemon=True)
        self._reader.start()

    # -- the process --------------------------------------------------------------------------------
    def stderr_tail(self, lines: int = 30) -> str:
        return "\n".join(self._stderr.tail(lines))

    def dead_error(self) -> BrowserClosedError:
        code = self.proc.poll()
        if code is None and self.closed is not None:  # the pipe closes just before the exit
            try:
                code = self.proc.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        status = "is still running" if code is None else f"exited with status {code}"
        why = self.closed or "the browser process exited"
        tail = self.stderr_tail()
        ends = f"; its stderr ends:\n{tail}" if tail else ""
        return BrowserClosedError(f"{why}; the browser {status}{ends}")

    def alive(self) -> bool:
        return self.closed is None and self.proc.poll() is None

    # -- messages -------------------------------------------------------------------------------------
    def _read_loop(self) -> None:
        buf = b""
        try:
            while True:
                chunk = os.read(self._read_fd, 1 << 20)
                if not chunk:
                    break
                buf += chunk
                while b"\0" in buf:
                    raw, buf = buf.split(b"\0", 1)
                    if raw:
                        self._dispatch(json.loads(raw))
        except OSError as err:
            self._shutdown(f"reading from the browser failed ({err})")
            return
        self._shutdown("the browser closed the DevTools pipe")

    def _dispatch(self, msg: dict[str, Any]) -> None:
        if "id" in msg:
            with self._lock:
                call = self._pending.pop(msg["id"], None)
            if call is None:
                return
            if "error" in msg:
                err = msg["error"]
                data = f" ({err['data']})" if "data" in err else ""
                call.error = CDPError(f"{err.get('message', err)}{data}")
            else:
                call.result = msg.get("result", {})
            call.done.set()
            return
        handler = self.handlers.get(msg.get("sessionId"))
        if handler is not None:
            try:
                handler(msg.get("method", ""), msg.get("params", {}))
            except Exception as err:  # a handler's bug must not stop the reader
                print(f"cdp: event handler failed: {err!r}", file=sys.stderr)

    def _shutdown(self, why: str) -> None:
        with self._lock:
            if self.closed is None:
                self.closed = why
            pending, self._pending = self._pending, {}
        for call in pending.values():
            call.error = self.dead_error()
            call.done.set()
        for handler in list(self.handlers.values()):
            try:
                handler("cdp.closed", {})
            except Exception:
                pass

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        """Send one command and wait (at most `timeout` seconds) for its reply's result."""
        call = _Call()
        with self._lock:
            if self.closed is not None:
                raise self.dead_error()
            self._next_id += 1
            msg: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
            if session is not None:
                msg["sessionId"] = session
            self._pending[msg["id"]] = call
            data = json.dumps(msg).encode() + b"\0"
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(self._write_fd, view) :]
            except OSError as err:
                self._pending.pop(msg["id"], None)
                raise self.dead_error() from err
        self.wait(call.done, timeout, method)
        if call.error is not None:
            raise call.error
        assert call.result is not None
        return call.result

    def wait(self, event: threading.Event, timeout: float, what: str) -> None:
        """Wait for `event`, checking the browser process meanwhile."""
        deadline = time.monotonic() + timeout
        while not event.wait(min(_SLICE, max(0.0, deadline - time.monotonic()))):
            if self.proc.poll() is not None and not event.is_set():
                # the reader may still be draining the replies written before the exit
                self._reader.join(1.0)
                if not event.is_set():
                    raise self.dead_error()
            if time.monotonic() >= deadline:
                raise CDPTimeoutError(f"{what}: no answer within {timeout:g} s")

    def close_pipes(self) -> None:
        for fd in (self._write_fd, self._read_fd):
            try:
                os.close(fd)
            except OSError:
                pass
        self._reader.join(2.0)


class _Tail:
    """The last lines of a stream, read by a thread of its own (so the process never blocks on a
    full stderr pipe)."""

    def __init__(self, stream: Any, keep: int = 200) -> None:
        self._lines: collections.deque[str] = collections.deque(maxlen=keep)
        self._thread = threading.Thread(target=self._run, args=(stream,), name="cdp-stderr", daemon=True)
        self._thread.start()

    def _run(self, stream: Any) -> None:
        for line in iter(stream.readline, b""):
            self._lines.append(line.decode(errors="replace").rstrip())
        stream.close()

    def tail(self, lines: int) -> list[str]:
        return list(self._lines)[-lines:]


class Page:
    """One tab in a browser context of its own (Playwright's ``browser.new_page()``)."""

    def __init__(self, browser: Browser, context_id: str, target_id: str, session: str) -> None:
        self._browser = browser
        self._conn = browser._conn
        self._context_id = context_id
        self._target_id = target_id
        self._session = session
        self._timeout = 30.0
        self._loads = 0
        self._load_event = threading.Event()
        self._gone: str | None = None
        self.closed = False
        self.console: list[ConsoleMessage] = []
        self.errors: list[str] = []

    def _on_event(self, method: str, params: dict[str, Any]) -> None:
        if method == "Page.loadEventFired":
            self._loads += 1
            self._load_event.set()
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(_remote_text(a) for a in params.get("args", []))
            msg = ConsoleMessage(params.get("type", "log"), text)
            self.console.append(msg)
            if self._browser.print_console:
                print(msg, file=sys.stderr, flush=True)
        elif method == "Runtime.exceptionThrown":
            text = _exception_text(params.get("exceptionDetails", {}))
            self.errors.append(text)
            if self._browser.print_console:
                print(f"[pageerror] {text}", file=sys.stderr, flush=True)
        elif method in ("Inspector.targetCrashed", "Inspector.detached", "cdp.closed"):
            self._gone = {"Inspector.targetCrashed": "the page crashed"}.get(method, "the page was detached")
            self._load_event.set()

    def _send(self, method: str, params: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        if self.closed:
            raise CDPError(f"{method}: the page is closed")
        return self._conn.send(method, params, self._session, self._timeout if timeout is None else timeout)

    def set_default_timeout(self, ms: float) -> None:
        """The timeout of every later call on this page, in milliseconds (Playwright's unit)."""
        self._timeout = ms / 1000.0

    def add_init_script(self, script: str) -> None:
        """Run `script` in every document of this page before its own scripts."""
        self._send("Page.addScriptToEvaluateOnNewDocument", {"source": script})

    def goto(self, url: str, timeout: float | None = None) -> None:
        """Navigate to `url` and wait for its load event (`timeout` in milliseconds)."""
        limit = self._timeout if timeout is None else timeout / 1000.0
        deadline = time.monotonic() + limit
        self._load_event.clear()
        loads = self._loads
        nav = self._send("Page.navigate", {"url": url}, timeout=limit)
        if nav.get("errorText"):
            raise CDPError(f"goto {url}: {nav['errorText']}")
        while self._loads == loads:
            if self._gone:
                raise CDPError(f"goto {url}: {self._gone}")
            self._conn.wait(self._load_event, max(0.0, deadline - time.monotonic()), f"goto {url}")
            self._load_event.clear()

    def evaluate(self, script: str, arg: Any = None) -> Any:
        """Call the JavaScript function `script` (its source, sync or async) with `arg` (JSON) and
        return its awaited result by value; a source that is not a function is returned as
        evaluated. A thrown exception raises `EvaluationError` with its text."""
        expression = f"((f, a) => typeof f === 'function' ? f(a) : f)((\n{script}\n), {json.dumps(arg)})"
        reply = self._send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True, "userGesture": True},
        )
        if "exceptionDetails" in reply:
            raise EvaluationError(_exception_text(reply["exceptionDetails"]))
        result = reply.get("result", {})
        if "unserializableValue" in result:
            return _unserializable(result["unserializableValue"])
        return result.get("value")

    def close(self) -> None:
        """Close the tab and dispose of its browser context."""
        if self.closed:
            return
        self.closed = True
        self._browser._pages.discard(self)
        self._conn.handlers.pop(self._session, None)
        if not self._conn.alive():
            return
        try:
            self._conn.send("Target.closeTarget", {"targetId": self._target_id}, timeout=10.0)
            dispose = {"browserContextId": self._context_id}
            self._conn.send("Target.disposeBrowserContext", dispose, timeout=10.0)
        except CDPError:
            if self._conn.alive():
                raise


class Browser:
    """A running Chromium process driven over its DevTools pipe; see `launch`."""

    def __init__(self, conn: _Connection, profile: str, print_console: bool) -> None:
        self._conn = conn
        self._profile = profile
        self._pages: set[Page] = set()
        self.print_console = print_console
        self.version = ""

    @property
    def pid(self) -> int:
        return self._conn.proc.pid

    def is_connected(self) -> bool:
        return self._conn.alive()

    def new_page(self) -> Page:
        """A blank tab in a fresh browser context, its Page and Runtime domains enabled."""
        send = self._conn.send
        context = send("Target.createBrowserContext", {"disposeOnDetach": True})["browserContextId"]
        target = send("Target.createTarget", {"url": "about:blank", "browserContextId": context})["targetId"]
        session = send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, context, target, session)
        self._conn.handlers[session] = page._on_event
        page._send("Page.enable")
        page._send("Runtime.enable")
        self._pages.add(page)
        return page

    def close(self, timeout: float = 10.0) -> None:
        """Close the browser: Browser.close, then wait for the process (its whole process group
        is killed if it lingers) and remove the temporary profile."""
        proc = self._conn.proc
        if proc.poll() is None and self._conn.closed is None:
            try:
                self._conn.send("Browser.close", timeout=timeout)
            except CDPError:
                pass  # it may exit before it replies
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
        self._kill_group()
        self._conn.close_pipes()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _kill_group(self) -> None:
        """Kill what is left of the browser's process group (its own, see `launch`)."""
        proc = self._conn.proc
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            pass
        # SIGKILL is delivered at once but a process takes a moment to die (its renderer and GPU
        # processes, reparented when the browser itself was killed, are reaped by init): wait
        # until the group has no live member, so a closed browser leaves no process behind.
        deadline = time.monotonic() + 5.0
        while _live_group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _live_group_members(pgid: int) -> list[int]:
    """The processes of process group `pgid` that are not zombies (Linux's /proc; elsewhere
    none are found)."""
    members = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return members
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry))
    return members


def launch(
    executable: str,
    args: list[str] | tuple[str, ...] = (),
    *,
    timeout: float = 30.0,
    print_console: bool = False,
    env: dict[str, str] | None = None,
) -> Browser:
    """Start the Chromium binary `executable` with `args` (and a temporary profile) and connect to
    it over ``--remote-debugging-pipe``; `timeout` (seconds) bounds the start-up."""
    profile = tempfile.mkdtemp(prefix="cdp-profile-")
    # our ends: we write commands to `cmd_w`, read replies from `out_r`; the browser's: 3 and 4
    cmd_r, cmd_w = os.pipe()
    out_r, out_w = os.pipe()

    def child_fds() -> None:  # in the child, before exec: its ends become descriptors 3 and 4
        high_r = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10)  # out of the way of 3 and 4 first
        high_w = fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
        os.dup2(high_r, 3)
        os.dup2(high_w, 4)

    cmd = [executable, *args, "--remote-debugging-pipe", f"--user-data-dir={profile}"]
    try:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            # kept open in the child once child_fds has set them (with 0-2 open, the two pipes
            # above guarantee that the parent has some 3 and 4 too, which Popen requires)
            pass_fds=(3, 4),
            preexec_fn=child_fds,
            start_new_session=True,  # its own process group: close() can kill every child it left
            env=env,
        )
    except BaseException:
        for fd in (cmd_r, cmd_w, out_r, out_w):
            os.close(fd)
        shutil.rmtree(profile, ignore_errors=True)
        raise
    os.close(cmd_r)
    os.close(out_w)
    assert proc.stderr is not None
    conn = _Connection(proc, cmd_w, out_r, _Tail(proc.stderr))
    browser = Browser(conn, profile, print_console)
    try:
        browser.version = conn.send("Browser.getVersion", timeout=timeout).get("product", "")
    except BaseException:
        browser.close(timeout=2.0)
        raise
    return browser
