"""benchmarks/cdp.py, the standard-library Chromium driver of benchmarks/bench_browser.py
(``--chromium PATH``): evaluate of sync and async functions with an argument, a JavaScript
exception raised in Python, an init script seen by the next document, a module imported from a
local page, console messages, a browser that dies failing the call instead of hanging, and close
leaving no process behind. Chromium is found, and started, as the browser tests do."""

from __future__ import annotations

import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import benchmark_module

pytestmark = pytest.mark.browser

FILES = {
    "/": (b"<!doctype html><title>cdp test</title><body>page</body>", "text/html"),
    "/mod.js": (b"export const answer = 41;", "text/javascript"),
}


def _cdp() -> Any:
    return benchmark_module("cdp")


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body, kind = FILES.get(self.path, (None, ""))
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


def _launch() -> Any:
    from browser.support import CHROMIUM_ARGS, chromium_executable

    return _cdp().launch(chromium_executable(), CHROMIUM_ARGS, timeout=20.0)


def _group_members(pgid: int) -> list[int]:
    """The live processes of process group `pgid` (the browser's own, see cdp.launch)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def test_page_api_and_close(url: str) -> None:
    cdp = _cdp()
    browser = _launch()
    try:
        page = browser.new_page()
        page.set_default_timeout(15_000)
        page.add_init_script("globalThis.__early = document.readyState;")
        page.goto(url)
        assert page.evaluate("() => [document.title, globalThis.__early]") == ["cdp test", "loading"]
        assert page.evaluate("(arg) => arg.a.map((v) => v * arg.k)", {"a": [1, 2.5], "k": 2}) == [2, 5]
        doubled = "async (arg) => { await new Promise((r) => setTimeout(r, 5)); return { n: arg.n * 2 }; }"
        assert page.evaluate(doubled, {"n": 21}) == {"n": 42}
        imported = "async (arg) => (await import('/mod.js')).answer + arg"
        assert page.evaluate(imported, 1) == 42
        with pytest.raises(cdp.EvaluationError, match="no such weight"):
            page.evaluate("async () => { throw new Error('no such weight'); }")
        with pytest.raises(cdp.EvaluationError, match="nope"):
            page.evaluate("() => { throw 'nope'; }")
        page.evaluate("() => console.warn('careful', 3)")
        deadline = time.monotonic() + 5
        while not page.console and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [(m.type, m.text) for m in page.console] == [("warning", "careful 3")]
        page.goto("data:text/html,<title>second</title>")
        assert page.evaluate("() => [document.title, typeof globalThis.__early]") == ["second", "string"]
        page.close()
        with pytest.raises(cdp.CDPError, match="closed"):
            page.evaluate("() => 1")
    finally:
        browser.close()
    assert browser._conn.proc.poll() is not None
    assert _group_members(browser.pid) == []


def test_dead_browser_raises() -> None:
    cdp = _cdp()
    browser = _launch()
    try:
        page = browser.new_page()
        page.set_default_timeout(60_000)
        os.kill(browser.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(cdp.BrowserClosedError, match="exited with status"):
            page.evaluate("() => new Promise(() => {})")  # would wait for ever
        assert time.monotonic() - start < 10
    finally:
        browser.close()
    assert _group_members(browser.pid) == []
