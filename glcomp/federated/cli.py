"""``glcomp federated ...``: the federation commands of the glcomp command line.

``glcomp federated simulate EXAMPLE.py --clients N --rounds R --partition iid|dirichlet:ALPHA
--seed S [--secure]`` compiles an example (a .py file defining ``build()``, as for ``glcomp
train``), deals its training set out to N sites, and runs a real Flower federation of them on this
machine with Flower's simulation engine (``flwr.simulation.run_simulation``: the ServerApp in a
thread, every site's ClientApp in Ray workers, the same apps and messages as under
``flower-superlink``/``flower-supernode``); the server evaluates the global model on the
example's test set after every round and prints one line per round, and last ``federated: R
rounds, N clients, test accuracy X%``.

``glcomp federated server EXAMPLE.py`` and ``glcomp federated site EXAMPLE.py --superlink
HOST:PORT [--browser]`` run a federation's server (a SuperLink and the ServerApp) and each site
(a SuperNode; with ``--browser`` a page that trains with glcomp.js) as separate commands
(glcomp.federated.deploy, glcomp.federated.site, glcomp.federated.bridge).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from glcomp.errors import GlcompError

if TYPE_CHECKING:
    from glcomp.federated.privacy import ClipAndNoise

RUNTIMES = ("gl", "reference", "mixed")
ENGINES = ("simulation", "deployment")


def _checked(text: str, cast: Any, ok: Any, expected: str) -> Any:
    """`cast(text)` where `ok` accepts it, else the argparse error "expected <expected>"."""
    try:
        value = cast(text)
    except ValueError:
        value = None
    if value is None or not ok(value):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _positive(text: str) -> int:
    return _checked(text, int, lambda v: v > 0, "a positive integer")


def _port(text: str) -> int:
    return _checked(text, int, lambda v: 0 <= v <= 65535, "a port from 0 to 65535 (0: any free port)")


def _seconds(text: str) -> float:
    return _checked(text, float, lambda v: 0 < v < float("inf"), "a positive number of seconds")


def _dp_clip(text: str) -> float:
    return _checked(text, float, lambda v: 0 < v < float("inf"), "a positive finite L2 norm")


def _dp_noise(text: str) -> float:
    return _checked(text, float, lambda v: 0 <= v < float("inf"), "a finite noise multiplier, 0 or more")


def _add_dp_arguments(p: Any) -> None:
    p.add_argument(
        "--dp-clip",
        type=_dp_clip,
        metavar="C",
        help="clip each site's update (its weights minus the global ones) to L2 norm C before it is sent",
    )
    p.add_argument(
        "--dp-noise",
        type=_dp_noise,
        metavar="Z",
        help="then add Gaussian noise of std Z*C to every weight (needs --dp-clip; default 0); "
        "local clipping and noise per round, no privacy accounting",
    )


def dp_option(clip: float | None, noise: float | None) -> ClipAndNoise | None:
    """The sites' ClipAndNoise of --dp-clip/--dp-noise (None without them); GlcompError for
    --dp-noise without --dp-clip."""
    if clip is None:
        if noise is not None:
            raise GlcompError("--dp-noise needs --dp-clip (the noise's std is Z times the clipping norm C)")
        return None
    from glcomp.federated.privacy import ClipAndNoise

    return ClipAndNoise(clip, noise or 0.0)


def _partition_arg(text: str) -> str:
    from glcomp.federated.partition import parse_partition

    try:
        parse_partition(text)
    except GlcompError as err:
        raise argparse.ArgumentTypeError(str(err).removeprefix("--partition: ")) from None
    return text


def add_federated_command(sub: Any) -> None:
    """Add ``federated`` (``simulate``, ``server``, ``site``) to the glcomp command's subparsers."""
    p = sub.add_parser(
        "federated", help="federated training on Flower: simulate a federation, or run its server and sites"
    )
    fsub = p.add_subparsers(dest="federated_command", required=True, metavar="COMMAND")
    s = fsub.add_parser(
        "simulate",
        help="run a local Flower federation (simulation engine) of an example's data dealt out to N sites",
        description=__doc__.split("\n\n")[1],
    )
    s.add_argument("example", metavar="EXAMPLE.py", help="a .py file defining build() (as for glcomp train)")
    s.add_argument("--clients", type=_positive, default=4, metavar="N", help="number of sites (default 4)")
    s.add_argument("--rounds", type=_positive, default=5, metavar="R", help="federated rounds (default 5)")
    s.add_argument(
        "--partition",
        type=_partition_arg,
        default="iid",
        metavar="iid|dirichlet:ALPHA",
        help="how the training set is dealt out: at random, or label-skewed (default iid)",
    )
    s.add_argument("--seed", type=int, default=0, help="seed of the split and of the sites' batch orders")
    s.add_argument("--secure", action="store_true", help="secure aggregation (Flower's SecAgg+; FedAvg)")
    s.add_argument(
        "--epochs", type=_positive, default=1, metavar="E", help="local epochs per round (default 1)"
    )
    s.add_argument(
        "--strategy", default="fedavg", choices=["fedavg", "fedprox", "fedadam"], help="(default fedavg)"
    )
    s.add_argument(
        "--runtime",
        default="gl",
        choices=RUNTIMES,
        help="the sites' runtime: gl, reference (numpy), or mixed (alternating) (default gl)",
    )
    s.add_argument(
        "--out",
        metavar="DIR",
        help="federation directory (default runs/federated-<example>; resumed if present)",
    )
    s.add_argument(
        "--engine",
        default="simulation",
        choices=ENGINES,
        help="Flower's simulation engine (default), or a SuperLink and one SuperNode process per site "
        "on 127.0.0.1 (flwr run)",
    )
    _add_dp_arguments(s)
    s.set_defaults(func=cmd_simulate)

    v = fsub.add_parser(
        "server",
        help="the server side of a federation: a Flower SuperLink and the glcomp ServerApp (sites join it)",
        description="Start a Flower SuperLink on 127.0.0.1 and run the glcomp ServerApp of an example on it "
        "(flwr run): each round waits for --min-clients sites (glcomp federated site ...), aggregates their "
        "checked updates, evaluates the global model on the example's test set and saves it in --out; "
        "run again on the same --out, it resumes after the last saved round.",
    )
    v.add_argument("example", metavar="EXAMPLE.py", help="a .py file defining build() (as for glcomp train)")
    v.add_argument(
        "--rounds", type=_positive, default=5, metavar="R", help="federated rounds in all (default 5)"
    )
    v.add_argument(
        "--min-clients", type=_positive, default=2, metavar="N", help="sites needed each round (default 2)"
    )
    v.add_argument(
        "--strategy", default="fedavg", choices=["fedavg", "fedprox", "fedadam"], help="(default fedavg)"
    )
    v.add_argument(
        "--epochs", type=_positive, default=1, metavar="E", help="local epochs per round (default 1)"
    )
    v.add_argument("--seed", type=int, default=0, help="seed of the sites' batch orders (default 0)")
    v.add_argument("--secure", action="store_true", help="secure aggregation (Flower's SecAgg+; FedAvg)")
    v.add_argument(
        "--port",
        type=_port,
        default=9092,
        help="the SuperLink's port on 127.0.0.1 (default 9092, 0: any free)",
    )
    v.add_argument(
        "--out",
        metavar="DIR",
        help="federation directory (default runs/federated-<example>; resumed if present)",
    )
    v.add_argument(
        "--round-timeout",
        type=_seconds,
        default=600.0,
        metavar="S",
        help="seconds a round waits for its sites",
    )
    v.add_argument(
        "--timeout", type=_seconds, default=None, metavar="S", help="give up after S seconds (default: never)"
    )
    v.set_defaults(func=cmd_server)

    t = fsub.add_parser(
        "site",
        help="one site of a federation: a Flower SuperNode training on its data (or in a browser page)",
        description="Start a Flower SuperNode connected to the server's SuperLink; its ClientApp trains the "
        "example's model on this site's data (--data, or the example's own training set dealt out: "
        "--partition-id). With --browser the data and the training are in a page served on 127.0.0.1 "
        "(glcomp.js); only weights, row counts and losses leave the page. Runs until interrupted.",
    )
    t.add_argument("example", metavar="EXAMPLE.py", help="the server's example file (the same build())")
    t.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the server's SuperLink")
    t.add_argument("--name", help="the site's name (default site-<partition-id>, or site)")
    t.add_argument(
        "--data", metavar="FILE", help="the site's data: .npz or .safetensors, the model's input and target"
    )
    t.add_argument(
        "--partition-id",
        type=int,
        metavar="I",
        help="(demo) train on part I of the example's training set dealt out to --clients sites",
    )
    t.add_argument(
        "--clients", type=_positive, default=2, metavar="N", help="with --partition-id (default 2)"
    )
    t.add_argument("--partition", type=_partition_arg, default="iid", metavar="iid|dirichlet:ALPHA")
    t.add_argument("--seed", type=int, default=0, help="seed of the --partition-id split (default 0)")
    t.add_argument("--runtime", default="gl", choices=["gl", "reference"], help="a Python site's runtime")
    t.add_argument("--browser", action="store_true", help="train in a browser page (glcomp.js) served here")
    t.add_argument(
        "--port", type=_port, default=8765, help="the page's port on 127.0.0.1 (default 8765, 0: any free)"
    )
    t.add_argument("--dir", metavar="DIR", help="the site's directory (default runs/sites/<name>)")
    t.add_argument(
        "--round-timeout",
        type=_seconds,
        default=600.0,
        metavar="S",
        help="seconds a round waits for the page",
    )
    t.add_argument(
        "--timeout", type=_seconds, default=None, metavar="S", help="stop after S seconds (default: never)"
    )
    _add_dp_arguments(t)
    t.set_defaults(func=cmd_site)


def load_example(source: str) -> Any:
    """The checked ``build()`` spec of an example file (glcomp.cli's TrainSpec)."""
    from glcomp.cli import _call_user, _train_spec, load_source

    if not source.endswith(".py") or not Path(source).is_file():
        raise GlcompError(f"{source}: expected an example .py file that defines build()")
    module = load_source(source)
    build = getattr(module, "build", None)
    if not callable(build):
        raise GlcompError(f"{source} defines no build() function")
    return _train_spec(_call_user(build, f"{source}: build()"), source)


def prepare(source: str, clients: int, partition: str, seed: int, runtime: str, progress: Any = None) -> Any:
    """Compile an example and deal its training set out: (spec, program, sites), the same in
    every process that calls it with the same arguments (the split depends only on the seed)."""
    import glcomp
    from glcomp.federated import Site
    from glcomp.federated.partition import partition as deal

    if runtime not in RUNTIMES:
        raise GlcompError(f"--runtime: expected one of {RUNTIMES}, got {runtime!r}")
    spec = load_example(source)
    if spec.target_spec is not None:
        raise GlcompError(f'{source}: federated simulate takes a loss module, not loss "forward"')
    name = next(iter(spec.inputs))
    prog = glcomp.compile(
        spec.model, spec.inputs, spec.loss, spec.optimizer, target=spec.target, target_name=spec.target_name
    )
    parts = deal(spec.y_train, clients, partition, seed, min_rows=spec.batch_size)
    labels = np.issubdtype(np.asarray(spec.y_train).dtype, np.integer) and np.ndim(spec.y_train) == 1
    sites = []
    for i, idx in enumerate(parts):
        kind = runtime if runtime != "mixed" else ("gl", "reference")[i % 2]
        site = Site(f"site-{i}", {name: spec.x_train[idx], spec.target_name: spec.y_train[idx]}, kind)
        sites.append(site)
        if progress is not None:
            per_class = f", per class {np.bincount(spec.y_train[idx]).tolist()}" if labels else ""
            progress(f"{site.name} ({kind}): {len(idx)} rows{per_class}")
    return spec, prog, sites


def simulate(
    source: str,
    *,
    clients: int = 4,
    rounds: int = 5,
    partition: str = "iid",
    seed: int = 0,
    secure: bool = False,
    epochs: int = 1,
    strategy: str = "fedavg",
    runtime: str = "gl",
    out: str | Path | None = None,
    client_class: Any = None,
    progress: Any = print,
    engine: str = "simulation",
    dp: ClipAndNoise | tuple[float, float] | None = None,
) -> Any:
    """Run ``glcomp federated simulate`` and return the GlcompServer (its ``out_dir`` holds every
    round; ``glcomp.federated.history(out_dir)`` lists them). `client_class`: a GlcompClient
    subclass to run at the sites instead (tests use it to break a site). `dp`: every site clips
    and noises its update (a `glcomp.federated.privacy.ClipAndNoise` or a ``(clip,
    noise_multiplier)`` pair; ``--dp-clip``/``--dp-noise``)."""
    from glcomp.federated import GlcompClient, GlcompServer, run_simulation
    from glcomp.federated.privacy import as_dp

    dp = as_dp(dp)
    dp_text = f", {dp.describe()}" if dp is not None else ""

    if engine not in ENGINES:
        raise GlcompError(f"--engine: expected one of {ENGINES}, got {engine!r}")
    stem = Path(source).stem
    out_dir = Path(out) if out is not None else Path("runs") / f"federated-{stem}"
    if engine == "deployment":
        if client_class is not None:
            raise GlcompError("--engine deployment runs glcomp's own client app (no client_class)")
        from glcomp.federated.deploy import run_deployment

        return run_deployment(
            source,
            out_dir,
            clients=clients,
            rounds=rounds,
            partition=partition,
            seed=seed,
            epochs=epochs,
            strategy=strategy,
            runtime=runtime,
            secure=secure,
            progress=progress,
            dp=dp,
        )
    start = time.perf_counter()
    spec, prog, sites = prepare(source, clients, partition, seed, runtime, progress)
    name = next(iter(spec.inputs))
    if progress is not None:
        progress(
            f"compiled {stem} in {time.perf_counter() - start:.1f} s; {clients} clients, {rounds} rounds, "
            f"partition {partition}, {epochs} local epoch(s){', SecAgg+' if secure else ''}{dp_text}; "
            "Flower simulation"
        )
    options = {"fedprox": {"proximal_mu": 0.01}, "fedadam": {"eta": 1e-2, "eta_l": 1e-2}}.get(strategy)
    server = GlcompServer(
        prog,
        out_dir,
        num_rounds=rounds,
        strategy=strategy,
        strategy_options=options,
        min_clients=clients,
        eval_data={name: spec.x_test, spec.target_name: spec.y_test},
        secure=secure,
        progress=progress,
    )
    cls = client_class or GlcompClient
    client = cls(prog, sites, epochs=epochs, seed=seed, audit_dir=out_dir.resolve() / "audit", dp=dp)
    run_simulation(server, client, num_supernodes=clients)
    return server


def cmd_simulate(args: argparse.Namespace) -> int:
    """``glcomp federated simulate``: see `simulate`."""
    from glcomp.federated import history

    dp = dp_option(args.dp_clip, args.dp_noise)
    server = simulate(
        args.example,
        clients=args.clients,
        rounds=args.rounds,
        partition=args.partition,
        seed=args.seed,
        secure=args.secure,
        epochs=args.epochs,
        strategy=args.strategy,
        runtime=args.runtime,
        out=args.out,
        engine=args.engine,
        dp=dp,
    )
    done = [r for r in history(server.out_dir) if r["round"] > 0]
    if len(done) < args.rounds:
        raise GlcompError(f"{server.out_dir}: the federation ended after {len(done)} of {args.rounds} rounds")
    return 0


def _say(line: str) -> None:
    print(line, flush=True)


def cmd_server(args: argparse.Namespace) -> int:
    """``glcomp federated server``: a SuperLink and the ServerApp (glcomp.federated.deploy)."""
    from glcomp.federated.deploy import run_deployment

    stem = Path(args.example).stem
    out_dir = Path(args.out) if args.out is not None else Path("runs") / f"federated-{stem}"
    load_example(args.example)  # a missing or broken example is the first thing to say
    if args.secure and args.min_clients < 3:
        raise GlcompError(
            f"--secure needs --min-clients 3 or more (Flower's SecAgg+ shares each site's masks among "
            f"at least 3), got {args.min_clients}"
        )
    run_deployment(
        args.example,
        out_dir,
        clients=args.min_clients,
        min_clients=args.min_clients,
        rounds=args.rounds,
        partition="iid",
        seed=args.seed,
        epochs=args.epochs,
        strategy=args.strategy,
        runtime="reference",
        secure=args.secure,
        progress=_say,
        round_timeout=args.round_timeout,
        total_timeout=args.timeout,
        port=args.port,
        supernodes=0,
    )
    return 0


def cmd_site(args: argparse.Namespace) -> int:
    """``glcomp federated site``: see glcomp.federated.site.run_site."""
    from glcomp.federated.site import run_site

    dp = dp_option(args.dp_clip, args.dp_noise)
    return run_site(
        args.example,
        args.superlink,
        name=args.name,
        data=args.data,
        partition_id=args.partition_id,
        clients=args.clients,
        partition=args.partition,
        seed=args.seed,
        runtime=args.runtime,
        browser=args.browser,
        port=args.port,
        site_dir=args.dir,
        round_timeout=args.round_timeout,
        timeout=args.timeout,
        progress=_say,
        dp=dp,
    )


__all__ = [
    "ENGINES",
    "RUNTIMES",
    "add_federated_command",
    "cmd_server",
    "cmd_simulate",
    "cmd_site",
    "dp_option",
    "load_example",
    "prepare",
    "simulate",
]
