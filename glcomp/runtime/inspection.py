"""The texture inspector's bookkeeping, shared by the GL runtime (which knows only the manifest):
which entry output holds a named tensor, and the error for a name nothing holds.

A bundle compiled with ``inspect=[names]`` has an output ``inspect:<name>`` in each entry that
computes the tensor (docs/inspect.md); an entry's own outputs (``loss``, ``output``,
``grad:<param>``) are readable under their names; states under theirs.
"""

from __future__ import annotations

from typing import Any

from glcomp.errors import GlcompError, near_names

INSPECT_PREFIX = "inspect:"


def visible_outputs(entry: dict[str, Any]) -> list[str]:
    """The outputs of a manifest entry that its runtime call returns (not the inspector's)."""
    return [k for k in entry["outputs"] if not k.startswith(INSPECT_PREFIX)]


def output_key(entry: dict[str, Any], name: str) -> str | None:
    """The output of a manifest entry that holds the tensor `name`, or None."""
    if INSPECT_PREFIX + name in entry["outputs"]:
        return INSPECT_PREFIX + name
    if name in entry["outputs"] and name.partition(":")[0] in ("loss", "output", "grad"):
        return name
    return None


def inspectable(manifest: dict[str, Any]) -> dict[str, list[str]]:
    """Every name the inspector can read from a bundle -> the entries that compute it (states
    and counters: an empty list, they are always readable)."""
    names: dict[str, list[str]] = {k: [] for k in [*manifest["states"], *manifest["counters"]]}
    for entry, e in manifest["entries"].items():
        for key in e["outputs"]:
            name = key[len(INSPECT_PREFIX) :] if key.startswith(INSPECT_PREFIX) else key
            if output_key(e, name) is not None:
                names.setdefault(name, []).append(entry)
    return names


def not_held(name: str, names: dict[str, list[str]], last: str | None, kept: bool) -> GlcompError:
    """The error for inspecting `name` when the last entry run (`last`) does not hold it.
    `kept`: whether the runtime can read any tensor of the program (else it reads only what the
    bundle kept, and the hint says to compile with ``inspect=``)."""
    if names.get(name):
        ran = f"the last entry run was {last}" if last else "no entry has run yet"
        return GlcompError(
            f"inspect: {name!r} is computed by {', '.join(names[name])}; {ran}: run one of them first"
        )
    hint = "" if kept else f" (a tensor this bundle did not keep: compile with inspect=[{name!r}])"
    return GlcompError(f"inspect: no tensor named {name!r}{hint}; {near_names(name, names)}")
