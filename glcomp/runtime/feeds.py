"""Checking what callers feed a program, shared by every runtime (reads manifest-style specs):
inputs, the learning rate, optimizer state to load, and the losses read while training."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.state import check_state

FLOAT32_MAX = float(np.finfo(np.float32).max)


# numpy dtype kinds of real numbers: booleans, signed and unsigned integers, floats (not complex
# numbers, whose imaginary part a conversion drops, nor timedelta64/datetime64, which numpy counts
# as integers).
REAL_KINDS = "biuf"


def as_real_array(value: Any, what: str) -> np.ndarray:
    """`value` as a numpy array of real numbers; GlcompError naming `what` for anything else (a
    torch tensor that requires grad, complex numbers, times, objects, strings)."""
    if getattr(value, "requires_grad", False) and hasattr(value, "detach"):
        raise GlcompError(
            f"{what} is a torch tensor that requires grad: pass tensor.detach() (glcomp computes "
            "gradients itself and reads only the values)"
        )
    try:
        arr = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as err:
        raise GlcompError(f"{what}: not an array ({err})") from None
    if arr.dtype.kind not in REAL_KINDS:
        raise GlcompError(
            f"{what} must hold numbers: booleans, integers or floats (not complex numbers or times), got "
            f"dtype {arr.dtype}"
        )
    return arr


def frame_sheet_of(name: str, image: dict[str, Any], shape: tuple[int, ...], value: Any) -> np.ndarray:
    """The frame sheet (the input's tensor, see glcomp.ir.ops.image) holding the uint8 images
    `value`, (N, H, W, 4) RGBA or (N, H, W, 3) RGB (alpha 255), each byte k as float32 k / 255
    (what a GPU samples from an RGBA8 texel); GlcompError naming the input for anything else."""
    arr = np.asarray(value)
    n, h, w = image["batch"], image["height"], image["width"]
    if arr.dtype != np.uint8:
        raise GlcompError(
            f"input {name!r} is an image input: pass uint8 images ({n}, {h}, {w}, 4), got dtype {arr.dtype}"
        )
    if arr.ndim != 4 or arr.shape[:3] != (n, h, w) or arr.shape[3] not in (3, 4):
        raise GlcompError(
            f"input {name!r} takes {n} images of {h}x{w} pixels, shape ({n}, {h}, {w}, 4) or "
            f"({n}, {h}, {w}, 3); got shape {arr.shape}"
        )
    sheet = np.zeros(shape, np.float32)
    cols = image["columns"]
    pixels = np.full((n, h, w, 4), 255, np.uint8)
    pixels[..., : arr.shape[3]] = arr
    values = pixels.astype(np.float32) / np.float32(255)
    for k in range(n):
        q, c = divmod(k, cols)
        sheet[q, :h, c * w : (c + 1) * w] = values[k]
    return sheet


def check_input(name: str, spec: dict[str, Any], value: Any) -> np.ndarray:
    """Return `value` as an array of the spec's shape; raise GlcompError naming the tensor. An
    image input takes uint8 images (see `frame_sheet_of`)."""
    if spec.get("image") is not None:
        return frame_sheet_of(name, spec["image"], tuple(spec["shape"]), value)
    arr = as_real_array(value, f"input {name!r}")
    shape = tuple(spec["shape"])
    if arr.shape != shape:
        hint = ""
        if arr.ndim == len(shape) and arr.ndim and arr.shape[1:] == shape[1:] and arr.shape[0] < shape[0]:
            hint = (
                f": a batch of {arr.shape[0]} where the program was compiled for {shape[0]} (the last, "
                "partial batch of a DataLoader?); programs have fixed shapes, so pass drop_last=True "
                "to the DataLoader, or compile a second program for the remainder's batch size"
            )
        raise GlcompError(f"input {name!r} expected shape {shape} but got {arr.shape}{hint}")
    classes = spec.get("num_classes")
    if classes is not None:
        if not np.issubdtype(arr.dtype, np.integer) and not np.all(np.mod(arr, 1) == 0):
            raise GlcompError(f"input {name!r}: class labels must be integers")
        if arr.size and (arr.min() < 0 or arr.max() >= classes):
            raise GlcompError(
                f"input {name!r}: class labels must lie in [0, {classes}), "
                f"got values from {arr.min()} to {arr.max()}"
            )
    elif not np.all(np.isfinite(arr)):
        raise GlcompError(f"input {name!r} holds NaN or infinite values")
    elif arr.size and arr.dtype.itemsize > 4 and np.abs(arr).max() > FLOAT32_MAX:
        raise GlcompError(
            f"input {name!r} holds values up to {float(np.abs(arr).max()):.3g}, beyond float32's range "
            f"(+-{FLOAT32_MAX:.3g}): they would become infinite on the GPU"
        )
    return arr


def check_feeds(entry: str, specs: dict[str, dict[str, Any]], given: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every name known, none missing, each one checked by `check_input`."""
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise GlcompError(f"{entry}: unknown input names {unknown}; expected {sorted(specs)}")
    missing = sorted(set(specs) - set(given))
    if missing:
        raise GlcompError(f"{entry}: missing inputs {missing}")
    return {name: check_input(name, spec, given[name]) for name, spec in specs.items()}


def check_lr(lr: Any) -> float:
    """The learning rate as a float; GlcompError unless it is a finite real number >= 0."""
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise GlcompError(f"set_lr: the learning rate must be a number, got {type(lr).__name__} {lr!r}")
    value = float(lr)
    if not math.isfinite(value) or value < 0:
        raise GlcompError(f"set_lr: the learning rate must be finite and >= 0, got {value}")
    return value


def check_optimizer_option(optimizer: Any, shapes: Mapping[str, tuple[int, ...]]) -> None:
    """Check `load_state_dict`'s ``optimizer`` argument: None, "reset", or an optimizer state
    with every key of `shapes` (the right shapes, finite values)."""
    if optimizer is None or (isinstance(optimizer, str) and optimizer == "reset"):
        return
    if isinstance(optimizer, Mapping):
        check_state(optimizer, shapes, "the optimizer state")
        return
    raise GlcompError(
        "load_state_dict: optimizer must be None (keep the optimizer state), 'reset' (zero it) or a "
        f"dict from optimizer_state(), got {optimizer!r}"
    )


def check_read_loss(loss: float, step: int, read_every: int) -> float:
    """Return the loss read after `step` (counted from 1 in one train_steps call); raise
    GlcompError when it is nan or infinite. Losses are read only every `read_every` steps (0:
    only after the last), so divergence is detected at those read points."""
    if math.isfinite(loss):
        return loss
    earlier = (step - 1) // read_every * read_every if read_every else 0  # the read point before
    reads = f"every {read_every} steps" if read_every else "after the last step only"
    when = f" (the loss is read {reads}: it turned non-finite in steps {earlier + 1}-{step})"
    when = when if step - earlier > 1 else ""
    raise GlcompError(
        f"loss is {loss} at step {step} of this train_steps call{when}; training diverged, and the "
        "weights and optimizer state are no longer usable: restore them with "
        "load_state_dict(saved_state, optimizer='reset') or reset the optimizer with reset_optimizer(), "
        "and lower the learning rate with set_lr()"
    )


def refuse_positional(entry: str, args: tuple[Any, ...], names: list[str]) -> None:
    """Runtimes take inputs by name only; a positional argument is a GlcompError saying so."""
    if args:
        example = ", ".join(f"{n}=..." for n in names) or "..."
        raise GlcompError(f"pass inputs by name: {entry}({example}); got {len(args)} positional argument(s)")


def carried_names(options: Mapping[str, Any], names: Any = None) -> list[str]:
    """The inputs carried across batches (glcomp.compile's ``carry=``, kept in the compile
    `options`): all of them, or `names` (one name or several) checked to be among them."""
    carried = options.get("carry") or {}
    known = list(carried) if isinstance(carried, Mapping) else []
    if names is None:
        return known
    chosen = [names] if isinstance(names, str) else list(names)
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise GlcompError(
            f"reset_state: {unknown} are not carried state; the carried inputs are {known} "
            "(glcomp.compile's carry=)"
        )
    return chosen
