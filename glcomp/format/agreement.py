"""Whether a bundle's program.json describes the computation of its shaders.

The GL runtime runs a bundle's shaders and draw lists (manifest.json, shaders.json); the
reference runtime runs program.json's graphs. Nothing but the code generator ties the two
together, and it is deterministic: the shaders and draws that the code generator emits for
program.json's graphs, under its recorded compile options and target, are the bundle's if and only
if program.json describes what the shaders compute. `disagreement` compares a loaded bundle with
that regeneration (glcomp.Program does the regenerating, lazily, when a reference runtime is made
from a loaded bundle) and names the first draw, kernel and shader that differ. Pure data: this
module imports nothing of glcomp but the format's names.
"""

from __future__ import annotations

from typing import Any

from glcomp.format.shaders import SHADERS_FILE

__all__ = ["STATE_FIELDS", "disagreement"]

# The entry points in the order a bundle is compiled (glcomp.ir.program.ENTRY_POINTS).
ENTRY_POINTS = ("predict", "gradients", "train_step")
# Manifest fields that hold state or storage, not computation: the learning rate and counters
# (the weights' values), the file digests and the format version the bundle was stored under.
STATE_FIELDS = frozenset({"version", "hyper", "counters", "files"})


def _origins(source: str) -> str:
    """The model layers a shader computes, from its ``// from ...`` lines."""
    found = [line[len("// from ") :] for line in source.splitlines()[:40] if line.startswith("// from ")]
    return f" (from {', '.join(found)})" if found else ""


def _shader(manifest: dict[str, Any], shaders: dict[str, str], pid: Any) -> str | None:
    record = manifest.get("programs", {}).get(pid)
    return None if not isinstance(record, dict) else shaders.get(record.get("fragment"))


def disagreement(
    manifest: dict[str, Any],
    shaders: dict[str, str],
    generated: dict[str, Any],
    generated_shaders: dict[str, str],
) -> str | None:
    """None when the loaded bundle (`manifest`, `shaders`) computes what the regenerated one
    (`generated`, `generated_shaders`: the code generator's output for program.json) does; else
    a sentence naming the first entry point, draw, kernel and shader that differ."""
    entries, regen = manifest.get("entries", {}), generated.get("entries", {})
    if sorted(entries) != sorted(regen):
        return f"its graphs compile to the entry points {sorted(regen)}, the manifest has {sorted(entries)}"
    for entry in [e for e in ENTRY_POINTS if e in regen] + sorted(set(regen) - set(ENTRY_POINTS)):
        have, want = entries[entry], regen[entry]
        draws, wanted = have.get("draws", []), want.get("draws", [])
        for i, (d, w) in enumerate(zip(draws, wanted)):
            source = _shader(manifest, shaders, d.get("program"))
            expected = _shader(generated, generated_shaders, w.get("program"))
            kernel = w.get("kernel")
            if source != expected:
                return (
                    f"graphs.{entry}: kernel {kernel}{_origins(expected or '')} compiles to another "
                    f"shader than {SHADERS_FILE}'s {d.get('program')} (draw {i} of {entry})"
                )
            if d != w or manifest["programs"].get(d.get("program")) != generated["programs"][w["program"]]:
                return (
                    f"graphs.{entry}: kernel {kernel}{_origins(expected or '')} is not drawn as draw {i} is"
                )
        if len(draws) != len(wanted):
            return f"graphs.{entry}: its graph compiles to {len(wanted)} draws, the manifest has {len(draws)}"
        for key in sorted(set(have) | set(want)):
            if key != "draws" and have.get(key) != want.get(key):
                return f"graphs.{entry}: its {key} are not the manifest's"
    for key in sorted((set(manifest) | set(generated)) - STATE_FIELDS - {"entries"}):
        if manifest.get(key) != generated.get(key):
            return f"it compiles to other {key} than the manifest's"
    for name in sorted(set(shaders) | set(generated_shaders)):
        if shaders.get(name) != generated_shaders.get(name):
            return f"it compiles to another {name} than {SHADERS_FILE}'s"
    return None
