"""Import layering: data flows one way, front-end -> IR -> passes -> plan -> GLSL -> bundle -> runtimes.

Every module under glcomp/ is parsed with `ast` (module-level and function-level imports alike,
nothing is imported) and each import of a glcomp module is checked against what the importing
module's layer may use:

- neutral (errors, state dicts, the bundle format): only other neutral modules;
- ir (graph, ops, tensors, tracing, passes, the numpy interpreter): neutral and ir;
- front-end (nn, functions, optim, lr_scheduler, onnx): neutral, ir and the front-end;
- codegen: neutral, ir and codegen (it lowers the frozen IR program, glcomp.ir.program, and
  never sees the Program facade);
- runtime (GL and numpy runtimes): neutral and runtime only; they know the manifest, not the IR;
- top (the package, compiler, the Program facade, cli, train, usercode, serve, testing): anything.

And `glcomp.load` stays light: loading a bundle imports no code-generator module and no Jinja
(GL runs the loaded shaders as they are). Building the reference runtime of a loaded bundle
does lower its program.json once, to check that it describes what the shaders compute
(glcomp.Program.check_agreement).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Any

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
    "codegen": {"neutral", "ir", "codegen"},
    "runtime": {"neutral", "runtime"},
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
    for layer in ("ir", "codegen", "runtime"):
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


_LOAD = """
import sys
import numpy as np
import glcomp
def loaded():
    found = sorted(m for m in sys.modules if m.startswith("glcomp.codegen") or m.split(".")[0] == "jinja2")
    print(" ".join(found) or "-")
program = glcomp.load(sys.argv[1])
program.bundle()
loaded()
runtime = program.runtime("reference")
runtime.train_step(x=np.ones((2, 3), np.float32), y=np.array([0, 1]))
loaded()
"""


def test_load_imports_no_codegen_and_no_jinja(tmp_path: Path) -> None:
    """In a fresh interpreter: import glcomp and load a saved bundle (and take the bundle GL
    runs); no glcomp.codegen module and no jinja2 is imported. Building its reference runtime
    then lowers program.json's graphs, once, for the agreement check."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))
    glcomp.compile(model, {"x": (2, 3)}, loss=nn.CrossEntropyLoss(), optimizer=glcomp.optim.SGD(lr=0.1)).save(
        tmp_path / "b"
    )
    done = subprocess.run(
        [sys.executable, "-c", _LOAD, str(tmp_path / "b")], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    after_load, after_reference = done.stdout.splitlines()
    assert after_load == "-", f"glcomp.load imported: {after_load}"
    assert "glcomp.codegen.bundle" in after_reference.split(), after_reference


def test_codegen_lowers_the_ir_program_not_the_facade() -> None:
    """codegen's lower takes the frozen IR program and typed options; a Program's lowering is
    that of its `ir` under its `compile_options` (same manifest and shaders)."""
    from glcomp.codegen.bundle import build_bundle, lower

    prog = glcomp.compile(nn.Sequential(nn.Linear(4, 3), nn.Tanh()), {"x": (2, 4)}, target="webgl1")
    ir = prog.ir
    with pytest.raises((AttributeError, TypeError)):
        ir.graphs["other"] = ir.graphs["predict"]  # type: ignore[index]
    lowered, built = lower(ir, prog.compile_options), build_bundle(prog)
    assert lowered.shaders == built.shaders and lowered.program is None
    assert lowered.manifest["states"] == built.manifest["states"]
    assert prog.compile_options is prog.compile_options  # parsed once
    assert prog.compile_options.target == "webgl1"


def test_options_are_parsed_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """glcomp.compile parses the options at the boundary; lowering, running and saving the
    program never parse them again."""
    from glcomp.codegen.options import CompileOptions

    calls = []
    real = CompileOptions.parse.__func__  # type: ignore[attr-defined]

    def counting(cls: type, options: Any) -> Any:
        calls.append(dict(options))
        return real(cls, options)

    monkeypatch.setattr(CompileOptions, "parse", classmethod(counting))
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    prog = glcomp.compile(
        model,
        {"x": (2, 4)},
        loss=nn.CrossEntropyLoss(),
        optimizer=glcomp.optim.SGD(lr=0.1),
        passes={"mrt": False},
    )
    prog.runtime("reference")
    prog.bundle()
    prog.with_state(lr=0.5).bundle()
    assert len(calls) == 1, calls
    assert calls[0] == {"passes": {"mrt": False}, "target": "webgl2"}
