"""Variant sets: one model compiled several ways (storage f32 / f16 / rgba8, or other compile
options), saved together so that a runtime can pick the best one a device supports.

A variant set is a directory holding ``variants.json`` and one ordinary bundle per variant in a
sub-directory named after it::

    variants.json        {"format": "glcomp-variants", "version": 1, "variants": [
                            {"name": "f32", "storage": "f32", "path": "f32",
                             "requires": {"webgl": 2, "float_textures": true, ...}}, ...]}
    f32/manifest.json, f32/shaders.json, f32/weights.safetensors, f32/program.json
    f16/...
    rgba8/...

Each variant is a complete bundle, validated and hashed as any other (``glcomp.load(dir/"rgba8")``
loads one). ``requires`` states what a device needs for that variant (see `requirements`);
``glcomp.js``'s ``loadVariants`` (``glcomp/runtime/js/variants.js``) probes the device and loads the
first variant, in the listed order, whose requirements it meets, and ``rt.info().variant`` says which
one and why the ones before it were skipped. In Python any variant can be forced:
``load_variants(dir).runtime("gl", variant="rgba8")``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from glcomp.errors import GlcompError
from glcomp.program import Program
from glcomp.runtime.protocol import Runtime

INDEX = "variants.json"
INDEX_FORMAT = "glcomp-variants"
INDEX_VERSION = 1
_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,31}")
# What a variant may require of a device, and what each key means.
REQUIREMENTS = {
    "webgl": "the WebGL version (1 or 2) its shaders are written for",
    "float_textures": "RGBA32F textures it renders to (WebGL 2: EXT_color_buffer_float; "
    "WebGL 1: OES_texture_float and WEBGL_color_buffer_float)",
    "half_float_textures": "RGBA16F textures it renders to (WebGL 2: EXT_color_buffer_float; "
    "WebGL 1: OES_texture_half_float and EXT_color_buffer_half_float)",
    "float_blend": "additive blending into float textures (EXT_float_blend)",
    "draw_buffers": "render targets per draw (WebGL 1: WEBGL_draw_buffers when more than 1)",
    "highp": "32-bit highp floats in fragment shaders",
}


def requirements(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a device needs to run the bundle of `manifest` (keys of `REQUIREMENTS`)."""
    formats = {t.get("format", "f32") for t in manifest["textures"].values()}
    return {
        "webgl": 1 if manifest["target"]["glsl_version"] == "100" else 2,
        "float_textures": "f32" in formats,
        "half_float_textures": "f16" in formats,
        "float_blend": any(d.get("blend") for e in manifest["entries"].values() for d in e["draws"]),
        "draw_buffers": max([p["outputs"] for p in manifest["programs"].values()] + [1]),
        "highp": True,
    }


def _spec(v: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(v, str):
        return {"name": v, "storage": v}
    if not isinstance(v, dict) or not isinstance(v.get("name"), str):
        raise GlcompError(f"variants: each variant is a storage name or a dict with a 'name', got {v!r}")
    return dict(v)


class VariantSet:
    """Programs of one model compiled several ways, in order of preference (best first)."""

    def __init__(self, programs: dict[str, Program]) -> None:
        if not programs:
            raise GlcompError("variants: at least one variant is needed")
        for name in programs:
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise GlcompError(f"variants: a name must match {_NAME.pattern}, got {name!r}")
        self.programs = dict(programs)

    @property
    def names(self) -> list[str]:
        return list(self.programs)

    def requirements(self, name: str) -> dict[str, Any]:
        """What a device needs to run variant `name`."""
        return requirements(self.program(name).bundle().manifest)

    def program(self, name: str | None = None) -> Program:
        """The Program of variant `name` (default: the first, most preferred)."""
        if name is None:
            return next(iter(self.programs.values()))
        if name not in self.programs:
            raise GlcompError(f"variants: no variant {name!r}; this set has {self.names}")
        return self.programs[name]

    def runtime(self, kind: str = "gl", variant: str | None = None, **kwargs: Any) -> Runtime:
        """A runtime of variant `variant` (forced; default the first), as `Program.runtime`."""
        return self.program(variant).runtime(kind, **kwargs)

    def index(self) -> dict[str, Any]:
        variants = []
        for name, prog in self.programs.items():
            m = prog.bundle().manifest
            storage = {t.get("format", "f32") for t in m["textures"].values()}
            variants.append(
                {
                    "name": name,
                    "storage": "rgba8" if "rgba8" in storage else "f16" if "f16" in storage else "f32",
                    "path": name,
                    "requires": requirements(m),
                    "texture_bytes": m["memory"]["texture_bytes"],
                }
            )
        return {"format": INDEX_FORMAT, "version": INDEX_VERSION, "variants": variants}

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write every variant's bundle to ``directory/<name>`` (each saved atomically, see
        `Bundle.save`) and then ``variants.json`` (replaced atomically). Returns the directory."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        for name, prog in self.programs.items():
            prog.save(root / name)
        tmp = root / (INDEX + ".tmp")
        tmp.write_text(json.dumps(self.index(), indent=1, sort_keys=True))
        os.replace(tmp, root / INDEX)
        return root


def compile_variants(
    model: Any,
    inputs: dict[str, Any],
    variants: Sequence[str | dict[str, Any]] = ("f32", "f16", "rgba8"),
    **kwargs: Any,
) -> VariantSet:
    """Compile `model` once per variant, in order of preference. A variant is a storage name
    (``"f32"``, ``"f16"``, ``"rgba8"``) or a dict ``{"name": ..., **compile options}`` overriding
    the shared keyword arguments (e.g. ``{"name": "mobile", "storage": "rgba8", "target":
    "webgl1-mobile"}``). Every variant starts from the model's current weights."""
    import glcomp

    specs = [_spec(v) for v in variants]
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise GlcompError(f"variants: names must be distinct, got {names}")
    programs = {}
    for spec in specs:
        options = {**kwargs, **{k: v for k, v in spec.items() if k != "name"}}
        programs[spec["name"]] = glcomp.compile(model, inputs, **options)
    return VariantSet(programs)


def load_variants(directory: str | os.PathLike[str]) -> VariantSet:
    """Load a saved variant set (each variant validated as `glcomp.load` validates a bundle)."""
    import glcomp

    root = Path(directory)
    where = f"{root / INDEX}"
    try:
        index = json.loads((root / INDEX).read_text())
    except (OSError, ValueError) as err:
        raise GlcompError(f"{where}: cannot be read as JSON ({err})") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise GlcompError(f"{where}: format must be {INDEX_FORMAT!r}")
    if index.get("version") != INDEX_VERSION:
        raise GlcompError(f"{where}: unknown version {index.get('version')!r} (supported: {INDEX_VERSION})")
    entries = index.get("variants")
    if not isinstance(entries, list) or not entries:
        raise GlcompError(f"{where}: variants must be a non-empty list")
    programs: dict[str, Program] = {}
    for i, v in enumerate(entries):
        name = v.get("name") if isinstance(v, dict) else None
        if not isinstance(name, str) or not _NAME.fullmatch(name) or name in programs:
            raise GlcompError(f"{where}: variants[{i}].name must be a new name matching {_NAME.pattern}")
        if v.get("path") != name:
            raise GlcompError(f"{where}: variants[{i}].path must be the variant's name {name!r}")
        prog = glcomp.load(root / name)
        if v.get("requires") != requirements(prog.bundle().manifest):
            raise GlcompError(f"{where}: variants[{i}].requires does not match the bundle {name}/")
        programs[name] = prog
    return VariantSet(programs)
