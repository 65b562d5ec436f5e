"""Flower's simulation engine for a glcomp federation: one process runs the ServerApp (in a
thread) and every site's ClientApp (in Ray workers on this machine), nothing goes over a network."""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from glcomp.errors import GlcompError
from glcomp.federated import _flwr


def run_simulation(
    server: Any,
    client: Any,
    num_supernodes: int,
    *,
    num_cpus: float = 1.0,
    backend_config: dict[str, Any] | None = None,
    verbose: bool = False,
) -> Any:
    """Run `server` (a GlcompServer) with `num_supernodes` simulated sites, each running `client`
    (a GlcompClient, or any Flower ClientApp) with ``partition-id`` 0..num_supernodes-1, through
    `flwr.simulation.run_simulation`; returns Flower's Result of the server's run. `num_cpus`:
    CPU cores reserved for each site's worker (so at most cores/num_cpus sites train at once)."""
    _flwr()
    if importlib.util.find_spec("ray") is None:
        raise GlcompError("Flower's simulation needs Ray: pip install 'glcomp[federated]' (flwr[simulation])")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    from flwr.simulation import run_simulation as flwr_run_simulation

    secure = bool(getattr(server, "secure", False))
    client_app = client.app(secure=secure) if hasattr(client, "train") and hasattr(client, "app") else client
    config = backend_config or {"client_resources": {"num_cpus": num_cpus, "num_gpus": 0.0}}
    flwr_run_simulation(
        server_app=server.app(),
        client_app=client_app,
        num_supernodes=num_supernodes,
        backend_config=config,
        verbose_logging=verbose,
    )
    return getattr(server, "result", None)
