"""Import layering: data flows one way, front-end -> IR -> passes -> plan -> GLSL -> bundle -> runtimes.

Every module under glcomp/ is parsed with `ast` (module-level and function-level imports alike,
nothing is imported) and each import of a glcomp module is checked against what the importing
module's layer may use:

- neutral (errors, state dicts, the bundle format): only other neutral modules;
- ir (graph, ops, tensors, tracing, passes, the numpy interpreter): neutral and ir;
- front-end (nn, functions, optim, lr_scheduler, onnx): neutral, ir and the front-end;
- codegen: neutral, ir, codegen and program (the compiled IR program it lowers);
- runtime (GL and numpy runtimes): neutral and runtime only; they know the manifest, not the IR;
- top (the package, compiler, program, cli, serve, testing): anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

import glcomp
from glcomp import nn

ROOT = Path(glcomp.__file__).parent

NEUTRAL = ("glcomp.errors", "glcomp.state", "glcomp.format")
FRONT_END = ("glcomp.nn", "glcomp.functions", "glcomp.optim", "glcomp.lr_scheduler", "glcomp.onnx")

ALLOWED = {
    "neutral": {"neutral"},
    "ir": {"neutral", "ir"},
    "front-end": {"neutral", "ir", "front-end"},
    "codegen": {"neutral", "ir", "codegen", "program"},
    "runtime": {"neutral", "runtime"},
    "program": {"neutral", "ir", "codegen", "runtime", "program"},
}

# Known exceptions (importer, imported): none. (The GL runtime read the manifest schema from
# glcomp.codegen.schema until the schema and its validator moved to the neutral glcomp.format.)
EXCEPTIONS: set[tuple[str, str]] = set()


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def layer_of(module: str) -> str:
    """The layer of a glcomp module; modules of no named layer are "top" (may import anything)."""
    if _within(module, NEUTRAL):
        return "neutral"
    if _within(module, FRONT_END):
        return "front-end"
    for layer in ("ir", "codegen", "runtime", "program"):
        if _within(module, (f"glcomp.{layer}",)):
            return layer
    return "top"


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT.parent / rel).with_suffix(".py").is_file() or (ROOT.parent / rel / "__init__.py").is_file()


def glcomp_imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, module) for every import of a glcomp module in the file, at any depth of the tree.
    ``from a import b`` counts as an import of ``a.b`` when that is a module, else of ``a``."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:
                sub = f"{source}.{a.name}"
                found.append((node.lineno, sub if is_module(sub) else source))
    found = [(line, m) for line, m in found if m == "glcomp" or m.startswith("glcomp.")]
    return list(dict.fromkeys(found))


def layering_violations(root: Path = ROOT) -> list[str]:
    """One line per import that its module's layer does not allow (the source tree under `root`)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        importer = module_name(path, root)
        allowed = ALLOWED.get(layer_of(importer))
        if allowed is None:
            continue
        for line, imported in glcomp_imports(path, root):
            if layer_of(imported) in allowed or (importer, imported) in EXCEPTIONS:
                continue
            where = f"{path.relative_to(root.parent)}:{line}"
            layers = f"({layer_of(importer)} -> {layer_of(imported)})"
            out.append(f"{where}: {importer} imports {imported} {layers}")
    return out


def test_imports_follow_the_layers() -> None:
    violations = layering_violations()
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_exceptions_are_still_needed() -> None:
    """An exception that no import uses any more is stale and must be removed from the list."""
    used = {
        (module_name(p), m)
        for p in ROOT.rglob("*.py")
        for _, m in glcomp_imports(p)
        if (module_name(p), m) in EXCEPTIONS
    }
    assert used == EXCEPTIONS, f"stale layering exceptions: {sorted(EXCEPTIONS - used)}"


def test_the_checker_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The checker itself: an import inside a function, and a relative one, are both found and
    refused in an ir module; the same imports in a top-level module are allowed."""
    root = tmp_path / "glcomp"
    (root / "ir").mkdir(parents=True)
    probe = "def f():\n    from glcomp.nn import functional\n    from ..runtime import feeds\n"
    (root / "ir" / "probe.py").write_text(probe)
    (root / "top.py").write_text(probe.replace("..runtime", ".runtime"))
    assert glcomp_imports(root / "ir" / "probe.py", root) == [
        (2, "glcomp.nn.functional"),
        (3, "glcomp.runtime.feeds"),
    ]
    found = layering_violations(root)
    assert len(found) == 2 and all(v.startswith("glcomp/ir/probe.py:") for v in found), found


def test_trace_checks_the_model_type_outside_the_tracer() -> None:
    """The IR tracer knows no Module class; the front-end's glcomp.trace still refuses anything
    that is not a glcomp.nn.Module, and the reference runtime runs the IR interpreter."""
    with pytest.raises(glcomp.GlcompError, match=r"expected a glcomp\.nn\.Module, got object"):
        glcomp.trace(object(), x=(2, 4))
    model = nn.Sequential(nn.Linear(4, 3), nn.Softmax(1))
    graph = glcomp.trace(model, x=(2, 4))
    assert graph.shape(graph.outputs["output"]) == (2, 3)
    out = glcomp.compile(model, {"x": (2, 4)}).runtime("reference").predict(x=np.ones((2, 4), np.float32))
    np.testing.assert_allclose(out.sum(1), 1.0, rtol=1e-6)
