"""Index ops: one_hot turns integer class labels (stored as floats on the GPU) into rows."""

from __future__ import annotations

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import dims, st
from glcomp.ir.ops.registry import Emitter, Op, register


def one_hot_shape(labels, num_classes):
    if num_classes < 1:
        raise GlcompError(f"one_hot needs at least one class, got {num_classes}")
    return (*labels, num_classes)


def one_hot_ref(labels, num_classes, dtype=np.float32):
    idx = np.asarray(labels).astype(np.int64)
    return (idx[..., None] == np.arange(num_classes)).astype(dtype)


def one_hot_emit(r: Emitter, n: int, args: list[str]) -> list[str]:
    """The label read at the leading indices, rounded, compared with the last index."""
    label = r.call(r.graph.operands(n)[0], args[:-1])
    return [f"return int(floor({label} + 0.5)) == {args[-1]} ? 1.0 : 0.0;"]


def one_hot_emit4(r: Emitter, n: int, lead: list[str]) -> tuple[list[str], list[int], list[int]] | None:
    """The texel of a one-hot row: the row's label read once, compared with each column."""
    src = r.graph.operands(n)[0]
    lanes = [f"k == j0{f' + {c}' if c else ''} ? 1.0 : 0.0" for c in range(4)]
    lines = [f"int k = int(floor({r.call(src, lead)} + 0.5));", f"return vec4({', '.join(lanes)});"]
    return lines, [], [src]


def sample_one_hot(draw):
    return [dims(draw, 1, 2, 6)], {"num_classes": draw(st().integers(1, 7))}


register(
    Op(
        "one_hot",
        "index",
        one_hot_shape,
        one_hot_ref,
        lambda g, out, labels, num_classes: (None,),
        sample=sample_one_hot,
        domain="labels",
        smooth=False,
        attrs=("num_classes",),
        emit=one_hot_emit,
        emit4=one_hot_emit4,
    )
)
