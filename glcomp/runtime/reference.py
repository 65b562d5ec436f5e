"""The numpy reference runtime: an interpreter of the IR using each op's `reference` rule.

It is the test oracle and the CPU fallback, so it is deliberately plain: evaluate the graph in
topological order, then copy updated parameters, buffers and optimizer state back.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.ir.ops import get_op
from glcomp.nn.module import check_state
from glcomp.program import Program


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


class ReferenceRuntime:
    """Runs a Program in numpy. float32 by default; ``dtype=np.float64`` for gradient checks."""

    def __init__(self, program: Program, dtype: Any = np.float32) -> None:
        self.program = program
        self.dtype = np.dtype(dtype)
        self.params = {k: v.astype(self.dtype) for k, v in program.params.items()}
        self.buffers = {k: v.astype(self.dtype) for k, v in program.buffers.items()}
        self.counters = {k: v.copy() for k, v in program.counters.items()}
        self.opt_state = {k: v.astype(self.dtype) for k, v in program.opt_state.items()}
        self.lr = program.lr

    def _run(self, entry: str, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        if entry not in self.program.graphs:
            raise GlcompError(f"{entry}: not compiled (pass a loss and an optimizer to glcomp.compile)")
        feeds: dict[str, Any] = dict(self.program.feeds(entry, inputs))
        feeds |= self.params | self.buffers | self.opt_state
        feeds["lr"] = self.lr
        return evaluate(self.program.graphs[entry], feeds, self.dtype)

    def predict(self, **inputs: Any) -> np.ndarray:
        out = self._run("predict", inputs)
        return out["output"] if "output" in out else out

    def gradients(self, **inputs: Any) -> dict[str, np.ndarray]:
        out = self._run("gradients", inputs)
        return {k[5:]: v for k, v in out.items() if k.startswith("grad:")}

    def train_step(self, **inputs: Any) -> float:
        out = self._run("train_step", inputs)
        for key, value in out.items():
            kind, _, name = key.partition(":")
            store = {"param": self.params, "buffer": self.buffers, "state": self.opt_state}.get(kind)
            if store is not None:
                store[name] = value
        for name in self.counters:
            self.counters[name] = self.counters[name] + 1
        return float(out["loss"])

    def train_steps(self, batches: Any, read_every: int = 0) -> list[float]:
        """Same contract as the GL runtime's: the losses of every `read_every`-th and the last step."""
        batches = list(batches)
        losses = []
        for i, batch in enumerate(batches):
            loss = self.train_step(**batch)
            if i == len(batches) - 1 or (read_every and (i + 1) % read_every == 0):
                losses.append(loss)
        return losses

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)

    def state_dict(self) -> dict[str, np.ndarray]:
        out = {k: v.copy() for k, v in self.params.items()}
        out |= {k: v.copy() for k, v in self.buffers.items()}
        out |= {k: v.copy() for k, v in self.counters.items()}
        return out

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_state(state, self.program.state_shapes(), "runtime")
        for store in (self.params, self.buffers, self.counters):
            for k in store:
                store[k] = np.asarray(state[k]).astype(store[k].dtype).reshape(store[k].shape)

    def save(self, directory: Any) -> Any:
        """Save this runtime as a bundle (atomically, see `Bundle.save`) holding its current
        state: parameters, buffers, optimizer state, step counters and learning rate (as
        float32). ``glcomp.load(directory)`` resumes from exactly this state."""
        f32 = {k: np.asarray(v, np.float32) for k, v in (self.params | self.buffers | self.opt_state).items()}
        program = self.program.with_state(
            params={k: f32[k] for k in self.params},
            buffers={k: f32[k] for k in self.buffers},
            opt_state={k: f32[k] for k in self.opt_state},
            counters={k: np.array(v) for k, v in self.counters.items()},
            lr=self.lr,
        )
        return program.save(directory)
