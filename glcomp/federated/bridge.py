"""A browser site's bridge: the page that trains (glcomp.js) on one side, the site's Flower
ClientApp on the other, over HTTP on 127.0.0.1 only.

``glcomp federated site --browser`` starts a `Bridge` in its own process. It serves the site page
(glcomp/pages/site.html beside the runtime's modules, glcomp/runtime/js/) and the site's bundle, and two APIs:

- the page's (same origin only): ``GET /api/job`` long-polls for the next round's job (the global
  weights, the local epochs or steps, the learning rate, the batch order), ``POST
  /api/job/<id>/update`` hands back the trained weights with the example count and the loss of
  every step, ``POST /api/job/<id>/fail`` reports that the page could not train, ``POST
  /api/data`` tells the bridge how many rows the page holds (never the rows);
- the ClientApp's (a random token in the ``X-Glcomp-Token`` header, which only the site's own
  SuperNode knows from its node config): ``POST /bridge/train`` with the global weights and
  the round's config, answered with the page's checked update (or a 422 naming what was wrong).

The page holds the data; what crosses the bridge is weights, row counts, losses and metrics.
Everything the page sends is untrusted: an update must hold exactly the program's tensors,
float32, of their shapes, finite, with one finite loss per step and the example count the page
registered; a bad one is refused with a GlcompError naming the site and is never handed to the
ClientApp (so it never reaches the server). The batch order of a round is computed here, from
the seed, the round and the site's name, exactly as a Python site computes it
(`glcomp.federated.core.local_train`), so a page and a Python site given the same data and
global weights train the same steps.
"""

from __future__ import annotations

import base64
import binascii
import http.server
import json
import math
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import numpy as np

from glcomp.errors import GlcompError
from glcomp.federated.core import LocalResult, federated_shapes, shuffle_seed, update_norm

HOST = "127.0.0.1"
JS_DIR = Path(__file__).resolve().parents[1] / "runtime" / "js"
PAGES_DIR = Path(__file__).resolve().parents[1] / "pages"  # site.html and site.js, served beside JS_DIR
PAGE = "site.html"
TOKEN_HEADER = "X-Glcomp-Token"
# How long a page's GET /api/job waits for a job before answering 204 (it asks again).
POLL_SECONDS = 15.0
# Bytes of JSON beyond the weights' base64 that a request may carry (losses, metrics, names).
_JSON_SLACK = 1 << 20
_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
}


def encode_tensors(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Tensors as JSON: name -> {shape, dtype "float32", data: base64 of little-endian float32}."""
    out = {}
    for k, v in arrays.items():
        a = np.ascontiguousarray(v, dtype="<f4")
        out[k] = {"shape": list(a.shape), "dtype": "float32", "data": base64.b64encode(a.tobytes()).decode()}
    return out


def decode_tensors(obj: Any, expected: Mapping[str, tuple[int, ...]], source: str) -> dict[str, np.ndarray]:
    """`encode_tensors`'s JSON back as float32 arrays, checked before decoding (exactly the
    expected names, dtype float32, the expected shape, as many bytes as that shape needs); the
    caller checks the values (`check_update`). GlcompError naming `source` and every problem."""
    if not isinstance(obj, dict):
        raise GlcompError(f"update from {source} rejected: weights must be an object of name -> tensor")
    problems = []
    missing = [k for k in expected if k not in obj]
    extra = [str(k)[:80] for k in obj if k not in expected]
    if missing:
        problems.append(f"missing tensors {missing}")
    if extra:
        problems.append(f"unexpected tensors {extra[:8]}" + (" ..." if len(extra) > 8 else ""))
    out: dict[str, np.ndarray] = {}
    for name, shape in expected.items():
        t = obj.get(name)
        if t is None:
            continue
        if not isinstance(t, dict) or not isinstance(t.get("data"), str):
            problems.append(f"tensor {name!r} is not {{shape, dtype, data}}")
            continue
        got = t.get("shape")
        if not isinstance(got, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in got):
            problems.append(f"tensor {name!r} has no shape list")
            continue
        if tuple(got) != tuple(shape):
            problems.append(f"tensor {name!r} has shape {tuple(got)}, expected {tuple(shape)}")
            continue
        if t.get("dtype") != "float32":
            problems.append(f"tensor {name!r} has dtype {str(t.get('dtype'))[:20]!r}, expected float32")
            continue
        size = 4 * math.prod(shape)
        if len(t["data"]) != 4 * ((size + 2) // 3):
            problems.append(f"tensor {name!r} carries {len(t['data'])} base64 characters, not {size} bytes")
            continue
        try:
            raw = base64.b64decode(t["data"], validate=True)
        except (binascii.Error, ValueError):
            problems.append(f"tensor {name!r} is not base64")
            continue
        out[name] = np.frombuffer(raw, dtype="<f4").astype(np.float32).reshape(shape)
    if problems:
        raise GlcompError(f"update from {source} rejected: " + "; ".join(problems))
    return out


def batch_order(n: int, batch: int, total: int, seed: int, server_round: int, site: str) -> list[int]:
    """The rows of a round's `total` steps, flat (`batch` per step): the order `local_train`
    visits them in (a fresh permutation each epoch, the last partial batch dropped)."""
    rng = np.random.default_rng(shuffle_seed(seed, server_round, site))
    per_epoch = n // batch
    rows: list[int] = []
    order, pos = np.empty(0, np.int64), per_epoch
    for _ in range(total):
        if pos == per_epoch:
            order, pos = rng.permutation(n), 0
        rows += order[pos * batch : (pos + 1) * batch].tolist()
        pos += 1
    return rows


class _Job:
    def __init__(self, job_id: int, payload: dict[str, Any], start: dict[str, np.ndarray]) -> None:
        self.id, self.payload, self.start = job_id, payload, start
        self.done = threading.Event()
        self.result: LocalResult | None = None
        self.error: str | None = None
        self.renderer = "unknown"


class Bridge:
    """The bridge of one browser site training `program` (its bundle in `bundle_dir`, served to
    the page). `port` 0 picks a free port (`self.port`); OSError when the port is taken.
    `job_timeout`: seconds a round waits for the page (to register its data and to train)."""

    def __init__(
        self,
        program: Any,
        site: str,
        bundle_dir: str | Path,
        *,
        port: int = 0,
        job_timeout: float = 600.0,
        progress: Any = print,
    ) -> None:
        self.program, self.site, self.bundle_dir = program, site, Path(bundle_dir).resolve()
        self.expected = federated_shapes(program)
        self.trainable = [k for k in (program.trainable or program.params) if k in self.expected]
        self.batch = int(next(iter(program.inputs.values())).shape[0])
        self.job_timeout, self.progress = float(job_timeout), progress
        self.token = secrets.token_urlsafe(24)
        self.rows: int | None = None  # the rows the page holds (it tells the count, never the rows)
        self.rounds: list[dict[str, Any]] = []  # what each round sent (shown by the page too)
        self._lock = threading.Condition()
        self._job: _Job | None = None
        self._next_id = 1
        self.httpd = _Server((HOST, int(port)), _Handler)
        self.httpd.bridge = self
        self.port = int(self.httpd.server_address[1])
        self.url = f"http://{HOST}:{self.port}/"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True
        )

    def start(self) -> Bridge:
        self._thread.start()
        return self

    def close(self) -> None:
        with self._lock:
            if self._job is not None and not self._job.done.is_set():
                self._job.error = f"site {self.site!r}: the bridge stopped before the page answered"
                self._job.done.set()
            self._lock.notify_all()
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> Bridge:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    # -- the ClientApp's side ------------------------------------------------------------------
    def train(
        self,
        global_weights: Mapping[str, np.ndarray],
        *,
        server_round: int,
        epochs: int = 1,
        steps: int | None = None,
        seed: int = 0,
        lr: float | None = None,
        proximal_mu: float = 0.0,
    ) -> tuple[LocalResult, str]:
        """One round of local training in the page: (the checked result, the page's renderer).
        GlcompError naming the site when the page holds no data in time, fails, or sends a bad
        update (nothing of which is returned)."""
        from glcomp.federated.core import check_update

        where = f"site {self.site!r}"
        start = check_update(dict(global_weights), self.expected, "the server")
        deadline = time.monotonic() + self.job_timeout
        with self._lock:
            while self.rows is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise GlcompError(
                        f"{where}: no page registered its data within {self.job_timeout:.0f} s ({self.url})"
                    )
                self._lock.wait(min(left, 1.0))
            n = self.rows
            if n < self.batch:
                raise GlcompError(f"{where}: the page holds {n} rows, fewer than one batch of {self.batch}")
            total = (
                epochs * (n // self.batch) if steps is None else min(int(steps), epochs * (n // self.batch))
            )
            payload = {
                "round": int(server_round),
                "site": self.site,
                "rows": n,
                "batch": self.batch,
                "steps": total,
                "epochs": int(epochs),
                "lr": lr,
                "proximal_mu": float(proximal_mu),
                "trainable": self.trainable,
                "order": batch_order(n, self.batch, total, seed, server_round, self.site),
                "weights": encode_tensors(start),
            }
            job = _Job(self._next_id, payload | {"id": self._next_id}, start)
            self._next_id += 1
            if self._job is not None and not self._job.done.is_set():
                self._job.error = f"{where}: superseded by round {server_round}"
                self._job.done.set()
            self._job = job
            self._lock.notify_all()
        self._say(
            f"site {self.site}: round {server_round}: sent the global weights to the page ({total} steps)"
        )
        if not job.done.wait(max(0.0, deadline - time.monotonic())):
            raise GlcompError(
                f"{where}: the page did not answer round {server_round} within {self.job_timeout:.0f} s"
            )
        if job.error is not None:
            raise GlcompError(job.error)
        assert job.result is not None
        return job.result, job.renderer

    # -- the page's side ------------------------------------------------------------------------
    def wait_job(self, after: int, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                job = self._job
                if job is not None and job.id > after and not job.done.is_set():
                    return job.payload
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(min(left, 1.0))

    def set_rows(self, rows: Any) -> None:
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise GlcompError(
                f"site {self.site!r}: the page's row count must be a positive integer, got {rows!r}"
            )
        with self._lock:
            self.rows = rows
            self._lock.notify_all()
        self._say(f"site {self.site}: the page holds {rows} rows")

    def _current(self, job_id: int) -> _Job:
        with self._lock:
            job = self._job
        if job is None or job.id != job_id or job.done.is_set():
            raise GlcompError(f"site {self.site!r}: job {job_id} is not waiting for an answer")
        return job

    def page_failed(self, job_id: int, reason: Any) -> None:
        job = self._current(job_id)
        job.error = (
            f"site {self.site!r}: the page could not train round {job.payload['round']}: {str(reason)[:500]}"
        )
        job.done.set()

    def page_update(self, job_id: int, body: Any) -> dict[str, Any]:
        """Check the page's answer to a job; on a bad one the round's ClientApp call fails with
        the GlcompError (naming the site) and nothing of the update is kept."""
        job = self._current(job_id)
        try:
            result = self._check(job, body)
        except GlcompError as err:
            job.error = str(err)
            job.done.set()
            self._say(f"site {self.site}: round {job.payload['round']}: {err}")
            raise
        renderer = body.get("renderer")
        job.renderer = str(renderer)[:200] if isinstance(renderer, str) else "unknown"
        sent = {
            "round": job.payload["round"],
            "steps": result.steps,
            "num-examples": result.num_examples,
            "loss-first": result.losses[0],
            "loss-last": result.losses[-1],
            "update-norm": result.update_norm,
            "bytes": int(sum(4 * v.size for v in result.weights.values())),
            "tensors": {
                k: {"shape": list(v.shape), "norm": float(np.linalg.norm(v.astype(np.float64)))}
                for k, v in result.weights.items()
            },
        }
        self.rounds.append(sent)
        job.result = result
        job.done.set()
        self._say(
            f"site {self.site}: round {sent['round']}: the page trained {result.steps} steps "
            f"(loss {result.losses[0]:.4f} -> {result.losses[-1]:.4f}), sent {sent['bytes']} bytes of "
            f"weights, update norm {result.update_norm:.4g}"
        )
        return sent

    def _check(self, job: _Job, body: Any) -> LocalResult:
        from glcomp.federated.core import check_update

        source = f"site {self.site!r} (its page) in round {job.payload['round']}"
        if not isinstance(body, dict):
            raise GlcompError(f"update from {source} rejected: not a JSON object")
        weights = check_update(
            decode_tensors(body.get("weights"), self.expected, source), self.expected, source
        )
        n = body.get("num_examples")
        if n != job.payload["rows"] or isinstance(n, bool):
            raise GlcompError(
                f"update from {source} rejected: num_examples {str(n)[:40]}, "
                f"but the page registered {job.payload['rows']} rows"
            )
        losses = body.get("losses")
        steps = job.payload["steps"]
        if not isinstance(losses, list) or len(losses) != steps:
            got = len(losses) if isinstance(losses, list) else type(losses).__name__
            raise GlcompError(f"update from {source} rejected: {got} losses for {steps} steps")
        if not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in losses
        ):
            raise GlcompError(f"update from {source} rejected: the losses must be finite numbers")
        lr = body.get("lr")
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not math.isfinite(lr):
            raise GlcompError(f"update from {source} rejected: lr must be a finite number")
        return LocalResult(
            weights=weights,
            num_examples=int(n),
            losses=[float(x) for x in losses],
            steps=steps,
            update_norm=update_norm(weights, job.start),
            opt_state={},
            counters={},
            lr=float(lr),
        )

    def state(self) -> dict[str, Any]:
        with self._lock:
            job = self._job
            waiting = job is not None and not job.done.is_set()
        return {"site": self.site, "rows": self.rows, "waiting": waiting, "rounds": self.rounds}


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True  # SO_REUSEADDR: a port in TIME_WAIT binds, one listened on does not
    bridge: Bridge

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a page closed mid-poll is no error
            super().handle_error(request, client_address)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- helpers -----------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj, allow_nan=False).encode())

    def _host_ok(self) -> bool:
        bridge = self.server.bridge
        return self.headers.get("Host") in (f"{HOST}:{bridge.port}", f"localhost:{bridge.port}")

    def _same_origin(self) -> bool:
        port = self.server.bridge.port
        return self.headers.get("Origin") in (f"http://{HOST}:{port}", f"http://localhost:{port}")

    def _body(self) -> Any:
        bridge = self.server.bridge
        limit = sum(8 * math.prod(s) for s in bridge.expected.values()) + _JSON_SLACK
        try:
            size = int(self.headers.get("Content-Length", ""))
        except ValueError:
            raise GlcompError("a request body needs a Content-Length") from None
        if not 0 <= size <= limit:
            raise GlcompError(
                f"a request body of {size} bytes is more than this model's updates need ({limit})"
            )
        try:
            return json.loads(self.rfile.read(size))
        except ValueError as err:
            raise GlcompError(f"the request body is not JSON ({err})") from None

    # -- GET ----------------------------------------------------------------------------------------
    def do_GET(self) -> None:
        if not self._host_ok():
            return self._json(403, {"error": "wrong Host"})
        bridge = self.server.bridge
        url = urlparse(self.path)
        path = url.path
        if path == "/api/job":
            try:
                after = int(parse_qs(url.query).get("after", ["0"])[0])
            except ValueError:
                after = 0
            job = bridge.wait_job(after, POLL_SECONDS)
            if job is None:
                return self._send(204, b"")
            return self._json(200, job)
        if path == "/api/state":
            return self._json(200, bridge.state())
        if path == "/":
            path = "/" + PAGE
        name = path.lstrip("/")
        if name.startswith("bundle/"):  # the bundle's own files
            folder, parts = bridge.bundle_dir, name[len("bundle/") :].split("/")
        else:  # the page and the runtime's modules (and their subfolders), .js and .html only
            parts = name.split("/")
            folder = PAGES_DIR if len(parts) == 1 and (PAGES_DIR / parts[0]).is_file() else JS_DIR
            if not name.endswith((".js", ".html")):
                return self._json(404, {"error": "not found"})
        if not all(part and not part.startswith(".") and "\\" not in part for part in parts):
            return self._json(404, {"error": "not found"})
        file = folder.joinpath(*parts)
        if not file.is_file() or not file.resolve().is_relative_to(folder.resolve()):
            return self._json(404, {"error": "not found"})
        self._send(200, file.read_bytes(), _TYPES.get(file.suffix, "application/octet-stream"))

    # -- POST ---------------------------------------------------------------------------------------
    def do_POST(self) -> None:
        if not self._host_ok():
            return self._json(403, {"error": "wrong Host"})
        bridge = self.server.bridge
        path = urlparse(self.path).path
        try:
            if path == "/bridge/train":
                if not secrets.compare_digest(self.headers.get(TOKEN_HEADER, ""), bridge.token):
                    return self._json(403, {"error": "wrong token"})
                return self._client_train(self._body())
            if not self._same_origin():
                return self._json(403, {"error": "cross-origin requests are refused"})
            body = self._body()
            if path == "/api/data":
                bridge.set_rows(body.get("rows") if isinstance(body, dict) else None)
                return self._json(200, {"rows": bridge.rows})
            parts = path.strip("/").split("/")
            if len(parts) == 4 and parts[:2] == ["api", "job"] and parts[2].isdigit():
                job_id = int(parts[2])
                if parts[3] == "update":
                    return self._json(200, bridge.page_update(job_id, body))
                if parts[3] == "fail":
                    bridge.page_failed(job_id, body.get("error") if isinstance(body, dict) else body)
                    return self._json(200, {})
            return self._json(404, {"error": "not found"})
        except GlcompError as err:
            return self._json(422, {"error": str(err)})

    def _client_train(self, body: Any) -> None:
        bridge = self.server.bridge
        if not isinstance(body, dict):
            raise GlcompError("/bridge/train: expected a JSON object")
        weights = decode_tensors(body.get("weights"), bridge.expected, "the server")
        try:
            options = {
                "server_round": int(body.get("round", 0)),
                "epochs": int(body.get("epochs", 1)),
                "steps": None if body.get("steps") is None else int(body["steps"]),
                "seed": int(body.get("seed", 0)),
                "lr": None if body.get("lr") is None else float(body["lr"]),
                "proximal_mu": float(body.get("proximal_mu", 0.0)),
            }
        except (TypeError, ValueError) as err:
            raise GlcompError(f"/bridge/train: a bad round config ({err})") from None
        if options["epochs"] < 1 or (options["steps"] is not None and options["steps"] < 1):
            raise GlcompError("/bridge/train: local epochs and steps must be positive")
        result, renderer = bridge.train(weights, **options)
        self._json(
            200,
            {
                "weights": encode_tensors(result.weights),
                "num_examples": result.num_examples,
                "losses": result.losses,
                "lr": result.lr,
                "renderer": renderer,
            },
        )


def request_train(
    url: str,
    token: str,
    global_weights: Mapping[str, np.ndarray],
    expected: Mapping[str, tuple[int, ...]],
    *,
    site: str,
    timeout: float,
    **config: Any,
) -> tuple[LocalResult, str]:
    """The ClientApp's call to its bridge (`url`, `token` from the node config): the page's
    checked update for one round, checked again here. GlcompError naming the site otherwise."""
    import urllib.error
    import urllib.request

    from glcomp.federated.core import check_update

    body = json.dumps({"weights": encode_tensors(global_weights), **config}).encode()
    req = urllib.request.Request(
        url.rstrip("/") + "/bridge/train",
        data=body,
        headers={"Content-Type": "application/json", TOKEN_HEADER: token},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            reply = json.loads(resp.read())
    except urllib.error.HTTPError as err:
        try:
            reason = json.loads(err.read()).get("error", err.reason)
        except ValueError:
            reason = err.reason
        raise GlcompError(str(reason)) from None
    except (OSError, ValueError) as err:
        raise GlcompError(f"site {site!r}: its browser bridge at {url} did not answer ({err})") from None
    source = f"site {site!r} (its bridge)"
    weights = check_update(decode_tensors(reply.get("weights"), expected, source), expected, source)
    start = {k: np.asarray(v, np.float32) for k, v in global_weights.items()}
    losses = [float(x) for x in reply["losses"]]
    result = LocalResult(
        weights=weights,
        num_examples=int(reply["num_examples"]),
        losses=losses,
        steps=len(losses),
        update_norm=update_norm(weights, start),
        opt_state={},
        counters={},
        lr=float(reply["lr"]),
    )
    return result, str(reply.get("renderer", "unknown"))


__all__ = ["Bridge", "batch_order", "decode_tensors", "encode_tensors", "request_train"]
