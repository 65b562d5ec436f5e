"""The demo server's resource bounds: streamed files, a fixed worker pool, idle timeouts."""

from __future__ import annotations

import http.client
import resource
import socket
import threading
import time
from pathlib import Path

import numpy as np

from glcomp.serve import make_server


def _bundle_with_big_file(tmp_path: Path, mb: int) -> Path:
    bundle = tmp_path / "b"
    bundle.mkdir()
    (bundle / "manifest.json").write_text("{}")
    block = np.random.default_rng(0).bytes(1 << 20)
    with open(bundle / "weights.safetensors", "wb") as f:
        for _ in range(mb):
            f.write(block)
    return bundle


def _threads() -> int:
    return threading.active_count()


def test_large_files_are_streamed_not_read_whole(tmp_path: Path) -> None:
    mb = 64
    bundle = _bundle_with_big_file(tmp_path, mb)
    server = make_server(bundle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        conns = []
        for _ in range(4):  # slow readers: each reads only the first chunk, then stalls
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/bundle/weights.safetensors")
            res = conn.getresponse()
            assert res.status == 200 and int(res.getheader("Content-Length")) == mb << 20
            assert len(res.read(1 << 16)) == 1 << 16
            conns.append(conn)
        time.sleep(0.5)
        grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
        # Reading the file whole per request would take 4 x 64 MB; streaming holds a few chunks.
        assert grown_mb < mb, f"peak memory grew by {grown_mb:.0f} MB for 4 readers of a {mb} MB file"
        for conn in conns:
            conn.close()
        # A full read still returns the exact bytes.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/bundle/weights.safetensors")
        body = conn.getresponse().read()
        conn.close()
        assert body == (bundle / "weights.safetensors").read_bytes()
    finally:
        server.shutdown()
        server.server_close()


def test_idle_connections_use_a_bounded_pool_and_time_out(tmp_path: Path) -> None:
    bundle = _bundle_with_big_file(tmp_path, 1)
    server = make_server(bundle, workers=4, timeout=0.5)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    base = _threads()
    idle = []
    try:
        for _ in range(16):  # connect and send nothing
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            idle.append(s)
        time.sleep(0.5)
        assert _threads() - base <= 4, f"{_threads() - base} threads for 16 idle connections"
        # The idle clients are dropped after the timeout and the server serves again.
        time.sleep(2.5)  # 16 connections / 4 workers x 0.5 s
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/bundle/manifest.json")
        assert conn.getresponse().status == 200
        conn.close()
        closed = 0
        for s in idle[:4]:
            s.settimeout(5)
            try:
                closed += s.recv(1) == b""
            except OSError:
                closed += 1
        assert closed == 4, "idle connections were not closed after the timeout"
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()
