"""The server side of a federation: a Flower ServerApp around a Flower strategy.

``GlcompServer(program, out_dir, ...).app()`` is a `flwr.serverapp.ServerApp` whose main runs
``strategy.start(...)`` of a Flower strategy (FedAvg by default; FedProx, FedAdam or any
`flwr.serverapp.strategy.Strategy` instance), wrapped so that

- every training reply is checked before the strategy sees it (exactly one ArrayRecord holding
  the program's tensors, float32, of their shapes, finite; a positive ``num-examples``; numeric
  metrics): a bad reply is rejected with a GlcompError naming the node, the site it claims to be
  and the tensor, logged, recorded in the round's ``round.json``, and left out of the aggregate
  (``on_reject="fail"`` ends the run with that error instead);
- the aggregate is float32 and finite, else the run ends with a GlcompError (a diverged server
  optimizer must not be sent to the sites);
- after every round the global model is evaluated on the held-out data (server side, on the
  reference runtime by default) and saved as a glcomp bundle in ``out_dir/round-NNNN/model``
  (see `RoundStore`), and a restarted server resumes after its last saved round, with the
  strategy's own state (FedAdam's moments) and the round numbering carried over.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Mapping
from logging import WARNING
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.federated import _flwr
from glcomp.federated.client import ARRAYS_KEY, SITE_KEY
from glcomp.federated.core import RUNTIME_KINDS, RoundStore, check_array_record, evaluate, federated_shapes

# Strategy names -> flwr.serverapp.strategy classes.
STRATEGIES = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedadam": "FedAdam"}
ON_REJECT = ("skip", "fail")
# Attributes of Flower's adaptive strategies that hold server optimizer state between rounds.
_STRATEGY_STATE = ("m_t", "v_t")


def _log(level: int, text: str) -> None:
    from flwr.supercore import log

    log(level, "%s", text)


class _Checked:
    """Builds the Strategy wrapper class once Flower is imported (its base class is Flower's)."""

    cls: Any = None


def _checked_strategy_class() -> Any:
    if _Checked.cls is not None:
        return _Checked.cls
    fl = _flwr()
    base = fl.serverapp.strategy.Strategy

    class CheckedStrategy(base):  # type: ignore[misc, valid-type]
        """A Flower strategy whose replies are checked first (see the module docstring).

        Delegates everything to `inner`; `offset` is the number of rounds already done before a
        resumed start (Flower's `start` counts from 1 again, the inner strategy and the sites see
        the true round)."""

        def __init__(
            self,
            inner: Any,
            expected: Mapping[str, tuple[int, ...]],
            on_reject: str = "skip",
            offset: int = 0,
            max_examples: int = 10**9,
        ) -> None:
            self.inner = inner
            self.expected = dict(expected)
            self.on_reject = on_reject
            self.offset = offset
            self.max_examples = max_examples
            self.rounds: dict[int, dict[str, Any]] = {}  # what each round received (for round.json)

        # -- delegation with the true round numbers --------------------------------------------
        def summary(self) -> None:
            self.inner.summary()

        def configure_train(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Iterable[Any]:
            return self.inner.configure_train(server_round + self.offset, arrays, config, grid)

        def configure_evaluate(self, server_round: int, arrays: Any, config: Any, grid: Any) -> Iterable[Any]:
            return self.inner.configure_evaluate(server_round + self.offset, arrays, config, grid)

        def aggregate_train(self, server_round: int, replies: Iterable[Any]) -> tuple[Any, Any]:
            true_round = server_round + self.offset
            replies = list(replies)
            record: dict[str, Any] = {"sites": [], "rejected": [], "failed": []}
            self.rounds[true_round] = record
            accepted = []
            for msg in replies:
                node = _node(msg)
                if msg.has_error():
                    record["failed"].append({"node": node, "reason": str(msg.error.reason)[:500]})
                    accepted.append(msg)  # the inner strategy counts and logs failures itself
                    continue
                try:
                    content, site = self._check_train_reply(msg, true_round)
                except GlcompError as err:
                    _log(WARNING, str(err))
                    record["rejected"].append({"node": node, "site": _claimed_site(msg), "error": str(err)})
                    if self.on_reject == "fail":
                        raise
                    continue
                msg.content = content
                accepted.append(msg)
                record["sites"].append(site)
            _common_metric_keys([m for m in accepted if not m.has_error()])
            if not any(not m.has_error() for m in accepted):
                _log(WARNING, f"round {true_round}: no update accepted; the global model stays as it was")
                return None, None
            arrays, metrics = self.inner.aggregate_train(true_round, accepted)
            if arrays is not None:
                arrays = self._check_aggregate(arrays, true_round)
            return arrays, metrics

        def aggregate_evaluate(self, server_round: int, replies: Iterable[Any]) -> Any:
            true_round = server_round + self.offset
            accepted = []
            for msg in replies:
                if msg.has_error():
                    accepted.append(msg)
                    continue
                try:
                    msg.content = self._check_metrics_only(msg, true_round)
                except GlcompError as err:
                    _log(WARNING, str(err))
                    self.rounds.setdefault(true_round, {}).setdefault("rejected_evaluate", []).append(
                        {"node": _node(msg), "site": _claimed_site(msg), "error": str(err)}
                    )
                    if self.on_reject == "fail":
                        raise
                    continue
                accepted.append(msg)
            _common_metric_keys([m for m in accepted if not m.has_error()])
            return self.inner.aggregate_evaluate(true_round, accepted)

        # -- checks -----------------------------------------------------------------------------
        def _source(self, msg: Any, true_round: int) -> str:
            site = _claimed_site(msg)
            who = f"node {_node(msg)}" + (f" (site {site!r})" if site else "")
            return f"{who} in round {true_round}"

        def _check_train_reply(self, msg: Any, true_round: int) -> tuple[Any, dict[str, Any]]:
            fl = _flwr()
            source = self._source(msg, true_round)
            content = msg.content
            records = content.array_records
            if len(records) != 1:
                raise GlcompError(f"update from {source} rejected: {len(records)} ArrayRecords, expected one")
            key = next(iter(records))
            weights = check_array_record(records[key], self.expected, source)
            metrics = self._metrics(content, source)
            new = fl.app.RecordDict(
                {
                    key: fl.app.ArrayRecord({k: fl.app.Array(v) for k, v in weights.items()}),
                    "metrics": fl.app.MetricRecord(metrics),
                }
            )
            site: dict[str, Any] = {"node": _node(msg), "metrics": metrics}
            info = content.config_records.get(SITE_KEY)
            if info is not None:
                for k in ("name", "runtime", "renderer"):
                    if isinstance(info.get(k), str):
                        site[k] = info[k][:200]
                curve = info.get("loss-curve")
                if isinstance(curve, list) and all(isinstance(x, (int, float)) for x in curve):
                    site["loss_curve"] = [float(x) if math.isfinite(x) else None for x in curve[:10000]]
            return new, site

        def _check_metrics_only(self, msg: Any, true_round: int) -> Any:
            fl = _flwr()
            source = self._source(msg, true_round)
            metrics = self._metrics(msg.content, source)
            return fl.app.RecordDict({"metrics": fl.app.MetricRecord(metrics)})

        def _metrics(self, content: Any, source: str) -> dict[str, Any]:
            records = content.metric_records
            if len(records) != 1:
                raise GlcompError(
                    f"update from {source} rejected: {len(records)} MetricRecords, expected one"
                )
            metrics = next(iter(records.values()))
            weight_key = getattr(self.inner, "weighted_by_key", "num-examples")
            n = metrics.get(weight_key)
            if (
                not isinstance(n, (int, float))
                or isinstance(n, bool)
                or not math.isfinite(n)
                or not 0 < n <= self.max_examples
            ):
                raise GlcompError(
                    f"update from {source} rejected: metric {weight_key!r} must be a number in "
                    f"(0, {self.max_examples}], got {n!r}"
                )
            out: dict[str, Any] = {}
            for k, v in metrics.items():  # scalars only: Flower averages lists element-wise
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                    out[k] = v
            return out

        def _check_aggregate(self, arrays: Any, true_round: int) -> Any:
            fl = _flwr()
            cast = {}
            for k, a in arrays.items():
                v = np.asarray(a.numpy())
                cast[k] = v.astype(np.float32) if v.dtype != np.float32 else v
            checked = check_array_record(
                fl.app.ArrayRecord({k: fl.app.Array(np.ascontiguousarray(v)) for k, v in cast.items()}),
                self.expected,
                f"the aggregation of round {true_round}",
            )
            return fl.app.ArrayRecord({k: fl.app.Array(v) for k, v in checked.items()})

        # -- server optimizer state (FedAdam's moments), saved with each round ----------------------
        def strategy_state(self) -> dict[str, np.ndarray]:
            out = {}
            for attr in _STRATEGY_STATE:
                value = getattr(self.inner, attr, None)
                if isinstance(value, dict):
                    out |= {f"{attr}/{k}": np.asarray(v) for k, v in value.items()}
            return out

        def load_strategy_state(self, state: Mapping[str, np.ndarray]) -> None:
            for attr in _STRATEGY_STATE:
                part = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(attr + "/")}
                if part and hasattr(self.inner, attr):
                    setattr(self.inner, attr, part)

    _Checked.cls = CheckedStrategy
    return CheckedStrategy


def _node(msg: Any) -> int:
    try:
        return int(msg.metadata.src_node_id)
    except Exception:
        return -1


def _claimed_site(msg: Any) -> str | None:
    """The site name a reply claims (untrusted; shortened)."""
    try:
        name = msg.content.config_records[SITE_KEY].get("name")
    except Exception:
        return None
    return name[:80] if isinstance(name, str) else None


def _common_metric_keys(messages: list[Any]) -> None:
    """Keep only the metric keys every reply has: Flower's checks refuse replies whose keys differ."""
    if not messages:
        return
    fl = _flwr()
    records = [next(iter(m.content.metric_records.values())) for m in messages]
    common = set(records[0])
    for r in records[1:]:
        common &= set(r)
    for m, r in zip(messages, records):
        if set(r) != common:
            key = next(iter(m.content.metric_records))
            m.content.metric_records[key] = fl.app.MetricRecord({k: v for k, v in r.items() if k in common})


class GlcompServer:
    """The server of a federation training `program` (a `glcomp.Program` or a bundle directory).

    `out_dir`: the federation directory (see `RoundStore`: ``round-NNNN/model`` is the global
    model after round N as a glcomp bundle; ``round-0000`` the initial one). `num_rounds`: the
    rounds of the whole federation, counting rounds a previous run of this server already saved
    there (a restarted server resumes after its last saved round; ``resume=False`` refuses a
    directory holding rounds). `strategy`: ``"fedavg"``, ``"fedprox"``, ``"fedadam"`` (with
    `strategy_options`, such as ``{"proximal_mu": 0.1}`` or ``{"eta": 0.01}``, passed to the Flower
    class) or a `flwr.serverapp.strategy.Strategy` instance. `min_clients`: sites sampled and
    required each round. `eval_data`: held-out inputs and target evaluated on the server after
    every round on `eval_runtime`. `local_epochs`, `local_steps`, `lr`: sent to the sites in the
    train config. `on_reject`: ``"skip"`` leaves a bad update out of the round, ``"fail"`` ends the
    run. `fraction_evaluate`: share of sites asked for client-side evaluation (0: none).
    `progress`: called with one line per round (default print; None for silence). `secure`: True
    (or SecAggPlusWorkflow options such as ``{"clipping_range": 8.0}``) aggregates with Flower's
    SecAgg+ (glcomp.federated.secure): FedAvg only, the sites' apps need ``secaggplus_mod``
    (``client.app(secure=True)``), and single updates cannot be checked, only their aggregate."""

    def __init__(
        self,
        program: Any,
        out_dir: str | os.PathLike[str],
        *,
        num_rounds: int = 3,
        strategy: Any = "fedavg",
        strategy_options: Mapping[str, Any] | None = None,
        min_clients: int = 2,
        eval_data: Mapping[str, Any] | None = None,
        eval_runtime: str = "reference",
        local_epochs: int | None = None,
        local_steps: int | None = None,
        lr: float | None = None,
        on_reject: str = "skip",
        keep_rounds: int | None = None,
        resume: bool = True,
        fraction_evaluate: float = 0.0,
        timeout: float = 3600.0,
        max_examples: int = 10**9,
        progress: Callable[[str], Any] | None = print,
        secure: bool | Mapping[str, Any] = False,
    ) -> None:
        if isinstance(program, (str, os.PathLike)):
            import glcomp

            program = glcomp.load(program)
        self.program = program
        self.out_dir = Path(out_dir)
        if not isinstance(num_rounds, int) or isinstance(num_rounds, bool) or num_rounds < 1:
            raise GlcompError(f"num_rounds must be a positive integer, got {num_rounds!r}")
        if isinstance(strategy, str) and strategy.lower() not in STRATEGIES:
            raise GlcompError(f"unknown strategy {strategy!r}; use one of {sorted(STRATEGIES)} or a Strategy")
        if eval_runtime not in RUNTIME_KINDS:
            raise GlcompError(f"eval_runtime must be 'gl' or 'reference', got {eval_runtime!r}")
        if on_reject not in ON_REJECT:
            raise GlcompError(f"on_reject must be 'skip' or 'fail', got {on_reject!r}")
        self.num_rounds, self.strategy, self.strategy_options = (
            num_rounds,
            strategy,
            dict(strategy_options or {}),
        )
        self.min_clients, self.eval_data, self.eval_runtime = min_clients, eval_data, eval_runtime
        self.train_config = {"local-epochs": local_epochs, "local-steps": local_steps, "lr": lr}
        self.on_reject, self.keep_rounds, self.resume = on_reject, keep_rounds, resume
        self.fraction_evaluate, self.timeout, self.max_examples = fraction_evaluate, timeout, max_examples
        self.progress = progress
        self.secure = secure
        self.store = RoundStore(self.out_dir, program, keep_rounds)
        self.result: Any = None  # Flower's Result of the last run
        self.checked: Any = None  # the CheckedStrategy of the last run (its .rounds)
        self.started_at = 0  # the round the last run resumed after

    def _make_strategy(self) -> Any:
        fl = _flwr()
        if not isinstance(self.strategy, str):
            if not isinstance(self.strategy, fl.serverapp.strategy.Strategy):
                raise GlcompError(
                    f"strategy must be a name or a flwr Strategy, got {type(self.strategy).__name__}"
                )
            return self.strategy
        cls = getattr(fl.serverapp.strategy, STRATEGIES[self.strategy.lower()])
        options = {
            "min_train_nodes": self.min_clients,
            "min_available_nodes": self.min_clients,
            "fraction_evaluate": self.fraction_evaluate,
            "min_evaluate_nodes": self.min_clients if self.fraction_evaluate else 0,
        } | self.strategy_options
        try:
            return cls(**options)
        except TypeError as err:
            raise GlcompError(f"{cls.__name__}: bad strategy_options ({err})") from None

    def main(self, grid: Any, context: Any) -> Any:
        """The ServerApp's main: resume or start, run the remaining rounds, return Flower's Result."""
        fl = _flwr()
        if self.secure:
            from glcomp.federated.secure import secure_main

            return secure_main(self, grid, context)
        self.store.open()
        expected = federated_shapes(self.program)
        saved = self.store.latest()
        if saved is not None and not self.resume:
            raise GlcompError(f"{self.out_dir}: holds round {saved.round} already; resume=True continues it")
        checked_cls = _checked_strategy_class()
        start = saved.round if saved is not None else 0
        checked = checked_cls(self._make_strategy(), expected, self.on_reject, start, self.max_examples)
        self.checked, self.started_at = checked, start
        if saved is not None:
            weights = saved.weights
            checked.load_strategy_state(saved.strategy_state)
        else:
            weights = {
                k: np.asarray((self.program.params | self.program.buffers)[k], np.float32) for k in expected
            }
        remaining = self.num_rounds - start
        rt = self.program.runtime(self.eval_runtime)
        try:
            rt.load_state_dict({**rt.state_dict(), **weights}, optimizer="reset")
            if remaining <= 0:
                self._say(
                    f"federated: {self.out_dir} holds round {start} of {self.num_rounds}; nothing to do"
                )
                return None
            if saved is not None:
                self._say(f"federated: resuming after round {start} (from {saved.path})")
            initial = fl.app.ArrayRecord(
                {k: fl.app.Array(np.ascontiguousarray(v)) for k, v in weights.items()}
            )
            config = fl.app.ConfigRecord({k: v for k, v in self.train_config.items() if v is not None})
            t0 = [time.perf_counter()]

            def evaluate_fn(server_round: int, arrays: Any) -> Any:
                true_round = server_round + start
                got = check_array_record(arrays, expected, f"the global model of round {true_round}")
                rt.load_state_dict({**rt.state_dict(), **got}, optimizer="reset")
                metrics = {}
                if self.eval_data is not None:
                    metrics = evaluate(rt, self.program, self.eval_data, "the server's held-out data")
                if server_round == 0 and saved is not None:
                    return fl.app.MetricRecord(metrics) if metrics else None
                now = time.perf_counter()
                info = self._round_info(true_round, metrics, checked, now - t0[0])
                t0[0] = now
                self.store.save(true_round, rt, info, checked.strategy_state())
                self._say(_round_line(info, self.num_rounds))
                return fl.app.MetricRecord(metrics) if metrics else None

            self.result = checked.start(
                grid=grid,
                initial_arrays=initial,
                num_rounds=remaining,
                timeout=self.timeout,
                train_config=config,
                evaluate_fn=evaluate_fn,
            )
        finally:
            rt.release()
        last = self.store.latest()
        acc = last.info.get("global", {}).get("accuracy") if last else None
        tail = f", test accuracy {100 * acc:.2f}%" if isinstance(acc, (int, float)) else ""
        self._say(f"federated: {self.num_rounds} rounds, {self.min_clients} clients{tail}")
        return self.result

    def _round_info(
        self, true_round: int, metrics: dict[str, Any], checked: Any, seconds: float
    ) -> dict[str, Any]:
        rec = checked.rounds.get(true_round, {})
        sites = rec.get("sites", [])
        total = sum(s["metrics"].get("num-examples", 0) for s in sites)
        mean_loss = None
        if sites and total:
            vals = [(s["metrics"]["num-examples"], s["metrics"].get("train-loss-mean")) for s in sites]
            if all(v is not None for _, v in vals):
                mean_loss = sum(n * v for n, v in vals) / total
        return {
            "round": true_round,
            "global": metrics,
            "answered": len(sites),
            "rejected": rec.get("rejected", []),
            "failed": rec.get("failed", []),
            "mean_local_loss": mean_loss,
            "seconds": seconds,
            "sites": sites,
            "strategy": type(checked.inner).__name__,
            "time": time.time(),
        }

    def _say(self, line: str) -> None:
        if self.progress is not None:
            self.progress(line)

    def app(self) -> Any:
        """A `flwr.serverapp.ServerApp` running this server."""
        fl = _flwr()
        app = fl.serverapp.ServerApp()
        app.main()(self.main)
        return app


def _round_line(info: Mapping[str, Any], num_rounds: int) -> str:
    if info["round"] == 0:
        parts = ["round 0 (initial model)"]
    else:
        parts = [f"round {info['round']}/{num_rounds}: {info['answered']} clients answered"]
        if info["rejected"] or info["failed"]:
            parts.append(f"{len(info['rejected'])} rejected, {len(info['failed'])} failed")
        if info["mean_local_loss"] is not None:
            parts.append(f"mean local loss {info['mean_local_loss']:.4f}")
    g = info["global"]
    if "accuracy" in g:
        parts.append(f"global test accuracy {100 * g['accuracy']:.2f}%")
    elif "loss" in g:
        parts.append(f"global test loss {g['loss']:.6g}")
    return ", ".join(parts)


def server_app(program: Any, out_dir: str | os.PathLike[str], **options: Any) -> Any:
    """A Flower ServerApp: ``GlcompServer(program, out_dir, **options).app()``."""
    return GlcompServer(program, out_dir, **options).app()


def history(out_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The ``round.json`` of every round saved in a federation directory, in order."""
    import json

    from glcomp.federated.core import ROUND_DIR

    out = []
    root = Path(out_dir)
    for p in sorted(root.iterdir()) if root.is_dir() else []:
        if ROUND_DIR.match(p.name) and (p / "round.json").is_file():
            out.append(json.loads((p / "round.json").read_text()))
    return sorted(out, key=lambda r: r["round"])


__all__ = ["ARRAYS_KEY", "STRATEGIES", "GlcompServer", "history", "server_app"]
