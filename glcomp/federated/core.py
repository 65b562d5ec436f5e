"""What a federation needs from glcomp, without Flower: the tensors a federation exchanges, the
check of an update received from elsewhere, one site's local training, evaluation on held-out
data, and the per-round checkpoints of the global model.

Nothing here imports flwr: `glcomp.federated.client` and `glcomp.federated.server` wrap these in
Flower's ClientApp and ServerApp.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import tempfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format.files import fsync_path, write_atomic

OPTIMIZER_MODES = ("reset", "keep")
RUNTIME_KINDS = ("gl", "reference")
# Bytes an .npy header may add to a float32 array's data (numpy pads headers to 64 bytes; a
# structured or very high-rank header is longer, but never legitimately this long).
_NPY_HEADER_SLACK = 4096


# -- the exchanged tensors ------------------------------------------------------------------------
def federated_shapes(program: Any) -> dict[str, tuple[int, ...]]:
    """The tensors a federation exchanges for `program`, in the program's order: its parameters
    and its float buffers (BatchNorm running statistics) by torch name. Optimizer state, step
    counters and random-number counters stay at each site."""
    shapes = {k: tuple(np.shape(v)) for k, v in program.params.items()}
    shapes |= {k: tuple(np.shape(v)) for k, v in program.buffers.items()}
    return shapes


def update_norm(new: Mapping[str, np.ndarray], old: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of ``new - old`` over every exchanged tensor (in float64)."""
    total = 0.0
    for k, v in old.items():
        d = np.asarray(new[k], np.float64) - np.asarray(v, np.float64)
        total += float(np.dot(d.ravel(), d.ravel()))
    return math.sqrt(total)


def check_update(
    arrays: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], source: str
) -> dict[str, np.ndarray]:
    """Check tensors received from another party against the program's: exactly the expected
    names, each a float32 numpy array of the expected shape holding finite values. Returns them
    as float32 arrays in the program's order; raises GlcompError naming `source` and every bad
    tensor (nothing is returned then, so nothing of a bad update is ever used).

    `arrays` maps names to numpy arrays (already decoded); `check_array_record` checks Flower
    `Array` objects before decoding them."""
    problems = []
    missing = [k for k in expected if k not in arrays]
    extra = [k for k in arrays if k not in expected]
    if missing:
        problems.append(f"missing tensors {missing}")
    if extra:
        problems.append(
            f"unexpected tensors {[_short(k) for k in extra[:8]]}" + (" ..." if len(extra) > 8 else "")
        )
    out: dict[str, np.ndarray] = {}
    for name, shape in expected.items():
        if name not in arrays:
            continue
        value = arrays[name]
        if not isinstance(value, np.ndarray):
            problems.append(f"tensor {name!r} is a {type(value).__name__}, not a numpy array")
            continue
        if value.dtype != np.float32:
            problems.append(f"tensor {name!r} has dtype {value.dtype}, expected float32")
            continue
        if value.shape != tuple(shape):
            problems.append(f"tensor {name!r} has shape {value.shape}, expected {tuple(shape)}")
            continue
        if not np.all(np.isfinite(value)):
            bad = int(np.size(value) - np.count_nonzero(np.isfinite(value)))
            problems.append(f"tensor {name!r} holds {bad} NaN or infinite values")
            continue
        out[name] = np.ascontiguousarray(value)
    if problems:
        raise GlcompError(f"update from {source} rejected: " + "; ".join(problems))
    return out


def check_array_record(
    record: Any, expected: Mapping[str, tuple[int, ...]], source: str
) -> dict[str, np.ndarray]:
    """`check_update` for a Flower ArrayRecord (untrusted bytes): each Array must declare
    numpy serialization, dtype float32 and the expected shape, and carry no more bytes than
    such an array needs, before it is decoded (numpy's loader, pickles refused); the decoded
    array is then checked again (its real dtype, shape and values)."""
    problems = []
    decoded: dict[str, Any] = {}
    try:
        items = list(record.items())
    except Exception as err:
        raise GlcompError(f"update from {source} rejected: not an ArrayRecord ({err})") from None
    for name, arr in items:
        shape = expected.get(name)
        if shape is None:
            decoded[name] = None  # reported as unexpected by check_update
            continue
        try:
            stype, dtype, dshape, data = arr.stype, arr.dtype, tuple(arr.shape), arr.data
        except Exception as err:
            problems.append(f"tensor {name!r} is not a Flower Array ({err})")
            continue
        if stype != "numpy.ndarray":
            problems.append(f"tensor {name!r} has serialization {_short(stype)!r}, expected 'numpy.ndarray'")
        elif dtype != "float32":
            problems.append(f"tensor {name!r} has dtype {_short(dtype)!r}, expected float32")
        elif dshape != tuple(shape):
            problems.append(f"tensor {name!r} has shape {dshape}, expected {tuple(shape)}")
        elif not isinstance(data, bytes) or len(data) > 4 * math.prod(shape) + _NPY_HEADER_SLACK:
            problems.append(
                f"tensor {name!r} carries {len(data)} bytes, more than a float32 array of its shape"
            )
        else:
            try:
                decoded[name] = arr.numpy()
            except Exception as err:
                problems.append(
                    f"tensor {name!r} cannot be decoded ({type(err).__name__}: {_short(str(err))})"
                )
    missing = [k for k in expected if k not in decoded and not any(k in p for p in problems)]
    if problems:
        if missing:
            problems.insert(0, f"missing tensors {missing}")
        raise GlcompError(f"update from {source} rejected: " + "; ".join(problems))
    return check_update(decoded, expected, source)


def _short(text: Any, limit: int = 80) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit] + "..."


# -- one site's data and local training ----------------------------------------------------------
@dataclass
class Site:
    """One member of a federation: its name (shown in logs and rejections), its training data
    (every input of the program and its target by name, any number of rows), the runtime it
    trains on (``"gl"`` or ``"reference"``), and optionally held-out data for Flower's
    client-side evaluation (else the training data is evaluated)."""

    name: str
    data: Mapping[str, Any]
    runtime: str = "gl"
    eval_data: Mapping[str, Any] | None = None
    runtime_options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.runtime not in RUNTIME_KINDS:
            raise GlcompError(
                f"site {self.name!r}: unknown runtime {self.runtime!r}; use 'gl' or 'reference'"
            )


def check_site_data(
    program: Any, data: Mapping[str, Any], where: str, full_batch: bool = True
) -> tuple[dict[str, np.ndarray], int]:
    """The site's arrays (the program's inputs and target, each N rows of the compiled shape
    beyond the batch axis) and N; GlcompError naming `where` and the array at fault. Training
    data (`full_batch`) needs at least one batch; held-out data at least one row."""
    specs = dict(program.inputs)
    if program.target is None:
        raise GlcompError(f"{where}: the program was compiled without a loss, so it cannot train")
    specs[program.target.name] = program.target
    missing = [k for k in specs if k not in data]
    extra = [k for k in data if k not in specs]
    if missing or extra:
        raise GlcompError(
            f"{where}: the data must hold exactly {sorted(specs)} (missing {missing}, unexpected {extra})"
        )
    arrays = {k: np.asarray(data[k]) for k in specs}
    sizes = {k: (len(v) if v.ndim else -1) for k, v in arrays.items()}
    n = sizes[next(iter(specs))]
    for k, spec in specs.items():
        if not spec.shape:
            raise GlcompError(f"{where}: input {k!r} has no batch axis")
        if sizes[k] != n or arrays[k].shape[1:] != tuple(spec.shape[1:]):
            want = str(("N", *spec.shape[1:])).replace("'", "")
            raise GlcompError(
                f"{where}: {k!r} has shape {arrays[k].shape}; expected {want} with the same N as "
                f"{next(iter(specs))!r} ({n})"
            )
    batch = specs[next(iter(specs))].shape[0]
    if n < (batch if full_batch else 1):
        raise GlcompError(
            f"{where}: {n} samples, fewer than " + (f"one batch of {batch}" if full_batch else "one")
        )
    return arrays, n


@dataclass
class LocalResult:
    """What one round of local training produced at a site."""

    weights: dict[str, np.ndarray]  # the exchanged tensors after training (float32)
    num_examples: int  # the site's training samples (the FedAvg weight)
    losses: list[float]  # the loss of every local step
    steps: int
    update_norm: float  # ||weights - global weights||_2
    opt_state: dict[str, np.ndarray]  # the optimizer state after training (kept at the site)
    counters: dict[str, np.ndarray]  # the step and random-number counters after training
    lr: float

    def metrics(self) -> dict[str, float | int]:
        """The numbers a site reports with its update (Flower MetricRecord-ready)."""
        losses = self.losses
        return {
            "num-examples": int(self.num_examples),
            "steps": int(self.steps),
            "train-loss-first": float(losses[0]),
            "train-loss-last": float(losses[-1]),
            "train-loss-mean": float(np.mean(losses)),
            "train-loss-min": float(np.min(losses)),
            "update-norm": float(self.update_norm),
            "lr": float(self.lr),
        }


def runtime_lr(rt: Any) -> float:
    """The learning rate a runtime trains with now."""
    hyper = getattr(rt, "hyper", None)
    if isinstance(hyper, dict) and "lr" in hyper:
        return float(hyper["lr"])
    return float(rt.lr)


def shuffle_seed(seed: int, server_round: int, site: str) -> list[int]:
    """The seed of a site's batch order in a round: the same on every runtime and every process."""
    return [int(seed), int(server_round), zlib.crc32(site.encode("utf-8"))]


def local_train(
    rt: Any,
    program: Any,
    data: Mapping[str, Any],
    global_weights: Mapping[str, np.ndarray],
    *,
    site: str = "site",
    epochs: int = 1,
    steps: int | None = None,
    seed: int = 0,
    server_round: int = 1,
    optimizer: str | Mapping[str, Any] = "reset",
    counters: Mapping[str, Any] | None = None,
    lr: float | None = None,
    proximal_mu: float = 0.0,
) -> LocalResult:
    """Train `rt` (a runtime of `program`) from `global_weights` on a site's data.

    The exchanged tensors come from `global_weights`, the counters from `counters` (the site's
    own, else the program's); `optimizer` is ``"reset"`` (zeroed) or the site's kept
    optimizer state. Each of the `epochs` epochs visits the data in a fresh order (seeded by
    `seed`, `server_round` and the site's name) in batches of the compiled batch size, the last
    partial batch dropped; `steps` caps the steps of the round. With `proximal_mu` > 0
    (FedProx) every step is followed by the proximal step of the term mu/2 ||w - w_global||^2,
    ``w <- (w + lr*mu*w_global) / (1 + lr*mu)``, on every trainable parameter. A non-finite
    loss raises GlcompError naming the site and the step."""
    where = f"site {site!r}"
    arrays, n = check_site_data(program, data, where)
    names = list(arrays)
    batch = program.inputs[names[0]].shape[0]
    per_epoch = n // batch
    if not isinstance(epochs, int) or isinstance(epochs, bool) or epochs < 1:
        raise GlcompError(f"{where}: local epochs must be a positive integer, got {epochs!r}")
    total = epochs * per_epoch if steps is None else min(int(steps), epochs * per_epoch)
    if total < 1:
        raise GlcompError(f"{where}: local steps must be a positive integer, got {steps!r}")
    if not (math.isfinite(proximal_mu) and proximal_mu >= 0):
        raise GlcompError(f"{where}: proximal-mu must be a finite number >= 0, got {proximal_mu!r}")

    shapes = federated_shapes(program)
    start = {k: np.asarray(global_weights[k], np.float32) for k in shapes}
    state: dict[str, Any] = dict(start)
    own = counters if counters is not None else program.counters
    state |= {k: np.asarray(own[k]) for k in program.counters}
    if isinstance(optimizer, str) and optimizer not in OPTIMIZER_MODES:
        raise GlcompError(f"{where}: optimizer must be 'reset', 'keep' or a state, got {optimizer!r}")
    rt.load_state_dict(state, optimizer="reset" if isinstance(optimizer, str) else optimizer)
    if lr is not None:
        rt.set_lr(lr)
    lr_now = runtime_lr(rt)
    trainable = [k for k in (program.trainable or program.params) if k in shapes]

    rng = np.random.default_rng(shuffle_seed(seed, server_round, site))
    losses: list[float] = []
    order, pos = np.empty(0, np.int64), per_epoch
    for step in range(total):
        if pos == per_epoch:
            order, pos = rng.permutation(n), 0
        idx = order[pos * batch : (pos + 1) * batch]
        pos += 1
        loss = rt.train_step(**{k: v[idx] for k, v in arrays.items()})
        if not math.isfinite(loss):
            raise GlcompError(
                f"{where}: local training diverged at step {step + 1} of round {server_round} (loss {loss}); "
                "nothing is sent for this round"
            )
        losses.append(float(loss))
        if proximal_mu > 0:
            now = rt.state_dict()
            c = lr_now * proximal_mu
            for k in trainable:
                now[k] = ((np.asarray(now[k], np.float64) + c * start[k]) / (1.0 + c)).astype(np.float32)
            rt.load_state_dict(now)

    final = rt.state_dict()
    weights = {k: np.asarray(final[k], np.float32).reshape(shapes[k]) for k in shapes}
    return LocalResult(
        weights=weights,
        num_examples=n,
        losses=losses,
        steps=total,
        update_norm=update_norm(weights, start),
        opt_state={k: np.asarray(v, np.float32) for k, v in rt.optimizer_state().items()},
        counters={k: np.asarray(final[k]) for k in program.counters},
        lr=lr_now,
    )


# -- evaluation -----------------------------------------------------------------------------------
def evaluate(rt: Any, program: Any, data: Mapping[str, Any], where: str = "evaluation") -> dict[str, float]:
    """Metrics of the runtime's current weights on held-out data (the program's inputs and target,
    any number of rows; the last batch padded with zero rows whose outputs are dropped): for class
    labels ``accuracy`` and ``loss`` (mean cross-entropy of the predicted logits), else ``loss``
    (mean squared error); ``num-examples`` is the number of rows."""
    from glcomp.cli import predict_batched

    arrays, n = check_site_data(program, data, where, full_batch=False)
    inputs = {k: arrays[k] for k in program.inputs}
    pred = predict_batched(rt, {k: s.shape for k, s in program.inputs.items()}, inputs)
    if isinstance(pred, dict):
        raise GlcompError(f"{where}: the model has several outputs; evaluate needs one")
    y = arrays[program.target.name]
    pred = np.asarray(pred, np.float64)
    if np.issubdtype(y.dtype, np.integer) and pred.ndim == y.ndim + 1:
        logits = pred - pred.max(axis=-1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
        ce = float(-np.take_along_axis(logp, y[..., None].astype(np.int64), axis=-1).mean())
        acc = float((pred.argmax(axis=-1) == y).mean())
        return {"accuracy": acc, "loss": ce, "num-examples": int(n)}
    mse = float(np.mean((pred - y.reshape(pred.shape)) ** 2))
    return {"loss": mse, "num-examples": int(n)}


# -- per-round checkpoints of the global model ------------------------------------------------------
ROUND_DIR = re.compile(r"^round-(\d{4,})$")
FEDERATION_FILE = "federation.json"
FEDERATION_FORMAT = "glcomp-federation"


@dataclass
class SavedRound:
    """A round read back from a federation directory."""

    round: int
    path: Path  # the round's directory; its model/ is a glcomp bundle
    weights: dict[str, np.ndarray]
    info: dict[str, Any]
    strategy_state: dict[str, np.ndarray]


class RoundStore:
    """A federation directory: ``federation.json`` (what is federated) and one directory per
    finished round, ``round-0003/`` holding ``model/`` (the global model after that round as a
    glcomp bundle, written by the server runtime's own ``save``), ``round.json`` (the round's
    metrics, clients, rejections) and, for adaptive strategies, ``strategy.safetensors`` (the
    server optimizer's moments). A round directory is assembled under a temporary name and
    renamed into place once complete, so a server killed at any moment leaves only whole rounds;
    the directory of the highest round is where a restarted server resumes. `keep` limits how
    many round directories stay (the newest; None keeps all)."""

    def __init__(self, directory: str | os.PathLike[str], program: Any, keep: int | None = None) -> None:
        self.dir = Path(directory)
        self.program = program
        self.shapes = federated_shapes(program)
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise GlcompError(f"keep_rounds must be a positive integer or None, got {keep!r}")
        self.keep = keep

    def _describe(self) -> dict[str, Any]:
        return {
            "format": FEDERATION_FORMAT,
            "version": 1,
            "tensors": {k: list(s) for k, s in self.shapes.items()},
        }

    def open(self) -> None:
        """Create the directory (or check that it is this program's federation directory)."""
        if self.dir.is_symlink():
            raise GlcompError(f"{self.dir}: a symbolic link; give the federation directory itself")
        marker = self.dir / FEDERATION_FILE
        if self.dir.exists():
            if not self.dir.is_dir():
                raise GlcompError(f"{self.dir}: not a directory")
            if marker.is_file():
                try:
                    have = json.loads(marker.read_text())
                except (OSError, ValueError) as err:
                    raise GlcompError(f"{marker}: unreadable ({err})") from None
                if have != self._describe():
                    raise GlcompError(
                        f"{marker}: this directory holds a federation of another model (its tensors "
                        "differ from the program's); use a fresh directory"
                    )
                return
            if any(self.dir.iterdir()):
                raise GlcompError(
                    f"{self.dir}: not empty and not a federation directory (no {FEDERATION_FILE})"
                )
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(marker, (json.dumps(self._describe(), indent=1) + "\n").encode())

    def rounds(self) -> list[int]:
        if not self.dir.is_dir():
            return []
        found = [int(m.group(1)) for p in self.dir.iterdir() if (m := ROUND_DIR.match(p.name)) and p.is_dir()]
        return sorted(found)

    def path(self, server_round: int) -> Path:
        return self.dir / f"round-{server_round:04d}"

    def load(self, server_round: int) -> SavedRound:
        """Read a saved round (its bundle validated by glcomp.load); GlcompError naming it."""
        import glcomp

        path = self.path(server_round)
        try:
            info = json.loads((path / "round.json").read_text())
        except (OSError, ValueError) as err:
            raise GlcompError(f"{path}/round.json: unreadable ({err})") from None
        prog = glcomp.load(path / "model")
        have = federated_shapes(prog)
        if have != self.shapes:
            raise GlcompError(f"{path}/model: its tensors differ from the program's")
        weights = {k: np.asarray((prog.params | prog.buffers)[k], np.float32) for k in self.shapes}
        strategy_state: dict[str, np.ndarray] = {}
        st = path / "strategy.safetensors"
        if st.is_file():
            from safetensors.numpy import load_file

            strategy_state = load_file(str(st))
        return SavedRound(server_round, path, weights, info, strategy_state)

    def latest(self) -> SavedRound | None:
        """The highest saved round, or None when none was saved."""
        rounds = self.rounds()
        return self.load(rounds[-1]) if rounds else None

    def save(
        self,
        server_round: int,
        runtime: Any,
        info: Mapping[str, Any],
        strategy_state: Mapping[str, np.ndarray] | None = None,
    ) -> Path:
        """Save round `server_round`: `runtime` (holding the global weights) saves the bundle,
        then the round's info and strategy state; the round directory appears whole or not at
        all. Older rounds beyond `keep` are removed afterwards."""
        final = self.path(server_round)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".partial", dir=self.dir))
        try:
            runtime.save(tmp / "model")
            if strategy_state:
                from safetensors.numpy import save_file

                save_file(
                    {k: np.ascontiguousarray(v) for k, v in strategy_state.items()},
                    str(tmp / "strategy.safetensors"),
                )
                fsync_path(tmp / "strategy.safetensors")
            text = json.dumps(dict(info), indent=1, allow_nan=False, default=_json_default) + "\n"
            (tmp / "round.json").write_text(text)
            fsync_path(tmp / "round.json")
            fsync_path(tmp)
            if final.exists():  # a round saved again (the server re-ran it): replace it whole
                old = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".old", dir=self.dir))
                os.rename(final, old / "round")
                os.rename(tmp, final)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.rename(tmp, final)
            fsync_path(self.dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        self._prune()
        return final

    def _prune(self) -> None:
        for p in self.dir.iterdir():  # what a killed save left behind (only our own temporaries)
            if p.name.startswith(".round-") and p.name.endswith((".partial", ".old")) and p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
        if self.keep is None:
            return
        for r in self.rounds()[: -self.keep]:
            shutil.rmtree(self.path(r), ignore_errors=True)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    return str(value)
