"""program.json: its JSON Schema (program.schema.json, beside this file) and the checks that tie
it to the manifest and the weights.

`check_program` validates untrusted program.json data: first the format and version, then the
structure against the schema (with the interpreter of glcomp/format/jsonschema.py), then in code
what the schema cannot say: the input specs agree with the manifest's inputs, the state order
lists exactly the manifest's states and counters, trainable names are parameters, the graphs
are the manifest's entries and every constant is a number. What needs the IR (each graph's
nodes, shapes against the state, outputs against the manifest) is checked by
`glcomp.Program.from_bundle` on the graphs `Graph.from_json` rebuilds; whether the graphs
compute what the shaders do, by `glcomp.Program.check_agreement` (glcomp.format.agreement).
Every fault is a GlcompError starting ``bundle program.json:``. This module imports nothing of
glcomp but its errors and the format.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from glcomp.errors import GlcompError
from glcomp.format.jsonschema import Validator, short

PROGRAM_FORMAT = "glcomp-program"
PROGRAM_VERSIONS = (1,)
SCHEMA_FILE = "program.schema.json"
WHERE = "bundle program.json"
# The roles of the manifest's states that each list of ``order`` names.
ORDER_ROLES = {"params": "param", "buffers": "buffer", "opt_state": "state"}


@cache
def program_schema() -> dict[str, Any]:
    """program.json's JSON Schema (program.schema.json, shipped with the package)."""
    text = resources.files("glcomp.format").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@cache
def _validator() -> Validator:
    return Validator(program_schema(), "program.json", root="program")


def _numeric(value: Any) -> bool:
    """A constant's value as Graph.to_json writes it: a number (not a bool), or an infinity as
    ``{"float": "inf"}`` / ``{"float": "-inf"}`` (a causal mask's); not NaN, not a string (a
    ``"1.0"`` would reach the reference interpreter as text), not a list (constants are scalars)."""
    if isinstance(value, dict):
        return set(value) == {"float"} and value["float"] in ("inf", "-inf")
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_constants(graphs: dict[str, Any]) -> None:
    """Every ``const`` node of every graph holds a numeric value (GlcompError naming the node)."""
    for entry, graph in graphs.items():
        for i, node in enumerate(graph["nodes"]):
            if not isinstance(node, dict) or node.get("op") != "const":
                continue  # the node's other fields are Graph.from_json's to check
            attrs = node.get("attrs")
            value = attrs.get("value") if isinstance(attrs, dict) else None
            _need(
                _numeric(value),
                f"graphs.{entry}: node {short(node.get('id'))} (nodes[{i}]) is a constant of value "
                f"{short(value)}, not a number",
            )


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise GlcompError(f"{WHERE}: {msg}")


def check_program(data: Any, manifest: dict[str, Any]) -> None:
    """Raise GlcompError (``bundle program.json: ...``) unless `data` is a program.json that fits
    its schema and agrees with the validated `manifest`; never raises anything else."""
    _need(isinstance(data, dict), "must be an object")
    _need(data.get("format") == PROGRAM_FORMAT, f"format must be {PROGRAM_FORMAT!r}")
    version = data.get("version")
    _need(
        type(version) is int and version in PROGRAM_VERSIONS,
        f"unknown version {short(version)} (supported: {', '.join(map(str, PROGRAM_VERSIONS))})",
    )
    _validator().validate(data)
    _check_constants(data["graphs"])
    specs = [(f"inputs[{i}]", s) for i, s in enumerate(data["inputs"])]
    if data["target"] is not None:
        specs.append(("target", data["target"]))
    for field, spec in specs:
        name = spec["name"]
        if name in manifest["inputs"]:
            record = {k: v for k, v in manifest["inputs"][name].items() if k != "layout"}
            _need(
                {k: v for k, v in spec.items() if k != "name"} == record,
                f"{field} ({name}) disagrees with manifest.json",
            )
    roles = {k: st["role"] for k, st in manifest["states"].items()}
    order = data["order"]
    for key, role in ORDER_ROLES.items():
        _need(
            sorted(order[key]) == sorted(k for k, r in roles.items() if r == role),
            f"order.{key} does not list the manifest's {role} states",
        )
    _need(
        sorted(order["counters"]) == sorted(manifest["counters"]),
        "order.counters does not list the manifest's counters",
    )
    trainable = data["trainable"]
    _need(
        set(trainable) <= set(order["params"]) and len(set(trainable)) == len(trainable),
        "trainable must list parameters",
    )
    graphs = data["graphs"]
    _need(
        set(graphs) == set(manifest["entries"]),
        f"graphs {sorted(graphs)} != the manifest's entries {sorted(manifest['entries'])}",
    )
