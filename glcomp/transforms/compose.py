"""Compose (torchvision's name) and how glcomp.compile applies ``transforms=`` to model inputs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from glcomp.errors import GlcompError
from glcomp.nn.module import Module


class Compose(Module):
    """torchvision's Compose: the transforms applied one after another (each one a module, so
    train mode applies them and eval mode passes the input through)."""

    def __init__(self, transforms: Any) -> None:
        super().__init__()
        if not isinstance(transforms, list | tuple) or not all(isinstance(t, Module) for t in transforms):
            raise GlcompError(f"Compose: transforms must be a list of glcomp modules, got {transforms!r:.80}")
        for i, t in enumerate(transforms):
            self.add_module(str(i), t)
        self.transforms = list(transforms)

    def forward(self, x: Any) -> Any:
        for t in self.transforms:
            x = t(x)
        return x


def input_transforms(transforms: Any, inputs: dict[str, Any]) -> dict[str, Module]:
    """``transforms=`` of glcomp.compile as input name -> one module: a module or a list of them
    applies to the one input, a dict maps input names to a module or a list."""
    if isinstance(transforms, dict):
        given = transforms
    else:
        if len(inputs) != 1:
            raise GlcompError(
                f"transforms: the model takes {len(inputs)} inputs {sorted(inputs)}; give a dict "
                "input name -> list of transforms"
            )
        given = {next(iter(inputs)): transforms}
    out = {}
    for name, value in given.items():
        if name not in inputs:
            raise GlcompError(f"transforms: no model input named {name!r}; inputs are {sorted(inputs)}")
        if isinstance(value, Module):
            out[name] = value
        elif isinstance(value, list | tuple) and all(isinstance(t, Module) for t in value):
            out[name] = Compose(list(value))
        else:
            raise GlcompError(
                f"transforms[{name!r}]: expected a glcomp.transforms module or a list of them, "
                f"got {value!r:.80}"
            )
    return out


class Augmented:
    """`model` traced with `transforms` (input name -> module) applied to its inputs first: the
    model's own modules keep their paths (so parameter names do not change) and the transforms
    trace as ``transforms.<input>``."""

    def __init__(self, model: Module, transforms: dict[str, Module]) -> None:
        self.model, self.transforms = model, transforms
        self.forward = model.forward  # its signature names the inputs

    @property
    def training(self) -> bool:
        return self.model.training

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Any]]:
        yield from self.model.named_modules(prefix)
        for name, t in self.transforms.items():
            yield from t.named_modules(f"transforms.{name}")

    def train(self, mode: bool = True) -> Augmented:
        self.model.train(mode)
        for t in self.transforms.values():
            t.train(mode)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        kwargs = {k: self.transforms[k](v) if k in self.transforms else v for k, v in kwargs.items()}
        return self.model(*args, **kwargs)
