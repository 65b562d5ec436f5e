"""A compiled program: the entry-point graphs plus the initial state they run on."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from glcomp.errors import GlcompError
from glcomp.ir.graph import Graph
from glcomp.runtime.feeds import check_feeds

ENTRY_POINTS = ("predict", "gradients", "train_step")


@dataclass(frozen=True)
class InputSpec:
    """A tensor the caller feeds: data inputs and the training target."""

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    num_classes: int | None = None  # class labels must lie in [0, num_classes)

    def to_json(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"shape": list(self.shape), "dtype": self.dtype}
        if self.num_classes is not None:
            spec["num_classes"] = self.num_classes
        return spec


@dataclass
class Program:
    """What `glcomp.compile` returns. Graph input names: data inputs and target by their names,
    parameters and buffers by torch names, optimizer state as ``opt.<param>.<slot>`` and
    ``opt.step``, the learning rate as ``lr``."""

    graphs: dict[str, Graph]
    inputs: dict[str, InputSpec]
    target: InputSpec | None
    params: dict[str, np.ndarray]
    trainable: list[str]
    buffers: dict[str, np.ndarray] = field(default_factory=dict)
    counters: dict[str, np.ndarray] = field(default_factory=dict)
    opt_state: dict[str, np.ndarray] = field(default_factory=dict)
    lr: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)

    def input_specs(self, entry: str) -> dict[str, InputSpec]:
        """What the caller feeds an entry point: data inputs, plus the target when training."""
        specs = dict(self.inputs)
        if entry != "predict":
            if self.target is None:
                raise GlcompError(f"{entry}: the program was compiled without a loss")
            specs[self.target.name] = self.target
        return specs

    def feeds(self, entry: str, given: dict[str, Any]) -> dict[str, np.ndarray]:
        """Validate user inputs for an entry point: every name known, none missing, shapes right."""
        specs = {k: v.to_json() for k, v in self.input_specs(entry).items()}
        return check_feeds(entry, specs, given)

    def state_shapes(self) -> dict[str, tuple[int, ...]]:
        shapes = {k: v.shape for k, v in self.params.items()}
        shapes |= {k: v.shape for k, v in self.buffers.items()}
        shapes |= {k: v.shape for k, v in self.counters.items()}
        return shapes

    def runtime(self, kind: str = "reference", **options: Any) -> Any:
        """A runtime for this program: ``"reference"`` (numpy) or ``"gl"`` (moderngl)."""
        if kind == "reference":
            from glcomp.runtime.reference import ReferenceRuntime

            return ReferenceRuntime(self, **options)
        if kind == "gl":
            from glcomp.codegen.bundle import build_bundle
            from glcomp.runtime.gl import GLRuntime

            return GLRuntime(build_bundle(self), **options)
        raise GlcompError(f"unknown runtime {kind!r}; use 'reference' or 'gl'")

    def save(self, directory: Any) -> None:
        """Write the program as a bundle directory (manifest, shaders, weights)."""
        from glcomp.codegen.bundle import build_bundle

        build_bundle(self).save(directory)
