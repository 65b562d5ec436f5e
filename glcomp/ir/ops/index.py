"""Index ops: one_hot turns integer class labels (stored as floats on the GPU) into rows."""

from __future__ import annotations

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.ops._samples import dims, st
from glcomp.ir.ops.registry import Op, register


def one_hot_shape(labels, num_classes):
    if num_classes < 1:
        raise GlcompError(f"one_hot needs at least one class, got {num_classes}")
    return (*labels, num_classes)


def one_hot_ref(labels, num_classes, dtype=np.float32):
    idx = np.asarray(labels).astype(np.int64)
    return (idx[..., None] == np.arange(num_classes)).astype(dtype)


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
    )
)
