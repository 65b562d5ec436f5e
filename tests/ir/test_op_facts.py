"""Ops hold maths, kernel families hold kernels: the code generator's per-op knowledge lives in one
package, `glcomp.codegen.families`, one module per family beside its templates.

An op's record (glcomp.ir.ops) carries shape, reference, gradient, cost and view facts and, for
elementwise ops, one GLSL expression; its lowering (template, loop extent, template parameters,
vec4 forms, fused bodies) is registered by its family module. These tests enumerate both
registries: every loop op has exactly one lowering, no codegen module outside the families names
an op, no IR module builds GLSL, every template a lowering asks for exists, and every op renders
through the code generator.
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
from glcomp.codegen.families import FUSED_KINDS, LOOP_KINDS, LOWERINGS
from glcomp.codegen.families.base import TEMPLATES, Lowering
from glcomp.ir.ops import KINDS, REGISTRY, Op
from glcomp.ir.tensor import prim
from glcomp.testing import OpCase, op_cases

CODEGEN = Path(glcomp.__file__).parent / "codegen"
FAMILIES = CODEGEN / "families"
IR = Path(glcomp.__file__).parent / "ir"

# String literals equal to an op name that a codegen module outside the families may hold, each
# for a reason that is not a per-op kernel fact. split_wide is a graph rewrite of concat and slice
# themselves (it builds and matches those nodes; it renders nothing); kernels.py labels why a value
# is stored ("input").
ALLOWED = {
    ("passes/split_wide.py", "concat"): "split_wide rewrites concat trees",
    ("passes/split_wide.py", "slice"): "split_wide narrows slices of concats",
    ("kernels.py", "input"): "the label of a storage reason (KernelPlan.stored), not an op test",
    ("passes/tiling.py", "matmul"): "the kind (Op.kind) of the product the blocked kernel replaces",
}


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


OUTSIDE_FAMILIES = sorted(p for p in CODEGEN.rglob("*.py") if FAMILIES not in p.parents)


@pytest.mark.parametrize("path", OUTSIDE_FAMILIES, ids=lambda p: p.relative_to(CODEGEN).as_posix())
def test_only_families_name_ops(path: Path):
    name = path.relative_to(CODEGEN).as_posix()
    found = [
        f"{name}:{line}: {op!r}"
        for line, op in op_name_literals(path.read_text())
        if (name, op) not in ALLOWED
    ]
    assert not found, "codegen names ops outside its kernel families (move it to a family's lowering):\n" + (
        "\n".join(found)
    )


def test_allowed_names_are_still_needed():
    """The allow-list does not outlive the code it excuses."""
    for (module, name), why in ALLOWED.items():
        names = {n for _, n in op_name_literals((CODEGEN / module).read_text())}
        assert name in names, f"{module} no longer names {name!r} ({why}): drop it from ALLOWED"


def test_ir_does_not_import_codegen_or_templates():
    """The IR stands alone: no IR module imports the code generator or Jinja."""
    found = []
    for path in sorted(IR.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            found += [f"{path.name}: {m}" for m in names if m.startswith(("glcomp.codegen", "jinja2"))]
    assert not found


def _glsl_statements(source: str) -> list[tuple[int, str]]:
    """(line, text) of string constants and f-strings in `source` that read as GLSL statements or
    declarations: a `;`-terminated text, or one that opens with a vec4 declaration."""
    marks = ("vec4 ",)
    tree = ast.parse(source)
    inside = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for v in node.values}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):  # an f-string: its literal parts
            text = "".join(v.value for v in node.values if isinstance(v, ast.Constant))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in inside:
            text = node.value
        else:
            continue
        if text.rstrip().endswith(";") or text.lstrip().startswith(marks):
            out.append((node.lineno, text))
    return out


def test_scan_finds_glsl_statements():
    source = 'a = f"return {x};"\nb = "vec4 e = v1_4(i0);"\nc = "acc + a"\nd = "a * b"\n'
    assert [line for line, _ in _glsl_statements(source)] == [1, 2]


@pytest.mark.parametrize("path", sorted(IR.rglob("*.py")), ids=lambda p: p.relative_to(IR).as_posix())
def test_ir_builds_no_glsl(path: Path):
    """IR modules hold no GLSL statements: an elementwise op's one expression is all the GLSL an
    op record carries."""
    found = _glsl_statements(path.read_text())
    assert not found, f"{path.name} builds GLSL (move it to glcomp.codegen.families): {found}"


def test_every_loop_op_has_exactly_one_lowering():
    """Each loop op is lowered once, by one family, with a template that exists, a loop extent and
    a root; fused ops that are not elementwise (views, indices, constants) have a scalar body."""
    for name, rule in REGISTRY.items():
        low = LOWERINGS.get(name)
        if rule.kind in LOOP_KINDS:
            assert low is not None, f"{name}: no lowering"
            assert (TEMPLATES / f"{low.template}.frag.j2").exists(), f"{name}: template {low.template}"
            assert low.loop_extent is not None and low.root is not None, name
            assert low.emit is None and low.emit4 is None, name
        elif rule.kind in ("movement", "index") or (rule.kind == "source" and not rule.feed):
            assert low is not None and low.emit is not None, f"{name}: no fused body"
        else:  # elementwise ops render from their record's expression, fed sources from textures
            assert low is None, f"{name}: an elementwise or fed op with a lowering of its own"
        if low is not None and low.root4t is not None:
            assert low.root4 is not None, f"{name}: a transposed vec4 form without a plain one"


def test_lowering_registry_refuses_a_second_lowering():
    from glcomp.codegen.families.base import register

    with pytest.raises(ValueError, match="lowered twice"):
        register(LOWERINGS["matmul"])
    with pytest.raises(ValueError, match="fused into their readers"):
        Lowering("reshape", "matmul")
    with pytest.raises(ValueError, match="needs a template, a loop extent and a root"):
        Lowering("sum", "reduce")


def test_every_family_template_is_used():
    """No template is left behind by a family that no longer asks for it (partials start with _;
    map.frag.j2 renders fused roots; matmul_tiled.frag.j2 is the matmul family's blocked form;
    a lowering's tiled_template its op's)."""
    used = {low.template for low in LOWERINGS.values()} | {"map", "matmul_tiled"}
    used |= {low.tiled_template for low in LOWERINGS.values() if low.tiled_template}
    files = {p.name.removesuffix(".frag.j2") for p in TEMPLATES.glob("*.frag.j2")}
    assert files == used


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_op_facts_are_consistent(name: str):
    rule: Op = REGISTRY[name]
    assert rule.kind in KINDS
    assert rule.kind in LOOP_KINDS or rule.kind in FUSED_KINDS
    assert (rule.glsl is not None) == (rule.kind == "elementwise"), name
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
        low = LOWERINGS.get(name)
        if low is not None and low.loop_extent is not None:
            extent = low.loop_extent(list(case.shapes), case.attrs)
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
