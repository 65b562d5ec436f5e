"""Flower's deployment engine on this machine: ``glcomp federated simulate --engine deployment``.

A ``flower-superlink`` process and one ``flower-supernode`` process per site, all on 127.0.0.1
(each SuperNode started with node config ``partition-id=i``), and ``flwr run`` submitting a Flower
App project written into the federation directory (``OUT/app``: a pyproject.toml whose
``[tool.flwr.app.config]`` holds the run's settings, and a module naming this module's apps).
The SuperLink runs the ServerApp in a ``flwr-serverapp`` process and each SuperNode runs the
ClientApp in a ``flwr-clientapp`` process; every process compiles the example and deals the
training set out again from the seed, and a site keeps only its own part. The server's round
lines are read back from the round directories it saves and printed here.

This module builds Flower apps at import (``server`` and ``client``), so it is imported only when
the deployment engine is used (and by the app processes).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from glcomp.errors import GlcompError
from glcomp.federated import _flwr

if TYPE_CHECKING:
    from glcomp.federated.privacy import ClipAndNoise

# Seconds to wait for the SuperLink's port, and for the processes to stop when asked.
START_TIMEOUT = 60.0
STOP_TIMEOUT = 10.0
# A site's reply is awaited at most this long per round before the round goes on without it.
ROUND_TIMEOUT = 120.0
APP_MODULE = "glcomp_federated_app"

fl = _flwr()


def _settings(context: Any) -> dict[str, Any]:
    cfg = dict(context.run_config)
    need = ("example", "out", "clients", "rounds", "partition", "seed", "epochs", "strategy", "runtime")
    missing = [k for k in need if k not in cfg]
    if missing:
        raise GlcompError(f"the Flower App's run config lacks {', '.join(missing)}")
    return cfg


def _prepared(cfg: dict[str, Any]) -> Any:
    from glcomp.federated.cli import prepare

    key = tuple(sorted((k, str(v)) for k, v in cfg.items()))
    cached = _PREPARED.get(key)
    if cached is None:
        cached = prepare(
            str(cfg["example"]),
            int(cfg["clients"]),
            str(cfg["partition"]),
            int(cfg["seed"]),
            str(cfg["runtime"]),
        )
        _PREPARED.clear()
        _PREPARED[key] = cached
    return cached


_PREPARED: dict[Any, Any] = {}
_CLIENTS: dict[Any, Any] = {}


def _secagg_when_asked(msg: Any, context: Any, call_next: Any) -> Any:
    """Flower's secaggplus_mod for the messages of a SecAgg+ round, the plain path otherwise (the
    app is one module for secure and plain runs; secaggplus_mod refuses plain train messages)."""
    from flwr.client.mod import secaggplus_mod
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS

    if RECORD_KEY_CONFIGS in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


def _dp_when_asked(msg: Any, context: Any, call_next: Any) -> Any:
    """The site's clipping and noise (glcomp.federated.privacy.ClipAndNoise) when its node config
    (``glcomp federated site --dp-clip``) or else the run config (``glcomp federated simulate
    --engine deployment --dp-clip``) has ``dp-clip`` (and ``dp-noise``); inside secaggplus_mod, on
    the reply before it is masked."""
    from glcomp.federated.privacy import ClipAndNoise

    for cfg in (context.node_config, context.run_config):
        if "dp-clip" in cfg:
            return ClipAndNoise(cfg["dp-clip"], cfg.get("dp-noise", 0.0))(msg, context, call_next)
    return call_next(msg, context)


server = fl.serverapp.ServerApp()
client = fl.clientapp.ClientApp(mods=[_secagg_when_asked, _dp_when_asked])


@server.main()
def _server_main(grid: Any, context: Any) -> Any:
    """The ServerApp: a GlcompServer built from the run config."""
    from glcomp.federated import GlcompServer

    cfg = _settings(context)
    spec, prog, _ = _prepared(cfg)
    name = next(iter(spec.inputs))
    options = {"fedprox": {"proximal_mu": 0.01}, "fedadam": {"eta": 1e-2, "eta_l": 1e-2}}.get(cfg["strategy"])
    glcomp_server = GlcompServer(
        prog,
        cfg["out"],
        num_rounds=int(cfg["rounds"]),
        strategy=str(cfg["strategy"]),
        strategy_options=options,
        min_clients=int(cfg.get("min-clients", cfg["clients"])),
        eval_data={name: spec.x_test, spec.target_name: spec.y_test},
        timeout=float(cfg.get("round-timeout", ROUND_TIMEOUT)),
        secure=bool(cfg.get("secure", False)),
    )
    return glcomp_server.main(grid, context)


def _glcomp_client(context: Any) -> Any:
    from glcomp.federated import GlcompClient

    cfg = _settings(context)
    if "bundle" in context.node_config:  # a site started by ``glcomp federated site``
        from glcomp.federated.site import node_client

        return node_client(cfg, dict(context.node_config), _CLIENTS)
    key = tuple(sorted((k, str(v)) for k, v in cfg.items()))
    got = _CLIENTS.get(key)
    if got is None:
        _, prog, sites = _prepared(cfg)
        audit = Path(str(cfg["out"])) / "audit"
        got = GlcompClient(prog, sites, epochs=int(cfg["epochs"]), seed=int(cfg["seed"]), audit_dir=audit)
        _CLIENTS.clear()
        _CLIENTS[key] = got
    return got


@client.train()
def _client_train(msg: Any, context: Any) -> Any:
    """The ClientApp's train: the GlcompClient of this node's partition-id."""
    return _glcomp_client(context).train(msg, context)


@client.evaluate()
def _client_evaluate(msg: Any, context: Any) -> Any:
    """The ClientApp's evaluate."""
    return _glcomp_client(context).evaluate(msg, context)


# -- the processes ------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def check_port_free(port: int, what: str = "--port") -> int:
    """`port` if nothing listens on 127.0.0.1:`port` now, else GlcompError naming the port."""
    if not isinstance(port, int) or isinstance(port, bool) or not 0 <= port <= 65535:
        raise GlcompError(f"{what}: expected a port from 0 to 65535 (0: any free port), got {port!r}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as the servers bind (SO_REUSEADDR): connections of a stopped server in TIME_WAIT are no
        # reason to refuse its port, a process listening on it is
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError as err:
            raise GlcompError(
                f"cannot listen on 127.0.0.1:{port} ({err.strerror or err}); give another {what}, "
                f"or {what} 0 for any free port"
            ) from None
    return port


def _wait_port(port: int, proc: subprocess.Popen[Any], what: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise GlcompError(f"{what} exited with status {proc.returncode} (see {log})")
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise GlcompError(f"{what} did not listen on 127.0.0.1:{port} within {START_TIMEOUT:.0f} s (see {log})")


def _tool(name: str) -> str:
    path = shutil.which(name) or str(Path(sys.executable).with_name(name))
    if not Path(path).exists():
        raise GlcompError(f"Flower's {name} command is not installed: pip install 'glcomp[federated]'")
    return path


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def write_app(app_dir: Path, config: dict[str, Any]) -> Path:
    """Write the Flower App project that ``flwr run`` submits (pyproject.toml and the app module)."""
    app_dir.mkdir(parents=True, exist_ok=True)
    lines = [
        "[build-system]",
        'requires = ["hatchling"]',
        'build-backend = "hatchling.build"',
        "",
        "[project]",
        'name = "glcomp-federated-app"',
        'version = "1.0.0"',
        'description = "A glcomp federation (written by glcomp federated simulate)"',
        'license = "Apache-2.0"',
        "dependencies = []",
        "",
        "[tool.hatch.build.targets.wheel]",
        'packages = ["."]',
        "",
        "[tool.flwr.app]",
        'publisher = "glcomp"',
        "",
        "[tool.flwr.app.components]",
        f'serverapp = "{APP_MODULE}:server"',
        f'clientapp = "{APP_MODULE}:client"',
        "",
        "[tool.flwr.app.config]",
        *(f"{k} = {_toml(v)}" for k, v in config.items()),
        "",
    ]
    (app_dir / "pyproject.toml").write_text("\n".join(lines), encoding="utf-8")
    (app_dir / f"{APP_MODULE}.py").write_text(
        '"""The Flower apps of a glcomp federation."""\n\n'
        "from glcomp.federated.deploy import client, server\n\n"
        '__all__ = ["client", "server"]\n',
        encoding="utf-8",
    )
    return app_dir


class Federation:
    """A SuperLink and SuperNodes on 127.0.0.1, as processes; `stop()` (or leaving a ``with``
    block) terminates them. `supernodes[i]` is site i's process; `kill(i)` and `restart(i)`
    let a test break a site."""

    def __init__(self, out_dir: Path, clients: int, port: int = 0) -> None:
        self.out_dir, self.clients = out_dir, clients
        self.logs = out_dir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home = out_dir / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.port = check_port_free(port) if port else _free_port()
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "glcomp"\n\n[superlink.glcomp]\naddress = "127.0.0.1:{self.port}"\n'
            "insecure = true\n",
            encoding="utf-8",
        )
        self.env = {**os.environ, "FLWR_HOME": str(self.home), "FLWR_TELEMETRY_ENABLED": "0"}
        self.superlink: subprocess.Popen[Any] | None = None
        self.supernodes: list[subprocess.Popen[Any] | None] = [None] * clients
        self._files: list[Any] = []

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[Any]:
        log = open(self.logs / log_name, "ab")  # closed in stop()
        self._files.append(log)
        return subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )

    def start(self) -> Federation:
        argv = [_tool("flower-superlink"), "--insecure", "--host", "127.0.0.1", "--port", str(self.port)]
        self.superlink = self._spawn(argv, "superlink.log")
        _wait_port(self.port, self.superlink, "flower-superlink", self.logs / "superlink.log")
        for i in range(self.clients):
            self.restart(i)
        return self

    def restart(self, i: int) -> None:
        """Start (again) site i's SuperNode: a new Flower node with the same partition-id."""
        argv = [_tool("flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{self.port}"]
        argv += ["--node-config", f"partition-id={i}", "--host", "127.0.0.1", "--port", str(_free_port())]
        self.supernodes[i] = self._spawn(argv, f"supernode-{i}.log")

    def kill(self, i: int) -> None:
        """SIGKILL site i's SuperNode and the ClientApp processes it started (its process group)."""
        proc = self.supernodes[i]
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(STOP_TIMEOUT)
        self.supernodes[i] = None

    def run(self, app_dir: Path, timeout: float) -> subprocess.Popen[Any]:
        """Submit the app with ``flwr run --stream`` (its output in logs/flwr-run.log)."""
        return self._spawn([_tool("flwr"), "run", str(app_dir), "glcomp", "--stream"], "flwr-run.log")

    def stop(self) -> None:
        procs = [p for p in [*self.supernodes, self.superlink] if p is not None]
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(STOP_TIMEOUT)
        for f in self._files:
            f.close()

    def __enter__(self) -> Federation:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def run_deployment(
    source: str,
    out_dir: Path,
    *,
    clients: int,
    rounds: int,
    partition: str,
    seed: int,
    epochs: int,
    strategy: str,
    runtime: str,
    secure: bool = False,
    progress: Any = print,
    round_timeout: float = ROUND_TIMEOUT,
    min_clients: int | None = None,
    total_timeout: float | None = 1800.0,
    on_round: Any = None,
    port: int = 0,
    supernodes: int | None = None,
    dp: ClipAndNoise | None = None,
) -> Any:
    """Run a federation on Flower's deployment engine (see the module's docstring); prints the
    server's round lines as its rounds are saved. `on_round(federation, round_info)`: called
    after each saved round (tests kill a SuperNode there). Returns a namespace with `out_dir`.

    `supernodes` (default `clients`): SuperNodes started here; ``glcomp federated server`` starts
    none (the sites start their own, ``glcomp federated site``) and gives the SuperLink's `port`
    (0: any free port). `total_timeout` None waits for the rounds without a limit. `dp`: the
    SuperNodes started here clip and noise their updates (the run config's ``dp-clip``/``dp-noise``)."""
    from glcomp.federated import history
    from glcomp.federated.cli import prepare
    from glcomp.federated.server import _round_line

    out_dir = Path(out_dir).resolve()
    from glcomp.federated.core import RoundStore

    shown = progress if supernodes != 0 else None  # the server command's sites bring their own data
    _, prog, _ = prepare(source, clients, partition, seed, runtime, shown)  # checks it all first
    RoundStore(out_dir, prog).open()  # the federation directory, before app/ and logs/ go in it
    config = {
        "example": str(Path(source).resolve()),
        "out": str(out_dir),
        "clients": clients,
        "min-clients": min_clients or clients,
        "rounds": rounds,
        "partition": partition,
        "seed": seed,
        "epochs": epochs,
        "strategy": strategy,
        "runtime": runtime,
        "secure": bool(secure),
        "round-timeout": float(round_timeout),
    }
    if dp is not None:
        config |= {"dp-clip": float(dp.clip), "dp-noise": float(dp.noise_multiplier)}
    dp_text = f", {dp.describe()}" if dp is not None else ""
    app_dir = write_app(out_dir / "app", config)
    seen = {r["round"] for r in history(out_dir)}
    if progress is not None and max(seen, default=0) > 0:
        last = max(seen)
        progress(f"resuming after round {last} of {rounds} ({out_dir / f'round-{last:04d}'})")
    nodes = clients if supernodes is None else supernodes
    with Federation(out_dir, nodes, port=port) as fed:
        if progress is not None and supernodes == 0:
            progress(
                f"SuperLink listening on 127.0.0.1:{fed.port}; {rounds} rounds, {min_clients or clients} "
                f"sites a round, {epochs} local epoch(s), {strategy}{', SecAgg+' if secure else ''}; start "
                f"each site with: glcomp federated site {source} --superlink 127.0.0.1:{fed.port} ..."
            )
        elif progress is not None:
            progress(
                f"{clients} clients, {rounds} rounds, partition {partition}, {epochs} local epoch(s)"
                f"{', SecAgg+' if secure else ''}{dp_text}; "
                f"Flower deployment engine: SuperLink on 127.0.0.1:{fed.port}, {clients} SuperNodes"
            )
        run = fed.run(app_dir, total_timeout or 0.0)
        deadline = time.monotonic() + (total_timeout or float("inf"))
        while True:
            for info in history(out_dir):
                if info["round"] not in seen:
                    seen.add(info["round"])
                    if progress is not None:
                        progress(_round_line(info, rounds))
                    if on_round is not None:
                        on_round(fed, info)
            if run.poll() is not None or (seen and max(seen) >= rounds):
                break
            if time.monotonic() > deadline:
                raise GlcompError(f"{out_dir}: the federation did not finish within {total_timeout} s")
            time.sleep(0.5)
        try:
            run.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGTERM)
    done = history(out_dir)
    if not done or done[-1]["round"] < rounds:
        raise GlcompError(
            f"{out_dir}: the federation ended after round {done[-1]['round'] if done else 0} of {rounds} "
            f"(see {out_dir / 'logs'})"
        )
    acc = done[-1].get("global", {}).get("accuracy")
    tail = f", test accuracy {100 * acc:.2f}%" if isinstance(acc, (int, float)) else ""
    if progress is not None:
        progress(f"federated: {rounds} rounds, {clients} clients{tail}")
    return SimpleNamespace(out_dir=out_dir, history=done)
