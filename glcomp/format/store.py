"""Bundle directories: writing a bundle atomically and in place, and reading one back with
strict validation.

A bundle is untrusted data. Reading checks the format and version, that every file named lies
inside the bundle directory (no symbolic link inside a bundle is ever followed), that every
texture, program, sampler and state reference resolves (glcomp.format.manifest), that the
weights match the declared state shapes and dtypes (glcomp.format.parse), that every shader's
loops fit what the manifest declares (glcomp.format.shaders), and (format 2 on) that every file
has the sha256 the manifest records. Format 3 keeps every shader in one file, shaders.json (an
object of shader file name -> GLSL source); formats 1 and 2, still read, have one file each
under shaders/. Format 4, which saves write, is format 3 with every file but manifest.json
stored under a name carrying its sha256 (weights.0123456789abcdef.safetensors:
glcomp.format.stored_name), so that a save switches the bundle by replacing manifest.json alone
(see "saving" below, docs/saving.md). It bounds what a bundle may ask of the GPU before anything
is allocated: the textures' total size (a budget, 2 GiB by default), no texture unused, and
every shader loop of the compiler's constant-bounded form, with the iterations per draw within
a budget. Any fault raises GlcompError naming the file and the field at fault, and nothing else
(JSON nesting, sizes and counts are bounded too). glcomp.js's loader accepts and rejects the
same bundles. program.json (the IR graphs) is read here as JSON; glcomp.format.program checks it
against the manifest and `Program.from_bundle` rebuilds its graphs.
Readers and writers of one directory follow one locking protocol (both halves live here).
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
from collections.abc import Iterator
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
from glcomp.format.manifest import (
    DEFAULT_ENTRY_BUDGET,
    DEFAULT_LOOP_BUDGET,
    DEFAULT_TEXTURE_BUDGET,
    FORMAT,
    PROGRAM_FILE,
    SHADERS_FILE,
    WEIGHTS_FILE,
    packed_shaders,
    stored_name,
    validate_manifest,
)
from glcomp.format.parse import COUNTER_DTYPES, MAX_JSON_BYTES, STATE_DTYPES, parse_json, parse_safetensors
from glcomp.format.shaders import _SHADER, _unicode_ok, check_shaders, unpack_shaders

FILES = ("manifest.json", "weights.safetensors")
MAX_PROGRAMS = 4096


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
    from glcomp.format.bundle import Bundle

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
