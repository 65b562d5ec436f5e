"""The bundle schema: writing a bundle atomically, and reading one back with strict validation.

A bundle is untrusted data. Reading checks the format and version, that every file named lies
inside the bundle directory (no symbolic link inside a bundle is ever followed), that every
texture, program, sampler and state reference resolves, that layouts are self-consistent, that
the weights match the declared state shapes, and (format 2) that every file has the sha256 the
manifest records. Any fault raises GlcompError naming the file and the field at fault.
program.json (the IR graphs) is read here as JSON and checked by `Program.from_bundle`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np

from glcomp.errors import GlcompError

FORMAT = "glcomp-bundle"
VERSIONS = (1, 2)  # 2 adds `files` (sha256 of each file) and program.json
FILES = ("manifest.json", "weights.safetensors")
_NAME = re.compile(r"^[A-Za-z0-9_.#-]{1,200}$")
_SHADER = re.compile(r"^[A-Za-z0-9_]{1,64}\.(frag|vert)$")
MAX_SIDE = 1 << 16


PROGRAM_FILE = "program.json"
BUNDLE_ENTRIES = ("manifest.json", "weights.safetensors", PROGRAM_FILE, "shaders")
_HEX = re.compile(r"^[0-9a-f]{64}$")
_TEMP = re.compile(r"^\.(?P<name>.+)\.(tmp|old)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_ACTIVE: set[str] = set()  # temporaries of saves running in this process
_ACTIVE_LOCK = threading.Lock()


def state_name_ok(name: Any) -> bool:
    """State names (parameters, buffers, optimizer state, counters) are torch names and may hold
    any printable character, spaces, tabs and newlines: they live only in JSON and the weights
    file, never in file paths or GLSL."""
    return (
        isinstance(name, str)
        and 0 < len(name) <= 500
        and all(ch.isprintable() or ch in "\t\n\r" for ch in name)
    )


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_files(bundle: Any) -> dict[str, bytes]:
    """The files of `bundle` as bytes (shaders, weights, program, then the manifest, which
    records the sha256 of every other file under ``files``)."""
    from safetensors.numpy import save

    files: dict[str, bytes] = {}
    for name, source in bundle.shaders.items():
        if not _SHADER.match(name):
            raise GlcompError(f"refusing to write shader with unsafe name {name!r}")
        files[f"shaders/{name}"] = source.encode("utf-8")
    for name in bundle.weights:
        if not state_name_ok(name):
            raise GlcompError(f"refusing to write weight with an unprintable name {name!r}")
    files["weights.safetensors"] = save(
        {k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in bundle.weights.items()}  # keeps 0-d
    )
    if bundle.program is not None:
        # Key order kept: it is the order of graph outputs and of the state.
        files[PROGRAM_FILE] = json.dumps(bundle.program, allow_nan=False).encode("utf-8")
    manifest = dict(bundle.manifest)
    manifest["files"] = {path: sha256(data) for path, data in sorted(files.items())}
    files["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    return files


def is_bundle_dir(path: Path) -> bool:
    """Whether `path` (not followed if a symbolic link) is a directory holding a glcomp manifest."""
    try:
        if path.is_symlink() or not path.is_dir() or (path / "manifest.json").is_symlink():
            return False
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def check_save_target(path: Path) -> None:
    """Refuse to save a bundle anywhere but a new path, an empty directory or a bundle directory,
    and never through a symbolic link."""
    if path.is_symlink():
        raise GlcompError(f"{path} is a symbolic link; refusing to save a bundle through it")
    if not path.exists():
        return
    if not path.is_dir():
        raise GlcompError(f"{path} exists and is not a directory")
    if any(path.iterdir()) and not is_bundle_dir(path):
        raise GlcompError(
            f"{path} is not empty and holds no glcomp bundle; refusing to overwrite it "
            "(choose another output directory)"
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def _clean_stale(parent: Path, name: str) -> None:
    """Remove temporaries of earlier saves to `name` that were interrupted (their process is gone,
    or it is this one and the save is no longer running)."""
    try:
        entries = list(parent.iterdir())
    except OSError:
        return
    for entry in entries:
        found = _TEMP.match(entry.name)
        if not found or found["name"] != name:
            continue
        pid = int(found["pid"])
        with _ACTIVE_LOCK:
            running = str(entry) in _ACTIVE
        if running or (pid != os.getpid() and _pid_alive(pid)):
            continue
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink(missing_ok=True)
        else:
            shutil.rmtree(entry, ignore_errors=True)


def _write_new(directory_fd: int, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(name, flags, 0o644, dir_fd=directory_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Write `files` (relative paths, at most one folder deep) into the fresh directory `root`,
    creating every file exclusively (O_EXCL, no symbolic link followed). The manifest goes last."""
    order = sorted(files, key=lambda p: (p == "manifest.json", p))
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    try:
        os.mkdir("shaders", 0o755, dir_fd=dfd)
        sfd = os.open("shaders", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dfd)
        try:
            for path in order:
                folder, _, base = path.rpartition("/")
                _write_new(sfd if folder else dfd, base, files[path])
            os.fsync(sfd)
        finally:
            os.close(sfd)
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_bundle(bundle: Any, directory: Path) -> Path:
    """Save `bundle` to `directory` atomically.

    Guarantees: the bundle is written into a fresh temporary directory beside `directory` and
    renamed into place (a bundle already there is moved aside, then removed), so a save that
    fails or is interrupted leaves the previous bundle intact and loadable, and a reader never
    sees a mix of two saves (the manifest's sha256 of each file catches any that would). Files in
    the old bundle directory that are not bundle files (say ``data.safetensors``) are copied
    over. Nothing is written through a symbolic link. Temporaries are removed on failure, and
    stale ones of interrupted saves on the next save. Refuses a non-empty non-bundle directory.
    """
    directory = Path(os.path.abspath(directory))
    check_save_target(directory)
    files = bundle_files(bundle)
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    _clean_stale(parent, directory.name)
    pid = os.getpid()
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.tmp-{pid}-", dir=parent))
    with _ACTIVE_LOCK:
        _ACTIVE.add(str(tmp))
    try:
        os.chmod(tmp, 0o755)
        _write_tree(tmp, files)
        if directory.is_dir() and not directory.is_symlink():
            for entry in directory.iterdir():  # the user's files beside the bundle
                if entry.name in BUNDLE_ENTRIES:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.copytree(entry, tmp / entry.name, symlinks=True)
                else:
                    shutil.copy2(entry, tmp / entry.name, follow_symlinks=False)
            shutil.copystat(directory, tmp, follow_symlinks=False)
        _swap_into_place(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.discard(str(tmp))
    return directory


def _swap_into_place(tmp: Path, directory: Path) -> None:
    """Rename `tmp` to `directory`; an existing `directory` is renamed aside first and removed
    once the new one is in place (restored if the rename fails). A concurrent save that wins the
    race is moved aside in turn: the last save to finish wins."""
    for _ in range(100):
        aside = None
        if os.path.lexists(directory):
            check_save_target(directory)
            aside = Path(
                tempfile.mkdtemp(prefix=f".{directory.name}.old-{os.getpid()}-", dir=directory.parent)
            )
            with _ACTIVE_LOCK:
                _ACTIVE.add(str(aside))
            try:
                os.rename(directory, aside / "bundle")
            except FileNotFoundError:  # another save moved it meanwhile
                pass
        try:
            try:
                os.rename(tmp, directory)
            except OSError as err:
                if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    if aside is not None and not os.path.lexists(directory):
                        os.rename(aside / "bundle", directory)  # put the old bundle back
                    raise
                continue  # a concurrent save put its bundle there first
            return
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
                with _ACTIVE_LOCK:
                    _ACTIVE.discard(str(aside))
    raise GlcompError(f"{directory}: could not put the bundle in place (other saves kept replacing it)")


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

    def state_name(self, obj: Any, field: str) -> str:
        self.need(state_name_ok(obj), f"{field} has an invalid name {obj!r}")
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
        c.state_name(name, "state")
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
        c.state_name(name, "counter")
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
            c.state_name(name, f"entries.{entry}.outputs")
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
    if m["version"] >= 2 or "files" in m:
        hashes = c.dict(m.get("files"), "files")
        for path, digest in hashes.items():
            folder, _, base = path.rpartition("/") if isinstance(path, str) else ("", "", "")
            c.need(
                path in ("weights.safetensors", PROGRAM_FILE)
                or (folder == "shaders" and bool(_SHADER.match(base))),
                f"files: unexpected file {path!r}",
            )
            c.need(
                isinstance(digest, str) and bool(_HEX.match(digest)), f"files.{path}: not a sha256 hex digest"
            )
        shaders = {m["vertex_shader"]} | {
            p.get("fragment") for p in m["programs"].values() if isinstance(p, dict)
        }
        for path in ["weights.safetensors"] + [f"shaders/{n}" for n in sorted(shaders, key=str)]:
            c.need(path in hashes, f"files: no sha256 for {path}")


class _Reader:
    """Reads files of one bundle directory through a descriptor opened once, so every file comes
    from the same directory even if a concurrent save renames another into its place; symbolic
    links inside the bundle are refused, never followed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            raise GlcompError(f"bundle {directory}: not a directory") from None
        self.shaders_fd: int | None = None

    def close(self) -> None:
        for fd in (self.shaders_fd, self.fd):
            if fd is not None:
                os.close(fd)

    def _stat(self, name: str, dir_fd: int, what: str, label: str) -> os.stat_result | None:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise GlcompError(f"bundle {what}: unreadable ({err.strerror})") from None
        if stat.S_ISLNK(st.st_mode):
            raise GlcompError(
                f"bundle {what}: {label} is a symbolic link (refused: it could lead outside the bundle)"
            )
        return st

    def shaders_dir(self) -> int | None:
        if self.shaders_fd is None:
            st = self._stat("shaders", self.fd, "shaders/", "the shaders folder")
            if st is None:
                return None
            if not stat.S_ISDIR(st.st_mode):
                raise GlcompError("bundle shaders/ is not a directory")
            flags = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0)
            try:
                self.shaders_fd = os.open("shaders", flags, dir_fd=self.fd)
            except OSError as err:
                raise GlcompError(f"bundle shaders/: unreadable ({err.strerror})") from None
        return self.shaders_fd

    def read(self, path: str) -> bytes | None:
        """The bytes of `path` (``name`` or ``shaders/name``), or None when it does not exist."""
        folder, _, name = path.rpartition("/")
        dir_fd = self.fd if not folder else self.shaders_dir()
        label = f"shader {name!r}" if folder else repr(name)
        if dir_fd is None or self._stat(name, dir_fd, path, label) is None:
            return None
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise GlcompError(f"bundle {path}: unreadable ({err.strerror})") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise GlcompError(f"bundle {path} is not a regular file")
            return f.read()


def read_bundle(directory: Path) -> Any:
    """Read and validate the bundle in `directory`; see the module docstring. Returns a Bundle
    whose manifest no longer holds ``files`` (those hashes describe the files on disk)."""
    reader = _Reader(directory)
    try:
        return _read(reader)
    finally:
        reader.close()


def _read(reader: _Reader) -> Any:
    from safetensors import SafetensorError
    from safetensors.numpy import load

    from glcomp.codegen.bundle import Bundle

    directory = reader.directory
    raw: dict[str, bytes] = {}
    for f in FILES:
        data = reader.read(f)
        if data is None:
            raise GlcompError(f"bundle {directory}: {f} is missing")
        raw[f] = data
    try:
        manifest = json.loads(raw["manifest.json"].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
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
            if name not in names:
                data = reader.read(f"shaders/{name}")
                if data is not None:
                    raw[f"shaders/{name}"] = data
                    names.add(name)
    validate_manifest(manifest, names)
    shaders = {}
    for n in names:
        try:
            shaders[n] = raw[f"shaders/{n}"].decode("utf-8")
        except UnicodeDecodeError:
            raise GlcompError(f"bundle shaders/{n}: not UTF-8 text") from None
    try:
        weights = load(raw["weights.safetensors"])
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
    program = None
    hashes = manifest.pop("files", None)
    if hashes is not None:
        if PROGRAM_FILE in hashes:
            data = reader.read(PROGRAM_FILE)
            if data is None:
                raise GlcompError(f"bundle {directory}: {PROGRAM_FILE} is missing")
            raw[PROGRAM_FILE] = data
        for path, digest in hashes.items():
            if path in raw and sha256(raw[path]) != digest:
                raise GlcompError(
                    f"bundle {path}: its sha256 does not match the one manifest.json records (the "
                    "file was changed, or comes from another save)"
                )
        if PROGRAM_FILE in raw:
            try:
                program = json.loads(raw[PROGRAM_FILE].decode("utf-8"), parse_constant=_no_constant)
            except (UnicodeDecodeError, ValueError) as err:
                raise GlcompError(f"bundle {PROGRAM_FILE}: not valid JSON ({err})") from None
            if not isinstance(program, dict):
                raise GlcompError(f"bundle {PROGRAM_FILE}: must be an object")
    return Bundle(manifest, shaders, weights, program)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
