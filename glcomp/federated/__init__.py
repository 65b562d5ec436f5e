"""Federated training of glcomp programs on Flower (``pip install 'glcomp[federated]'``).

Sites (hospitals, browsers' bridge processes, ...) train a glcomp program locally, on the GL or the
reference runtime, and send only their weights; a server aggregates them with a Flower strategy
(FedAvg by default, FedProx or FedAdam), evaluates the global model on held-out data each round
and saves it as a glcomp bundle after every round, resuming from the last saved round when
restarted. Every update a server receives is checked (names, shapes, float32, finite) and a bad
one is rejected with a GlcompError naming the site and tensor, never aggregated.

- `GlcompClient` / `client_app`: the Flower ClientApp of a site (glcomp.federated.client);
- `GlcompServer` / `server_app`: the Flower ServerApp (glcomp.federated.server);
- `Site`, `local_train`, `evaluate`, `check_update`, `RoundStore`: the Flower-free pieces
  (glcomp.federated.core);
- `run_simulation`: Flower's in-process simulation of a server and its sites.
- `ClipAndNoise`: a Flower client mod clipping each site's update and adding Gaussian noise
  (``GlcompClient(..., dp=...)``, ``--dp-clip``/``--dp-noise``; glcomp.federated.privacy).
- ``glcomp federated simulate``: an example's data dealt out to N sites (glcomp.federated.partition)
  and federated on Flower's simulation engine or, ``--engine deployment``, on a SuperLink and
  SuperNode processes on 127.0.0.1 (glcomp.federated.cli, glcomp.federated.deploy).
- ``glcomp federated server`` / ``glcomp federated site [--browser]``: the server (a SuperLink
  and the ServerApp) and one site (a SuperNode) as separate commands; a browser site trains in a
  glcomp.js page through a checked local bridge (glcomp.federated.site, glcomp.federated.bridge).

Importing this package does not import Flower; building an app does. Flower's telemetry is
switched off (``FLWR_TELEMETRY_ENABLED=0``) unless the environment sets it.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any

from glcomp.errors import GlcompError
from glcomp.federated.core import (
    RoundStore,
    SavedRound,
    Site,
    check_array_record,
    check_update,
    evaluate,
    federated_shapes,
    local_train,
)

FLWR_REQUIREMENT = "flwr==1.42.*"


def _flwr() -> Any:
    """Flower's modules this package uses, imported on first use (GlcompError when missing)."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    try:
        import flwr.app
        import flwr.clientapp
        import flwr.serverapp
        import flwr.serverapp.strategy
    except ImportError as err:
        raise GlcompError(
            f"glcomp.federated needs Flower ({FLWR_REQUIREMENT}): pip install 'glcomp[federated]' ({err})"
        ) from None
    return SimpleNamespace(app=flwr.app, clientapp=flwr.clientapp, serverapp=flwr.serverapp, flwr=flwr)


def __getattr__(name: str) -> Any:
    if name in ("GlcompClient", "client_app"):
        from glcomp.federated import client

        return getattr(client, name)
    if name in ("GlcompServer", "server_app", "STRATEGIES", "history"):
        from glcomp.federated import server

        return getattr(server, name)
    if name == "ClipAndNoise":
        from glcomp.federated.privacy import ClipAndNoise

        return ClipAndNoise
    if name == "run_simulation":
        from glcomp.federated.simulation import run_simulation

        return run_simulation
    raise AttributeError(f"module 'glcomp.federated' has no attribute {name!r}")


__all__ = [
    "FLWR_REQUIREMENT",
    "STRATEGIES",
    "ClipAndNoise",
    "GlcompClient",
    "GlcompServer",
    "RoundStore",
    "SavedRound",
    "Site",
    "check_array_record",
    "check_update",
    "client_app",
    "evaluate",
    "federated_shapes",
    "history",
    "local_train",
    "run_simulation",
    "server_app",
]
