"""program.json: its JSON Schema (glcomp/format/program.schema.json), its agreement with the
manifest (glcomp.format.program), and with the shaders: a constant of the graphs that the
bundle's shaders do not hold (the reference would compute other numbers than GL) is refused,
naming program.json, the graph and the node."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import as_format_3

import glcomp
from format.test_hostile_bundles import _program_variant, _py
from glcomp import GlcompError, nn, optim
from glcomp.codegen.families.glsl import glsl_float
from glcomp.format.jsonschema import check_keywords
from glcomp.format.program import check_program, program_schema
from glcomp.format.shaders import float_literal, shader_literals


@pytest.fixture(scope="module")
def good(tmp_path_factory: pytest.TempPathFactory) -> Path:
    glcomp.manual_seed(3)
    model = nn.Sequential(nn.Linear(3, 5), nn.LeakyReLU(0.25), nn.Linear(5, 2))
    prog = glcomp.compile(model, {"x": (2, 3)}, loss=nn.CrossEntropyLoss(), optimizer=optim.Adam(lr=0.01))
    return as_format_3(prog.save(tmp_path_factory.mktemp("good") / "b"))


def _consts(p: dict[str, Any]) -> list[dict[str, Any]]:
    return [n for g in p["graphs"].values() for n in g["nodes"] if n["op"] == "const"]


def test_the_good_bundle_loads_and_its_constants_are_in_its_shaders(good: Path) -> None:
    assert _py(good) is None
    prog = glcomp.load(good)
    literals = shader_literals(prog.bundle().shaders)
    values = [g.attrs(n)["value"] for g in prog.graphs.values() for n in g.g.nodes if g.op(n) == "const"]
    assert 0.25 in values and all(float_literal(v) in literals for v in values)


def _shifted(p: dict[str, Any]) -> None:
    node = next(n for n in _consts(p) if n["attrs"]["value"] == 0.25)  # LeakyReLU's slope
    node["attrs"]["value"] = 0.2578125


def _negated(p: dict[str, Any]) -> None:
    for n in _consts(p):
        if n["attrs"]["value"] == 0.25:
            n["attrs"]["value"] = -7.75


def _listed(p: dict[str, Any]) -> None:
    _consts(p)[0]["attrs"]["value"] = [0.25, 0.25]


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (_shifted, r"graphs\.\w+: node \d+ is the constant 0\.2578125, which no shader of the bundle holds"),
        (_negated, r"node \d+ is the constant -7\.75, which no shader of the bundle holds"),
        (_listed, r"node \d+ \(nodes\[\d+\]\) is a constant of value \[0\.25, 0\.25\], not a number"),
    ],
)
def test_constants_that_disagree_with_the_shaders_are_refused(
    good: Path, tmp_path: Path, change: Any, want: str
) -> None:
    """The LeakyReLU slope 0.25 -> 0.2578125 in program.json only: the reference oracle would
    differ from GL, silently; now glcomp.load refuses the bundle."""
    msg = _py(_program_variant(good, tmp_path / "p", change))
    assert msg is not None and msg.startswith("bundle program.json: "), msg
    assert re.search(want, msg), msg


@pytest.mark.parametrize(
    ("change", "want"),
    [
        (lambda p: p.update(extra=1), "unknown fields ['extra']"),
        (lambda p: p["inputs"][0].update(dtype="float16"), "inputs[0].dtype"),
        (lambda p: p["order"].update(params="0.weight"), "order.params must be a list"),
        (lambda p: p["inputs"].clear(), "inputs"),
        (lambda p: p["graphs"].update(evaluate={}), "graphs"),
        (lambda p: p["inputs"][0].update(shape=[2, 4]), "inputs[0] (x) disagrees with manifest.json"),
        (lambda p: p["trainable"].append("nope"), "trainable must list parameters"),
        (lambda p: p.update(version=2), "unknown version 2"),
    ],
)
def test_program_json_is_checked_against_its_schema_and_the_manifest(
    good: Path, tmp_path: Path, change: Any, want: str
) -> None:
    msg = _py(_program_variant(good, tmp_path / "p", change))
    assert msg is not None and msg.startswith("bundle program.json: ") and want in msg, msg


def test_check_program_raises_only_glcomp_errors(good: Path) -> None:
    manifest = glcomp.load(good).bundle().manifest
    for value in (None, [], "x", {"format": "glcomp-program"}, {"format": "glcomp-program", "version": 1}):
        with pytest.raises(GlcompError, match=r"^bundle program\.json: "):
            check_program(value, manifest)


def test_the_schema_uses_only_keywords_both_interpreters_know() -> None:
    check_keywords(program_schema())  # raises for an unsupported keyword


@pytest.mark.parametrize(
    "value", [0, 1, -2, 0.25, -0.5, 1e-5, 1 / 3, 0.09999999999999998, 1e30, -1e-30, math.inf, -math.inf]
)
def test_float_literal_is_the_code_generators_spelling(value: float) -> None:
    assert float_literal(value) == glsl_float(value)
    assert float_literal(np.float32(value).item()) == glsl_float(np.float32(value).item())
