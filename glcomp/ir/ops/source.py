"""Source nodes: graph inputs and scalar constants. They have no operands and no kernels."""

from __future__ import annotations

import numpy as np

from glcomp.ir.ops.registry import Op, register

register(
    Op(
        "input",
        "source",
        lambda shape, name, role: tuple(shape),
        lambda **_: None,  # fed by the runtime
        None,
        0,
        attrs=("shape", "name", "role"),
        cost=0,
        feed=True,
    )
)
register(
    Op(
        "const",
        "source",
        lambda value: (),
        lambda value, dtype=np.float32: np.asarray(value, dtype=dtype),
        None,
        0,
        attrs=("value",),
        cost=0,
    )
)
