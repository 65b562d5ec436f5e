"""The bundle schema: writing a bundle, and reading one back with strict validation.

A bundle is untrusted data. Reading checks the format and version, that every file named lies
inside the bundle directory, that every texture, program, sampler and state reference resolves,
that layouts are self-consistent, and that the weights match the declared state shapes. Any
fault raises GlcompError naming the file and the field at fault.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

FORMAT = "glcomp-bundle"
VERSIONS = (1,)
FILES = ("manifest.json", "weights.safetensors")
_NAME = re.compile(r"^[A-Za-z0-9_.#-]{1,200}$")
_SHADER = re.compile(r"^[A-Za-z0-9_]{1,64}\.(frag|vert)$")
MAX_SIDE = 1 << 16


def write_bundle(bundle: Any, directory: Path) -> Path:
    from safetensors.numpy import save_file

    directory.mkdir(parents=True, exist_ok=True)
    shader_dir = directory / "shaders"
    shader_dir.mkdir(exist_ok=True)
    for name, source in bundle.shaders.items():
        if not _SHADER.match(name):
            raise GlcompError(f"refusing to write shader with unsafe name {name!r}")
        (shader_dir / name).write_text(source)
    (directory / "manifest.json").write_text(json.dumps(bundle.manifest, indent=1, sort_keys=True))
    save_file(
        {k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in bundle.weights.items()},  # keeps 0-d
        str(directory / "weights.safetensors"),
    )
    return directory


class _Check:
    """Collects the context of a failing field so the message says where it is."""

    def __init__(self, where: str) -> None:
        self.where = where

    def fail(self, msg: str) -> GlcompError:
        return GlcompError(f"bundle {self.where}: {msg}")

    def need(self, cond: bool, msg: str) -> None:
        if not cond:
            raise self.fail(msg)

    def dict(self, obj: Any, field: str) -> dict[str, Any]:
        self.need(isinstance(obj, dict), f"{field} must be an object")
        return obj

    def int(self, obj: Any, field: str, lo: int = 0, hi: int = 1 << 40) -> int:
        self.need(
            isinstance(obj, int) and not isinstance(obj, bool) and lo <= obj <= hi,
            f"{field} must be an integer in [{lo}, {hi}], got {obj!r}",
        )
        return obj

    def name(self, obj: Any, field: str) -> str:
        self.need(isinstance(obj, str) and bool(_NAME.match(obj)), f"{field} has an invalid name {obj!r}")
        return obj


def check_layout(c: _Check, lay: Any, field: str, shape: Any = None) -> dict[str, Any]:
    lay = c.dict(lay, field)
    keys = {"shape", "rows", "row_len", "row_texels", "texels", "width", "height", "pages"}
    c.need(set(lay) == keys, f"{field} must have exactly the keys {sorted(keys)}")
    c.need(
        isinstance(lay["shape"], list) and all(isinstance(s, int) and s >= 0 for s in lay["shape"]),
        f"{field}.shape must be a list of sizes",
    )
    if shape is not None:
        c.need(list(shape) == lay["shape"], f"{field}.shape {lay['shape']} != {list(shape)}")
    for k in keys - {"shape"}:
        c.int(lay[k], f"{field}.{k}", 1 if k not in ("rows", "row_len") else 0, 1 << 40)
    shape = lay["shape"]
    rows = math.prod(shape[:-1]) if shape else 1
    row_len = shape[-1] if shape else 1
    c.need(lay["rows"] == rows and lay["row_len"] == row_len, f"{field} rows/row_len disagree with shape")
    c.need(lay["row_texels"] == max(1, math.ceil(row_len / 4)), f"{field}.row_texels is wrong")
    c.need(lay["texels"] == max(1, rows * lay["row_texels"]), f"{field}.texels is wrong")
    for side in ("width", "height"):
        v = lay[side]
        c.need(v <= MAX_SIDE and v & (v - 1) == 0, f"{field}.{side} must be a power of two <= {MAX_SIDE}")
    c.need(lay["width"] * lay["height"] * lay["pages"] >= lay["texels"], f"{field} pages too small")
    return lay


def validate_manifest(m: Any, shader_names: set[str]) -> None:
    """Raise GlcompError for anything in a manifest that does not fit the schema."""
    c = _Check("manifest.json")
    m = c.dict(m, "manifest")
    c.need(m.get("format") == FORMAT, f"format must be {FORMAT!r}, got {m.get('format')!r}")
    c.need(
        m.get("version") in VERSIONS, f"unknown format version {m.get('version')!r} (supported: {VERSIONS})"
    )
    required = {
        "target",
        "inputs",
        "hyper",
        "states",
        "counters",
        "textures",
        "vertex_shader",
        "programs",
        "entries",
        "memory",
    }
    missing = required - set(m)
    c.need(not missing, f"missing fields {sorted(missing)}")
    target = c.dict(m["target"], "target")
    c.need(target.get("glsl_version") in ("300 es", "100"), "target.glsl_version must be '300 es' or '100'")
    max_size = c.int(target.get("max_texture_size"), "target.max_texture_size", 1, MAX_SIDE)

    textures = c.dict(m["textures"], "textures")
    for name, tex in textures.items():
        c.name(name, "texture")
        tex = c.dict(tex, f"textures.{name}")
        for side in ("width", "height"):
            v = c.int(tex.get(side), f"textures.{name}.{side}", 1, max_size)
            c.need(v & (v - 1) == 0, f"textures.{name}.{side} must be a power of two")

    states = c.dict(m["states"], "states")
    for name, st in states.items():
        c.name(name, "state")
        st = c.dict(st, f"states.{name}")
        lay = check_layout(c, st.get("layout"), f"states.{name}.layout")
        sets = st.get("textures")
        c.need(isinstance(sets, list) and len(sets) == 2, f"states.{name}.textures must hold two sets")
        for group in sets:
            c.need(
                isinstance(group, list) and len(group) == lay["pages"],
                f"states.{name}.textures: one texture per page expected",
            )
            for t in group:
                c.need(t in textures, f"states.{name} refers to unknown texture {t!r}")
                c.need(
                    textures[t] == {"width": lay["width"], "height": lay["height"]},
                    f"states.{name}: texture {t!r} has the wrong size",
                )
    for name, spec in c.dict(m["inputs"], "inputs").items():
        c.name(name, "input")
        spec = c.dict(spec, f"inputs.{name}")
        check_layout(c, spec.get("layout"), f"inputs.{name}.layout", spec.get("shape"))
    for name, value in c.dict(m["hyper"], "hyper").items():
        c.name(name, "hyper")
        c.need(isinstance(value, int | float) and math.isfinite(value), f"hyper.{name} must be a number")
    for name, value in c.dict(m["counters"], "counters").items():
        c.name(name, "counter")
        c.int(value, f"counters.{name}", 0)
    c.need(m["vertex_shader"] in shader_names, f"vertex shader {m['vertex_shader']!r} is missing")

    programs = c.dict(m["programs"], "programs")
    for pid, prog in programs.items():
        c.name(pid, "program")
        prog = c.dict(prog, f"programs.{pid}")
        c.need(
            prog.get("fragment") in shader_names,
            f"programs.{pid}: shader {prog.get('fragment')!r} is missing",
        )
        for s in prog.get("samplers", []) + prog.get("uniforms", []):
            c.need(
                isinstance(s, str) and re.match(r"^[a-z][a-z0-9_]{0,40}$", s) is not None,
                f"programs.{pid}: bad uniform name {s!r}",
            )
        c.int(prog.get("outputs"), f"programs.{pid}.outputs", 1, 16)

    state_textures = {t for st in states.values() for group in st["textures"] for t in group}

    def check_ref(ref: Any, field: str) -> tuple[int, int]:
        if isinstance(ref, str):
            c.need(ref in textures, f"{field} refers to unknown texture {ref!r}")
            # Which set of a state is current flips every update: only a state reference says.
            c.need(ref not in state_textures, f"{field} names state texture {ref!r} directly")
            return textures[ref]["width"], textures[ref]["height"]
        ref = c.dict(ref, field)
        c.need(ref.get("state") in states, f"{field} refers to unknown state {ref.get('state')!r}")
        c.need(ref.get("version") in ("cur", "next"), f"{field}.version must be 'cur' or 'next'")
        lay = states[ref["state"]]["layout"]
        c.int(ref.get("page"), f"{field}.page", 0, lay["pages"] - 1)
        return lay["width"], lay["height"]

    entries = c.dict(m["entries"], "entries")
    c.need(set(entries) <= {"predict", "gradients", "train_step"}, f"unknown entry points {sorted(entries)}")
    for entry, e in entries.items():
        e = c.dict(e, f"entries.{entry}")
        for name, refs in c.dict(e.get("inputs"), f"entries.{entry}.inputs").items():
            c.need(name in m["inputs"], f"entries.{entry}: unknown input {name!r}")
            c.need(
                isinstance(refs, list) and len(refs) == m["inputs"][name]["layout"]["pages"],
                f"entries.{entry}.inputs.{name}: one texture per page expected",
            )
            lay = m["inputs"][name]["layout"]
            for r in refs:
                size = check_ref(r, f"entries.{entry}.inputs.{name}")
                want = (lay["width"], lay["height"])
                c.need(size == want, f"entries.{entry}.inputs.{name}: a texture's size is not {want}")
        for name, out in c.dict(e.get("outputs"), f"entries.{entry}.outputs").items():
            c.name(name.replace(":", "_"), f"entries.{entry}.outputs")
            out = c.dict(out, f"entries.{entry}.outputs.{name}")
            lay = check_layout(c, out.get("layout"), f"entries.{entry}.outputs.{name}.layout")
            c.need(
                isinstance(out.get("textures"), list) and len(out["textures"]) == lay["pages"],
                f"entries.{entry}.outputs.{name}: one texture per page expected",
            )
            for r in out["textures"]:
                size = check_ref(r, f"entries.{entry}.outputs.{name}")
                want = (lay["width"], lay["height"])
                c.need(size == want, f"entries.{entry}.outputs.{name}: a texture's size is not {want}")
        for name in e.get("updates", []):
            c.need(name in states, f"entries.{entry}.updates: unknown state {name!r}")
        draws = e.get("draws")
        c.need(isinstance(draws, list), f"entries.{entry}.draws must be a list")
        for i, d in enumerate(draws):
            field = f"entries.{entry}.draws[{i}]"
            d = c.dict(d, field)
            prog = programs.get(d.get("program"))
            c.need(prog is not None, f"{field} refers to unknown program {d.get('program')!r}")
            samplers = c.dict(d.get("samplers"), f"{field}.samplers")
            c.need(
                sorted(samplers) == sorted(prog["samplers"]), f"{field}: samplers do not match the program"
            )
            for s, r in samplers.items():
                check_ref(r, f"{field}.samplers.{s}")
            uniforms = c.dict(d.get("uniforms"), f"{field}.uniforms")
            c.need(
                sorted(uniforms) == sorted(prog["uniforms"]), f"{field}: uniforms do not match the program"
            )
            for u, src in uniforms.items():
                c.need(
                    isinstance(src, dict) and src.get("hyper") in m["hyper"],
                    f"{field}.uniforms.{u} must name a hyper-parameter",
                )
            targets = d.get("targets")
            c.need(
                isinstance(targets, list) and len(targets) == prog["outputs"],
                f"{field}: one target per program output expected",
            )
            sizes = {check_ref(r, f"{field}.targets") for r in targets}
            vp = d.get("viewport")
            c.need(
                isinstance(vp, list) and len(vp) == 2 and all(isinstance(v, int) for v in vp),
                f"{field}.viewport must be [width, height]",
            )
            c.need(sizes == {tuple(vp)}, f"{field}: render targets must all match the viewport size")
            read = {json.dumps(r, sort_keys=True) for r in samplers.values()}
            c.need(
                not read & {json.dumps(r, sort_keys=True) for r in targets},
                f"{field} samples a texture it renders to",
            )
            c.int(d.get("page_offset"), f"{field}.page_offset", 0)
            c.need(d.get("blend", False) in (True, False), f"{field}.blend must be a boolean")


def read_bundle(directory: Path) -> Any:
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from glcomp.codegen.bundle import Bundle

    if not directory.is_dir():
        raise GlcompError(f"bundle {directory}: not a directory")
    for f in FILES:
        if not (directory / f).is_file():
            raise GlcompError(f"bundle {directory}: {f} is missing")
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise GlcompError(f"bundle manifest.json: not valid JSON ({err})") from None
    names: set[str] = set()
    if isinstance(manifest, dict):
        wanted = [manifest.get("vertex_shader")]
        wanted += [
            p.get("fragment") for p in (manifest.get("programs") or {}).values() if isinstance(p, dict)
        ]
        for name in wanted:
            if not isinstance(name, str) or not _SHADER.match(name):
                raise GlcompError(f"bundle manifest.json: shader name {name!r} is not a plain file name")
            if (directory / "shaders" / name).is_symlink():
                raise GlcompError(f"bundle manifest.json: shader {name!r} is a symbolic link")
            path = (directory / "shaders" / name).resolve()
            if directory.resolve() not in path.parents:
                raise GlcompError(f"bundle manifest.json: shader {name!r} lies outside the bundle")
            if path.is_file() and not (directory / "shaders" / name).is_symlink():
                names.add(name)
    validate_manifest(manifest, names)
    shaders = {n: (directory / "shaders" / n).read_text() for n in names}
    try:
        weights = load_file(str(directory / "weights.safetensors"))
    except (SafetensorError, OSError, ValueError) as err:
        raise GlcompError(f"bundle weights.safetensors: unreadable ({err})") from None
    expected = {k: tuple(v["layout"]["shape"]) for k, v in manifest["states"].items()}
    expected |= {k: () for k in manifest["counters"]}
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise GlcompError(f"bundle weights.safetensors: missing {missing}, unexpected {extra}")
    for k, shape in expected.items():
        if tuple(weights[k].shape) != shape:
            raise GlcompError(
                f"bundle weights.safetensors: {k!r} has shape {weights[k].shape}, expected {shape}"
            )
        if not np.all(np.isfinite(weights[k])):
            raise GlcompError(f"bundle weights.safetensors: {k!r} holds NaN or infinite values")
    return Bundle(manifest, shaders, weights)
