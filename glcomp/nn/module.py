"""`Module` and `Parameter`: torch.nn's container semantics over numpy weights.

Outside tracing a module only holds numpy data. Inside `glcomp.trace` its parameters and
buffers read as symbolic Tensors bound to graph inputs, and every call records the module's
path and class as the origin of the nodes it creates (e.g. ``features.0 (Conv2d)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.graph import origin
from glcomp.ir.tensor import Tensor
from glcomp.ir.trace import _TRACE
from glcomp.state import check_state


class Parameter:
    """A trainable float32 array; `requires_grad=False` freezes it."""

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        self.data = np.array(data, dtype=np.float32)
        self.requires_grad = requires_grad

    @property
    def shape(self) -> tuple[int, ...]:
        return self.data.shape

    def requires_grad_(self, flag: bool = True) -> Parameter:
        self.requires_grad = flag
        return self

    def numpy(self) -> np.ndarray:
        return self.data

    def numel(self) -> int:
        return int(self.data.size)

    def size(self, dim: int | None = None) -> Any:
        return self.data.shape if dim is None else self.data.shape[dim]

    def dim(self) -> int:
        return self.data.ndim

    def to(self, *args: Any, **kwargs: Any) -> Parameter:
        return self

    def __repr__(self) -> str:
        return f"Parameter(shape={self.shape}, requires_grad={self.requires_grad})"


class Module:
    """Base class of models: subclass it, assign sub-modules and Parameters in `__init__`,
    and write `forward` with torch operations on the tensors it receives."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "training", True)

    # -- attribute plumbing -----------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise GlcompError(f"{type(self).__name__}.__init__ must call super().__init__() first")
        for store in ("_parameters", "_buffers", "_modules"):
            self.__dict__[store].pop(name, None)
        if isinstance(value, Parameter):
            self._parameters[name] = value
        elif isinstance(value, Module):
            self._modules[name] = value
        else:
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        for store in ("_parameters", "_buffers"):
            if name in d.get(store, {}):
                state = _TRACE.get()
                if state is not None and (id(self), name) in state.values:
                    return state.values[(id(self), name)]
                return d[store][name]
        if name in d.get("_modules", {}):
            return d["_modules"][name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def register_buffer(self, name: str, value: Any) -> None:
        self._buffers[name] = np.array(value)

    def register_parameter(self, name: str, value: Parameter | None) -> None:
        if value is not None:
            self._parameters[name] = value

    def add_module(self, name: str, module: Module) -> None:
        self._modules[name] = module

    # -- traversal ------------------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self._modules.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator[Module]:
        for _, m in self.named_modules():
            yield m

    def children(self) -> Iterator[Module]:
        yield from self._modules.values()

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        for path, m in self.named_modules():
            for name, p in m._parameters.items():
                yield (f"{path}.{name}" if path else name), p

    def parameters(self) -> Iterator[Parameter]:
        for _, p in self.named_parameters():
            yield p

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        for path, m in self.named_modules():
            for name, b in m._buffers.items():
                yield (f"{path}.{name}" if path else name), b

    # -- modes ------------------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        for m in self.modules():
            object.__setattr__(m, "training", mode)
        return self

    def eval(self) -> Module:
        return self.train(False)

    # -- device and dtype spellings of torch scripts: glcomp decides placement at compile time ----
    def to(self, *args: Any, **kwargs: Any) -> Module:
        """Returns the module itself: `.to(device)` / `.to(torch.float32)` in ported scripts."""
        return self

    def cuda(self, device: Any = None) -> Module:
        return self

    def cpu(self) -> Module:
        return self

    def float(self) -> Module:
        return self

    def double(self) -> Module:
        """Returns the module itself: glcomp computes in float32 whatever a script asks for."""
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Gradients are never accumulated across steps in glcomp: nothing to clear."""

    def named_children(self) -> Iterator[tuple[str, Module]]:
        yield from self._modules.items()

    def apply(self, fn: Any) -> Module:
        """Call `fn` on every sub-module (children first) and on this module, as torch does."""
        for m in self.children():
            m.apply(fn)
        fn(self)
        return self

    def requires_grad_(self, flag: bool = True) -> Module:
        for p in self.parameters():
            p.requires_grad = flag
        return self

    # -- state ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Parameters and buffers by torch name, as copies, in torch's order (module by module)."""
        out: dict[str, np.ndarray] = {}
        for path, m in self.named_modules():
            prefix = f"{path}." if path else ""
            out.update({prefix + k: p.data.copy() for k, p in m._parameters.items()})
            out.update({prefix + k: np.array(b) for k, b in m._buffers.items()})
        return out

    def load_state_dict(self, state: Mapping[str, Any], strict: bool = True) -> None:
        """Load numpy arrays (e.g. a torch state_dict converted with `.numpy()`).

        All entries are checked before any is written: a missing, unexpected or wrongly shaped
        entry raises GlcompError and leaves the module unchanged."""
        targets = {k: ("param", m, n) for k, m, n in self._slots("_parameters")}
        targets |= {k: ("buffer", m, n) for k, m, n in self._slots("_buffers")}
        check_state(state, {k: _slot_shape(t) for k, t in targets.items()}, type(self).__name__, strict)
        for key, (kind, module, name) in targets.items():
            if key not in state:
                continue
            value = np.asarray(state[key])
            if kind == "param":
                module._parameters[name].data = value.astype(np.float32).copy()
            else:
                old = module._buffers[name]
                module._buffers[name] = value.astype(old.dtype).reshape(old.shape).copy()

    def _slots(self, store: str) -> Iterator[tuple[str, Module, str]]:
        for path, m in self.named_modules():
            for name in getattr(m, store):
                yield (f"{path}.{name}" if path else name), m, name

    # -- calling ----------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        state = _TRACE.get()
        if state is None:
            raise GlcompError(
                f"{type(self).__name__} was called outside a trace: glcomp modules run through "
                "glcomp.compile(...) or glcomp.trace(...)"
            )
        if state.graph is None:
            for value in (*args, *kwargs.values()):
                if isinstance(value, Tensor):
                    state.graph = value.graph
                    break
        path = state.paths.get(id(self), "")
        label = f"{path} ({type(self).__name__})" if path else f"({type(self).__name__})"
        with origin(label):
            return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise GlcompError(f"{type(self).__name__} does not define forward()")

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, m in self._modules.items():
            lines.append(f"  ({name}): " + repr(m).replace("\n", "\n  "))
        return lines[0] + (")" if len(lines) == 1 else "\n" + "\n".join(lines[1:]) + "\n)")


def _slot_shape(target: tuple[str, Module, str]) -> tuple[int, ...]:
    kind, module, name = target
    store = module._parameters if kind == "param" else module._buffers
    return tuple(np.shape(store[name].data if kind == "param" else store[name]))
