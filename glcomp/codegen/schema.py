"""The bundle schema: writing a bundle atomically, and reading one back with strict validation.

A bundle is untrusted data. Reading checks the format and version, that every file named lies
inside the bundle directory (no symbolic link inside a bundle is ever followed), that every
texture, program, sampler and state reference resolves, that layouts are self-consistent, that
the weights match the declared state shapes and dtypes, and (format 2 on) that every file has the
sha256 the manifest records. Format 3 keeps every shader in one file, shaders.json (an object of
shader file name -> GLSL source); formats 1 and 2, still read, have one file each under shaders/.
Format 4, which saves write, is format 3 with every file but manifest.json stored under a name
carrying its sha256 (weights.0123456789abcdef.safetensors: glcomp.format.stored_name), so that a
save switches the bundle by replacing manifest.json alone (see "saving" below, docs/saving.md).
It bounds what a bundle may ask of the GPU before anything is allocated: the textures' total size
(a budget, 2 GiB by default), no texture unused, and every shader loop of the compiler's
constant-bounded form, with the iterations per draw within a budget. Any fault raises GlcompError
naming the file and the field at fault, and nothing else (JSON nesting, sizes and counts are
bounded too). glcomp.js's loader accepts and rejects the same bundles. The manifest itself is
validated by glcomp.format (its JSON Schema and cross-checks), whose names this module re-exports.
program.json (the IR graphs) is read here as JSON and checked by `Program.from_bundle`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import numbers
import os
import re
import secrets
import stat
import time
from bisect import bisect_left
from collections.abc import Iterator
from itertools import accumulate
from pathlib import Path
from typing import Any

try:
    import fcntl
except ImportError:  # no flock (Windows): saves and loads work, without their locks
    fcntl = None  # type: ignore[assignment]

import numpy as np

from glcomp.errors import GlcompError
from glcomp.format.jsonschema import short as _short
from glcomp.format.jsonschema import state_name_ok
from glcomp.format.manifest import (  # noqa: F401  (the format's names, as this module always offered them)
    DEFAULT_ENTRY_BUDGET,
    DEFAULT_LOOP_BUDGET,
    DEFAULT_TEXTURE_BUDGET,
    FORMAT,
    PROGRAM_FILE,
    SHADERS_FILE,
    TEXEL_BYTES,
    VERSIONS,
    WEIGHTS_FILE,
    packed_shaders,
    shader_path,
    stored_name,
    texel_bytes,
    texture_bytes,
    texture_format,
    validate_manifest,
)

FILES = ("manifest.json", "weights.safetensors")
_SHADER = re.compile(r"[A-Za-z0-9_]{1,64}\.(frag|vert)")


# -- saving ------------------------------------------------------------------------------------------
# A save never renames, replaces or re-creates the bundle directory, writes nothing outside it and
# touches no file in it but the bundle's own, so user files beside the bundle (their hard links,
# owners and modes) stay as they are, and a directory that is a mount point, or a writable
# directory in a read-only parent, saves like any other. Format 4 stores every file but
# manifest.json under a name carrying its sha256 (glcomp.format.stored_name): a save writes its
# files under those fresh names (first into a staging folder inside the bundle directory, then
# renamed beside the old ones) and then replaces manifest.json with one os.replace, which switches
# the bundle from the old save to the new. A reader, and a save killed at any point, sees the old
# bundle or the new one and never a mix (the manifest's sha256s tie its files together). Files of
# earlier saves are removed only once no reader holds the manifest that named them: readers lock
# it (shared) while they open its files, and the save locks it (exclusive) before removing them.
# Saves to one directory are serialized by an exclusive lock on LOCK_FILE.
LOCK_FILE = ".glcomp.lock"
STAGING_PREFIX = ".glcomp-save-"
_STAGING = re.compile(r"^\.glcomp-save-\d+-[0-9a-f]{12}$")
# The stored names of format 4 (glcomp.format.stored_name): a save removes such files when the
# manifest it writes does not name them.
_STORED = re.compile(r"^(?:weights\.[0-9a-f]{16}\.safetensors|(?:shaders|program)\.[0-9a-f]{16}\.json)$")
# What a save of glcomp before format 4 left when it was killed between its two renames: the old
# bundle, moved aside to .NAME.old-PID-x/bundle (put back by recover_legacy, never deleted).
_LEGACY_ASIDE = re.compile(r"^\.(?P<name>.+)\.old-(?P<pid>\d+)-[A-Za-z0-9_]+$")
LOCK_TIMEOUT = 600.0  # seconds a save waits for another save to the same directory to finish
RETIRE_TIMEOUT = 2.0  # seconds a save waits for readers of the manifest it replaced
READ_ATTEMPTS = 20  # reads of a bundle whose manifest a save replaced meanwhile
_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO named like a bundle file is never waited on


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_files(bundle: Any, version: int = 3) -> dict[str, bytes]:
    """The files of `bundle` as bytes, stored name -> bytes, in format `version` (3 or 4; its
    manifest's ``version`` is set to it): shaders.json (every shader, keys sorted), weights,
    program, then the manifest, which records the sha256 of every other file under ``files``
    (keyed by weights.safetensors, shaders.json, program.json). Format 3 stores them under those
    names, format 4 under names carrying the sha256 (glcomp.format.stored_name), which is what
    `write_bundle` writes. Bundle directories hold no sub-folder."""
    from safetensors.numpy import save

    if version not in (3, 4):
        raise GlcompError(f"bundle_files: format version {version!r} is not written (3 or 4)")
    files: dict[str, bytes] = {}
    for name, source in bundle.shaders.items():
        if not _SHADER.fullmatch(name):
            raise GlcompError(f"refusing to write shader with unsafe name {name!r}")
        if not isinstance(source, str) or not _unicode_ok(source):
            raise GlcompError(f"refusing to write shader {name!r}: its source is not Unicode text")
    files[SHADERS_FILE] = json.dumps(
        dict(sorted(bundle.shaders.items())), indent=1, ensure_ascii=False
    ).encode("utf-8")
    for name, value in bundle.weights.items():
        if not state_name_ok(name):
            raise GlcompError(f"refusing to write weight with an unprintable name {name!r}")
        # What glcomp.load refuses is never saved (a bundle saved over would be lost for it).
        with np.errstate(over="ignore"):  # a float64 beyond float32's range is infinite there
            unloadable = np.asarray(value).dtype.kind == "f" and not np.all(
                np.isfinite(np.asarray(value, np.float32))
            )
        if unloadable:
            raise GlcompError(
                f"refusing to save: the state {name!r} holds NaN or infinite values (training diverged?), "
                "which glcomp.load refuses; restore a good state with load_state_dict first"
            )
    hyper = bundle.manifest.get("hyper", {})
    if (
        not all(isinstance(v, numbers.Real) and math.isfinite(v) for v in hyper.values())
        or hyper.get("lr", 0) < 0
    ):
        raise GlcompError(f"refusing to save: the hyper-parameters {hyper} must be finite (and lr >= 0)")
    files[WEIGHTS_FILE] = save(
        {k: np.ascontiguousarray(v).reshape(np.shape(v)) for k, v in bundle.weights.items()}  # keeps 0-d
    )
    if bundle.program is not None:
        # Key order kept: it is the order of graph outputs and of the state.
        files[PROGRAM_FILE] = json.dumps(bundle.program, allow_nan=False).encode("utf-8")
    manifest = dict(bundle.manifest)
    manifest["version"] = version
    manifest["files"] = {path: sha256(data) for path, data in sorted(files.items())}
    stored = {stored_name(version, path, manifest["files"][path]): data for path, data in files.items()}
    stored["manifest.json"] = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
    return stored  # type: ignore[return-value]


def is_bundle_dir(path: Path) -> bool:
    """Whether `path` (not followed if a symbolic link) is a directory holding a glcomp manifest."""
    try:
        if path.is_symlink() or not path.is_dir() or (path / "manifest.json").is_symlink():
            return False
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def _holds_bundle(path: Path) -> bool:
    """Whether the directory `path` holds a glcomp manifest (a regular file, not followed); an
    error reading it is raised (an OSError), not taken for "no bundle"."""
    try:
        st = os.lstat(path / "manifest.json")
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_JSON_BYTES:
        return False
    fd = os.open(path / "manifest.json", os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC)
    try:
        data = _read_all(fd, MAX_JSON_BYTES)
    finally:
        _close_quiet(fd)
    try:
        manifest = json.loads(data)
    except (ValueError, RecursionError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def _unfinished_first_save(path: Path) -> bool:
    """Whether the directory `path` holds only what a first save to it that did not finish leaves
    (the lock file, a staging folder, stored files no manifest names yet)."""
    try:
        return all(
            e.name == LOCK_FILE or _STAGING.match(e.name) or _STORED.match(e.name) for e in path.iterdir()
        )
    except OSError:
        return False


def check_save_target(path: Path) -> None:
    """Refuse to save a bundle anywhere but a new path, an empty directory or a bundle directory,
    and never through a symbolic link."""
    if path.is_symlink():
        raise GlcompError(f"{path} is a symbolic link; refusing to save a bundle through it")
    if not path.exists():
        return
    if not path.is_dir():
        raise GlcompError(f"{path} exists and is not a directory")
    if any(path.iterdir()) and not _holds_bundle(path) and not _unfinished_first_save(path):
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


def recover_legacy(parent: Path, name: str) -> bool:
    """Put back the bundle NAME that a save of glcomp before format 4 moved aside (to
    ``.NAME.old-PID-x/bundle``, with the user's files in it) when it was killed before renaming
    the new bundle in. Only when nothing is at NAME and the saving process is gone; nothing is
    ever deleted (but the ``.NAME.old-PID-x`` folder once empty: any ``.NAME.tmp-PID-x`` folder
    of such a save, a copy of the new bundle, is left for the user). Returns whether a bundle was
    put back."""
    target = parent / name
    if os.path.lexists(target):
        return False
    try:
        entries = sorted(os.listdir(parent))
    except OSError:
        return False
    for entry in entries:
        found = _LEGACY_ASIDE.match(entry)
        if not found or found["name"] != name:
            continue
        pid = int(found["pid"])
        if pid != os.getpid() and _pid_alive(pid):
            continue  # a save of an older glcomp, still running
        aside = parent / entry / "bundle"
        if (parent / entry).is_symlink() or not is_bundle_dir(aside):
            continue
        try:
            os.rename(aside, target)
        except OSError:
            continue
        try:
            os.rmdir(parent / entry)  # the folder it was in, if that left it empty
        except OSError:
            pass
        _fsync_quiet(parent)
        return True
    return False


def _fsync_quiet(path: Any) -> None:
    """fsync a directory (a path, or an open descriptor) so that renames in it survive a power
    loss; where the filesystem cannot, nothing."""
    try:
        fd = path if isinstance(path, int) else os.open(path, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        if fd is not path:
            _close_quiet(fd)


def _close_quiet(fd: int) -> None:
    """Close a descriptor opened for reading (or a directory's): it is freed whatever close
    reports, and nothing written through it could be lost."""
    try:
        os.close(fd)
    except OSError:
        pass


def _flock(fd: int, op: int, timeout: float) -> bool | None:
    """Take the flock `op` (LOCK_SH or LOCK_EX) on `fd`, waiting at most `timeout` seconds: True
    when taken, None when it was not within `timeout`, False when this filesystem (or platform)
    has no such locks."""
    if fcntl is None:
        return False
    deadline = time.monotonic() + timeout
    pause = 0.0005
    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return None
        except OSError:  # ENOLCK, EOPNOTSUPP, EINVAL: locks not supported here
            return False
        time.sleep(pause)
        pause = min(2 * pause, 0.05)


@contextlib.contextmanager
def _save_lock(dfd: int, directory: Path) -> Iterator[bool]:
    """Hold the exclusive lock of the bundle directory `dfd` (on LOCK_FILE, created if needed and
    never removed) while a save runs; yields whether locks work there (where they do not, a save
    removes no file of an earlier save, which a concurrent save might be reusing)."""
    flags = os.O_CREAT | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK
    try:
        fd = os.open(LOCK_FILE, os.O_RDWR | flags, 0o644, dir_fd=dfd)
    except PermissionError:  # another user's lock file: a read-only descriptor can lock it too
        fd = os.open(LOCK_FILE, os.O_RDONLY | flags, dir_fd=dfd)
    # A file object, so that the descriptor (and the lock) goes with it even where an interrupt
    # comes before the close: a lock left held would stop every later save in this process.
    with os.fdopen(fd, "rb", buffering=0) as lock:
        if not stat.S_ISREG(os.fstat(lock.fileno()).st_mode):
            raise GlcompError(f"{directory / LOCK_FILE} is not a regular file; refusing to save there")
        locked = _flock(lock.fileno(), fcntl.LOCK_EX if fcntl else 0, LOCK_TIMEOUT)
        if locked is None:
            raise GlcompError(
                f"{directory}: another save to this directory has held {LOCK_FILE} for "
                f"{LOCK_TIMEOUT:.0f} s; not saving"
            )
        yield locked  # closing the file releases the lock


class _Replaced:
    """The manifest.json a save replaces, held open from before the switch, so that the save can
    wait for its readers before it removes the files it names."""

    def __init__(self, dfd: int) -> None:
        self.fd: int | None = None
        self.stat: os.stat_result | None = None
        self.manifest: Any = None
        try:
            fd = os.open("manifest.json", os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=dfd)
        except (FileNotFoundError, OSError) as err:
            if isinstance(err, FileNotFoundError) or err.errno in (errno.ELOOP, errno.ENXIO):
                return  # none yet, or not a file (check_save_target refused that already)
            raise
        self.fd = fd
        self.stat = os.fstat(fd)
        if not stat.S_ISREG(self.stat.st_mode) or self.stat.st_size > MAX_JSON_BYTES:
            return
        try:
            self.manifest = json.loads(_read_all(fd, MAX_JSON_BYTES))
        except (ValueError, RecursionError):
            self.manifest = None

    def mode_owner(self) -> tuple[int | None, tuple[int, int] | None]:
        """The permission bits and owner new bundle files take: those of the manifest replaced
        (its owner where this process may give files away: the group always if it is one of
        ours, the user as root), else the defaults (0o644 less the umask, this process's)."""
        if self.stat is None or not stat.S_ISREG(self.stat.st_mode):
            return None, None
        uid = self.stat.st_uid if os.geteuid() == 0 else -1
        return stat.S_IMODE(self.stat.st_mode) & 0o777, (uid, self.stat.st_gid)

    def close(self) -> None:
        if self.fd is not None:
            _close_quiet(self.fd)
            self.fd = None


def _read_all(fd: int, limit: int) -> bytes:
    chunks = []
    size = 0
    while size <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _write_new(
    directory_fd: int, name: str, data: bytes, mode: int | None = None, owner: Any = None
) -> tuple[int, int]:
    """Create the file `name` in `directory_fd` exclusively (O_EXCL, no symbolic link followed)
    holding `data`, with `mode` and `owner` where given, and fsync it. Returns its (st_dev,
    st_ino)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC
    fd = os.open(name, flags, 0o644, dir_fd=directory_fd)
    try:
        st = os.fstat(fd)
        if mode is not None:
            os.fchmod(fd, mode)
        if owner is not None:
            try:
                os.fchown(fd, *owner)
            except OSError:
                pass  # not ours to give away: the file stays this process's
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def _holds(directory_fd: int, name: str, data: bytes) -> bool:
    """Whether the regular file `name` in `directory_fd` holds exactly `data` (a file of an
    earlier save, stored under the name of these very bytes, is kept rather than written again)."""
    try:
        st = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size != len(data):
            return False
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=directory_fd)
    except OSError:
        return False
    try:
        return _read_all(fd, len(data)) == data
    except OSError:
        return False
    finally:
        _close_quiet(fd)


def _unlink_file(name: str, directory_fd: int) -> None:
    """Remove `name` from `directory_fd` if it is a regular file (nothing else is ever removed)."""
    try:
        if stat.S_ISREG(os.stat(name, dir_fd=directory_fd, follow_symlinks=False).st_mode):
            os.unlink(name, dir_fd=directory_fd)
    except OSError:
        pass


def _remove_staging(dfd: int, name: str, created: Any = None) -> None:
    """Remove the staging folder `name` of a save (this one, or one killed earlier: the caller
    holds the directory's lock): the files a save puts there (`created`, or any manifest.json and
    stored name), then the folder if that left it empty. Errors leave it for the next save."""
    try:
        sfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dfd)
    except OSError:
        return
    try:
        for entry in created if created is not None else os.listdir(sfd):
            if entry == "manifest.json" or _STORED.match(entry):
                _unlink_file(entry, sfd)
    except OSError:
        pass
    finally:
        _close_quiet(sfd)
    try:
        os.rmdir(name, dir_fd=dfd)
    except OSError:
        pass


def _collect(dfd: int, keep: set[str], replaced: _Replaced) -> None:
    """Remove the files of earlier saves from the bundle directory `dfd`: stored files (format 4
    names) that the new manifest does not name, and the files of a format 1-3 bundle that the
    save replaced (those its manifest names, where they still hold the bytes it records). First
    waits for the readers of the replaced manifest to have opened its files (at most
    RETIRE_TIMEOUT; after that everything is left for the next save). Errors leave files, never
    fail the save: the new bundle is in place already."""
    if replaced.fd is not None and fcntl is not None:
        if _flock(replaced.fd, fcntl.LOCK_EX, RETIRE_TIMEOUT) is None:
            return
    try:
        entries = os.listdir(dfd)
    except OSError:
        return
    for entry in entries:
        if entry not in keep and _STORED.match(entry):
            _unlink_file(entry, dfd)
    old = replaced.manifest
    if not isinstance(old, dict) or old.get("format") != FORMAT or old.get("version") not in (1, 2, 3):
        return
    hashes = old.get("files") if isinstance(old.get("files"), dict) else {}
    if old["version"] == 1:  # no hashes: the files it names are the bundle's
        programs = old.get("programs") if isinstance(old.get("programs"), dict) else {}
        names = [old.get("vertex_shader")] + [
            p.get("fragment") for p in programs.values() if isinstance(p, dict)
        ]
        hashes = {WEIGHTS_FILE: None} | {f"shaders/{n}": None for n in names if isinstance(n, str)}
    shaders_fd = None
    try:
        for path, digest in hashes.items():
            folder, _, name = path.rpartition("/")
            if folder == "shaders" and _SHADER.fullmatch(name):
                if shaders_fd is None:
                    flags = os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
                    shaders_fd = os.open("shaders", flags, dir_fd=dfd)
                where = shaders_fd
            elif not folder and name in (WEIGHTS_FILE, SHADERS_FILE, PROGRAM_FILE):
                where = dfd
            else:
                continue
            if digest is None or _digest_of(where, name) == digest:
                _unlink_file(name, where)
    except OSError:
        pass
    finally:
        if shaders_fd is not None:
            _close_quiet(shaders_fd)
            try:
                os.rmdir("shaders", dir_fd=dfd)  # only if nothing else is in it
            except OSError:
                pass


def _digest_of(directory_fd: int, name: str) -> str | None:
    try:
        fd = os.open(name, os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC, dir_fd=directory_fd)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        h = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None
    finally:
        _close_quiet(fd)


def _save_error(directory: Path, err: OSError, committed: bool) -> GlcompError:
    what = err.strerror or str(err)
    if committed:
        return GlcompError(f"{directory}: the bundle was saved, but then: {what}")
    return GlcompError(f"{directory}: could not save the bundle ({what}); the bundle there is as it was")


def write_bundle(bundle: Any, directory: Path) -> Path:
    """Save `bundle` to `directory` (format 4), atomically and in place.

    Guarantees: the directory itself is never renamed or replaced and nothing outside it is
    written; its files that are not the bundle's (say ``data.safetensors``) are never opened,
    copied or changed. The new files are written under fresh names and fsynced, then
    manifest.json is replaced in one rename, the switch from the old bundle to the new: a save
    that fails or is killed at any point leaves the previous bundle loadable (or the new one,
    once switched), and a reader sees one or the other, never a mix. A fault is a GlcompError
    naming the directory (disk full included). The files of the previous save are removed once
    its readers have opened them; saves to one directory wait for each other (LOCK_FILE).
    Refuses a non-empty non-bundle directory and symbolic links; a bundle of formats 1-3 there
    is replaced (its files removed after the switch)."""
    directory = Path(os.path.abspath(directory))
    committed = [False]
    try:
        check_save_target(directory)
        files = bundle_files(bundle, version=4)
        recover_legacy(directory.parent, directory.name)
        if not os.path.lexists(directory):
            directory.mkdir(parents=True, exist_ok=True)
            _fsync_quiet(directory.parent)
        dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise GlcompError(
                f"{directory} is a symbolic link; refusing to save a bundle through it"
            ) from None
        raise _save_error(directory, err, False) from None
    try:
        with _save_lock(dfd, directory) as locked:
            check_save_target(directory)  # again: another save may have run meanwhile
            _save(dfd, files, locked, committed)
    except OSError as err:
        raise _save_error(directory, err, committed[0]) from None
    finally:
        _close_quiet(dfd)
    return directory


def _save(dfd: int, files: dict[str, bytes], locked: bool, committed: list[bool]) -> None:
    if locked:  # staging folders of saves killed earlier (no save runs but this one)
        for entry in os.listdir(dfd):
            if _STAGING.match(entry):
                _remove_staging(dfd, entry)
    replaced = _Replaced(dfd)
    try:
        mode, owner = replaced.mode_owner()
        staging = f"{STAGING_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        created: list[str] = []  # what may be in the staging folder
        added: list[str] = []  # stored names this save puts in the bundle directory
        switched = None  # the manifest this save wrote: (st_dev, st_ino)
        try:
            os.mkdir(staging, 0o700, dir_fd=dfd)
            sfd = os.open(staging, os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=dfd)
            try:
                for name in sorted(files):
                    if name == "manifest.json" or _holds(dfd, name, files[name]):
                        continue  # a file of an earlier save holds these very bytes: kept
                    if not _exists(dfd, name):
                        added.append(name)
                    created.append(name)
                    _write_new(sfd, name, files[name], mode, owner)
                    os.rename(name, name, src_dir_fd=sfd, dst_dir_fd=dfd)
                os.fsync(dfd)  # the files are in place before a manifest names them
                created.append("manifest.json")
                switched = _write_new(sfd, "manifest.json", files["manifest.json"], mode, owner)
                os.replace("manifest.json", "manifest.json", src_dir_fd=sfd, dst_dir_fd=dfd)  # the switch
            finally:
                _close_quiet(sfd)
        finally:
            # Whether the switch happened is read from the directory (an exception may have come
            # just after the rename): where that cannot be told, nothing this save added is removed.
            state = _is_file(dfd, "manifest.json", switched)
            committed[0] = state is True
            _remove_staging(dfd, staging, created)
            if state is False and locked:
                for name in added:  # no manifest names them: this save's, unfinished
                    _unlink_file(name, dfd)
        _fsync_quiet(dfd)
        if locked:
            _collect(dfd, set(files), replaced)
    finally:
        replaced.close()


def _exists(directory_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _is_file(directory_fd: int, name: str, ident: tuple[int, int] | None) -> bool | None:
    """Whether `name` in `directory_fd` is the file `ident` ((st_dev, st_ino)); None when that
    cannot be told."""
    if ident is None:
        return False
    try:
        st = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    except OSError:
        return None
    return (st.st_dev, st.st_ino) == ident


MAX_DIMS = 32  # of a tensor's shape (numpy's limit)
MAX_JSON_BYTES = 64 << 20  # every JSON file (and a weights file's header)
MAX_PROGRAMS = 4096


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- loops in shaders: every one constant-bounded, with an upper bound of iterations ---------------
_COMMENT = re.compile(r"//[^\n]*|/\*(?:.|\n)*?\*/")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9]+|[^ \t\r\n]")
_TOKEN_SPLIT = re.compile(f"({_TOKEN.pattern})")
# Tokens that act whatever follows them ("(" and ")" count parentheses, and the token before a
# "(" acts too).
_EVENTS = frozenset({"{", "}", "for", "while", "do", "(", ")"})
_FOR = re.compile(
    r"for[ \t\r\n]*\([ \t\r\n]*int[ \t\r\n]+([A-Za-z_][A-Za-z0-9_]*)[ \t\r\n]*=[ \t\r\n]*0[ \t\r\n]*;"
    r"[ \t\r\n]*\1[ \t\r\n]*<[ \t\r\n]*([0-9]{1,9})[ \t\r\n]*;[ \t\r\n]*\1[ \t\r\n]*\+\+[ \t\r\n]*\)"
    r"[ \t\r\n]*\{"
)
_WRITE_AFTER = re.compile(r"[ \t\r\n]*(?:[-+*/%&|^]?=(?!=)|<<=|>>=|\+\+|--)")
_WRITE_BEFORE = re.compile(r"(?:\+\+|--)[ \t\r\n]*$")
_DIRECTIVE = re.compile(
    r"#[ \t]*(?:version[ \t]+(?:100|300[ \t]+es)|extension[ \t]+[A-Za-z0-9_]+[ \t]*:[ \t]*[a-z]+)"
)
_CODE_CHARS = re.compile(r"[ -~\t\r\n]*")
_WRITING_QUALIFIERS = frozenset({"out", "inout"})
MAX_SHADER_CHARS = 1 << 20
MAX_ARRAY_ELEMENTS = 4096  # the integer literals in a shader's brackets, added up
MAX_INLINED_TOKENS = 1 << 18  # of one function with every call inlined (a shader of 1 MiB has ~300k)


def shader_loop_bound(source: str, where: str) -> int:
    """An upper bound of the loop iterations one invocation of `source`'s ``main`` runs.

    Refuses (GlcompError naming `where`) any loop that is not of the constant-bounded form the
    compiler emits, ``for (int v = 0; v < N; v++) {``, or that writes ``v`` in its body; any
    ``while`` or ``do``; any preprocessor directive but ``#version`` and ``#extension``;
    backslashes (line continuations could hide code from this analysis); characters other than
    printable ASCII outside comments; and any call of a function not defined above the caller
    (so no recursion). Nested loops multiply; a call adds the callee's bound times the
    iterations around it. The browser runtime's shaderLoopBound computes the same numbers.

    Calls are inlined by every GLSL compiler, so calls multiply a function's size: a function's
    inlined size is its own tokens (from its "{" to its "}") plus the inlined size of every call
    it makes, and none may exceed MAX_INLINED_TOKENS (functions calling each other twice, 30
    deep, are 2^30 copies: that once took tens of GB to compile). Overloads share a name, and
    which one a call means is not known here: a call counts the costliest overload of its name,
    and every overload must be defined before the first call of its name (an overload defined
    later could be the one called). A loop variable may not be passed to a function with ``out``
    or ``inout`` parameters (which could write it)."""

    def fail(msg: str, pos: int | None = None) -> GlcompError:
        at = "" if pos is None else f"line {text.count(chr(10), 0, pos) + 1}: "
        return GlcompError(f"bundle {where}: {at}{msg}")

    text = source
    if len(source) > MAX_SHADER_CHARS:
        raise fail(f"the shader is longer than {MAX_SHADER_CHARS} characters")
    if "\\" in source:
        raise fail("backslashes (line continuations) are not allowed in shaders")
    text = _COMMENT.sub(lambda mt: re.sub(r"[^\n]", " ", mt[0]), source)
    if "/*" in text:
        raise fail("unterminated comment")
    if not _CODE_CHARS.fullmatch(text):
        raise fail("characters other than printable ASCII outside comments")
    for line in text.split("\n"):
        line = line.strip(" \t\r")
        if line.startswith("#") and not _DIRECTIVE.fullmatch(line.rstrip(" \t")):
            raise fail(f"preprocessor directive {line[:60]!r} is not allowed")
    # Tokens and where each starts: split keeps the tokens at odd indices, the whitespace
    # between them at even ones, so the running sum of lengths gives every start at C speed.
    parts = _TOKEN_SPLIT.split(text)
    toks = parts[1::2]
    ends = list(accumulate(map(len, parts)))
    starts = ends[0::2][: len(toks)]  # token k (parts[2k + 1]) starts after parts[0 .. 2k]
    count = len(toks)
    _check_brackets(toks, starts, fail)
    # Only some tokens do anything below: braces, loop keywords, the token before each "(" and
    # the names of loop variables; the scans visit those alone, in order (every other token
    # leaves every variable as it was).
    marks = [k for k, t in enumerate(toks) if t in _EVENTS]
    loop_vars = {found[1] for k in marks if toks[k] == "for" and (found := _FOR.match(text, starts[k]))}
    events = set(marks)
    events.update(k - 1 for k in marks if toks[k] == "(")
    if loop_vars:
        events.update(k for k, t in enumerate(toks) if t in loop_vars)
        events.update(k for k, t in enumerate(toks) if t in _WRITING_QUALIFIERS)
    events.discard(-1)  # a "(" that opens the shader follows no token
    events = sorted(events)
    # A function's name is the identifier before the "(" that opens its parameters: the last one
    # followed by "(" outside every brace and parenthesis (a call in an array size of a parameter,
    # `int k(int a[abs(2)])`, must not take the name's place).
    defined: set[str] = set()  # functions: NAME ( ... ) { at the top level
    writers: set[str] = set()  # those of them with an out or inout parameter
    depth = paren = 0
    last_name = ""
    writes = False  # an out or inout qualifier in the parameters after last_name
    for i in events:
        tok = toks[i]
        if tok == "{":
            if depth == 0 and i > 0 and toks[i - 1] == ")":
                defined.add(last_name)
                if writes:
                    writers.add(last_name)
            depth += 1
        elif tok == "}":
            depth -= 1
        elif depth == 0 and tok in "()":
            paren += 1 if tok == "(" else -1
        elif depth == 0 and paren > 0 and tok in _WRITING_QUALIFIERS:
            writes = True
        elif depth == 0 and paren == 0 and i + 1 < count and toks[i + 1] == "(":
            if tok[0].isalpha() or tok[0] == "_":
                last_name = tok
                writes = False
    bounds: dict[str, int] = {}
    sizes: dict[str, int] = {}  # inlined size in tokens of each function defined
    called: set[str] = set()  # the functions called so far
    depth = paren = 0
    func: str | None = None
    last_name = ""
    total = 0
    opened = inlined = 0  # the token opening the function being read; its callees' sizes
    calls: list[str | None] = []  # the functions whose parentheses are open (None: no name)
    loops: list[tuple[str, int, int]] = []  # (variable, iterations including this loop's, depth)
    skip_to = 0  # tokens before this one belong to a loop header already read
    for i in events:
        if i < skip_to:
            continue
        tok, pos = toks[i], starts[i]
        mult = loops[-1][1] if loops else 1
        nxt = toks[i + 1] if i + 1 < count else ""
        if tok in ("while", "do"):
            raise fail(f"{tok} loops are not allowed", pos)
        if tok == "for":
            found = _FOR.match(text, pos)
            if func is None or found is None:
                raise fail("a loop not of the form 'for (int v = 0; v < N; v++) {'", pos)
            n = int(found[2])
            total += mult * n
            depth += 1
            loops.append((found[1], mult * n, depth))
            skip_to = bisect_left(starts, found.end(), i)
            continue
        if tok == "{":
            depth += 1
            if depth == 1:
                func = last_name if i > 0 and toks[i - 1] == ")" else None
                if func is not None and func in called:
                    raise fail(
                        f"function {func} is defined after a call of {func} (every overload must come "
                        "before the calls of its name)",
                        pos,
                    )
                total = inlined = 0
                opened = i
                calls.clear()
        elif tok == "}":
            if loops and loops[-1][2] == depth:
                loops.pop()
            depth -= 1
            if depth < 0:
                raise fail("unbalanced braces", pos)
            if depth == 0 and func is not None:
                size = i - opened + 1 + inlined
                if size > MAX_INLINED_TOKENS:
                    raise fail(
                        f"function {func} inlined would hold {size} tokens, more than the "
                        f"{MAX_INLINED_TOKENS} allowed (every call inlines its callee)",
                        pos,
                    )
                # Overloads share a name and a call's overload is not known here: each call of
                # the name counts the costliest (all are defined before the first call).
                bounds[func] = max(total, bounds.get(func, 0))
                sizes[func] = max(size, sizes.get(func, 0))
                func = None
        elif tok in "()":
            if depth == 0:
                paren += 1 if tok == "(" else -1
            elif tok == "(":
                before = toks[i - 1] if i > 0 else ""
                calls.append(before if before[:1].isalpha() or before[:1] == "_" else None)
            elif calls:
                calls.pop()
        elif tok[0].isalpha() or tok[0] == "_":
            if depth == 0 and nxt == "(":
                if paren == 0:
                    last_name = tok
            elif depth > 0 and nxt == "(" and tok in defined:
                if tok not in bounds:
                    raise fail(f"{tok} is called before its definition ends (recursion is not allowed)", pos)
                called.add(tok)
                total += mult * bounds[tok]
                inlined += sizes[tok]
                if inlined > MAX_INLINED_TOKENS:
                    raise fail(
                        f"function {func} inlined would hold more than the {MAX_INLINED_TOKENS} tokens "
                        "allowed (every call inlines its callee)",
                        pos,
                    )
            for var, _, _ in loops:
                if tok == var and (
                    _WRITE_AFTER.match(text, pos + len(tok))
                    or _WRITE_BEFORE.search(text[max(0, pos - 16) : pos])
                ):
                    raise fail(f"the loop variable {var} is written in its loop", pos)
                if tok == var:
                    callee = next((c for c in reversed(calls) if c is not None), None)
                    if callee in writers:
                        raise fail(
                            f"the loop variable {var} is passed to {callee}, which has out or inout "
                            "parameters (it could write it)",
                            pos,
                        )
    if depth != 0:
        raise fail("unbalanced braces")
    return bounds.get("main", 0)


def _check_brackets(toks: list[str], starts: list[int], fail: Any) -> None:
    """Arrays: the compiler declares none (it indexes gl_FragData[N] alone), so a bracket must
    hold one integer literal, and those literals add up to at most MAX_ARRAY_ELEMENTS (an array
    of 2^31 floats once loaded, and ran at 16 GB)."""
    total = 0
    for k in (k for k, t in enumerate(toks) if t == "["):
        size = toks[k + 1] if k + 1 < len(toks) else ""
        if not size.isdigit() or k + 2 >= len(toks) or toks[k + 2] != "]":
            raise fail(
                "a bracket must hold one integer literal, as in gl_FragData[1] (no other arrays)", starts[k]
            )
        total += int(size[:12])
        if total > MAX_ARRAY_ELEMENTS:
            raise fail(f"arrays of more than {MAX_ARRAY_ELEMENTS} elements in all", starts[k])


def check_shaders(manifest: dict[str, Any], shaders: dict[str, str]) -> None:
    """Check every shader's loops (see `shader_loop_bound`) against the validated `manifest`:
    the vertex shader runs no loop, and each program's fragment shader at most the
    ``loop_iterations`` its program declares (per fragment). Errors name a shader as
    `shader_path` does for the manifest's format version."""
    version = manifest["version"]
    vert = manifest["vertex_shader"]
    if shader_loop_bound(shaders[vert], shader_path(version, vert)) != 0:
        raise GlcompError(f"bundle {shader_path(version, vert)}: the vertex shader must not loop")
    for pid, prog in manifest["programs"].items():
        where = shader_path(version, prog["fragment"])
        bound = shader_loop_bound(shaders[prog["fragment"]], where)
        if bound > prog["loop_iterations"]:
            raise GlcompError(
                f"bundle {where}: its loops may run {bound} iterations per fragment, "
                f"more than the {prog['loop_iterations']} manifest.json declares for program {pid}"
            )


class _RetiredError(Exception):
    """manifest.json was being retired by a save (its files about to be removed) as it was read."""


class _Reader:
    """Reads files of one bundle directory through a descriptor opened once; symbolic links
    inside the bundle are refused, never followed. `read_manifest` reads manifest.json and opens
    the weights, shaders.json and program.json it names right away, under a shared lock of the
    manifest (which a save waits for before it removes the files of a manifest it replaced), so
    what is read later comes from the same save whatever saves run meanwhile."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            self.fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | _O_CLOEXEC)
        except OSError:
            raise GlcompError(f"bundle {directory}: not a directory") from None
        self.shaders_fd: int | None = None
        # path (a key of files) -> (descriptor or None when missing, its fault, stored name)
        self.pinned: dict[str, tuple[int | None, GlcompError | None, str]] = {}
        self.manifest_id: tuple[int, int] | None = None

    def close(self) -> None:
        for fd in (self.shaders_fd, self.fd, *(p[0] for p in self.pinned.values())):
            if fd is not None:
                _close_quiet(fd)
        self.pinned = {}
        self.shaders_fd = None

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
            flags = os.O_RDONLY | os.O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC
            try:
                self.shaders_fd = os.open("shaders", flags, dir_fd=self.fd)
            except OSError as err:
                raise GlcompError(f"bundle shaders/: unreadable ({err.strerror})") from None
        return self.shaders_fd

    def _open(self, name: str, dir_fd: int, path: str, label: str) -> int | None:
        """A descriptor of the regular file `name` (`path` in errors), None when missing."""
        if self._stat(name, dir_fd, path, label) is None:
            return None
        flags = os.O_RDONLY | _O_NOFOLLOW | _O_NONBLOCK | _O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            if err.errno == errno.ELOOP:  # replaced by a link since the stat
                raise GlcompError(
                    f"bundle {path}: {label} is a symbolic link (refused: it could lead outside the bundle)"
                ) from None
            raise GlcompError(f"bundle {path}: unreadable ({err.strerror})") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise GlcompError(f"bundle {path} is not a regular file")
        except BaseException:
            _close_quiet(fd)
            raise
        return fd

    def read_manifest(self, parse: Any) -> Any:
        """manifest.json's value (its bytes given to `parse`), having opened the files it names."""
        fd = self._open("manifest.json", self.fd, "manifest.json", "'manifest.json'")
        if fd is None:
            raise GlcompError(f"bundle {self.directory}: manifest.json is missing")
        try:
            st = os.fstat(fd)
            self.manifest_id = (st.st_dev, st.st_ino)
            if fcntl is not None and _flock(fd, fcntl.LOCK_SH, 0.0) is None:
                raise _RetiredError()  # a save replaced it and is removing its files: read the new one
            manifest = parse(self._read_fd(fd, "manifest.json", MAX_JSON_BYTES))
            if isinstance(manifest, dict):
                self._pin(manifest)
        finally:
            _close_quiet(fd)  # and with it the lock
        return manifest

    def _pin(self, manifest: dict[str, Any]) -> None:
        version, files = manifest.get("version"), manifest.get("files")
        files = files if isinstance(files, dict) else {}
        paths = [WEIGHTS_FILE, PROGRAM_FILE] + ([SHADERS_FILE] if packed_shaders(version) else [])
        for path in paths:
            name = stored_name(version, path, files.get(path))
            if name is None:
                continue  # no file can be named: validate_manifest refuses that digest
            try:
                self.pinned[path] = (self._open(name, self.fd, path, repr(name)), None, name)
            except GlcompError as err:  # reported when the file is read, as before pinning
                self.pinned[path] = (None, err, name)

    def resolved(self, path: str) -> bool:
        """Whether the manifest read names a file for `path` (format 4: a valid sha256 for it)."""
        return path in self.pinned

    def label(self, path: str) -> str:
        """`path` as errors name it: with its stored name where that differs (format 4)."""
        name = self.pinned.get(path, (None, None, path))[2]
        return path if name == path else f"{path} ({name})"

    def replaced(self) -> bool:
        """Whether manifest.json is no longer the file this reader read (a save switched it)."""
        if self.manifest_id is None:
            return False
        try:
            st = os.stat("manifest.json", dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) != self.manifest_id

    def _target(self, path: str) -> tuple[int | None, str]:
        folder, _, name = path.rpartition("/")
        return (self.fd if not folder else self.shaders_dir()), name

    def size(self, path: str) -> int | None:
        """The size in bytes of the regular file `path`, or None when it does not exist."""
        if path in self.pinned:
            fd, err, _ = self.pinned[path]
            if err is not None:
                raise err
            return None if fd is None else os.fstat(fd).st_size
        dir_fd, name = self._target(path)
        label = f"shader {name!r}" if "/" in path else repr(name)
        st = None if dir_fd is None else self._stat(name, dir_fd, path, label)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise GlcompError(f"bundle {path} is not a regular file")
        return st.st_size

    def read(self, path: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
        """The bytes of `path` (``name`` or ``shaders/name``), or None when it does not exist;
        a file larger than `limit` bytes is refused before it is read (its size from fstat)."""
        if path in self.pinned:
            fd, err, _ = self.pinned[path]
            if err is not None:
                raise err
            if fd is None:
                return None
            os.lseek(fd, 0, os.SEEK_SET)
            return self._read_fd(fd, path, limit)
        if self.size(path) is None:
            return None
        dir_fd, name = self._target(path)
        label = f"shader {name!r}" if "/" in path else repr(name)
        fd = None if dir_fd is None else self._open(name, dir_fd, path, label)
        if fd is None:
            return None
        try:
            return self._read_fd(fd, path, limit)
        finally:
            _close_quiet(fd)

    def _read_fd(self, fd: int, path: str, limit: int) -> bytes:
        try:
            if os.fstat(fd).st_size > limit:
                raise GlcompError(f"bundle {path}: larger than {limit} bytes")
            data = _read_all(fd, limit)  # the file may have grown since
        except OSError as err:
            raise GlcompError(f"bundle {path}: unreadable ({err.strerror})") from None
        if len(data) > limit:
            raise GlcompError(f"bundle {path}: larger than {limit} bytes")
        return data


MAX_JSON_DEPTH = 64
# The nesting pre-scan: escapes (a backslash and the character after it) removed first, then
# strings, so no pattern repeats a group (that took ~124 bytes of memory per byte of one long
# string); the brackets left give the depth. glcomp.js scans the same way.
_JSON_ESCAPE = re.compile(r"\\.", re.DOTALL)
_JSON_STRING = re.compile(r'"[^"]*"')
_JSON_BRACKET = re.compile(r"[\[\]{}]")
# Weights dtypes the runtimes take: float states, integer counters (as the browser runtime).
STATE_DTYPES = {"F32": "<f4", "F64": "<f8"}
COUNTER_DTYPES = {"I32": "<i4", "I64": "<i8"}
_DTYPE_SIZES = {"F32": 4, "F64": 8, "I32": 4, "I64": 8}


def _json_number(text: str) -> Any:
    """JSON numbers as the browser reads them: one kind of number, so 2.0 is the integer 2, and
    numbers too large for a double are infinite."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _json_int(text: str) -> Any:
    return int(text) if len(text) <= 300 else float(text)


def parse_json(data: bytes, where: str, browser_numbers: bool = True) -> Any:
    """Parse untrusted JSON bytes as the browser runtime does (UTF-8, no NaN/Infinity literals,
    integral numbers are integers), refusing more than MAX_JSON_BYTES or MAX_JSON_DEPTH levels of
    nesting; any fault is a GlcompError naming `where`. ``browser_numbers=False`` keeps Python's
    reading of numbers (2.0 a float), for files only Python reads (program.json)."""
    if len(data) > MAX_JSON_BYTES:
        raise GlcompError(f"bundle {where}: larger than {MAX_JSON_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise GlcompError(f"bundle {where}: not valid JSON ({err})") from None
    depth = 0
    bare = _JSON_STRING.sub("", _JSON_ESCAPE.sub("", text))
    for mt in _JSON_BRACKET.finditer(bare):
        token = mt[0]
        if token in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                raise GlcompError(f"bundle {where}: nested deeper than {MAX_JSON_DEPTH} levels")
        elif token in "]}":
            depth -= 1
    try:
        return json.loads(
            text,
            parse_float=_json_number if browser_numbers else float,
            parse_int=_json_int,
            parse_constant=_no_constant,
        )
    except (ValueError, RecursionError) as err:
        raise GlcompError(f"bundle {where}: not valid JSON ({err})") from None


def parse_safetensors(data: bytes, where: str = "weights.safetensors") -> dict[str, np.ndarray]:
    """Parse a safetensors file strictly, exactly as the browser runtime's parseSafetensors: a
    header of at most MAX_JSON_BYTES, dtypes F32, F64, I32 or I64 only, shapes of sizes,
    offsets inside the file that neither overlap nor leave gaps. GlcompError naming `where`
    (and the tensor) otherwise. The arrays returned are copies, little-endian."""

    def fail(msg: str) -> GlcompError:
        return GlcompError(f"bundle {where}: unreadable ({msg})")

    if len(data) < 8:
        raise fail("file shorter than its 8-byte header length")
    length = int.from_bytes(data[:8], "little")
    if length > len(data) - 8 or length > 100_000_000:
        raise fail(f"header length {length} exceeds the file size {len(data)}")
    header = parse_json(data[8 : 8 + length], f"{where} header")
    if not isinstance(header, dict):
        raise fail("header is not a JSON object")
    start = 8 + length
    size = len(data) - start
    spans = []
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise fail("bad __metadata__")
            continue
        if not isinstance(info, dict):
            raise fail(f"entry {name!r} is not an object")
        dtype = info.get("dtype")
        if not isinstance(dtype, str) or dtype not in _DTYPE_SIZES:
            raise fail(
                f"tensor {name!r} has unsupported dtype {_short(dtype)} (F32, F64, I32 or I64 expected)"
            )
        shape, offs = info.get("shape"), info.get("data_offsets")
        if (
            not isinstance(shape, list)
            or len(shape) > MAX_DIMS
            or not all(_is_int(s) and s >= 0 for s in shape)
        ):
            raise fail(f"tensor {name!r} has a bad shape")
        if (
            not isinstance(offs, list)
            or len(offs) != 2
            or not all(_is_int(o) and o >= 0 for o in offs)
            or offs[1] < offs[0]
            or offs[1] > size
        ):
            raise fail(f"tensor {name!r} has data offsets outside the file")
        n = math.prod(shape)
        if offs[1] - offs[0] != n * _DTYPE_SIZES[dtype]:
            raise fail(f"tensor {name!r}: {offs[1] - offs[0]} bytes for shape {tuple(shape)}")
        spans.append((offs[0], offs[1]))
        np_dtype = {**STATE_DTYPES, **COUNTER_DTYPES}[dtype]
        try:
            out[name] = np.frombuffer(data, np_dtype, n, start + offs[0]).reshape(shape).copy()
        except (ValueError, OverflowError) as err:
            raise fail(f"tensor {name!r}: {err}") from None
    end = 0
    for b, e in sorted(spans):
        if b != end:
            raise fail("tensor data overlaps or leaves gaps")
        end = e
    if end != size:
        raise fail("the file holds bytes no tensor covers")
    return out


def read_bundle(
    directory: Path,
    *,
    texture_budget_bytes: int = DEFAULT_TEXTURE_BUDGET,
    loop_budget: int = DEFAULT_LOOP_BUDGET,
    entry_budget: int = DEFAULT_ENTRY_BUDGET,
) -> Any:
    """Read and validate the bundle in `directory`; see the module docstring. Returns a Bundle
    whose manifest no longer holds ``files`` (those hashes describe the files on disk).

    Guarantees: any fault in the files (whatever they hold) raises GlcompError naming the file,
    and nothing else; the textures declared fit `texture_budget_bytes` and each draw's loop
    iterations `loop_budget`, each entry's draws together `entry_budget` (see `validate_manifest`
    and `check_shaders`); no file is read whole before its size is known to be within bounds.
    During saves to `directory` it returns the bundle of one save, whole: a read whose manifest
    a save replaced meanwhile (and whose files it removed) is read again, from the new one."""
    directory = Path(directory)
    if not os.path.lexists(directory) and directory.name:
        recover_legacy(Path(os.path.abspath(directory)).parent, directory.name)  # an old save killed midway
    for attempt in range(READ_ATTEMPTS + 1):
        reader = _Reader(directory)
        try:
            return _read(reader, texture_budget_bytes, loop_budget, entry_budget)
        except _RetiredError:
            if attempt == READ_ATTEMPTS:
                raise GlcompError(
                    f"bundle {directory}: manifest.json was replaced by a save {attempt + 1} times while "
                    "it was read"
                ) from None
        except GlcompError:
            if attempt == READ_ATTEMPTS or not reader.replaced():
                raise
        finally:
            reader.close()
        time.sleep(min(0.0005 * 2**attempt, 0.05))
    raise AssertionError("unreachable")


def weights_limit(manifest: dict[str, Any]) -> int:
    """The most bytes the weights file of the validated `manifest` may hold: its header's
    length and header, and 8 bytes (F64, I64) for every element of every state and counter."""
    elements = sum(math.prod(v["layout"]["shape"]) for v in manifest["states"].values())
    return 8 + MAX_JSON_BYTES + 8 * (elements + len(manifest["counters"]))


def _read(reader: _Reader, texture_budget_bytes: int, loop_budget: int, entry_budget: int) -> Any:
    from glcomp.codegen.bundle import Bundle

    directory = reader.directory
    raw: dict[str, bytes] = {}
    manifest = reader.read_manifest(lambda data: parse_json(data, "manifest.json"))
    # The weights must exist; they are read once the manifest bounds their size.
    if not isinstance(manifest, dict) or reader.resolved(WEIGHTS_FILE):
        if reader.size(WEIGHTS_FILE) is None:
            raise GlcompError(f"bundle {directory}: {reader.label(WEIGHTS_FILE)} is missing")
    names: set[str] = set()
    if isinstance(manifest, dict):
        programs = manifest.get("programs")
        wanted = [manifest.get("vertex_shader")]
        wanted += [
            p.get("fragment")
            for p in (programs.values() if isinstance(programs, dict) else ())
            if isinstance(p, dict)
        ]
        if len(wanted) > MAX_PROGRAMS + 1:
            raise GlcompError(f"bundle manifest.json: more than {MAX_PROGRAMS} programs")
        for name in wanted:
            if not isinstance(name, str) or not _SHADER.fullmatch(name):
                raise GlcompError(
                    f"bundle manifest.json: shader name {_short(name)} is not a plain file name"
                )
        if packed_shaders(manifest.get("version")):
            if reader.resolved(SHADERS_FILE):  # else the manifest is refused for its digest
                data = reader.read(SHADERS_FILE)
                if data is None:
                    raise GlcompError(f"bundle {directory}: {reader.label(SHADERS_FILE)} is missing")
                raw[SHADERS_FILE] = data
            names = set(wanted)  # shaders.json is judged once the manifest is known to be valid
        else:
            for name in dict.fromkeys(wanted):
                data = reader.read(f"shaders/{name}")
                if data is not None:
                    raw[f"shaders/{name}"] = data
                    names.add(name)
    validate_manifest(
        manifest,
        names,
        texture_budget_bytes=texture_budget_bytes,
        loop_budget=loop_budget,
        entry_budget=entry_budget,
    )
    if packed_shaders(manifest["version"]):
        if SHADERS_FILE not in raw:
            raise GlcompError(f"bundle {directory}: {reader.label(SHADERS_FILE)} is missing")
        vertex = [manifest["vertex_shader"]]
        shaders = unpack_shaders(
            raw[SHADERS_FILE], vertex + [p["fragment"] for p in manifest["programs"].values()]
        )
    else:
        shaders = {}
        for n in names:
            try:
                shaders[n] = raw[f"shaders/{n}"].decode("utf-8")
            except UnicodeDecodeError:
                raise GlcompError(f"bundle shaders/{n}: not UTF-8 text") from None
    check_shaders(manifest, shaders)
    data = reader.read(WEIGHTS_FILE, weights_limit(manifest))
    if data is None:
        raise GlcompError(f"bundle {directory}: {reader.label(WEIGHTS_FILE)} is missing")
    raw["weights.safetensors"] = data
    weights = parse_safetensors(data)
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
        kind, allowed = ("counter", COUNTER_DTYPES) if k in manifest["counters"] else ("state", STATE_DTYPES)
        if weights[k].dtype.str not in allowed.values():
            raise GlcompError(
                f"bundle weights.safetensors: tensor {k!r} is {weights[k].dtype}; a {kind} must be "
                f"{' or '.join(allowed)}"
            )
        if not np.all(np.isfinite(weights[k])):
            raise GlcompError(f"bundle weights.safetensors: {k!r} holds NaN or infinite values")
        with np.errstate(over="ignore"):
            beyond = kind == "state" and not np.all(np.isfinite(weights[k].astype(np.float32)))
        if beyond:
            # the runtimes compute in float32: a float64 beyond its range would be infinite there
            raise GlcompError(f"bundle weights.safetensors: {k!r} holds values beyond float32's range")
    manifest["hyper"] = {k: float(v) for k, v in manifest["hyper"].items()}
    program = None
    hashes = manifest.pop("files", None)
    if hashes is not None:
        if PROGRAM_FILE in hashes:
            data = reader.read(PROGRAM_FILE)
            if data is None:
                raise GlcompError(f"bundle {directory}: {reader.label(PROGRAM_FILE)} is missing")
            raw[PROGRAM_FILE] = data
        for path, digest in hashes.items():
            if path in raw and sha256(raw[path]) != digest:
                raise GlcompError(
                    f"bundle {path}: its sha256 does not match the one manifest.json records (the "
                    "file was changed, or comes from another save)"
                )
        if PROGRAM_FILE in raw:
            program = parse_json(raw[PROGRAM_FILE], PROGRAM_FILE, browser_numbers=False)
            if not isinstance(program, dict):
                raise GlcompError(f"bundle {PROGRAM_FILE}: must be an object")
    return Bundle(manifest, shaders, weights, program)


def _unicode_ok(text: str) -> bool:
    """Whether `text` is Unicode text (no lone surrogate, which JSON's \\u escapes can spell)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unpack_shaders(data: bytes, wanted: list[str]) -> dict[str, str]:
    """The shaders of a shaders.json file's bytes (format 3): a JSON object of exactly the shader
    file names `wanted` (the manifest's vertex shader and fragments, already checked to be plain
    file names) -> GLSL source (strings of Unicode text). Any other name, or a name missing, or
    a value not a string: GlcompError naming shaders.json and the shader. The browser runtime's
    unpackShaders refuses the same files with the same messages."""
    packed = parse_json(data, SHADERS_FILE)
    if not isinstance(packed, dict):
        raise GlcompError(f"bundle {SHADERS_FILE}: must be an object of shader file name -> GLSL source")
    known = set(wanted)
    extra = sorted(name for name in packed if name not in known)
    if extra:
        raise GlcompError(
            f"bundle {SHADERS_FILE}: holds shader {_short(extra[0])}, which manifest.json does not name"
        )
    shaders: dict[str, str] = {}
    for name in dict.fromkeys(wanted):
        if name not in packed:
            raise GlcompError(f"bundle {SHADERS_FILE}: shader {name!r} is missing (manifest.json names it)")
        source = packed[name]
        if not isinstance(source, str):
            raise GlcompError(f"bundle {shader_path(3, name)}: must be a string (the shader's GLSL source)")
        if not _unicode_ok(source):
            raise GlcompError(f"bundle {shader_path(3, name)}: not Unicode text (a lone surrogate)")
        shaders[name] = source
    return shaders


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed")
