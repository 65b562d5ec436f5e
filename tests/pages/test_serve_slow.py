"""`glcomp serve` under slow, idle and too many clients (all from 127.0.0.1): a request head has a
deadline of its own (not per read), slow clients never keep others waiting, and a client beyond
the connection bound gets a 503 response rather than a closed socket."""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from glcomp.serve import DemoServer, make_server


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    b = tmp_path / "b"
    b.mkdir()
    (b / "manifest.json").write_text('{"ok": true}')
    (b / "weights.safetensors").write_bytes(np.random.default_rng(0).bytes(1 << 20))
    return b


@contextlib.contextmanager
def running(server: DemoServer) -> Iterator[DemoServer]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def timed_get(port: int, path: str = "/bundle/manifest.json") -> tuple[int, bytes, float]:
    start = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    conn.request("GET", path)
    res = conn.getresponse()
    body = res.read()
    conn.close()
    return res.status, body, time.monotonic() - start


def slow_clients(port: int, n: int, stop: threading.Event, every: float) -> list[socket.socket]:
    """`n` sockets that send a request line, then one header line every `every` seconds."""
    socks = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(n)]
    for s in socks:
        s.sendall(b"GET /bundle/manifest.json HTTP/1.1\r\n")

    def trickle() -> None:
        i = 0
        while not stop.wait(every):
            for s in socks:
                try:
                    s.sendall(f"X-Slow-{i}: {i}\r\n".encode())
                except OSError:
                    pass
            i += 1

    threading.Thread(target=trickle, daemon=True).start()
    return socks


def test_slow_and_idle_clients_do_not_starve_a_normal_request(bundle: Path) -> None:
    """8 sockets trickling header lines (more than the old server's 8 workers) and 100 idle
    sockets: a normal request is still answered at once, with the default 15 s deadline."""
    stop = threading.Event()
    with running(make_server(bundle)) as server:
        port = server.server_address[1]
        slow = slow_clients(port, 8, stop, every=1.0)
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
        try:
            time.sleep(1.5)
            for _ in range(3):
                status, body, took = timed_get(port)
                assert status == 200 and body == b'{"ok": true}'
                assert took < 3.0, f"a normal request took {took:.1f} s beside 8 slow and 100 idle clients"
            assert server.connections() >= 100  # the slow and idle ones are still open
        finally:
            stop.set()
            for s in slow + idle:
                s.close()


def test_a_request_head_has_a_deadline_not_a_per_read_timeout(bundle: Path) -> None:
    """A header line every 0.3 s never lets a 1 s per-read timeout expire; the per-request
    deadline answers 408 and closes the connection after about 1 s."""
    stop = threading.Event()
    with running(make_server(bundle, timeout=1.0)) as server:
        port = server.server_address[1]
        (s,) = slow_clients(port, 1, stop, every=0.3)
        try:
            start = time.monotonic()
            s.settimeout(10)
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            took = time.monotonic() - start
            assert data.startswith(b"HTTP/1.0 408 "), data[:80]
            assert took < 4.0, f"the slow client was held {took:.1f} s past a 1 s deadline"
        finally:
            stop.set()
            s.close()
        # Idle sockets are closed at the deadline too (no response: they sent nothing).
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        start = time.monotonic()
        assert idle.recv(1) == b"" and time.monotonic() - start < 4.0
        idle.close()


def test_beyond_the_connection_bound_a_client_gets_503(bundle: Path) -> None:
    with running(make_server(bundle, max_connections=4)) as server:
        port = server.server_address[1]
        idle = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(4)]
        try:
            time.sleep(0.3)
            status, body, _ = timed_get(port)
            assert status == 503 and b"busy" in body
        finally:
            for s in idle:
                s.close()
        time.sleep(0.3)
        assert timed_get(port)[0] == 200  # served again once the others are gone


def test_concurrent_downloads_each_get_a_response(bundle: Path) -> None:
    """40 concurrent 1 MiB downloads against a bound of 16: every client gets an HTTP response,
    the whole file or 503 (the old server closed some without any)."""
    expected = (bundle / "weights.safetensors").read_bytes()
    results: list[object] = []

    def download() -> None:
        try:
            status, body, _ = timed_get(port, "/bundle/weights.safetensors")
            results.append(status if status != 200 or body == expected else "short body")
        except Exception as err:
            results.append(f"{type(err).__name__}: {err}")

    with running(make_server(bundle, max_connections=16)) as server:
        port = server.server_address[1]
        threads = [threading.Thread(target=download) for _ in range(40)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert len(results) == 40
    assert set(results) <= {200, 503}, [r for r in results if r not in (200, 503)]
    assert results.count(200) >= 16


def test_a_stalled_download_is_dropped_and_others_are_served(bundle: Path) -> None:
    big = bundle / "big.safetensors"
    big.write_bytes(b"\0" * (32 << 20))
    with running(make_server(bundle, timeout=1.0)) as server:
        port = server.server_address[1]
        stalled = socket.create_connection(("127.0.0.1", port), timeout=5)
        stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stalled.sendall(b"GET /bundle/big.safetensors HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            time.sleep(0.3)
            assert server.connections() == 1
            assert timed_get(port)[2] < 3.0
            deadline = time.monotonic() + 6
            while server.connections() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert server.connections() == 0, "a client that stopped reading was not dropped"
        finally:
            stalled.close()
