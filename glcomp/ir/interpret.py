"""The numpy interpreter of the IR: evaluates a graph with each op's `reference` rule.

It is the test oracle and the CPU fallback (the reference runtime runs programs with it), so it
is deliberately plain: evaluate the graph in topological order.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op


def evaluate(graph: Graph, feeds: dict[str, np.ndarray], dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Evaluate every output of `graph`; `feeds` maps input names to arrays."""
    values: dict[int, np.ndarray] = {}
    for n in graph.topo():
        node = graph.node(n)
        op, attrs = node["op"], node["attrs"]
        if op == "input":
            name = attrs["name"]
            if name not in feeds:
                raise GlcompError(f"no value fed for graph input {name!r}")
            values[n] = np.asarray(feeds[name], dtype=dtype)
        elif op == "const":
            values[n] = np.asarray(attrs["value"], dtype=dtype)
        else:
            args = [values[o] for o in graph.operands(n)]
            values[n] = np.asarray(get_op(op).reference(*args, **attrs), dtype=dtype)
    return {name: values[n] for name, n in graph.outputs.items()}
