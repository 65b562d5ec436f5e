"""One site of a federation as its own long-running command: ``glcomp federated site``.

The site compiles the example (the same ``build()`` as the server's), saves it as a bundle in
its site directory and starts a Flower SuperNode (``flower-supernode``) connected to the
server's SuperLink, with a node config naming the site, the bundle and either the site's data
file (a Python site: the ClientApp trains on GL or the reference runtime) or, with ``--browser``,
its bridge (glcomp.federated.bridge): a page on 127.0.0.1 that trains with glcomp.js and holds
the data, the ClientApp delegating each round's local training to it (`BrowserClient`). The
ClientApp that runs is the server's (Flower sends it with the run); glcomp.federated.deploy's
client app picks these clients when the node config names a bundle.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.federated.client import GlcompClient
from glcomp.federated.core import Site, federated_shapes
from glcomp.federated.privacy import ClipAndNoise

ROUND_TIMEOUT = 600.0
# A site starts a new SuperNode when its SuperNode exits, at most MAX_RESTARTS times a window.
MAX_RESTARTS, RESTART_WINDOW = 5, 60.0


class _OneSite:
    """The `sites` of a client that is one site (a picklable function of the node's context)."""

    def __init__(self, site: Site) -> None:
        self.site = site

    def __call__(self, context: Any) -> Site:
        return self.site


class BrowserClient(GlcompClient):
    """A site whose local training runs in a page: each round's global weights go to the site's
    bridge (`url`, with its `token`), which hands them to the page and answers with the page's
    checked update; the update is checked again here before it becomes the ClientApp's reply.
    SecAgg+ masking, when the server asks for it, is Flower's ``secaggplus_mod`` in this
    ClientApp process, so the page never sees it. The optimizer state is reset each round (the
    page zeroes it), the page keeps its own counters."""

    def __init__(
        self,
        program: Any,
        name: str,
        url: str,
        token: str,
        *,
        epochs: int = 1,
        seed: int = 0,
        timeout: float = ROUND_TIMEOUT,
        audit_dir: str | None = None,
    ) -> None:
        super().__init__(
            program, _OneSite(Site(name, {}, "gl")), epochs=epochs, seed=seed, audit_dir=audit_dir
        )
        self.url, self.token, self.timeout = url, token, float(timeout)

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
        from glcomp.federated.bridge import request_train

        return request_train(
            self.url,
            self.token,
            global_weights,
            federated_shapes(program),
            site=site.name,
            timeout=self.timeout + 30.0,
            round=server_round,
            epochs=epochs,
            steps=steps,
            seed=self.seed,
            lr=lr,
            proximal_mu=proximal_mu,
        )

    def evaluate(self, msg: Any, context: Any) -> Any:
        raise GlcompError(f"site {self.site(context).name!r}: a browser site does not evaluate")


def load_data(path: str | os.PathLike[str], program: Any, where: str) -> dict[str, np.ndarray]:
    """A site's data file (.npz or .safetensors holding the program's input and target by name),
    checked against the program."""
    from glcomp.federated.core import check_site_data

    p = Path(path)
    if not p.is_file():
        raise GlcompError(f"{where}: no data file {p}")
    try:
        if p.suffix == ".safetensors":
            from safetensors.numpy import load_file

            arrays = dict(load_file(str(p)))
        else:
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
    except Exception as err:
        raise GlcompError(f"{where}: {p} is not an .npz or .safetensors file ({err})") from None
    return check_site_data(program, arrays, where)[0]


def node_client(cfg: dict[str, Any], node: dict[str, Any], cache: dict[Any, Any]) -> Any:
    """The ClientApp's client for a SuperNode started by ``glcomp federated site`` (its node
    config names the site, the bundle, and the data file or the browser bridge); one per process."""
    key = ("site", tuple(sorted((k, str(v)) for k, v in {**cfg, **node}.items())))
    got = cache.get(key)
    if got is not None:
        return got
    import glcomp

    name, bundle = str(node.get("site-name", "site")), str(node["bundle"])
    program = glcomp.load(bundle)
    epochs, seed = int(cfg["epochs"]), int(cfg["seed"])
    audit = str(node["audit"]) if "audit" in node else None
    if "bridge" in node:
        got = BrowserClient(
            program,
            name,
            str(node["bridge"]),
            str(node.get("bridge-token", "")),
            epochs=epochs,
            seed=seed,
            timeout=float(node.get("round-timeout", ROUND_TIMEOUT)),
            audit_dir=audit,
        )
    else:
        data = load_data(str(node["data"]), program, f"site {name!r}")
        site = Site(name, data, str(node.get("runtime", "gl")))
        got = GlcompClient(program, _OneSite(site), epochs=epochs, seed=seed, audit_dir=audit)
    cache.clear()
    cache[key] = got
    return got


def _address(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise GlcompError(f"--superlink: expected HOST:PORT (the server's SuperLink), got {text!r}")
    return text


def run_site(
    source: str,
    superlink: str,
    *,
    name: str | None = None,
    data: str | None = None,
    partition_id: int | None = None,
    clients: int = 2,
    partition: str = "iid",
    seed: int = 0,
    runtime: str = "gl",
    browser: bool = False,
    port: int = 8765,
    site_dir: str | os.PathLike[str] | None = None,
    round_timeout: float = ROUND_TIMEOUT,
    timeout: float | None = None,
    progress: Any = print,
    on_ready: Any = None,
    dp: ClipAndNoise | None = None,
) -> int:
    """Run ``glcomp federated site`` until interrupted (SIGINT, SIGTERM), the SuperNode exits, or
    `timeout` seconds pass. `on_ready(info)`: called once the site is up (tests). `dp`: the site
    clips and noises each update it sends (``--dp-clip``/``--dp-noise``: its node config's
    ``dp-clip``/``dp-noise``, read by the ClientApp)."""
    import glcomp
    from glcomp.federated.cli import load_example, prepare
    from glcomp.federated.deploy import _free_port, _toml, _tool, check_port_free

    superlink = _address(superlink)
    if not browser and data is None and partition_id is None:
        raise GlcompError("a site needs its data: --data FILE (.npz or .safetensors), or --partition-id I")
    if partition_id is not None and not 0 <= partition_id < clients:
        raise GlcompError(f"--partition-id {partition_id}: expected 0 to {clients - 1} (--clients {clients})")
    if data is not None and browser:
        raise GlcompError("--data is for a Python site; a browser site's data stays in its page")
    if browser:
        check_port_free(port)  # before compiling: a taken port is the first thing to say
    name = name or (f"site-{partition_id}" if partition_id is not None else "site")
    folder = Path(site_dir) if site_dir is not None else Path("runs") / "sites" / name
    folder = folder.resolve()
    (folder / "logs").mkdir(parents=True, exist_ok=True)
    if partition_id is not None:
        spec, prog, sites = prepare(source, clients, partition, seed, "reference")
        site_data = dict(sites[partition_id].data)
    else:
        spec = load_example(source)
        prog = glcomp.compile(
            spec.model,
            spec.inputs,
            spec.loss,
            spec.optimizer,
            target=spec.target,
            target_name=spec.target_name,
        )
        site_data = None
    bundle = folder / "model"
    prog.save(bundle)
    node: dict[str, Any] = {"site-name": name, "bundle": str(bundle), "round-timeout": float(round_timeout)}
    node["audit"] = str(folder / "audit")
    if dp is not None:
        node |= {"dp-clip": float(dp.clip), "dp-noise": float(dp.noise_multiplier)}
    bridge = None
    if browser:
        from glcomp.federated.bridge import Bridge

        if site_data is not None:  # the demo's part of the example's data, for the user to pick
            from safetensors.numpy import save_file

            save_file(
                {k: np.ascontiguousarray(v) for k, v in site_data.items()}, str(folder / "data.safetensors")
            )
        try:
            bridge = Bridge(prog, name, bundle, port=port, job_timeout=round_timeout, progress=progress)
        except OSError as err:
            raise GlcompError(
                f"cannot listen on 127.0.0.1:{port} ({err.strerror or err}); give another --port, "
                "or --port 0 for any free port"
            ) from None
        bridge.start()
        node |= {"bridge": bridge.url, "bridge-token": bridge.token}
    else:
        if data is not None:
            load_data(data, prog, f"site {name!r}")  # fail here, not in the ClientApp
            node["data"] = str(Path(data).resolve())
        else:
            assert site_data is not None
            np.savez(folder / "data.npz", **site_data)
            node["data"] = str(folder / "data.npz")
        node["runtime"] = runtime
    config_file = folder / "node-config.toml"
    config_file.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in node.items()), encoding="utf-8")
    config_file.chmod(0o600)  # it holds the bridge's token
    home = folder / "flwr-home"
    home.mkdir(exist_ok=True)
    env = {**os.environ, "FLWR_HOME": str(home), "FLWR_TELEMETRY_ENABLED": "0"}
    argv = [
        _tool("flower-supernode"),
        "--insecure",
        "--superlink",
        superlink,
        "--node-config",
        str(config_file),
    ]
    argv += ["--host", "127.0.0.1", "--port", str(_free_port())]
    stop = {"signal": None}

    def _stop(signum: int, _frame: Any) -> None:
        stop["signal"] = signum

    main_thread = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGTERM, _stop) if main_thread else None
    log = open(folder / "logs" / "supernode.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        where = f"; the page: {bridge.url}" if bridge is not None else ""
        if progress is not None:
            progress(
                f"site {name}: SuperNode started for the SuperLink at {superlink} "
                f"({'browser' if browser else runtime}{', ' + dp.describe() if dp is not None else ''}; "
                f"log {folder / 'logs' / 'supernode.log'}){where}"
            )
            if browser and site_data is not None:
                progress(f"site {name}: this site's data for the page to pick: {folder / 'data.safetensors'}")
        if on_ready is not None:
            on_ready({"bridge": bridge, "dir": folder, "supernode": proc})
        deadline = None if timeout is None else time.monotonic() + timeout
        restarts: list[float] = []
        while stop["signal"] is None:
            if deadline is not None and time.monotonic() > deadline:
                break
            if proc.poll() is not None:
                # A SuperNode leaves when its SuperLink stops (a server restarted to resume, say):
                # the site starts a new one, which waits for the SuperLink to come back.
                now = time.monotonic()
                restarts = [t for t in restarts if now - t < RESTART_WINDOW] + [now]
                if len(restarts) > MAX_RESTARTS:
                    raise GlcompError(
                        f"site {name}: flower-supernode exited {len(restarts)} times within "
                        f"{RESTART_WINDOW:.0f} s, last with status {proc.returncode} "
                        f"(see {folder / 'logs' / 'supernode.log'})"
                    )
                if progress is not None:
                    progress(
                        f"site {name}: the SuperNode exited (status {proc.returncode}); starting a new one"
                    )
                time.sleep(1.0)
                proc = subprocess.Popen(
                    argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                )
            time.sleep(0.2)
    except KeyboardInterrupt:
        pass
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        if bridge is not None:
            bridge.close()
    if progress is not None:
        progress(f"site {name}: stopped")
    return 0


__all__ = ["BrowserClient", "load_data", "node_client", "run_site"]
