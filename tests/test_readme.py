"""README.md's "Supported operations" and ONNX op lists against what glcomp exports, both ways:
every name the README lists exists, and every public layer, loss, optimizer, scheduler, nn.init
function, Tensor method, functional op and top-level function (those torch also has, plus
glcomp's own exports), IR primitive and ONNX op is listed."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

import glcomp
from glcomp import nn, optim
from glcomp.ir.ops.registry import REGISTRY
from glcomp.ir.tensor import Tensor
from glcomp.nn import functional as F
from glcomp.nn import init
from glcomp.optim import lr_scheduler

torch = pytest.importorskip("torch")

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def section() -> str:
    start = README.index("## Supported operations")
    return README[start : README.index("\n## ", start + 1)]


def bullet(label: str) -> str:
    """The text of the section's bullet that starts with `label`, after its heading (the first colon)."""
    items = re.split(r"\n- ", section())
    found = [item for item in items if item.startswith(label)]
    assert len(found) == 1, f"README: no single bullet starts with {label!r} under 'Supported operations'"
    return found[0].split(":", 1)[1]


def names(text: str) -> list[str]:
    """The identifiers quoted in `text`: each backticked span split at spaces and slashes, a
    leading dot or ``glcomp.``/``nn.`` dropped, call parentheses ignored."""
    out = []
    for span in re.findall(r"`([^`]+)`", text):
        for word in re.split(r"[\s/]+", span):
            word = word.lstrip(".").split("(")[0]
            for prefix in ("glcomp.", "nn."):
                word = word.removeprefix(prefix)
            if IDENT.match(word) and word != "None":
                out.append(word)
    return out


def listed() -> set[str]:
    return set(names(section()))


def classes_named(text: str) -> list[str]:
    return [n for n in names(text) if n[0].isupper()]


def test_listed_layers_losses_optimizers_and_schedulers_exist() -> None:
    layers, init_part = bullet("Layers:").split("`nn.init`:")
    for name in (
        classes_named(layers) + classes_named(bullet("Recurrent layers:")) + classes_named(bullet("Losses"))
    ):
        assert isinstance(getattr(nn, name, None), type), f"README lists nn.{name}, which glcomp.nn lacks"
    for name in names(init_part.split("(drawn")[0]):
        assert callable(getattr(init, name, None)), f"README lists nn.init.{name}, which glcomp lacks"
    opts, scheds = bullet("Optimizers:").split("Schedulers in")
    for name in classes_named(opts):
        assert issubclass(getattr(optim, name), optim.Optimizer), name
    for name in classes_named(scheds):
        assert issubclass(getattr(lr_scheduler, name), lr_scheduler.LRScheduler), name


def test_listed_tensor_methods_functional_and_top_level_names_exist() -> None:
    for name in names(bullet("Tensor methods").split("Comparisons return")[0]):
        assert hasattr(Tensor, name), f"README lists Tensor.{name}, which glcomp.Tensor lacks"
    for name in names(bullet("`glcomp.nn.functional`")):
        assert callable(getattr(F, name, None)), f"README lists F.{name}, which glcomp.nn.functional lacks"
    top = bullet("Top-level functions").split("The creation functions")[0]
    for name in names(top):
        assert name in glcomp.__all__ or name == "is_available", f"README lists glcomp.{name}, not exported"
    for name in names(bullet("IR primitives")):
        assert name in REGISTRY, f"README lists IR primitive {name}, which the op registry lacks"


def test_every_export_is_listed() -> None:
    seen = listed()
    missing = {
        "glcomp.nn": [n for n in nn.__all__ if n not in ("functional", "init") and n not in seen],
        "glcomp.nn.init": [  # torch's in-place initialisers (its deprecated aliases without _ aside)
            n for n in dir(init) if hasattr(torch.nn.init, n) and (n.endswith("_") or n == "calculate_gain")
            and not n.startswith("_") and n not in seen
        ],
        "glcomp.optim": [
            n for n, c in vars(optim).items() if inspect.isclass(c) and issubclass(c, optim.Optimizer)
            and c is not optim.Optimizer and n not in seen
        ],
        "glcomp.optim.lr_scheduler": [
            n for n, c in vars(lr_scheduler).items()
            if inspect.isclass(c) and issubclass(c, lr_scheduler.LRScheduler)
            and c is not lr_scheduler.LRScheduler and n not in seen
        ],
        "glcomp.Tensor": [
            n for n in dir(Tensor) if not n.startswith("_") and hasattr(torch.Tensor, n) and n not in seen
        ],
        "glcomp.nn.functional": [
            n for n in dir(F) if not n.startswith("_") and callable(getattr(F, n))
            and not isinstance(getattr(F, n), type)
            and hasattr(torch.nn.functional, n) and n not in seen
        ],
        "glcomp": [n for n in glcomp.__all__ if n not in seen],
        "IR primitives": [n for n in REGISTRY if n not in seen],
    }  # fmt: skip
    missing = {k: v for k, v in missing.items() if v}
    assert not missing, f"README.md's 'Supported operations' does not list {missing}"


def test_onnx_op_list_is_the_importers() -> None:
    text = README[README.index("Supported ops (`glcomp.onnx.SUPPORTED_OPS`):") :]
    ops = text.split(":", 1)[1].split(". Any other op")[0]
    assert sorted(op.strip() for op in ops.replace("\n", " ").split(",")) == sorted(glcomp.onnx.SUPPORTED_OPS)


def test_examples_named_in_the_readme_exist() -> None:
    root = Path(__file__).resolve().parents[1]
    examples = set(re.findall(r"examples/[a-z_]+\.py", README))
    assert "examples/char_gpt.py" in examples
    for path in examples:
        assert (root / path).is_file(), f"README names {path}, which does not exist"
    assert {f"examples/{p.name}" for p in (root / "examples").glob("*.py")} <= examples, (
        "an example the README omits"
    )
