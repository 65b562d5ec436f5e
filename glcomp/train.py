"""Training an example: what ``glcomp train EXAMPLE.py`` does, as a function.

An example is a .py file defining ``build()``, which returns a dict: ``model`` (a glcomp.nn
Module), ``inputs`` (one data input's shape, batch first), ``loss`` (a glcomp.nn loss Module, or
``"forward"`` with ``target_spec`` for a model whose forward() takes the target and returns the
loss), ``optimizer``, ``data`` (``x_train``, ``y_train``, ``x_test``, ``y_test`` and any more
arrays for the browser demo), ``batch_size`` and ``epochs``; optionally ``steps``, ``seed``,
``target``, ``target_name`` and ``sample`` (a function of the trained runtime returning text).

:func:`train` compiles it, trains it (each epoch reshuffles the training set and drops its last
partial batch), evaluates it on the whole test set (accuracy for class labels, else mean squared
error) and writes into its output directory, each file atomically:

- ``weights.safetensors``: the trained parameters and buffers by their torch names;
- ``loss.png``: the loss per step (where matplotlib is installed);
- ``metrics.json``: the test metric, steps, batch size, runtime, renderer and timings;
- ``bundle/``: the trained model as a bundle, with ``data.safetensors`` for ``glcomp serve``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.usercode import call_user, load_source

RUNTIMES = ("gl", "reference")
RUN_FILES = ("weights.safetensors", "loss.png", "metrics.json", "bundle")


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


@dataclasses.dataclass
class TrainResult:
    """What :func:`train` did: where it wrote, the loss of every step and the metrics it saved
    (``metrics.json``'s contents)."""

    out: Path
    losses: list[float]
    metrics: dict[str, Any]
    saved: list[str]  # what was written into `out`, as printed by ``glcomp train``
    runtime: Any  # the trained runtime (still live: release() it when done)


def check_spec(spec: Any, source: str) -> TrainSpec:
    """Check what `source`'s ``build()`` returned and make it a :class:`TrainSpec`; a GlcompError
    names the first key that is missing or wrong."""
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


def _check_example_path(source: str) -> None:
    if not source.endswith(".py"):
        raise GlcompError(f"{source}: expected an example .py file that defines build()")
    wanted = "give the path of an example .py file that defines build()"
    if not Path(source).exists():
        raise GlcompError(f"{source}: no such file ({wanted})")
    if not Path(source).is_file():
        raise GlcompError(f"{source} is not a file ({wanted})")


def load_example(source: str | Path) -> TrainSpec:
    """Import the example file `source`, call its ``build()`` and check the result."""
    source = str(source)
    _check_example_path(source)
    module = load_source(source)
    build = getattr(module, "build", None)
    if not callable(build):
        raise GlcompError(f"{source} defines no build() function")
    return check_spec(call_user(build, f"{source}: build()"), source)


def check_run_dir(path: Path) -> None:
    """Refuse to write a training run into a non-empty directory that holds no earlier run."""
    from glcomp.format.store import check_save_target

    if path.exists() and not path.is_dir():
        raise GlcompError(f"{path} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not any((path / f).exists() for f in RUN_FILES):
        raise GlcompError(
            f"{path} is not empty and holds no earlier training run; refusing to write into it "
            "(choose another --out directory)"
        )
    check_save_target(path / "bundle")


def describe(manifest: dict[str, Any]) -> str:
    """One line on a bundle: each entry point's draws and kernels, its shaders and texture memory."""
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


class _Progress:
    """tqdm when it is installed and stderr is a terminal, else a line every few percent with loss
    and steps/s (through `log`); nothing without `log`."""

    def __init__(self, total: int, log: Callable[[str], None] | None) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()
        self.every = max(1, total // 20)
        self.log = log
        self.bar = None
        if log is not None and sys.stderr.isatty():  # a redirected log gets plain lines instead
            with contextlib.suppress(ImportError):
                from tqdm import tqdm

                self.bar = tqdm(total=total, unit="step", mininterval=0.5, dynamic_ncols=True)

    def update(self, loss: float, epoch: int) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            if self.done % 5 == 0 or self.done == self.total:
                self.bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", refresh=False)
        elif self.log is not None and (self.done % self.every == 0 or self.done == self.total):
            rate = self.done / max(time.perf_counter() - self.start, 1e-9)
            self.log(f"step {self.done}/{self.total}  epoch {epoch}  loss {loss:.4f}  {rate:.1f} steps/s")

    def write(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)
        elif self.log is not None:
            self.log(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _plot_losses(losses: list[float], steps_per_epoch: int, title: str, path: Path) -> None:
    """Write the loss curve as a PNG at `path`, atomically. ImportError without matplotlib."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from glcomp.format.files import write_atomic

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
    png = io.BytesIO()
    fig.savefig(png, format="png")
    write_atomic(path, png.getvalue())


def evaluate(rt: Any, spec: TrainSpec) -> tuple[str, dict[str, Any]]:
    """Test-set metric of the runtime `rt` of `spec`'s model, as a line of text and a dict:
    accuracy for class labels (and cross-entropy for a label per position), else mean squared
    error. Every test sample counts: the last batch is padded with zero rows whose outputs are
    dropped."""
    name = next(iter(spec.inputs))
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


def _check_length(value: int | None, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise GlcompError(f"train: {what} must be a positive integer, got {value!r}")


def train(
    example: str | Path,
    *,
    steps: int | None = None,
    epochs: int | None = None,
    runtime: str = "gl",
    out: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> TrainResult:
    """Compile the example file `example` (a .py file defining ``build()``, see the module
    docstring), train it, evaluate it on its test set and save the run into `out`.

    `steps` or `epochs` (not both) overrides the example's length (its ``steps``, else its
    ``epochs``). `runtime`: ``"gl"`` (an OpenGL context) or ``"reference"`` (numpy). `out`: the
    output directory (default ``runs/<example name>``); a non-empty directory that holds no
    earlier run is refused before anything is compiled. `log` receives each line of the report
    (what was compiled, the plan, progress, the per-epoch mean loss, the test metric and the
    sample); nothing is printed without it.

    Returns a :class:`TrainResult` whose `runtime` is the trained runtime, still live. Raises
    GlcompError for a bad argument (naming it), a bad example, a diverged run (a non-finite
    loss) or an output directory in the way.
    """
    say: Callable[[str], None] = log if log is not None else (lambda text: None)
    _check_length(steps, "steps")
    _check_length(epochs, "epochs")
    if steps is not None and epochs is not None:
        raise GlcompError("train: give steps or epochs, not both")
    if runtime not in RUNTIMES:
        raise GlcompError(f"train: runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    import glcomp
    from glcomp.codegen.bundle import build_bundle

    source = str(example)
    _check_example_path(source)
    out = Path(out) if out is not None else Path("runs") / Path(source).stem
    check_run_dir(out)  # before the example's (perhaps slow) build() and the compile
    spec = load_example(source)
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
    rt = prog.runtime(runtime)
    setup = time.perf_counter() - start
    where = rt.info()["renderer"] if runtime == "gl" else "numpy"
    say(f"compiled {Path(source).stem} for {spec.target} in {setup:.1f} s; runtime {runtime} ({where})")
    if runtime == "gl":
        say(f"  {describe(rt.manifest)}")

    n_train, b = len(spec.x_train), spec.batch_size
    per_epoch = n_train // b
    dropped = n_train - per_epoch * b
    if steps is not None or (spec.steps is not None and epochs is None):
        total = steps if steps is not None else spec.steps
        assert total is not None
        plan = f"{total} steps"
    else:
        n_epochs = epochs if epochs is not None else spec.epochs
        total = n_epochs * per_epoch
        plan = f"{n_epochs} epochs x {per_epoch} steps"
    note = f"; each epoch reshuffles and drops the last {dropped} samples (partial batch)" if dropped else ""
    say(f"training: {plan} of batch {b} on {n_train} samples{note}")

    rng = np.random.default_rng(spec.seed)
    losses: list[float] = []
    progress = _Progress(total, log)
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
    say(
        f"trained {total} steps in {train_time:.1f} s ({total / max(train_time, 1e-9):.1f} steps/s, "
        f"{1000 * train_time / max(total, 1):.1f} ms/step); final loss {losses[-1]:.4f}"
    )

    start = time.perf_counter()
    line, metrics = evaluate(rt, spec)
    say(f"{line} [{time.perf_counter() - start:.1f} s]")
    if spec.sample is not None:
        text = call_user(lambda: spec.sample(rt), f"{source}: sample")
        say(f"sample:\n{text}")

    from glcomp.format.files import write_atomic
    from glcomp.runtime.weights import save_weights
    from glcomp.serve import export_data

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
    build_bundle(trained).save(out / "bundle")  # atomic: a bundle already there is replaced whole
    # The example's data beside the bundle, so `glcomp serve` can train it in the browser.
    export_data(out / "bundle", spec.x_train, spec.y_train, spec.x_test, spec.y_test, extra=spec.extra)
    saved = ["weights.safetensors", "bundle/ (with data.safetensors)"]
    with contextlib.suppress(ImportError):  # no matplotlib: no loss.png (the CLI warns)
        _plot_losses(losses, per_epoch, f"{Path(source).stem} ({runtime} runtime)", out / "loss.png")
        saved.insert(1, "loss.png")
    metrics |= {
        "steps": total,
        "batch_size": b,
        "runtime": runtime,
        "renderer": where,
        "ms_per_step": 1000 * train_time / max(total, 1),
        "train_seconds": train_time,
        "final_loss": losses[-1],
    }
    write_atomic(out / "metrics.json", (json.dumps(metrics, indent=1) + "\n").encode())
    saved.append("metrics.json")
    return TrainResult(out, losses, metrics, saved, rt)
