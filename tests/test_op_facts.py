"""Ops own their kernel facts: the code generator has no per-op tables.

Every registered op carries what the GL code generator needs (loop extent, cost, template and
template parameters, vec4 form, index rules of fused ops) in its `Op` record, so adding a
primitive means its op file plus, at most, its template. These tests enumerate the registry:
no codegen module names an op, every template an op asks for exists, and every op's facts agree
with each other and render through the code generator.
"""

from __future__ import annotations

import ast
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings

import glcomp
from glcomp import nn
from glcomp.codegen.bundle import build_bundle
from glcomp.codegen.render import templates_dir
from glcomp.ir.ops import KINDS, REGISTRY, Op
from glcomp.ir.tensor import prim
from glcomp.testing import OpCase, op_cases

CODEGEN = Path(glcomp.__file__).parent / "codegen"

# String literals equal to an op name that a codegen module may hold, each for a reason that is
# not a per-op kernel fact. split_wide is a graph rewrite of concat and slice themselves (it builds
# and matches those nodes; it renders nothing); kernels.py labels why a value is stored ("input").
ALLOWED = {
    ("passes/split_wide.py", "concat"): "split_wide rewrites concat trees",
    ("passes/split_wide.py", "slice"): "split_wide narrows slices of concats",
    ("kernels.py", "input"): "the label of a storage reason (KernelPlan.stored), not an op test",
    ("passes/tiling.py", "matmul"): "the kernel family (Op.kind) the blocked kernel replaces, not an op name",
}

LOOP_KINDS = ("reduce", "matmul", "conv", "pool")
FUSED_KINDS = ("elementwise", "movement", "index", "source")


def op_name_literals(source: str) -> list[tuple[int, str]]:
    """(line, name) of every string constant in `source` that equals a registered op name."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in REGISTRY
    ]


def test_scan_finds_op_names_in_branches_and_tables():
    """The scan sees names in comparisons, sets and dict keys (so the next test means something)."""
    source = 'if op == "matmul":\n    pass\nCOSTLY = {"exp", "log"}\nT = {"conv2d": 1}\nx = "no op"\n'
    assert sorted(name for _, name in op_name_literals(source)) == ["conv2d", "exp", "log", "matmul"]


@pytest.mark.parametrize(
    "path", sorted(CODEGEN.rglob("*.py")), ids=lambda p: p.relative_to(CODEGEN).as_posix()
)
def test_codegen_names_no_op(path: Path):
    name = path.relative_to(CODEGEN).as_posix()
    found = [
        f"{name}:{line}: {op!r}"
        for line, op in op_name_literals(path.read_text())
        if (name, op) not in ALLOWED
    ]
    assert not found, "codegen branches on op names (move the fact into the op's record):\n" + "\n".join(
        found
    )


def test_allowed_names_are_still_needed():
    """The allow-list does not outlive the code it excuses."""
    for (module, name), why in ALLOWED.items():
        names = {n for _, n in op_name_literals((CODEGEN / module).read_text())}
        assert name in names, f"{module} no longer names {name!r} ({why}): drop it from ALLOWED"


def test_ir_does_not_import_codegen():
    """The ops' kernel hooks take the renderer as a plain `Emitter`: the IR stands alone."""
    found = []
    for path in sorted((CODEGEN.parent / "ir").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            found += [f"{path.name}: {m}" for m in names if m.startswith("glcomp.codegen")]
    assert not found


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_op_facts_are_consistent(name: str):
    rule: Op = REGISTRY[name]
    assert rule.kind in KINDS
    if rule.template is not None:
        assert (templates_dir() / f"{rule.template}.frag.j2").exists(), f"{name}: template {rule.template}"
    if rule.kind in LOOP_KINDS:  # roots a kernel of its own: a loop, a template and its parameters
        assert rule.template and rule.loop_extent and rule.spec, name
        assert rule.emit is None, name
    else:  # fused into its readers: no loop, a scalar function
        assert rule.loop_extent is None and rule.loop_reads is None and rule.spec is None, name
        assert rule.spec4 is None and rule.spec4t is None, name
        assert rule.kind == "elementwise" or rule.emit is not None or rule.feed, name
    if rule.spec4t is not None:
        assert rule.spec4 is not None, f"{name}: a transposed vec4 form without a plain one"
    assert rule.cost >= 0
    assert rule.cost == 0 or rule.kind != "movement", f"{name}: movement ops only move elements"
    assert not rule.feed or rule.kind == "source", f"{name}: only sources are fed by the runtime"
    assert not rule.broadcast or rule.kind == "movement", name
    assert not rule.blend_add or (rule.kind == "elementwise" and rule.arity == 2), name
    assert rule.view is None or rule.kind == "movement", name


class OpModel(nn.Module):
    def __init__(self, case: OpCase) -> None:
        super().__init__()
        self.op, self.attrs, self.count = case.op, case.attrs, len(case.inputs)
        for i, value in enumerate(case.inputs):
            setattr(self, f"p{i}", nn.Parameter(value, requires_grad=False))

    def forward(self, x: Any) -> Any:
        return prim(self.op, *(getattr(self, f"p{i}") for i in range(self.count)), **self.attrs) * x


SAMPLED = sorted(n for n, op in REGISTRY.items() if op.sample is not None)


@pytest.mark.parametrize("name", SAMPLED)
def test_op_renders_through_codegen(name: str):
    """A sample case of every op compiles to shaders on both dialects; a loop op's kernel uses its
    own template, and its loop extent is a positive count no larger than its inputs allow."""
    rule = REGISTRY[name]

    @seed(0)
    @settings(max_examples=2, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=op_cases(name, np.float32))
    def check(case: OpCase) -> None:
        out = rule.shape(*case.shapes, **case.attrs)
        if rule.loop_extent is not None:
            extent = rule.loop_extent(list(case.shapes), case.attrs)
            assert 1 <= extent <= max(math.prod(s) for s in case.shapes)
        for target in ("webgl2", "webgl1"):
            # Without epilogue fusion a loop op roots its own kernel, named after it.
            prog = glcomp.compile(OpModel(case), {"x": out}, target=target, passes={"epilogue": False})
            bundle = build_bundle(prog)
            sources = "\n".join(bundle.shaders.values())
            assert "void main()" in sources
            if rule.kind in LOOP_KINDS:
                draws = [d for e in bundle.manifest["entries"].values() for d in e["draws"]]
                assert any(name in d["kernel"] for d in draws), f"{name}: no kernel of its own"

    check()
