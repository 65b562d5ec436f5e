"""The site side of a federation: a Flower ClientApp that trains a glcomp program locally.

``GlcompClient(program, sites, ...).app()`` is a `flwr.clientapp.ClientApp`. On a train message
it checks the global weights it received (as the server checks updates: names, shapes, float32,
finite), loads them into the site's runtime (GL or reference; optimizer state reset, or the
site's own kept from its previous round), trains the local epochs on the site's data and replies
with the new weights (an ArrayRecord ``"arrays"``), a MetricRecord ``"metrics"``
(``num-examples``, ``steps``, ``train-loss-first/last/mean/min``, ``update-norm``, ``lr``) and a
ConfigRecord ``"site"`` (the site's name, runtime kind, GL renderer and whole loss curve). The data
never leaves the site. On an evaluate message it reports ``accuracy``/``loss`` of the received
weights on the site's held-out data (or its training data).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.federated import _flwr
from glcomp.federated.core import (
    OPTIMIZER_MODES,
    Site,
    check_array_record,
    evaluate,
    federated_shapes,
    local_train,
)
from glcomp.federated.privacy import ClipAndNoise, as_dp

# Record keys in messages (Flower's strategies send "arrays" and "config").
ARRAYS_KEY = "arrays"
CONFIG_KEY = "config"
METRICS_KEY = "metrics"
SITE_KEY = "site"
# Keys of a site's own state, kept by Flower in the node's Context between rounds.
_STATE_OPTIMIZER = "glcomp.optimizer"
_STATE_COUNTERS = "glcomp.counters"

# Per process: programs loaded and runtimes made (a GL runtime compiles its shaders once), by the
# client's token; a ClientApp is pickled into every simulation worker, its caches are not.
_CACHE: dict[tuple[Any, ...], Any] = {}
_LOCK = threading.Lock()


class GlcompClient:
    """A site (or, in a simulation, every site) of a federation training `program`.

    `program`: a `glcomp.Program` (compiled, or loaded with `glcomp.load`) or a bundle directory
    (loaded where the client runs). `sites`: a sequence of `Site`, the one for a node chosen by its
    ``partition-id`` node config (as Flower's simulation sets it, or ``flower-supernode
    --node-config "partition-id=0"``), or a function of the node's `flwr.app.Context` returning
    its Site. `epochs`, `steps` (a cap on steps per round), `lr` and the FedProx ``proximal-mu``
    may also come from the server's train config (keys ``local-epochs``, ``local-steps``, ``lr``,
    ``proximal-mu``), which wins. `optimizer`: ``"reset"`` zeroes the optimizer state each round,
    ``"keep"`` carries the site's own state from its previous round over (kept in the node's
    Context). `audit_dir`: each site appends one JSON line per round to ``<audit_dir>/<site>.jsonl``
    with what it computed and sent (losses, update norm, bytes and a sha256 of every tensor).
    `dp`: clip each round's update to that L2 norm and add Gaussian noise before it leaves the
    site (a `glcomp.federated.privacy.ClipAndNoise`, or a ``(clip, noise_multiplier)`` pair; the
    audit records the update as trained, before clipping)."""

    def __init__(
        self,
        program: Any,
        sites: Sequence[Site] | Callable[[Any], Site],
        *,
        epochs: int = 1,
        steps: int | None = None,
        optimizer: str = "reset",
        seed: int = 0,
        lr: float | None = None,
        audit_dir: str | os.PathLike[str] | None = None,
        dp: ClipAndNoise | tuple[float, float] | None = None,
    ) -> None:
        if optimizer not in OPTIMIZER_MODES:
            raise GlcompError(f"optimizer must be one of {OPTIMIZER_MODES}, got {optimizer!r}")
        if isinstance(program, (str, os.PathLike)):
            self._program, self._path = None, str(program)
        else:
            if not hasattr(program, "params") or not hasattr(program, "runtime"):
                raise GlcompError(
                    f"program must be a glcomp.Program or a bundle directory, got {type(program).__name__}"
                )
            # Without the compiled-in Optimizer (it tracks runtimes for schedulers): the program is
            # pickled into every simulation worker.
            light = dataclasses.replace(program, optimizer=None)  # shares its lowering
            self._program, self._path = light, None
        if not callable(sites):
            sites = list(sites)
            for s in sites:
                if not isinstance(s, Site):
                    raise GlcompError(f"sites must be glcomp.federated.Site objects, got {type(s).__name__}")
        self.sites = sites
        self.epochs, self.steps, self.optimizer, self.seed, self.lr = epochs, steps, optimizer, seed, lr
        self.audit_dir = None if audit_dir is None else str(audit_dir)
        self.dp = as_dp(dp)
        self.token = uuid.uuid4().hex

    # -- the pieces, per process ---------------------------------------------------------------------
    def program(self) -> Any:
        if self._program is not None:
            return self._program
        key = ("program", self.token)
        with _LOCK:
            if key not in _CACHE:
                import glcomp

                _CACHE[key] = glcomp.load(self._path)
            return _CACHE[key]

    def site(self, context: Any) -> Site:
        if callable(self.sites):
            site = self.sites(context)
            if not isinstance(site, Site):
                raise GlcompError(f"the sites function returned a {type(site).__name__}, not a Site")
            return site
        pid = context.node_config.get("partition-id")
        if not isinstance(pid, int) or isinstance(pid, bool) or not 0 <= pid < len(self.sites):
            raise GlcompError(
                f"node {context.node_id}: node config partition-id {pid!r} names none of the "
                f"{len(self.sites)} sites (0..{len(self.sites) - 1})"
            )
        return self.sites[pid]

    def runtime(self, site: Site) -> Any:
        """The site's runtime, made once per process (a GL runtime compiles its shaders then)."""
        key = ("runtime", self.token, site.name, site.runtime)
        with _LOCK:
            rt = _CACHE.get(key)
            if rt is None:
                rt = self.program().runtime(site.runtime, **site.runtime_options)
                _CACHE[key] = rt
            return rt

    # -- message handlers ---------------------------------------------------------------------------
    def train(self, msg: Any, context: Any) -> Any:
        """Handle a Flower train message: the reply carries the site's new weights and metrics."""
        fl = _flwr()
        if "fitins.parameters" in msg.content.array_records:  # a SecAgg+ round (Flower's FitIns)
            from glcomp.federated.secure import legacy_train

            return legacy_train(self, msg, context)
        program = self.program()
        site = self.site(context)
        config = _config(msg)
        server_round = int(config.get("server-round", 0))
        expected = federated_shapes(program)
        global_weights = check_array_record(_arrays(msg), expected, "the server")
        epochs = _int_option(config, "local-epochs", self.epochs)
        steps = _int_option(config, "local-steps", self.steps)
        lr = _number_option(config, "lr", self.lr)
        mu = _number_option(config, "proximal-mu", 0.0)

        state = context.state
        opt: Any = "reset"
        if self.optimizer == "keep" and _STATE_OPTIMIZER in state.array_records:
            opt = {k: v.numpy() for k, v in state.array_records[_STATE_OPTIMIZER].items()}
        counters = None
        if _STATE_COUNTERS in state.array_records:
            counters = {k: v.numpy() for k, v in state.array_records[_STATE_COUNTERS].items()}

        t0 = time.perf_counter()
        result, renderer = self.train_locally(
            program,
            site,
            global_weights,
            server_round=server_round,
            epochs=epochs,
            steps=steps,
            optimizer=opt,
            counters=counters,
            lr=None if lr is None else float(lr),
            proximal_mu=mu,
        )
        seconds = time.perf_counter() - t0
        if self.optimizer == "keep":
            state.array_records[_STATE_OPTIMIZER] = fl.app.ArrayRecord(
                {k: fl.app.Array(np.ascontiguousarray(v)) for k, v in result.opt_state.items()}
            )
        if result.counters:
            state.array_records[_STATE_COUNTERS] = fl.app.ArrayRecord(
                {k: fl.app.Array(np.ascontiguousarray(v)) for k, v in result.counters.items()}
            )

        arrays = fl.app.ArrayRecord({k: fl.app.Array(v) for k, v in result.weights.items()})
        metrics = fl.app.MetricRecord(result.metrics() | {"train-seconds": float(seconds)})
        info = fl.app.ConfigRecord(
            {
                "name": site.name,
                "runtime": site.runtime,
                "renderer": renderer,
                "loss-curve": [float(x) for x in result.losses],
            }
        )
        if self.audit_dir is not None:
            self._audit(site, server_round, result, renderer, arrays, seconds)
        content = fl.app.RecordDict({ARRAYS_KEY: arrays, METRICS_KEY: metrics, SITE_KEY: info})
        return fl.app.Message(content=content, reply_to=msg)

    def train_locally(
        self,
        program: Any,
        site: Site,
        global_weights: dict[str, np.ndarray],
        *,
        server_round: int,
        epochs: int,
        steps: int | None,
        optimizer: Any = "reset",
        counters: Any = None,
        lr: float | None = None,
        proximal_mu: float = 0.0,
    ) -> tuple[Any, str]:
        """One round of local training at `site`: (`local_train`'s LocalResult, the renderer).
        A browser site (glcomp.federated.site.BrowserClient) hands the round to its page instead."""
        rt = self.runtime(site)
        result = local_train(
            rt,
            program,
            site.data,
            global_weights,
            site=site.name,
            epochs=epochs,
            steps=steps,
            seed=self.seed,
            server_round=server_round,
            optimizer=optimizer,
            counters=counters,
            lr=lr,
            proximal_mu=proximal_mu,
        )
        return result, _renderer(rt, site.runtime)

    def evaluate(self, msg: Any, context: Any) -> Any:
        """Handle a Flower evaluate message: metrics of the received weights on the site's data."""
        fl = _flwr()
        program = self.program()
        site = self.site(context)
        weights = check_array_record(_arrays(msg), federated_shapes(program), "the server")
        rt = self.runtime(site)
        own = rt.state_dict()
        rt.load_state_dict({**own, **weights})
        data = site.eval_data if site.eval_data is not None else site.data
        metrics = evaluate(rt, program, data, f"site {site.name!r}: evaluation")
        content = fl.app.RecordDict(
            {METRICS_KEY: fl.app.MetricRecord(metrics), SITE_KEY: fl.app.ConfigRecord({"name": site.name})}
        )
        return fl.app.Message(content=content, reply_to=msg)

    def app(self, mods: Sequence[Any] | None = None, secure: bool = False) -> Any:
        """A `flwr.clientapp.ClientApp` running this client (`mods`: Flower client mods; `secure`
        adds Flower's `secaggplus_mod`, which masks the reply of a SecAgg+ round). The client's
        `dp` mod comes last, innermost: it clips and noises the reply before any other mod (and
        secaggplus_mod's masking) sees it."""
        fl = _flwr()
        mods = list(mods or [])
        if secure:
            from flwr.client.mod import secaggplus_mod

            mods.append(secaggplus_mod)
        if self.dp is not None:
            mods.append(self.dp)
        app = fl.clientapp.ClientApp(mods=mods)
        app.train()(self.train)
        app.evaluate()(self.evaluate)
        return app

    # -- audit ----------------------------------------------------------------------------------------
    def _audit(
        self, site: Site, server_round: int, result: Any, renderer: str, arrays: Any, seconds: float
    ) -> None:
        folder = Path(self.audit_dir or ".")
        folder.mkdir(parents=True, exist_ok=True)
        tensors = {
            k: {"bytes": len(a.data), "sha256": hashlib.sha256(a.data).hexdigest()} for k, a in arrays.items()
        }
        line = {
            "round": server_round,
            "site": site.name,
            "runtime": site.runtime,
            "renderer": renderer,
            "time": time.time(),
            "train_seconds": seconds,
            "metrics": result.metrics(),
            "losses": result.losses,
            "sent_bytes": sum(t["bytes"] for t in tensors.values()),
            "tensors": tensors,
        }
        safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in site.name) or "site"
        with open(folder / f"{safe}.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(line) + "\n")


def client_app(program: Any, sites: Sequence[Site] | Callable[[Any], Site], **options: Any) -> Any:
    """A Flower ClientApp training `program` at each site: ``GlcompClient(program, sites,
    **options).app()`` (see GlcompClient for the options, ``dp`` among them; ``mods=[...]`` adds
    Flower mods such as ``secaggplus_mod``)."""
    mods = options.pop("mods", None)
    return GlcompClient(program, sites, **options).app(mods=mods)


def _arrays(msg: Any) -> Any:
    content = msg.content
    if ARRAYS_KEY in content.array_records:
        return content.array_records[ARRAYS_KEY]
    records = list(content.array_records.values())
    if len(records) != 1:
        raise GlcompError(
            f"the server's message holds {len(records)} ArrayRecords; expected one ({ARRAYS_KEY!r})"
        )
    return records[0]


def _config(msg: Any) -> dict[str, Any]:
    records = msg.content.config_records
    rec = records.get(CONFIG_KEY)
    return dict(rec) if rec is not None else {}


def _int_option(config: dict[str, Any], key: str, default: int | None) -> Any:
    if key not in config:
        return default
    value = config[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GlcompError(f"the server's config {key!r} must be a positive integer, got {value!r}")
    return value


def _number_option(config: dict[str, Any], key: str, default: float | None) -> Any:
    if key not in config:
        return default
    value = config[key]
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise GlcompError(f"the server's config {key!r} must be a finite number, got {value!r}")
    return float(value)


def _renderer(rt: Any, kind: str) -> str:
    if kind != "gl":
        return "numpy"
    try:
        return str(rt.info()["renderer"])
    except Exception:  # a renderer that cannot be queried is no reason to drop the update
        return "unknown"
