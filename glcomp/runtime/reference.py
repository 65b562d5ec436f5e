"""The numpy reference runtime: runs a program's IR graphs with the numpy interpreter.

It is the test oracle and the CPU fallback, so it is deliberately plain: evaluate the entry's
graph (with the interpreter the program passes in, `glcomp.ir.interpret.evaluate`; a runtime
knows no IR), then copy updated parameters, buffers and optimizer state back.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.runtime.feeds import (
    carried_names,
    check_lr,
    check_optimizer_option,
    check_read_loss,
    refuse_positional,
)
from glcomp.state import check_state

# The IR interpreter: (graph, feeds by input name, dtype) -> outputs by name.
Evaluate = Callable[[Any, dict[str, Any], Any], dict[str, np.ndarray]]
# The tensor names of a program's graphs: graphs by entry -> entry -> name -> node
# (glcomp.ir.names.program_tensor_nodes).
TensorNames = Callable[[Mapping[str, Any]], dict[str, dict[str, int]]]


class ReferenceRuntime:
    """Runs a Program in numpy. float32 by default; ``dtype=np.float64`` for gradient checks.

    The same interface and checks as the GL runtime, including `release()` and ``with``: a
    released runtime raises GlcompError when used. Built by ``program.runtime("reference")``:
    `program` is a `glcomp.Program` and `evaluate` the IR interpreter that runs its graphs.
    """

    def __init__(
        self, program: Any, evaluate: Evaluate, dtype: Any = np.float32, names: TensorNames | None = None
    ) -> None:
        self.program = program
        self._evaluate = evaluate
        self._names = names  # the tensor names of the program's graphs, for inspect
        self._last: tuple[str, dict[str, Any]] | None = None  # the last entry run and its feeds
        self.dtype = np.dtype(dtype)
        self.params = {k: v.astype(self.dtype) for k, v in program.params.items()}
        self.buffers = {k: v.astype(self.dtype) for k, v in program.buffers.items()}
        self.counters = {k: v.copy() for k, v in program.counters.items()}
        self.opt_state = {k: v.astype(self.dtype) for k, v in program.opt_state.items()}
        self.lr = program.lr
        self._released = False

    def _input_names(self, entry: str) -> list[str]:
        try:
            return list(self.program.input_specs(entry))
        except GlcompError:
            return list(self.program.inputs)

    def _run(self, entry: str, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
        self._check_usable()
        if entry not in self.program.graphs:
            raise GlcompError(f"{entry}: not compiled (pass a loss and an optimizer to glcomp.compile)")
        feeds: dict[str, Any] = dict(self.program.feeds(entry, inputs))
        feeds |= self.params | self.buffers | self.opt_state
        feeds["lr"] = self.lr
        self._last = (entry, feeds)
        return self._evaluate(self.program.graphs[entry], feeds, self.dtype)

    def inspect(self, name: str) -> np.ndarray:
        """The tensor `name` (as `GLRuntime.inspect` names them, docs/inspect.md): a state as it
        is now, a counter, or any tensor of the last entry point run, evaluated again from that
        run's inputs and state (nothing changes; no ``inspect=`` option is needed here).
        GlcompError listing near matches for an unknown name."""
        from glcomp.runtime.inspection import not_held

        self._check_usable()
        states = self.params | self.buffers | self.opt_state
        if name in states:
            return states[name].copy()
        if name in self.counters:
            return np.array(self.counters[name], np.int64)
        nodes = self._names(self.program.graphs) if self._names is not None else {}
        held = {k: [e for e in nodes if k in nodes[e]] for k in set().union(*nodes.values())}
        held |= {k: [] for k in states} | {k: [] for k in self.counters}
        last = self._last[0] if self._last is not None else None
        if last is None or name not in nodes.get(last, {}):
            raise not_held(name, held, last, kept=True)
        graph = self.program.graphs[last].copy()
        graph.outputs = {name: nodes[last][name]}
        graph.prune_in_place()
        return self._evaluate(graph, self._last[1], self.dtype)[name]

    def predict(self, *args: Any, **inputs: Any) -> np.ndarray:
        refuse_positional("predict", args, self._input_names("predict"))
        out = self._updated(self._run("predict", inputs))  # carry_predict=True writes carried state
        return out["output"] if "output" in out else out

    def gradients(self, *args: Any, **inputs: Any) -> dict[str, np.ndarray]:
        refuse_positional("gradients", args, self._input_names("gradients"))
        out = self._run("gradients", inputs)
        return {k[5:]: v for k, v in out.items() if k.startswith("grad:")}

    def train_step(self, *args: Any, **inputs: Any) -> float:
        """One forward, backward and optimizer step; returns the loss (nan or inf when the
        training diverged: the step is taken all the same)."""
        refuse_positional("train_step", args, self._input_names("train_step"))
        out = self._updated(self._run("train_step", inputs))
        for name in self.counters:
            self.counters[name] = self.counters[name] + 1
        return float(out["loss"])

    def _updated(self, out: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Store the state updates among an entry's outputs; the other outputs."""
        kept = {}
        for key, value in out.items():
            kind, _, name = key.partition(":")
            store = {"param": self.params, "buffer": self.buffers, "state": self.opt_state}.get(kind)
            if store is not None:
                store[name] = value
            else:
                kept[key] = value
        return kept

    def reset_state(self, names: Any = None) -> None:
        """Zero the state carried across batches (glcomp.compile's ``carry=``): every carried
        input, or those in `names` (one name or several); GlcompError for any other name."""
        self._check_usable()
        for name in carried_names(self.program.options, names):
            self.buffers[name] = np.zeros_like(self.buffers[name])

    def train_steps(self, batches: Iterable[dict[str, Any]], read_every: int = 0) -> list[float]:
        """Same contract as the GL runtime's: the losses of every `read_every`-th and the last step,
        and GlcompError naming the step when a loss read there is nan or infinite."""
        batches = list(batches)
        losses = []
        for i, batch in enumerate(batches):
            loss = self.train_step(**batch)
            if i == len(batches) - 1 or (read_every and (i + 1) % read_every == 0):
                losses.append(check_read_loss(loss, i + 1, read_every))
        return losses

    def set_lr(self, lr: float) -> None:
        """Set the learning rate (a finite number >= 0) used by the following train steps."""
        self._check_usable()
        self.lr = check_lr(lr)

    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters, buffers and counters by their torch names (copies), every value an np.ndarray
        (integer buffers such as ``num_batches_tracked`` 0-d int64 arrays)."""
        self._check_usable()
        out = {k: v.copy() for k, v in self.params.items()}
        out |= {k: v.copy() for k, v in self.buffers.items()}
        out |= {k: np.array(v, np.int64) for k, v in self.counters.items()}
        return out

    def save_weights(self, path: Any) -> Any:
        """Write `state_dict()` to the safetensors file `path`, atomically: the parameters and
        buffers by their torch names and nothing else (no optimizer state, step or random-number
        counters), so the torch twin of the model loads it with
        ``model.load_state_dict(safetensors.torch.load_file(path), strict=True)``. Returns the
        path (see glcomp.runtime.weights)."""
        from glcomp.runtime.weights import save_weights

        carried = carried_names(self.program.options)
        return save_weights(path, {k: v for k, v in self.state_dict().items() if k not in carried})

    def optimizer_state(self) -> dict[str, np.ndarray]:
        """The optimizer state (``opt.<param>.<slot>``, ``opt.step``) as it is now (copies)."""
        self._check_usable()
        return {k: v.copy() for k, v in self.opt_state.items()}

    def reset_optimizer(self) -> None:
        """Set every optimizer state (moments, momentum, the step count ``opt.step``) to zero."""
        self._check_usable()
        self.opt_state = {k: np.zeros_like(v) for k, v in self.opt_state.items()}

    def load_state_dict(
        self, state: Mapping[str, Any], optimizer: str | Mapping[str, Any] | None = None
    ) -> None:
        """Load parameters, buffers and counters (every key, right shapes, finite values).

        ``optimizer``: None keeps the optimizer state as it is, ``"reset"`` zeroes it (as
        `reset_optimizer`), a dict from `optimizer_state()` restores it. Everything is checked
        before anything is loaded."""
        self._check_usable()
        check_state(state, self.program.state_shapes(), "runtime")
        check_optimizer_option(optimizer, {k: v.shape for k, v in self.opt_state.items()})
        for store in (self.params, self.buffers, self.counters):
            for k in store:
                store[k] = np.asarray(state[k]).astype(store[k].dtype).reshape(store[k].shape)
        if optimizer == "reset":
            self.reset_optimizer()
        elif isinstance(optimizer, Mapping):
            for k, v in self.opt_state.items():
                self.opt_state[k] = np.asarray(optimizer[k]).astype(v.dtype).reshape(v.shape)

    # -- lifetime ---------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._released:
            raise GlcompError("this reference runtime was released; create a new one")

    def release(self) -> None:
        """Mark the runtime released (it holds no GPU resources); safe to call more than once."""
        self._released = True

    def __enter__(self) -> ReferenceRuntime:
        self._check_usable()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

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
