"""Secure aggregation (Flower's SecAgg+): the server learns only the weighted sum of the sites'
weights, never one site's.

Flower 1.42 runs SecAgg+ through its workflow API (`flwr.server.workflow.SecAggPlusWorkflow`
inside `DefaultWorkflow`, with a `flwr.server.strategy` strategy and `flwr.server.LegacyContext`)
and, at each site, the `secaggplus_mod` client mod, which masks the site's reply before it
leaves. Those speak Flower's FitIns/FitRes records (``fitins.parameters``, ``fitres.parameters``:
an ordered list of arrays, no names), so this module maps them onto the program's tensors in
order. The server cannot check single updates (it only ever sees masked vectors); it checks the
unmasked aggregate (float32-castable, the program's shapes, finite) before saving or sending it.
"""

from __future__ import annotations

import io
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.federated import _flwr
from glcomp.federated.core import check_update, evaluate, federated_shapes

FITINS_KEY = "fitins.parameters"
_SLACK = 4096


def decode_tensors(
    blobs: list[bytes], expected: Mapping[str, tuple[int, ...]], source: str
) -> dict[str, np.ndarray]:
    """Legacy Flower Parameters (one .npy blob per tensor, in the program's order) as the program's
    tensors, checked like any update (sizes bounded before decoding, pickles refused)."""
    names = list(expected)
    if len(blobs) != len(names):
        raise GlcompError(
            f"update from {source} rejected: {len(blobs)} tensors, expected {len(names)} ({names})"
        )
    out: dict[str, Any] = {}
    for name, blob in zip(names, blobs):
        limit = 8 * math.prod(expected[name]) + _SLACK
        if not isinstance(blob, bytes) or len(blob) > limit:
            raise GlcompError(f"update from {source} rejected: tensor {name!r} carries too many bytes")
        try:
            out[name] = np.load(io.BytesIO(blob), allow_pickle=False)
        except Exception as err:
            raise GlcompError(
                f"update from {source} rejected: tensor {name!r} cannot be decoded ({err})"
            ) from None
    return out


def _params(arrays: Mapping[str, np.ndarray]) -> Any:
    from flwr.common import ndarrays_to_parameters

    return ndarrays_to_parameters([np.ascontiguousarray(v) for v in arrays.values()])


def legacy_train(client: Any, msg: Any, context: Any) -> Any:
    """A site's answer to a FitIns message (a secure round): local training as in
    `GlcompClient.train`, replied as FitRes for `secaggplus_mod` to mask."""
    fl = _flwr()
    from flwr.common import Code, FitRes, Status
    from flwr.compat.common.recorddict_compat import fitres_to_recorddict, recorddict_to_fitins

    program = client.program()
    site = client.site(context)
    fitins = recorddict_to_fitins(msg.content, keep_input=True)
    expected = federated_shapes(program)
    global_weights = check_update(
        {
            k: v.astype(np.float32) if v.dtype == np.float64 else v
            for k, v in decode_tensors(list(fitins.parameters.tensors), expected, "the server").items()
        },
        expected,
        "the server",
    )
    config = dict(fitins.config)
    t0 = time.perf_counter()
    steps = config.get("local-steps", client.steps)
    lr = config.get("lr", client.lr)
    result, renderer = client.train_locally(
        program,
        site,
        global_weights,
        server_round=int(config.get("server-round", 0)),
        epochs=int(config.get("local-epochs", client.epochs)),
        steps=None if steps is None else int(steps),
        counters=None,
        lr=None if lr is None else float(lr),
    )
    seconds = time.perf_counter() - t0
    if client.audit_dir is not None:  # the site's own record; the server gets none of it
        arrays = fl.app.ArrayRecord({k: fl.app.Array(v) for k, v in result.weights.items()})
        client._audit(site, int(config.get("server-round", 0)), result, renderer, arrays, seconds)
    # No metrics in the reply: secaggplus_mod masks the weights only, and a site's loss or update
    # norm would tell the server about that one site.
    fitres = FitRes(Status(Code.OK, "ok"), _params(result.weights), result.num_examples, {})
    content = fitres_to_recorddict(fitres, keep_input=True)
    return fl.app.Message(content=content, reply_to=msg)


def secure_main(server: Any, grid: Any, context: Any) -> Any:
    """The ServerApp main of a secure federation (`GlcompServer(..., secure=True)`)."""
    from flwr.common import ndarrays_to_parameters
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    expected = federated_shapes(server.program)
    store = server.store
    store.open()
    saved = store.latest()
    if saved is not None and not server.resume:
        raise GlcompError(f"{server.out_dir}: holds round {saved.round} already; resume=True continues it")
    start = saved.round if saved is not None else 0
    server.started_at = start
    if saved is not None:
        weights = saved.weights
        server._say(f"federated: resuming after round {start} (from {saved.path})")
    else:
        weights = {
            k: np.asarray((server.program.params | server.program.buffers)[k], np.float32) for k in expected
        }
    remaining = server.num_rounds - start
    if remaining <= 0:
        server._say(f"federated: {server.out_dir} holds round {start} of {server.num_rounds}; nothing to do")
        return None
    rt = server.program.runtime(server.eval_runtime)
    options = dict(server.secure) if isinstance(server.secure, Mapping) else {}
    n = server.min_clients
    options.setdefault("num_shares", n)
    options.setdefault("reconstruction_threshold", max(2, (2 * n + 2) // 3))
    options.setdefault("timeout", server.timeout)
    t0 = [time.perf_counter()]

    def evaluate_fn(server_round: int, ndarrays: list[np.ndarray], _config: dict[str, Any]) -> Any:
        true_round = server_round + start
        arrays = dict(zip(expected, ndarrays))
        cast = {k: np.asarray(v).astype(np.float32) for k, v in arrays.items()}
        got = check_update(cast, expected, f"the secure aggregation of round {true_round}")
        rt.load_state_dict({**rt.state_dict(), **got}, optimizer="reset")
        metrics = {}
        if server.eval_data is not None:
            metrics = evaluate(rt, server.program, server.eval_data, "the server's held-out data")
        if server_round == 0 and saved is not None:
            return metrics.get("loss", 0.0), metrics
        now = time.perf_counter()
        answered, failed = strategy.answered.get(server_round, (0, 0))
        info = {
            "round": true_round,
            "global": metrics,
            "answered": answered,
            "rejected": [],
            "failed": [{"node": None, "reason": "failed or dropped out"}] * failed,
            "mean_local_loss": None,
            "seconds": now - t0[0],
            "sites": [],
            "strategy": "FedAvg+SecAgg+",
            "secure": True,
            "time": time.time(),
        }
        t0[0] = now
        store.save(true_round, rt, info)
        from glcomp.federated.server import _round_line

        server._say(_round_line(info, server.num_rounds))
        return metrics.get("loss", 0.0), metrics

    def fit_config(server_round: int) -> dict[str, Any]:
        config = {"server-round": server_round + start}
        return config | {k: v for k, v in server.train_config.items() if v is not None}

    class CountingFedAvg(FedAvg):  # type: ignore[misc]
        """Flower's FedAvg, recording how many sites answered each round."""

        def aggregate_fit(self, server_round: int, results: Any, failures: Any) -> Any:
            self.answered[server_round] = (len(results), len(failures))
            return super().aggregate_fit(server_round, results, failures)

    strategy = CountingFedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=n,
        min_evaluate_clients=0,
        min_available_clients=n,
        initial_parameters=ndarrays_to_parameters(list(weights.values())),
        evaluate_fn=evaluate_fn,
        on_fit_config_fn=fit_config,
    )
    strategy.answered = {}
    legacy = LegacyContext(context, config=ServerConfig(num_rounds=remaining), strategy=strategy)
    try:
        DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(**options))(grid, legacy)
    finally:
        rt.release()
    server.result = legacy.history
    last = store.latest()
    acc = last.info.get("global", {}).get("accuracy") if last else None
    tail = f", test accuracy {100 * acc:.2f}%" if isinstance(acc, (int, float)) else ""
    # The same last line as a plain run (what ``glcomp federated simulate`` promises); its header
    # line and every round.json say the run was secure.
    server._say(f"federated: {server.num_rounds} rounds, {n} clients{tail}")
    return server.result
