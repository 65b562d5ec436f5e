"""The compiled IR program: the entry-point graphs and the signature of the state they run on,
frozen. It is what the code generator lowers (glcomp.codegen.bundle.lower); `glcomp.Program`
is the facade over it that also holds the state's values and the runtimes.

Guarantees: an `IRProgram` is immutable (its mappings are read-only views, its graphs are
treated as fixed once compiled); `states` lists parameters, then buffers, then optimizer state,
in the order the bundle stores them; `counters` the integer step counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph

ENTRY_POINTS = ("predict", "gradients", "train_step")
# The roles of persistent states, as the manifest names them.
STATE_ROLES = ("param", "buffer", "state")


@dataclass(frozen=True)
class InputSpec:
    """A tensor the caller feeds: data inputs and the training target."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    num_classes: int | None = None  # class labels must lie in [0, num_classes)
    image: dict[str, Any] | None = None  # an image input: frames of this size (see glcomp.transforms)

    def to_json(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.num_classes is not None:
            spec["num_classes"] = self.num_classes
        if self.image is not None:
            spec["image"] = dict(self.image)
        return spec


@dataclass(frozen=True)
class StateSpec:
    """One persistent float state: its role (param, buffer or state) and shape."""

    role: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class IRProgram:
    """The graphs of the entry points (ENTRY_POINTS order), the inputs the caller feeds, the
    training target (None without a loss), and the names, roles and shapes of the state."""

    graphs: Mapping[str, Graph]
    inputs: Mapping[str, InputSpec]
    target: InputSpec | None
    states: Mapping[str, StateSpec]
    counters: tuple[str, ...]

    def input_specs(self, entry: str) -> dict[str, InputSpec]:
        """What the caller feeds an entry point: data inputs, plus the target when training."""
        specs = dict(self.inputs)
        if entry != "predict":
            if self.target is None:
                raise GlcompError(f"{entry}: the program was compiled without a loss")
            specs[self.target.name] = self.target
        return specs

    def entries(self) -> list[str]:
        """The entry points this program has, in ENTRY_POINTS order."""
        return [e for e in ENTRY_POINTS if e in self.graphs]
