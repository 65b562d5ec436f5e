"""The ``glcomp`` command line: ``info``, ``compile``, ``run``, ``train`` (and ``serve``, see glcomp.serve).

Every mistake in what the user gave (a model path, an input shape, a bundle directory) is a
GlcompError, printed as ``error: ...`` with exit status 2 and no traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import importlib.util
import inspect
import json
import math
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from glcomp.codegen.target import TARGETS
from glcomp.errors import GlcompError

EXIT_USAGE = 2
LOSSES = {"cross_entropy": "CrossEntropyLoss", "mse": "MSELoss"}
OPTIMIZERS = {"sgd": "SGD", "adam": "Adam"}
_INPUT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# -- loading user code ------------------------------------------------------------------------------
@contextlib.contextmanager
def _on_path(folder: str) -> Iterator[None]:
    """Put `folder` first on sys.path while user code is imported (as ``python file.py`` would)."""
    sys.path.insert(0, folder)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(folder)


def _user_error(err: BaseException, what: str) -> GlcompError:
    """A one-line error for an exception raised by user code, naming where it was raised."""
    if isinstance(err, GlcompError):
        return err
    frames = traceback.extract_tb(err.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    text = str(err).strip().splitlines()
    detail = f": {text[0]}" if text else ""
    return GlcompError(f"{what} failed: {type(err).__name__}{detail}{where}")


def _call_user(fn: Callable[[], Any], what: str) -> Any:
    try:
        return fn()
    except GlcompError:
        raise
    except Exception as err:  # user code may raise anything; report it in one line
        raise _user_error(err, what) from None


def load_source(source: str) -> ModuleType:
    """Import `source`: a path to a .py file, or an importable module name."""
    path = Path(source)
    if source.endswith(".py") or "/" in source or "\\" in source or path.is_file():
        if not path.is_file():
            raise GlcompError(f"{source}: no such file")
        name = "_glcomp_user_" + re.sub(r"\W", "_", path.stem)
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise GlcompError(f"{source}: cannot be imported as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look modules up by name
        try:
            with _on_path(str(path.resolve().parent)):
                _call_user(lambda: spec.loader.exec_module(module), f"importing {source}")
        except GlcompError:
            sys.modules.pop(name, None)
            raise
        return module
    if not all(part.isidentifier() for part in source.split(".")):
        raise GlcompError(f"{source!r} is neither a .py file nor a module name")
    try:
        with _on_path(str(Path.cwd())):
            return importlib.import_module(source)
    except ModuleNotFoundError as err:
        if err.name and (source == err.name or source.startswith(err.name + ".")):
            msg = f"no module named {source!r} (give a path to a .py file or an importable name)"
            raise GlcompError(msg) from None
        raise _user_error(err, f"importing {source}") from None
    except GlcompError:
        raise
    except Exception as err:  # the module's own code failed
        raise _user_error(err, f"importing {source}") from None


def load_model(target: str) -> Any:
    """Resolve ``MODULE:ATTR`` to a glcomp Module: an instance, or a zero-argument factory's result."""
    from glcomp.nn import Module

    source, sep, attr = target.rpartition(":")
    if not sep or not source or not attr:
        raise GlcompError(f"expected MODULE:ATTR (e.g. model.py:net or mypkg.models:make), got {target!r}")
    module = load_source(source)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            found = sorted(
                k
                for k, v in vars(module).items()
                if not k.startswith("_") and (isinstance(v, Module) or inspect.isfunction(v))
            )
            hint = f"; it defines {', '.join(found)}" if found else ""
            raise GlcompError(f"{source} has no attribute {attr!r}{hint}")
        obj = getattr(obj, part)
    if type(obj).__module__.split(".")[0] == "torch":
        raise GlcompError(f"{target} is a torch {type(obj).__name__}; build the model with glcomp.nn instead")
    if not isinstance(obj, Module) and callable(obj) and not isinstance(obj, type):
        try:
            inspect.signature(obj).bind()
        except TypeError:
            raise GlcompError(f"{target} needs arguments; give a Module or a zero-argument factory") from None
        except ValueError:
            pass  # no signature available (a builtin): just call it
        obj = _call_user(obj, f"calling {target}()")
    elif isinstance(obj, type) and issubclass(obj, Module):
        obj = _call_user(obj, f"constructing {target}()")
    if not isinstance(obj, Module):
        raise GlcompError(f"{target} is a {type(obj).__name__}, not a glcomp.nn.Module")
    return obj


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


RUN_FILES = ("weights.safetensors", "loss.png", "metrics.json", "bundle")


def check_run_dir(path: Path) -> None:
    """Refuse to write a training run into a non-empty directory that holds no earlier run."""
    if path.exists() and not path.is_dir():
        raise GlcompError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not any((path / f).exists() for f in RUN_FILES):
        raise GlcompError(
            f"{path} is not empty and holds no earlier training run; refusing to write into it "
            "(choose another --out directory)"
        )
    check_bundle_dir(path / "bundle")


def save_bundle(bundle: Any, path: Path) -> None:
    """Write `bundle` to `path` atomically, replacing a bundle already there as a whole."""
    bundle.save(path)


def _describe(manifest: dict[str, Any]) -> str:
    entries = manifest["entries"]
    parts = []
    for name, entry in entries.items():
        kernels = len({d["kernel"] for d in entry["draws"]})
        parts.append(f"{name} {len(entry['draws'])} draws/{kernels} kernels")
    memory = _bytes(manifest["memory"]["texture_bytes"])
    return f"{', '.join(parts)}; {len(manifest['programs'])} shaders, {memory} of textures"


def _bytes(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


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
def predict_batched(rt: Any, specs: dict[str, tuple[int, ...]], feeds: dict[str, np.ndarray]) -> Any:
    """Run `rt.predict` over inputs of any leading size N with a program compiled for batch B:
    batches of B, the last one padded with zero rows whose outputs are dropped."""
    sizes = {name: len(v) if np.ndim(v) else -1 for name, v in feeds.items()}
    batch = {name: shape[0] if shape else -1 for name, shape in specs.items()}
    if set(feeds) != set(specs) or all(tuple(np.shape(v)) == specs[k] for k, v in feeds.items()):
        return rt.predict(**feeds)  # exact shapes, or a mismatch the runtime reports
    n = next(iter(sizes.values()))
    b = next(iter(batch.values()))
    same = all(sizes[k] == n and batch[k] == b and np.shape(feeds[k])[1:] == specs[k][1:] for k in feeds)
    if not same or n <= 0 or b <= 0:
        return rt.predict(**feeds)  # let the runtime name the mismatch
    outputs: list[Any] = []
    for start in range(0, n, b):
        chunk = {}
        for k, v in feeds.items():
            part = np.asarray(v[start : start + b])
            if len(part) < b:
                pad = np.zeros((b - len(part), *part.shape[1:]), part.dtype)
                part = np.concatenate([part, pad])
            chunk[k] = part
        outputs.append(rt.predict(**chunk))
    keep = n - (len(outputs) - 1) * b

    def join(parts: list[np.ndarray]) -> np.ndarray:
        if any(np.ndim(p) == 0 or len(p) != b for p in parts):
            raise GlcompError(f"the model output is not per-sample (leading size {b}); feed exactly {b} rows")
        return np.concatenate([*parts[:-1], parts[-1][:keep]])

    if isinstance(outputs[0], dict):
        return {k: join([o[k] for o in outputs]) for k in outputs[0]}
    return join(outputs)


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
@dataclasses.dataclass
class TrainSpec:
    """What an example's ``build()`` returns, checked."""

    model: Any
    inputs: dict[str, tuple[int, ...]]
    loss: Any
    optimizer: Any
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    batch_size: int
    epochs: int
    seed: int = 0
    target: str = "webgl2"
    steps: int | None = None  # the example's default length in steps (else `epochs`)
    target_name: str = "y"
    target_spec: Any = None
    sample: Any = None  # a function of the trained runtime returning text to print
    extra: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # more arrays for the demo


def _train_spec(spec: Any, source: str) -> TrainSpec:
    from glcomp.nn import Module
    from glcomp.optim import Optimizer

    where = f"{source}: build()"
    if not isinstance(spec, dict):
        raise GlcompError(f"{where} must return a dict, got {type(spec).__name__}")
    missing = sorted({"model", "inputs", "loss", "optimizer", "data", "batch_size", "epochs"} - set(spec))
    if missing:
        raise GlcompError(f"{where} returned no {', '.join(missing)}")
    if not isinstance(spec["model"], Module):
        raise GlcompError(f"{where}: model must be a glcomp.nn Module")
    if isinstance(spec["loss"], str) and spec["loss"] == "forward":
        if "target_spec" not in spec:
            raise GlcompError(f'{where}: loss "forward" needs target_spec (the target forward() takes)')
    elif not isinstance(spec["loss"], Module):
        raise GlcompError(f'{where}: loss must be a glcomp.nn Module or "forward"')
    if not isinstance(spec["optimizer"], Optimizer):
        raise GlcompError(f"{where}: optimizer must be a glcomp.optim optimizer")
    data = spec["data"]
    keys = ("x_train", "y_train", "x_test", "y_test")
    if not isinstance(data, dict) or set(keys) - set(data):
        raise GlcompError(f"{where}: data must be a dict with {', '.join(keys)}")
    arrays = {k: np.asarray(data[k]) for k in keys}
    extra = {k: np.asarray(v) for k, v in data.items() if k not in keys}
    for split in ("train", "test"):
        nx, ny = len(arrays[f"x_{split}"]), len(arrays[f"y_{split}"])
        if nx != ny or nx == 0:
            raise GlcompError(f"{where}: x_{split} and y_{split} need the same, non-zero length ({nx}, {ny})")
    batch, epochs = spec["batch_size"], spec["epochs"]
    if not isinstance(batch, int) or not isinstance(epochs, int) or batch <= 0 or epochs <= 0:
        raise GlcompError(f"{where}: batch_size and epochs must be positive integers")
    steps = spec.get("steps")
    if steps is not None and (not isinstance(steps, int) or steps <= 0):
        raise GlcompError(f"{where}: steps must be a positive integer, got {steps!r}")
    sample = spec.get("sample")
    if sample is not None and not callable(sample):
        raise GlcompError(f"{where}: sample must be a function of the trained runtime")
    inputs = {k: tuple(int(d) for d in v) for k, v in dict(spec["inputs"]).items()}
    if len(inputs) != 1:
        raise GlcompError(f"{where}: train takes models with one data input, got {sorted(inputs)}")
    shape = next(iter(inputs.values()))
    if shape != (batch, *arrays["x_train"].shape[1:]):
        raise GlcompError(
            f"{where}: inputs shape {shape} must be (batch_size, *x_train.shape[1:]) = "
            f"{(batch, *arrays['x_train'].shape[1:])}"
        )
    if len(arrays["x_train"]) < batch:
        raise GlcompError(
            f"{where}: {len(arrays['x_train'])} training samples, fewer than one batch of {batch}"
        )
    return TrainSpec(
        spec["model"],
        inputs,
        spec["loss"],
        spec["optimizer"],
        arrays["x_train"].astype(np.float32),
        arrays["y_train"],
        arrays["x_test"].astype(np.float32),
        arrays["y_test"],
        batch,
        epochs,
        int(spec.get("seed", 0)),
        str(spec.get("target", "webgl2")),
        steps,
        str(spec.get("target_name", "y")),
        spec.get("target_spec"),
        sample,
        extra,
    )


class _Progress:
    """tqdm when it is installed, else a line every few percent with loss and steps/s."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.every = max(1, total // 20)
        self.bar = None
        if sys.stderr.isatty():  # a redirected log gets plain lines instead of carriage returns
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", mininterval=0.5, dynamic_ncols=True)

    def update(self, loss: float, epoch: int) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            if self.done % 5 == 0 or self.done == self.total:
                self.bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", refresh=False)
        elif self.done % self.every == 0 or self.done == self.total:
            rate = self.done / max(time.perf_counter() - self.start, 1e-9)
            print(
                f"step {self.done}/{self.total}  epoch {epoch}  loss {loss:.4f}  {rate:.1f} steps/s",
                flush=True,
            )

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        else:
            print(text, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _plot_losses(losses: list[float], steps_per_epoch: int, title: str, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    steps = np.arange(1, len(losses) + 1)
    ax.plot(steps, losses, lw=0.8, alpha=0.45, label="loss per step")
    window = max(1, min(steps_per_epoch, len(losses)))
    if window > 1:
        smooth = np.convolve(losses, np.ones(window) / window, mode="valid")
        ax.plot(steps[window - 1 :], smooth, lw=1.8, label=f"mean over {window} steps")
    ax.set_xlabel("training step")
    ax.set_ylabel("loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)


def _evaluate(rt: Any, spec: TrainSpec, name: str) -> tuple[str, dict[str, Any]]:
    """Test-set metric: accuracy for class labels, else mean squared error. Every test sample
    counts: the last batch is padded with zero rows whose outputs are dropped."""
    shape = spec.inputs[name]
    pred = predict_batched(rt, {name: shape}, {name: spec.x_test})
    n, b = len(spec.x_test), spec.batch_size
    batches, pad = math.ceil(n / b), (-n) % b
    how = f"{batches} batches of {b}" + (f", the last padded with {pad} zero rows (ignored)" if pad else "")
    if isinstance(pred, dict):
        raise GlcompError("train evaluates models with one output")
    labels = np.issubdtype(spec.y_test.dtype, np.integer)
    if labels and pred.ndim > 2 and pred.shape[:-1] == spec.y_test.shape:
        # a label per position (a language model's next tokens): accuracy and cross-entropy per position
        logits = pred.astype(np.float64)
        logits -= logits.max(axis=-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        y = spec.y_test[..., None].astype(np.int64)
        ce = float(-np.take_along_axis(logp, y, axis=-1).mean())
        correct, total = int((pred.argmax(axis=-1) == spec.y_test).sum()), spec.y_test.size
        acc = correct / total
        return (
            f"test accuracy per position: {100 * acc:.2f}% ({correct}/{total}), cross-entropy {ce:.4f} "
            f"({n} samples; {how})",
            {"test_accuracy": acc, "test_cross_entropy": ce},
        )
    classes = labels and pred.ndim == 2
    if classes:
        correct = int((pred.argmax(axis=1) == spec.y_test).sum())
        acc = correct / n
        return f"test accuracy: {100 * acc:.2f}% ({correct}/{n}; {how})", {"test_accuracy": acc}
    mse = float(np.mean((pred - spec.y_test.reshape(pred.shape)) ** 2))
    return f"test mean squared error: {mse:.6g} ({n} samples; {how})", {"test_mse": mse}


def cmd_train(args: argparse.Namespace) -> int:
    """Compile an example, train it, evaluate it and save weights, loss curve and bundle."""
    import glcomp
    from glcomp.codegen.bundle import build_bundle

    source = args.example
    if not source.endswith(".py"):
        raise GlcompError(f"{source}: expected an example .py file that defines build()")
    wanted = "give the path of an example .py file that defines build()"
    if not Path(source).exists():
        raise GlcompError(f"{source}: no such file ({wanted})")
    if not Path(source).is_file():
        raise GlcompError(f"{source} is not a file ({wanted})")
    out = Path(args.out) if args.out else Path("runs") / Path(source).stem
    check_run_dir(out)
    module = load_source(source)
    build = getattr(module, "build", None)
    if not callable(build):
        raise GlcompError(f"{source} defines no build() function")
    spec = _train_spec(_call_user(build, f"{source}: build()"), source)
    name = next(iter(spec.inputs))

    start = time.perf_counter()
    prog = glcomp.compile(
        spec.model,
        spec.inputs,
        spec.loss,
        spec.optimizer,
        target=spec.target,
        target_name=spec.target_name,
        target_spec=spec.target_spec,
    )
    rt = prog.runtime(args.runtime)
    setup = time.perf_counter() - start
    where = rt.info()["renderer"] if args.runtime == "gl" else "numpy"
    print(
        f"compiled {Path(source).stem} for {spec.target} in {setup:.1f} s; runtime {args.runtime} ({where})"
    )
    if args.runtime == "gl":
        print(f"  {_describe(rt.manifest)}")

    n_train, b = len(spec.x_train), spec.batch_size
    per_epoch = n_train // b
    dropped = n_train - per_epoch * b
    if args.steps is not None or (spec.steps is not None and args.epochs is None):
        total = args.steps if args.steps is not None else spec.steps
        plan = f"{total} steps"
    else:
        epochs = args.epochs if args.epochs is not None else spec.epochs
        total = epochs * per_epoch
        plan = f"{epochs} epochs x {per_epoch} steps"
    note = f"; each epoch reshuffles and drops the last {dropped} samples (partial batch)" if dropped else ""
    print(f"training: {plan} of batch {b} on {n_train} samples{note}")

    rng = np.random.default_rng(spec.seed)
    losses: list[float] = []
    progress = _Progress(total)
    epoch, order, pos = 0, np.empty(0, np.int64), per_epoch
    train_start = time.perf_counter()
    try:
        for step in range(total):
            if pos == per_epoch:
                epoch, order, pos = epoch + 1, rng.permutation(n_train), 0
            idx = order[pos * b : (pos + 1) * b]
            pos += 1
            loss = rt.train_step(**{name: spec.x_train[idx]}, **{prog.target.name: spec.y_train[idx]})
            if not math.isfinite(loss):
                raise GlcompError(
                    f"training diverged at step {step + 1} (loss {loss}); lower the learning rate"
                )
            losses.append(loss)
            progress.update(loss, epoch)
            if pos == per_epoch:
                rate = (step + 1) / (time.perf_counter() - train_start)
                mean = np.mean(losses[-per_epoch:])
                progress.write(f"epoch {epoch}: mean loss {mean:.4f}  ({rate:.1f} steps/s)")
    finally:
        progress.close()
    train_time = time.perf_counter() - train_start
    print(
        f"trained {total} steps in {train_time:.1f} s ({total / max(train_time, 1e-9):.1f} steps/s, "
        f"{1000 * train_time / max(total, 1):.1f} ms/step); final loss {losses[-1]:.4f}"
    )

    start = time.perf_counter()
    line, metrics = _evaluate(rt, spec, name)
    print(f"{line} [{time.perf_counter() - start:.1f} s]")
    if spec.sample is not None:
        text = _call_user(lambda: spec.sample(rt), f"{source}: sample")
        print(f"sample:\n{text}")

    from glcomp.runtime.weights import save_weights

    out.mkdir(parents=True, exist_ok=True)
    state = rt.state_dict()
    # Torch-named parameters and buffers only (as rt.save_weights): torch's twin of the model loads
    # it with strict=True.
    save_weights(out / "weights.safetensors", state)
    opt_state = rt.optimizer_state() if hasattr(rt, "optimizer_state") else dict(rt.opt_state)
    trained = dataclasses.replace(
        prog,
        params={k: np.asarray(state[k], np.float32) for k in prog.params},
        buffers={k: np.asarray(state[k], np.float32) for k in prog.buffers},
        counters={k: np.asarray(state[k]) for k in prog.counters},
        opt_state={
            k: np.asarray(v, np.float32).reshape(prog.opt_state[k].shape) for k, v in opt_state.items()
        },
    )
    save_bundle(build_bundle(trained), out / "bundle")
    # The example's data beside the bundle, so `glcomp serve` can train it in the browser.
    from glcomp.serve import export_data

    export_data(out / "bundle", spec.x_train, spec.y_train, spec.x_test, spec.y_test, extra=spec.extra)
    saved = ["weights.safetensors", "bundle/ (with data.safetensors)"]
    try:
        _plot_losses(losses, per_epoch, f"{Path(source).stem} ({args.runtime} runtime)", out / "loss.png")
        saved.insert(1, "loss.png")
    except ImportError:
        print("warning: matplotlib is not installed; no loss.png (pip install matplotlib)", file=sys.stderr)
    metrics |= {
        "steps": total,
        "batch_size": b,
        "runtime": args.runtime,
        "renderer": where,
        "ms_per_step": 1000 * train_time / max(total, 1),
        "train_seconds": train_time,
        "final_loss": losses[-1],
    }
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1) + "\n")
    saved.append("metrics.json")
    print(f"saved {out}/: {', '.join(saved)}")
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
