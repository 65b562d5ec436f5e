"""The ``glcomp`` command line: ``info``, ``compile``, ``run``, ``train`` (and ``serve``, see glcomp.serve).

Every mistake in what the user gave (a model path, an input shape, a bundle directory) is a
GlcompError, printed as ``error: ...`` with exit status 2 and no traceback.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.codegen.target import TARGETS
from glcomp.errors import GlcompError
from glcomp.train import check_spec as _train_spec  # noqa: F401 (the old name, glcomp.federated.cli's)
from glcomp.train import describe as _describe
from glcomp.train import predict_batched
from glcomp.usercode import call_user as _call_user  # noqa: F401 (the old name, glcomp.federated.cli's)
from glcomp.usercode import load_model
from glcomp.usercode import load_source as load_source

EXIT_USAGE = 2
LOSSES = {"cross_entropy": "CrossEntropyLoss", "mse": "MSELoss"}
OPTIMIZERS = {"sgd": "SGD", "adam": "Adam"}
_INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- parsing --------------------------------------------------------------------------------------
def _split_input(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    name = name.strip()
    if not sep or not _INPUT_NAME.match(name) or not value.strip():
        raise GlcompError(f"--input {text!r}: expected {what}")
    return name, value.strip()


def parse_shapes(items: list[str]) -> dict[str, tuple[int, ...]]:
    """``["x=64,1,8,8"]`` -> ``{"x": (64, 1, 8, 8)}``."""
    shapes: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, value = _split_input(item, "NAME=D0,D1,... (e.g. x=64,1,8,8)")
        try:
            dims = tuple(int(d) for d in value.split(","))
        except ValueError:
            raise GlcompError(f"--input {item!r}: sizes must be integers separated by commas") from None
        if any(d <= 0 for d in dims):
            raise GlcompError(f"--input {item!r}: sizes must be positive")
        if name in shapes:
            raise GlcompError(f"--input {name!r} given twice")
        shapes[name] = dims
    if not shapes:
        raise GlcompError("give at least one --input NAME=SHAPE (e.g. --input x=64,1,8,8)")
    return shapes


def parse_files(items: list[str]) -> dict[str, np.ndarray]:
    """``["x=batch.npy"]`` -> ``{"x": array}``."""
    arrays: dict[str, np.ndarray] = {}
    for item in items:
        name, value = _split_input(item, "NAME=FILE.npy (e.g. x=batch.npy)")
        if name in arrays:
            raise GlcompError(f"--input {name!r} given twice")
        try:
            arrays[name] = np.load(value, allow_pickle=False)
        except FileNotFoundError:
            raise GlcompError(f"--input {name}: {value}: no such file") from None
        except (OSError, ValueError) as err:
            raise GlcompError(f"--input {name}: {value} is not a readable .npy file ({err})") from None
        if not isinstance(arrays[name], np.ndarray):
            raise GlcompError(f"--input {name}: {value} holds several arrays (.npz); give one .npy per input")
    return arrays


# -- bundle directories -------------------------------------------------------------------------------
def check_bundle_dir(path: Path) -> None:
    """Refuse to write a bundle into anything but a new, empty or bundle directory (checked
    again by the save itself; called early so a bad --out fails before a slow compile)."""
    from glcomp.format.store import check_save_target

    check_save_target(path)


def save_bundle(bundle: Any, path: Path) -> None:
    """Write `bundle` to `path` atomically, replacing a bundle already there as a whole."""
    bundle.save(path)


# -- info -------------------------------------------------------------------------------------------
def cmd_info(args: argparse.Namespace) -> int:
    """Print what the OpenGL context offers."""
    from glcomp.runtime.gl import context_info, create_context, probe_float_targets

    ctx = create_context()
    try:
        info = context_info(ctx) | probe_float_targets(ctx)
    finally:
        ctx.release()
    if args.json:
        print(json.dumps(info, indent=1))
        return 0
    labels = {
        "renderer": "GL renderer",
        "vendor": "GL vendor",
        "version": "GL version",
        "max_texture_size": "max texture size",
        "max_draw_buffers": "max draw buffers",
        "max_texture_units": "texture units",
        "float_render_targets": "float render targets",
        "float_blending": "float blending",
    }
    for key, label in labels.items():
        value = info.get(key)
        if isinstance(value, bool):
            value = "yes" if value else "no"
        print(f"{label + ':':<22}{value}")
    return 0


# -- compile --------------------------------------------------------------------------------------
def cmd_compile(args: argparse.Namespace) -> int:
    """Compile MODULE:ATTR (or a model.onnx file) into a bundle directory."""
    import glcomp
    from glcomp import nn, optim
    from glcomp.codegen.bundle import build_bundle

    out = Path(args.output)
    check_bundle_dir(out)  # fail before the (slow) compile
    onnx_file = args.model.lower().endswith(".onnx") and ":" not in Path(args.model).name
    onnx_model = glcomp.onnx.load(args.model) if onnx_file else None
    if (
        onnx_model is not None
        and not args.input
        and all(None not in shape for shape in onnx_model.input_shapes.values())
    ):  # an ONNX file with static input shapes needs no --input
        inputs = dict(onnx_model.input_shapes)
    else:
        inputs = parse_shapes(args.input)
    if args.optimizer and not args.loss:
        raise GlcompError("--optimizer needs --loss (cross_entropy or mse)")
    if args.lr <= 0 or not math.isfinite(args.lr):
        raise GlcompError(f"--lr must be a positive number, got {args.lr}")
    model = onnx_model if onnx_model is not None else load_model(args.model)
    loss = getattr(nn, LOSSES[args.loss])() if args.loss else None
    opt = getattr(optim, OPTIMIZERS[args.optimizer])(lr=args.lr) if args.optimizer else None
    start = time.perf_counter()
    prog = glcomp.compile(model, inputs, loss, opt, target=args.target)
    bundle = build_bundle(prog)
    save_bundle(bundle, out)
    print(f"wrote {out} ({args.target}, {time.perf_counter() - start:.1f} s): {_describe(bundle.manifest)}")
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    """Print the kernel plan of a model (compiled here) or of a saved bundle: its draws, or with
    --dump-after each entry point's plan after that pass."""
    import glcomp
    from glcomp import nn, optim
    from glcomp.codegen.pipeline import check_pass_name

    if args.dump_after is not None:
        check_pass_name(args.dump_after, "--dump-after")  # before any compiling
    if Path(args.model).is_dir():
        print(glcomp.load(args.model).explain(args.dump_after))
        return 0
    inputs = parse_shapes(args.input)
    if args.optimizer and not args.loss:
        raise GlcompError("--optimizer needs --loss (cross_entropy or mse)")
    model = load_model(args.model)
    loss = getattr(nn, LOSSES[args.loss])() if args.loss else None
    opt = getattr(optim, OPTIMIZERS[args.optimizer])(lr=args.lr) if args.optimizer else None
    print(glcomp.compile(model, inputs, loss, opt, target=args.target).explain(args.dump_after))
    return 0


# -- run -----------------------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    """Run a bundle's predict entry point on .npy inputs."""
    import glcomp

    feeds = parse_files(args.input)
    prog = glcomp.load(args.bundle)
    if "predict" not in prog.bundle().manifest["entries"]:
        raise GlcompError(f"{args.bundle}: the bundle has no predict entry point")
    rt = prog.runtime("gl")
    m = rt.manifest
    specs = {name: tuple(m["inputs"][name]["shape"]) for name in m["entries"]["predict"]["inputs"]}
    result = predict_batched(rt, specs, feeds)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(result, dict):
        with out.open("wb") as f:
            np.savez(f, **result)
        print(f"wrote {out} (.npz with {', '.join(result)})")
    else:
        with out.open("wb") as f:
            np.save(f, result)
        print(f"wrote {out} (shape {tuple(result.shape)})")
    return 0


# -- train ----------------------------------------------------------------------------------------
def cmd_train(args: argparse.Namespace) -> int:
    """Compile an example, train it, evaluate it and save weights, loss curve and bundle
    (glcomp.train.train, which prints through `print`)."""
    from glcomp.train import train

    def say(text: str) -> None:
        print(text, flush=True)

    result = train(
        args.example, steps=args.steps, epochs=args.epochs, runtime=args.runtime, out=args.out, log=say
    )
    if "loss.png" not in result.saved:
        print("warning: matplotlib is not installed; no loss.png (pip install matplotlib)", file=sys.stderr)
    print(f"saved {result.out}/: {', '.join(result.saved)}")
    return 0


# -- entry point ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``glcomp`` command."""
    from glcomp import __version__

    parser = argparse.ArgumentParser(
        prog="glcomp",
        description="Compile neural networks into GLSL ES shaders that train them on WebGL GPUs.",
    )
    parser.add_argument("--version", action="version", version=f"glcomp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("info", help="show the OpenGL renderer, its limits and float texture support")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("compile", help="compile MODULE:ATTR or model.onnx into a bundle directory")
    p.add_argument(
        "model",
        metavar="MODULE:ATTR",
        help="a .py path or module name, and a Module or factory in it; or an ONNX file (model.onnx)",
    )
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="bundle directory to write")
    p.add_argument(
        "--input", action="append", default=[], metavar="NAME=SHAPE", help="an input shape, e.g. x=64,1,8,8"
    )
    p.add_argument("--target", default="webgl2", choices=list(TARGETS))
    p.add_argument("--loss", choices=sorted(LOSSES), help="add gradients (and train_step with --optimizer)")
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="add a train_step entry point")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("explain", help="print the kernel plan of a model or bundle: draws and estimated work")
    p.add_argument("model", metavar="MODULE:ATTR|DIR", help="a model as for compile, or a bundle directory")
    p.add_argument("--input", action="append", default=[], metavar="NAME=SHAPE", help="e.g. x=64,1,8,8")
    p.add_argument("--target", default="webgl2", choices=list(TARGETS))
    p.add_argument(
        "--loss", choices=sorted(LOSSES), help="explain gradients (and train_step with --optimizer)"
    )
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), help="explain a train_step entry point")
    p.add_argument("--lr", type=float, default=0.01, help="learning rate (default 0.01)")
    p.add_argument(
        "--dump-after",
        metavar="PASS",
        help="print each entry point's kernel plan after this code-generation pass instead "
        "(e.g. fold_views, fusion, mrt, memplan; an unknown name lists them all)",
    )
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser("run", help="run a bundle's predict on .npy inputs")
    p.add_argument("bundle", metavar="DIR")
    p.add_argument("--input", action="append", default=[], metavar="NAME=FILE", help="e.g. x=batch.npy")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="where to np.save the output")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("train", help="train an example (a .py file defining build())")
    p.add_argument("example", metavar="EXAMPLE.py")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--steps", type=_positive, metavar="N", help="train N steps")
    length.add_argument(
        "--epochs", type=_positive, metavar="N", help="train N epochs (default: the example's)"
    )
    p.add_argument("--runtime", default="gl", choices=["gl", "reference"])
    p.add_argument("--out", metavar="DIR", help="output directory (default runs/<example name>)")
    p.set_defaults(func=cmd_train)

    try:  # the browser demo server, where it is installed
        from glcomp.serve import add_serve_command
    except ImportError:
        pass
    else:
        add_serve_command(sub)
    try:  # federated training on Flower (glcomp[federated]; Flower itself is imported when used)
        from glcomp.federated.cli import add_federated_command
    except ImportError:
        pass
    else:
        add_federated_command(sub)
    return parser


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _print_error(err: GlcompError) -> None:
    lines = str(err).strip().splitlines() or ["unknown error"]
    print(f"error: {lines[0]}", file=sys.stderr)
    for line in lines[1:]:
        print(f"  {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run the ``glcomp`` command; returns the exit status (2 for usage and input errors)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version, or a usage error argparse already printed
        return done.code if isinstance(done.code, int) else EXIT_USAGE
    try:
        return args.func(args)
    except GlcompError as err:
        _print_error(err)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
