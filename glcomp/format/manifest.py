"""The bundle manifest: its schema (manifest.schema.json, beside this file) and its validation.

`validate_manifest` checks a manifest's structure against the JSON Schema with the interpreter of
glcomp/format/jsonschema.py, then in code what a schema cannot say: every texture, state,
program, shader and hyper-parameter a field names exists, layouts agree with their shapes and
textures, formats are consistent, and the resources it asks for fit their budgets. The browser
runtime (glcomp/runtime/js/format/manifest.js) loads the same schema (as the generated module
manifest_schema.js) into the same interpreter and runs the same cross-checks, so both accept and
reject the same manifests. This module imports nothing of glcomp but its errors: runtimes and the
code generator both use it.
"""

from __future__ import annotations

import json
import math
import re
from functools import cache
from importlib import resources
from typing import Any

from glcomp.errors import GlcompError
from glcomp.format.jsonschema import Validator, short

SCHEMA_FILE = "manifest.schema.json"
FORMAT = "glcomp-bundle"
# 2 adds `files` (sha256 of each file) and program.json; 3 keeps every shader in one file,
# shaders.json ({shader file name: GLSL source}), where 1 and 2 have one file each under shaders/;
# 4 is 3 with every file but manifest.json stored under a name carrying its sha256 (see
# stored_name), so that a save writes fresh files and switches the bundle by replacing
# manifest.json alone.
VERSIONS = (1, 2, 3, 4)
MAX_SIDE = 1 << 16
# Texel formats a texture record may name in "format" (absent: "f32"), and their sizes in bytes.
# "rgba8": each logical texel (4 floats) is 4 RGBA8 texels side by side, each holding one
# float32's 4 bytes (little-endian): the texture is 4x wider than its record's width, exact.
TEXEL_BYTES = {"f32": 16, "f16": 8, "rgba8": 16}
# Formats that hold float32 values exactly (states and entry inputs must use one of them).
EXACT_FORMATS = ("f32", "rgba8")
DEFAULT_TEXTURE_BUDGET = 2 << 30  # bytes of textures a bundle may declare (2 GiB)
DEFAULT_LOOP_BUDGET = 1 << 32  # loop iterations one draw may run (bound per fragment x fragments)
# What the draws of one entry may run together: each draw's fragments times its loop iterations
# per fragment (at least 1: a fragment without loops still runs), summed.
DEFAULT_ENTRY_BUDGET = 1 << 36
WEIGHTS_FILE = "weights.safetensors"
PROGRAM_FILE = "program.json"
SHADERS_FILE = "shaders.json"


def shader_path(version: Any, name: str) -> str:
    """Where the shader `name` of a bundle of format `version` is, as errors name it:
    ``shaders.json[name]`` from version 3 on, the file ``shaders/name`` before."""
    return f"{SHADERS_FILE}[{name}]" if packed_shaders(version) else f"shaders/{name}"


STORED_DIGITS = 16  # hex digits of a file's sha256 in its stored name (format 4)
_DIGEST = re.compile(r"[0-9a-f]{64}")


def stored_name(version: Any, path: str, digest: Any) -> str | None:
    """The name under which the file `path` (a key of the manifest's ``files``: weights.safetensors,
    shaders.json, program.json) is stored in a bundle of format `version` whose manifest records
    the sha256 `digest` for it: from version 4 on, the name with the digest's first 16 hex digits
    before its extension (``weights.0123456789abcdef.safetensors``), for other versions `path`
    itself. None where a name of version 4 cannot be formed (`digest` is not a sha256: the
    manifest is refused for that). glcomp.js's storedName gives the same names."""
    if not (type(version) is int and version == 4):  # a version this module knows
        return path
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest):
        return None
    stem, _, ext = path.rpartition(".")
    return f"{stem}.{digest[:STORED_DIGITS]}.{ext}"


def packed_shaders(version: Any) -> bool:
    """Whether a bundle of format `version` keeps its shaders in shaders.json (version 3 on)."""
    return type(version) is int and version >= 3


@cache
def manifest_schema() -> dict[str, Any]:
    """The manifest's JSON Schema (manifest.schema.json, shipped with the package)."""
    text = resources.files("glcomp.format").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    return json.loads(text)


@cache
def _validator() -> Validator:
    return Validator(manifest_schema(), "manifest.json")


def texture_format(tex: dict[str, Any]) -> str:
    """A (validated) texture record's texel format: "f32" (RGBA32F), "f16" (RGBA16F) or "rgba8"
    (float32 bytes in RGBA8 texels, 4 GL texels per logical texel)."""
    return str(tex.get("format", "f32"))


def texel_span(tex: dict[str, Any]) -> int:
    """GL texels per logical texel along x: 4 for "rgba8" (the GL texture is 4x wider), else 1."""
    return 4 if texture_format(tex) == "rgba8" else 1


def texel_bytes(tex: dict[str, Any]) -> int:
    """Bytes one texel of a (validated) texture record takes."""
    return TEXEL_BYTES[texture_format(tex)]


def texture_bytes(manifest: dict[str, Any]) -> int:
    """Bytes of GPU memory the (validated) manifest's textures take (RGBA32F 16 a texel, RGBA16F 8,
    rgba8 16 a logical texel)."""
    return sum(texel_bytes(t) * t["width"] * t["height"] for t in manifest["textures"].values())


class _Check:
    """Raises GlcompError ``bundle manifest.json: ...`` for a failed cross-check."""

    def need(self, cond: bool, msg: str) -> None:
        if not cond:
            raise GlcompError(f"bundle manifest.json: {msg}")


def _pow2(v: int) -> bool:
    return v >= 1 and v & (v - 1) == 0


def check_layout(c: _Check, lay: dict[str, Any], field: str, shape: list[int] | None = None) -> None:
    """Cross-checks of a layout the schema has validated: rows, row lengths and texel counts
    follow from the shape (and the shape is `shape` when given), sides are powers of two and the
    pages hold every texel."""
    if shape is not None:
        c.need(shape == lay["shape"], f"{field}.shape {lay['shape']} != {short(shape)}")
    dims = lay["shape"]
    rows = math.prod(dims[:-1]) if dims else 1
    row_len = dims[-1] if dims else 1
    c.need(lay["rows"] == rows and lay["row_len"] == row_len, f"{field} rows/row_len disagree with shape")
    c.need(lay["row_texels"] == max(1, -(-row_len // 4)), f"{field}.row_texels is wrong")
    c.need(lay["texels"] == max(1, rows * lay["row_texels"]), f"{field}.texels is wrong")
    for side in ("width", "height"):
        c.need(_pow2(lay[side]), f"{field}.{side} must be a power of two <= {MAX_SIDE}")
    c.need(lay["width"] * lay["height"] * lay["pages"] >= lay["texels"], f"{field} pages too small")


def validate_manifest(
    m: Any,
    shader_names: set[str],
    *,
    texture_budget_bytes: int = DEFAULT_TEXTURE_BUDGET,
    loop_budget: int = DEFAULT_LOOP_BUDGET,
    entry_budget: int = DEFAULT_ENTRY_BUDGET,
) -> None:
    """Raise GlcompError for anything in a manifest that does not fit the schema; never raises
    anything else, whatever `m` holds. `shader_names`: the shaders present (shader files under
    shaders/ for versions 1 and 2; from version 3 on, shaders.json's are judged apart). The browser
    runtime's validateManifest accepts and rejects exactly the same manifests.

    First the format and version, then the structure (manifest.schema.json: types, names, enums,
    integer ranges, required and unknown fields), then what the schema cannot express: references
    to textures, states, programs, shaders and hyper-parameters resolve; layouts agree with their
    shapes and textures; texture sides are powers of two within ``target.max_texture_size``;
    states and entry inputs are f32 (or rgba8, which is all or nothing: every texture or none, 4x
    its record's width within ``max_texture_size``, never blended), a draw's targets share one
    format; and resources fit
    before anything is allocated: the textures' total size (16 bytes a texel, 8 for
    ``"format": "f16"``) is at most `texture_budget_bytes`, every texture is used by a state, an
    entry's inputs or outputs, or a draw, and every draw's declared loop iterations (its program's
    ``loop_iterations`` per fragment times the viewport's fragments) are at most `loop_budget`,
    and the sum over an entry's draws of their fragments times ``max(1, loop_iterations)`` at
    most `entry_budget` (many draws each within the budget must not add up to hours)."""
    c = _Check()
    c.need(isinstance(m, dict), "manifest must be an object")
    c.need(m.get("format") == FORMAT, f"format must be {FORMAT!r}, got {short(m.get('format'))}")
    version = m.get("version")
    c.need(
        type(version) is int and version in VERSIONS,
        f"unknown format version {short(version)} (supported: {VERSIONS})",
    )
    _validator().validate(m)
    _cross_check(c, m, shader_names, texture_budget_bytes, loop_budget, entry_budget)


def _cross_check(
    c: _Check,
    m: dict[str, Any],
    shader_names: set[str],
    texture_budget_bytes: int,
    loop_budget: int,
    entry_budget: int,
) -> None:
    max_size = m["target"]["max_texture_size"]
    textures = m["textures"]
    total = 0
    for name, tex in textures.items():
        for side in ("width", "height"):
            v = tex[side]
            c.need(_pow2(v), f"textures.{name}.{side} must be a power of two")
            c.need(v <= max_size, f"textures.{name}.{side} {v} exceeds target.max_texture_size {max_size}")
        c.need(
            texel_span(tex) * tex["width"] <= max_size,
            f"textures.{name}: an rgba8 texture is 4x its width wide, more than {max_size}",
        )
        total += texel_bytes(tex) * tex["width"] * tex["height"]
    # rgba8 storage is all or nothing: its shaders decode every texture they read from bytes.
    state_format = "rgba8" if any(texture_format(t) == "rgba8" for t in textures.values()) else "f32"
    c.need(
        state_format == "f32" or all(texture_format(t) == "rgba8" for t in textures.values()),
        "textures: either every texture is rgba8 or none is",
    )
    c.need(
        total <= texture_budget_bytes,
        f"the textures take {total} bytes, more than the budget of {texture_budget_bytes} bytes",
    )
    used: set[str] = set()

    states = m["states"]
    owner: dict[str, str] = {}
    for name, st in states.items():
        lay = st["layout"]
        check_layout(c, lay, f"states.{name}.layout")
        for group in st["textures"]:
            c.need(len(group) == lay["pages"], f"states.{name}.textures: one texture per page expected")
            for t in group:
                c.need(t in textures, f"states.{name} refers to unknown texture {short(t)}")
                c.need(
                    (textures[t]["width"], textures[t]["height"]) == (lay["width"], lay["height"]),
                    f"states.{name}: texture {t!r} has the wrong size",
                )
                c.need(
                    texture_format(textures[t]) in EXACT_FORMATS,
                    f"states.{name}: texture {t!r} must be f32 or rgba8 (states are kept in float32)",
                )
                c.need(
                    t not in owner, f"states.{name}: texture {t!r} is used twice by the state texture sets"
                )
                owner[t] = name
    used |= set(owner)
    inputs = m["inputs"]
    for name, spec in inputs.items():
        check_layout(c, spec["layout"], f"inputs.{name}.layout", spec["shape"])
    hyper = m["hyper"]
    for name in m["counters"]:
        c.need(name not in states, f"counters.{name} has the name of a state")
    c.need(m["vertex_shader"] in shader_names, f"vertex shader {short(m['vertex_shader'])} is missing")
    programs = m["programs"]
    for pid, prog in programs.items():
        c.need(
            prog["fragment"] in shader_names, f"programs.{pid}: shader {short(prog['fragment'])} is missing"
        )
        names = prog["samplers"] + prog["uniforms"]
        c.need(len(set(names)) == len(names), f"programs.{pid}: a uniform name appears twice")

    def check_ref(ref: Any, field: str) -> tuple[int, int]:
        if isinstance(ref, str):
            c.need(ref in textures, f"{field} refers to unknown texture {ref!r}")
            # Which set of a state is current flips every update: only a state reference says.
            c.need(ref not in owner, f"{field} names state texture {ref!r} directly")
            used.add(ref)
            return textures[ref]["width"], textures[ref]["height"]
        c.need(ref["state"] in states, f"{field} refers to unknown state {short(ref['state'])}")
        lay = states[ref["state"]]["layout"]
        c.need(
            ref["page"] < lay["pages"],
            f"{field}.page {ref['page']} is beyond the state's {lay['pages']} pages",
        )
        return lay["width"], lay["height"]

    def ref_key(r: Any) -> str:
        return json.dumps(r) if isinstance(r, str) else json.dumps([r["page"], r["state"], r["version"]])

    for entry, e in m["entries"].items():
        for name, refs in e["inputs"].items():
            c.need(name in inputs, f"entries.{entry}: unknown input {name!r}")
            lay = inputs[name]["layout"]
            c.need(len(refs) == lay["pages"], f"entries.{entry}.inputs.{name}: one texture per page expected")
            for r in refs:
                want = (lay["width"], lay["height"])
                size = check_ref(r, f"entries.{entry}.inputs.{name}")
                c.need(size == want, f"entries.{entry}.inputs.{name}: a texture's size is not {want}")
                c.need(
                    not isinstance(r, str) or texture_format(textures[r]) in EXACT_FORMATS,
                    f"entries.{entry}.inputs.{name}: input texture {r!r} must be f32 or rgba8",
                )
        for name, out in e["outputs"].items():
            lay = out["layout"]
            check_layout(c, lay, f"entries.{entry}.outputs.{name}.layout")
            c.need(
                len(out["textures"]) == lay["pages"],
                f"entries.{entry}.outputs.{name}: one texture per page expected",
            )
            for r in out["textures"]:
                want = (lay["width"], lay["height"])
                size = check_ref(r, f"entries.{entry}.outputs.{name}")
                c.need(size == want, f"entries.{entry}.outputs.{name}: a texture's size is not {want}")
        for name in e.get("updates", []):
            c.need(name in states, f"entries.{entry}.updates: unknown state {short(name)}")
        entry_work = 0
        for i, d in enumerate(e["draws"]):
            field = f"entries.{entry}.draws[{i}]"
            c.need(d["program"] in programs, f"{field} refers to unknown program {short(d['program'])}")
            prog = programs[d["program"]]
            samplers, uniforms, targets, vp = d["samplers"], d["uniforms"], d["targets"], d["viewport"]
            c.need(
                sorted(samplers) == sorted(prog["samplers"]), f"{field}: samplers do not match the program"
            )
            for s, r in samplers.items():
                check_ref(r, f"{field}.samplers.{s}")
            c.need(
                sorted(uniforms) == sorted(prog["uniforms"]), f"{field}: uniforms do not match the program"
            )
            for u, src in uniforms.items():
                named = src.get("hyper")
                c.need(
                    named is None or named in hyper,
                    f"{field}.uniforms.{u} must name a hyper-parameter, got {short(named)}",
                )
            c.need(len(targets) == prog["outputs"], f"{field}: one target per program output expected")
            sizes = {check_ref(r, f"{field}.targets") for r in targets}
            formats = {texture_format(textures[r]) if isinstance(r, str) else state_format for r in targets}
            c.need(
                len(formats) == 1, f"{field}: render targets must all have one format, got {sorted(formats)}"
            )
            c.need(sizes == {tuple(vp)}, f"{field}: render targets must all match the viewport size")
            read = {ref_key(r) for r in samplers.values()}
            c.need(not any(ref_key(r) in read for r in targets), f"{field} samples a texture it renders to")
            c.need(
                len({ref_key(r) for r in targets}) == len(targets), f"{field} renders to one texture twice"
            )
            c.need(
                not (d.get("blend", False) and formats == {"rgba8"}),
                f"{field}: rgba8 render targets cannot be blended",
            )
            span = 4 if formats == {"rgba8"} else 1  # an rgba8 draw covers 4 fragments a texel
            work = prog["loop_iterations"] * vp[0] * span * vp[1]
            c.need(
                work <= loop_budget,
                f"{field} may run {work} loop iterations ({prog['loop_iterations']} per fragment), more "
                f"than the budget of {loop_budget} per draw",
            )
            entry_work += max(1, prog["loop_iterations"]) * vp[0] * span * vp[1]
        c.need(
            entry_work <= entry_budget,
            f"entries.{entry}: its {len(e['draws'])} draws may run {entry_work} fragments and loop "
            f"iterations, more than the budget of {entry_budget} per entry",
        )
    unused = sorted(set(textures) - used)
    c.need(not unused, f"textures {short(unused)} are used by no state, input, output or draw")
    if m["version"] >= 2 or "files" in m:
        c.need("files" in m, "files must be an object of sha256 digests (format version 2 has one per file)")
        files = m["files"]
        if packed_shaders(m["version"]):
            paths = [WEIGHTS_FILE, SHADERS_FILE]
            for path in sorted(files):
                c.need(
                    not path.startswith("shaders/"),
                    f"files: {path} is not a file of format version 3 ({SHADERS_FILE} holds every shader)",
                )
        else:
            shaders = {m["vertex_shader"]} | {p["fragment"] for p in programs.values()}
            paths = [WEIGHTS_FILE] + [f"shaders/{n}" for n in sorted(shaders)]
            c.need(
                SHADERS_FILE not in files,
                f"files: {SHADERS_FILE} is a file of format version 3, not {m['version']}",
            )
        for path in paths:
            c.need(path in files, f"files: no sha256 for {path}")


def js_module() -> str:
    """The browser runtime's copy of the schema, glcomp/runtime/js/format/manifest_schema.js: an ES
    module whose default export is manifest.schema.json's value (tests check the two agree)."""
    body = json.dumps(manifest_schema(), indent=2, ensure_ascii=True)
    return (
        "// The manifest's JSON Schema for the browser runtime, generated from\n"
        "// glcomp/format/manifest.schema.json by `python3 -m glcomp.format > "
        "glcomp/runtime/js/format/manifest_schema.js`.\n"
        "// Do not edit: change the JSON and regenerate (a test checks that both agree).\n"
        f"export default {body};\n"
    )
