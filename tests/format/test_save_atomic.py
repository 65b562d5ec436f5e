"""Saving in place (format 4, docs/saving.md): a save writes its files under fresh names inside the
bundle directory and switches the bundle by replacing manifest.json alone.

What must hold, whatever happens during a save: the bundle directory itself is never renamed or
replaced, a save or a kill at any syscall boundary leaves the old or the new bundle loadable and
every file of the user's intact (never opened, copied, moved or deleted: hard links, owners, modes
and times kept), a reader during saves loads the old or the new bundle every time, concurrent
writers never fail, and saving works where renaming the directory could not (a mount point, a
read-only parent) and fails cleanly where it must (disk full).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser.support import _js
from conftest import as_format_2, as_format_3, stored_path

import glcomp
from glcomp import nn, optim
from glcomp.errors import GlcompError
from glcomp.format import store as schema
from glcomp.format import stored_name
from glcomp.format.store import LOCK_FILE, STAGING_PREFIX, read_bundle

ROOT = Path(__file__).resolve().parents[2]
STORED = ("program.json", "shaders.json", "weights.safetensors")


def _program(seed: int, **options: Any) -> glcomp.Program:
    glcomp.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 8), nn.ReLU(), nn.Linear(8, 3))
    prog = glcomp.compile(model, {"x": (6, 5)}, nn.CrossEntropyLoss(), optim.Adam(lr=0.01), **options)
    prog.bundle()  # lowered once, before any save is timed or faulted
    return prog


@pytest.fixture(scope="module")
def programs() -> dict[str, glcomp.Program]:
    """Three programs of the same shapes (so that a mix of their files would look whole): a, b
    (other weights and other shaders: b fuses nothing) and c (a's shaders, other weights)."""
    return {
        "a": _program(1),
        "b": _program(2, passes={"fusion": False, "mrt": False}),
        "c": _program(3),
    }


def _fingerprint(weights: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode() + b"\0" + np.ascontiguousarray(weights[name], np.float64).tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def prints(programs: dict[str, glcomp.Program]) -> dict[str, str]:
    """Each program's fingerprint as a loaded bundle gives it -> its name."""
    return {_fingerprint(p.bundle().weights): k for k, p in programs.items()}


def _which(directory: Path, prints: dict[str, str]) -> str:
    """Which program the bundle in `directory` holds (loading it in full, as glcomp.load does)."""
    bundle = read_bundle(directory)
    glcomp.Program.from_bundle(bundle)
    found = prints.get(_fingerprint(bundle.weights))
    assert found is not None, "the bundle holds none of the programs saved: a mix of two saves"
    return found


def _snapshot(paths: list[Path]) -> dict[str, Any]:
    """What must never change about the user's files: inode, links, mode, owner, size, mtime and
    bytes (lstat: links are not followed; FIFOs and sockets are never opened)."""
    out = {}
    for p in paths:
        st = os.lstat(p)
        data = p.read_bytes() if stat.S_ISREG(st.st_mode) else None
        out[p.name] = (
            st.st_ino,
            st.st_nlink,
            st.st_mode,
            st.st_uid,
            st.st_gid,
            st.st_size,
            st.st_mtime_ns,
            data,
        )
    return out


def _user_files(d: Path, outside: Path) -> list[Path]:
    """A user's files beside a bundle: data (hard-linked from outside), a folder, a symbolic link, a
    FIFO and a socket, a file named like format 3's weights, with odd modes (and owners as root)."""
    data = d / "data.safetensors"
    data.write_bytes(b"the user's data" * 1000)
    outside.mkdir(exist_ok=True)
    os.link(data, outside / "data-link")
    os.chmod(data, 0o640)
    notes = d / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("train longer\n")
    os.chmod(notes, 0o750)
    (d / "elsewhere").symlink_to(outside / "nowhere")
    os.mkfifo(d / "pipe")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(d / "sock"))
    sock.close()
    (d / "weights.safetensors").write_bytes(
        b"not the bundle's: a format 4 bundle stores its weights elsewhere"
    )
    if os.geteuid() == 0:
        os.chown(data, 4321, 4321)
        os.chown(notes, 4321, 4321, follow_symlinks=False)
    for p in (data, notes / "todo.txt"):
        os.utime(p, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
    return [
        data,
        notes,
        notes / "todo.txt",
        d / "elsewhere",
        d / "pipe",
        d / "sock",
        d / "weights.safetensors",
    ]


def _clean_listing(d: Path, user: list[Path]) -> list[str]:
    """What a bundle directory holds after a save that finished: the manifest, the files it names,
    the lock file and the user's entries; nothing else (no staging folder, no file of an earlier
    save)."""
    m = json.loads((d / "manifest.json").read_text())
    named = [stored_name(4, p, m["files"][p]) for p in m["files"]]
    return sorted({"manifest.json", LOCK_FILE, *named, *(p.name for p in user if p.parent == d)})


# -- 1. the directory and the user's files are never touched ----------------------------------------
def test_a_save_never_touches_the_directory_or_the_users_files(
    programs: dict[str, glcomp.Program],
    prints: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Saves before format 4 renamed the directory and copied the user's files into every new
    bundle: hard links broken, owners and directory modes the saver's, a FIFO beside the bundle
    made every save hang or fail, a socket made it fail. Now they are never opened."""
    d = tmp_path / "b"
    programs["a"].save(d)
    user = _user_files(d, tmp_path / "outside")
    os.chmod(d, 0o2751)
    if os.geteuid() == 0:
        os.chown(d, 1234, 1234)
    before, directory = _snapshot(user), os.lstat(d)
    opened: list[str] = []
    real_open = os.open

    def spy(path: Any, *args: Any, **kwargs: Any) -> int:
        opened.append(os.path.basename(os.fsdecode(path)))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", spy)
    for name in "bab":
        programs[name].save(d)
    rt = programs["c"].runtime("reference")
    rt.train_step(x=np.ones((6, 5), np.float32), y=np.zeros(6, np.int64))
    rt.save(d)
    monkeypatch.undo()
    assert _snapshot(user) == before
    after = os.lstat(d)
    for field in ("st_ino", "st_dev", "st_mode", "st_uid", "st_gid"):
        assert getattr(after, field) == getattr(directory, field), field
    assert not {p.name for p in user} & set(opened), opened
    assert sorted(os.listdir(d)) == _clean_listing(d, user)
    saved = read_bundle(d).weights
    for name, value in rt.state_dict().items():  # the runtime's trained state
        np.testing.assert_array_equal(saved[name], value, err_msg=name)


def test_new_bundle_files_take_the_mode_and_owner_of_the_manifest_they_replace(
    programs: dict[str, glcomp.Program], tmp_path: Path
) -> None:
    d = tmp_path / "b"
    programs["a"].save(d)
    os.chmod(d / "manifest.json", 0o640)
    if os.geteuid() == 0:
        os.chown(d / "manifest.json", 4321, 4322)
    programs["b"].save(d)
    for name in ["manifest.json", *(stored_path(d, p).name for p in STORED)]:
        st = os.lstat(d / name)
        assert stat.S_IMODE(st.st_mode) == 0o640, name
        if os.geteuid() == 0:
            assert (st.st_uid, st.st_gid) == (4321, 4322), name


# -- 2. a fault or a kill at every syscall boundary ---------------------------------------------------
# The os functions a save calls (any that it calls: each call is a boundary faulted in turn).
SYSCALLS = (
    "open", "read", "write", "fsync", "close", "lseek", "fstat", "stat", "lstat", "listdir", "mkdir",
    "rmdir", "unlink", "rename", "replace", "fchmod", "fchown", "scandir",
)  # fmt: skip


@contextmanager
def _faults(at: int | None, when: str, fault: Callable[[], Any]) -> Iterator[list[str]]:
    """Count this thread's calls of SYSCALLS; at call number `at`, call `fault` (which raises,
    or kills the process) before the call is made, or after it returned (`when`; after, for a
    close, which frees the descriptor whatever it reports: a fault just before it is one just
    after the call before)."""
    calls: list[str] = []
    me = threading.get_ident()
    saved = {name: getattr(os, name) for name in SYSCALLS}

    def wrap(name: str, real: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != me:
                return real(*args, **kwargs)
            calls.append(name)
            hit = len(calls) - 1 == at
            if hit and when == "before" and name != "close":
                fault()
            if hit and name == "close":  # close frees the descriptor even when it fails (Linux)
                real(*args, **kwargs)
                fault()
            out = real(*args, **kwargs)
            if hit and when == "after":
                fault()
            return out

        return call

    for name, real in saved.items():
        setattr(os, name, wrap(name, real))
    try:
        yield calls
    finally:
        for name, real in saved.items():
            setattr(os, name, real)


# The boundaries where a save changes the directory or the disk: faulted in every combination of
# fault and timing; the quick profile faults every other call in one combination only.
CHANGES = ("write", "fsync", "rename", "replace", "mkdir", "rmdir", "unlink", "fchmod", "fchown")


def _prepare(programs: dict[str, glcomp.Program], tmp_path: Path) -> tuple[Path, list[Path], list[str]]:
    """A bundle of a with the user's files beside it; the syscalls of a save of b over a."""
    d = tmp_path / "b"
    programs["a"].save(d)
    user = _user_files(d, tmp_path / "outside")
    with _faults(None, "before", lambda: None) as calls:
        programs["b"].save(d)
    programs["a"].save(d)
    assert len(calls) > 20 and "replace" in calls, calls
    return d, user, calls


def _recover(d: Path, user: list[Path], before: dict[str, Any], program: glcomp.Program, where: str) -> None:
    """The save after an interrupted one finishes and leaves nothing of it behind: exactly the
    manifest a clean save writes, the files it names (their sha256 checked), the user's."""
    program.save(d)
    files = schema.bundle_files(program.bundle(), 4)
    assert (d / "manifest.json").read_bytes() == files["manifest.json"], where
    for name, data in files.items():
        assert (d / name).read_bytes() == data, (where, name)
    assert sorted(os.listdir(d)) == _clean_listing(d, user), where
    assert _snapshot(user) == before, where


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("kind", ["OSError", "KeyboardInterrupt"])
def test_a_fault_at_every_syscall_of_a_save_leaves_the_old_or_the_new_bundle(
    kind: str,
    when: str,
    programs: dict[str, glcomp.Program],
    prints: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """An exception injected at each syscall boundary of a save of b over the bundle (before the
    call, or just after it returned): the save raises GlcompError naming the directory (never a
    raw OSError) or lets the interrupt through, the directory holds the old bundle or b's,
    whole, the user's files are intact, and the next save recovers. Every boundary with --slow;
    else every one for OSError before the call, those that change the disk for the others."""
    d, user, calls = _prepare(programs, tmp_path)
    before = _snapshot(user)
    every = request.config.getoption("--slow") or (kind, when) == ("OSError", "before")
    boundaries = [i for i, name in enumerate(calls) if every or name in CHANGES]
    seen = {"old": 0, "b": 0}

    def fault() -> None:
        if kind == "OSError":
            raise OSError(errno.EIO, "Input/output error (injected)")
        raise KeyboardInterrupt

    old = "a"
    for at in boundaries:
        where = f"fault {kind} {when} call {at} ({calls[at]})"
        with _faults(at, when, fault) as made:
            try:
                programs["b"].save(d)
            except GlcompError as err:
                assert kind == "OSError", (where, err)
                assert str(err).startswith(f"{d}: "), err
            except KeyboardInterrupt:
                assert kind == "KeyboardInterrupt", where
        assert made[: at + 1] == calls[: at + 1], where  # the same save, up to the fault
        which = _which(d, prints)
        assert which in (old, "b"), where
        assert _snapshot(user) == before, where
        seen["b" if which == "b" else "old"] += 1
        old = "c" if old == "a" else "a"
        _recover(d, user, before, programs[old], where)
    print(f"{kind} {when}: {len(boundaries)} boundaries, left old {seen['old']}, new {seen['b']}")
    assert seen["old"] and seen["b"], seen  # the faults fell on both sides of the switch


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_kill_at_every_syscall_of_a_save_leaves_the_old_or_the_new_bundle(
    programs: dict[str, glcomp.Program], prints: dict[str, str], tmp_path: Path
) -> None:
    """kill -9 at each syscall boundary of a save (in a forked process): the bundle is the old one
    or b's and loads, the user's files are intact, and the next save recovers (nothing of the
    killed save is left, nothing is deleted but its own files)."""
    d, user, calls = _prepare(programs, tmp_path)
    before = _snapshot(user)
    seen = {"old": 0, "b": 0}
    old = "a"
    for at in range(len(calls) + 1):
        pid = os.fork()
        if pid == 0:  # the child: save b, killed at call `at`
            signal.alarm(120)  # never a hung test: a child stuck on a lock another thread held dies
            try:
                with _faults(at, "before", lambda: os.kill(os.getpid(), signal.SIGKILL)):
                    programs["b"].save(d)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        assert killed or at == len(calls), (at, status)
        where = f"killed at call {at}"
        which = _which(d, prints)
        assert which in (old, "b"), where
        assert _snapshot(user) == before, where
        seen["b" if which == "b" else "old"] += 1
        old = "c" if old == "a" else "a"
        _recover(d, user, before, programs[old], where)
    print(f"kill -9: {len(calls) + 1} boundaries, left old {seen['old']}, new {seen['b']}")
    assert seen["old"] and seen["b"], seen


# -- 3. readers during saves, and concurrent writers ---------------------------------------------------
_READER = """
import hashlib, json, sys, time
import numpy as np
from glcomp.format.store import read_bundle
from glcomp.errors import GlcompError
directory, seconds = sys.argv[1], float(sys.argv[2])
def fingerprint(weights):
    h = hashlib.sha256()
    for name in sorted(weights):
        h.update(name.encode() + b"\\0" + np.ascontiguousarray(weights[name], np.float64).tobytes())
    return h.hexdigest()[:16]
print("ready", flush=True)
sys.stdin.readline()
counts, errors = {}, []
end = time.monotonic() + seconds
while time.monotonic() < end:
    try:
        key = fingerprint(read_bundle(directory).weights)
    except GlcompError as err:
        errors.append(str(err))
        continue
    counts[key] = counts.get(key, 0) + 1
print(json.dumps({"counts": counts, "errors": errors[:5], "failed": len(errors)}), flush=True)
"""

_WRITER = """
import sys, time
import glcomp
source, directory, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
prog = glcomp.load(source)
prog.bundle()
print("ready", flush=True)
sys.stdin.readline()
saves, end = 0, time.monotonic() + seconds
while time.monotonic() < end:
    prog.save(directory)
    saves += 1
print(saves, flush=True)
"""


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def test_readers_during_saves_load_the_old_or_the_new_bundle_every_time(
    programs: dict[str, glcomp.Program],
    prints: dict[str, str],
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    """Before format 4, 371 of 413 loads during repeated saves failed ("program.json is
    missing"), and two concurrent writers failed with a raw FileNotFoundError. Now: a writer
    thread saving a and c, a writer process saving b, a reader thread and a reader process
    loading in a loop, for a few seconds (60 with --slow): every load is a, b or c, whole, and no
    save fails."""
    seconds = 60.0 if request.config.getoption("--slow") else 3.0
    d = tmp_path / "shared"
    programs["b"].save(tmp_path / "b-source")
    programs["a"].save(d)
    (d / "data.safetensors").write_bytes(b"the user's data")
    reader = _start(_READER, str(d), str(seconds))
    writer = _start(_WRITER, str(tmp_path / "b-source"), str(d), str(seconds))
    stop = threading.Event()
    errors: list[BaseException] = []
    saves, loads = [0], {"a": 0, "b": 0, "c": 0}

    def write() -> None:
        try:
            while not stop.is_set():
                programs["ac"[saves[0] % 2]].save(d)
                saves[0] += 1
        except BaseException as err:  # reported below
            errors.append(err)

    def read() -> None:
        try:
            while not stop.is_set():
                loads[_which(d, prints)] += 1
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=write), threading.Thread(target=read)]
    for proc in (reader, writer):
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for t in threads:
        t.start()
    try:
        out_r, _ = reader.communicate(timeout=seconds + 120)
        out_w, _ = writer.communicate(timeout=seconds + 120)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert reader.returncode == 0 and writer.returncode == 0, (out_r, out_w)
    result = json.loads(out_r.strip().splitlines()[-1])
    assert result["failed"] == 0, result
    named = {prints[k]: n for k, n in result["counts"].items()}  # a KeyError here: a mixed bundle
    print(
        f"{seconds:g} s: loads {named} (process), {loads} (thread), {result['failed']} failed; "
        f"saves {saves[0]} (thread), {out_w.strip().splitlines()[-1]} (process)"
    )
    assert sum(named.values()) >= 5 and sum(loads.values()) >= 5, (named, loads)
    assert saves[0] >= 2 and int(out_w.strip().splitlines()[-1]) >= 2, (saves, out_w)
    assert (d / "data.safetensors").read_bytes() == b"the user's data"
    assert sorted(os.listdir(d)) == _clean_listing(d, [d / "data.safetensors"])


def test_a_read_whose_files_a_save_removed_reads_the_new_bundle(
    programs: dict[str, glcomp.Program],
    prints: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A reader that read a's manifest and then found its files gone (a save of b switched the
    bundle and removed them in between: as if the reader had opened a's manifest before the
    switch but locked it only after the save's removal) reads again, from b's manifest."""
    d = tmp_path / "b"
    programs["a"].save(d)
    real_pin, real_collect = schema._Reader._pin, schema._collect
    raced: list[str] = []

    def pin(self: Any, manifest: dict[str, Any]) -> None:
        if not raced:
            raced.append("saved")
            programs["b"].save(d)  # a's files are gone when the reader opens them
        real_pin(self, manifest)

    def collect(dfd: int, keep: set[str], replaced: Any) -> None:
        replaced.fd, fd = None, replaced.fd  # no reader's lock to wait for
        try:
            real_collect(dfd, keep, replaced)
        finally:
            replaced.fd = fd

    monkeypatch.setattr(schema._Reader, "_pin", pin)
    monkeypatch.setattr(schema, "_collect", collect)
    assert _which(d, prints) == "b" and raced


def test_files_of_a_manifest_a_reader_holds_are_removed_by_a_later_save(
    programs: dict[str, glcomp.Program], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save removes the files of the manifest it replaced only once no reader holds it (readers
    lock it, shared, while they open its files); else the next save removes them."""
    import fcntl

    d = tmp_path / "b"
    programs["a"].save(d)
    a_files = {stored_path(d, p) for p in STORED}
    monkeypatch.setattr(schema, "RETIRE_TIMEOUT", 0.05)
    fd = os.open(d / "manifest.json", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # as a reader does between reading it and opening its files
        programs["b"].save(d)
        assert all(p.exists() for p in a_files)  # a reader may still need them
    finally:
        os.close(fd)
    programs["c"].save(d)
    b_only = {stored_path(d, p) for p in STORED}
    assert not any(p.exists() for p in a_files - b_only)
    assert sorted(os.listdir(d)) == _clean_listing(d, [])


# -- 4. where renaming the directory would fail ---------------------------------------------------------
def _resolve(path: Any, dir_fd: int | None) -> str:
    path = os.fsdecode(path)
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    return os.path.abspath(path)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_a_mount_point_in_a_read_only_parent_saves(
    programs: dict[str, glcomp.Program],
    prints: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bundle directory a mount point (renaming it is EBUSY) inside a read-only parent
    (creating anything there is EROFS), simulated: saves before format 4 failed every time (and
    left an empty .old folder). Now they never touch the parent."""
    parent = tmp_path / "volume-parent"
    d = parent / "b"
    programs["a"].save(d)
    (d / "data.safetensors").write_bytes(b"the user's data")
    before = sorted(os.listdir(parent))

    def guard(name: str, paths: Callable[..., list[str]]) -> None:
        real = getattr(os, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            for p in paths(*args, **kwargs):
                if p == str(d):
                    raise OSError(errno.EBUSY, "Device or resource busy (a mount point)", p)
                if os.path.dirname(p) == str(parent):
                    raise OSError(errno.EROFS, "Read-only file system", p)
            return real(*args, **kwargs)

        monkeypatch.setattr(os, name, call)

    def one(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> list[str]:
        return [_resolve(path, dir_fd)]

    def two(src: Any, dst: Any, *, src_dir_fd: int | None = None, dst_dir_fd: int | None = None) -> list[str]:
        return [_resolve(src, src_dir_fd), _resolve(dst, dst_dir_fd)]

    def created(path: Any, flags: int, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> list[str]:
        writes = flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        return [_resolve(path, dir_fd)] if writes else []

    for name in ("mkdir", "rmdir", "unlink"):
        guard(name, one)
    for name in ("rename", "replace"):
        guard(name, two)
    guard("open", created)
    for name in "bca":
        programs[name].save(d)
        assert _which(d, prints) == name
    monkeypatch.undo()
    assert sorted(os.listdir(parent)) == before
    assert (d / "data.safetensors").read_bytes() == b"the user's data"


_MOUNTED = """
set -e
mount -t tmpfs tmpfs "$1" || exit 77
mkdir "$1/b"
mount -t tmpfs tmpfs "$1/b"
"$2" -c 'import glcomp, sys; glcomp.load(sys.argv[1]).save(sys.argv[2])' "$3" "$1/b"
echo mine > "$1/b/data.txt"
mount -o remount,ro "$1"
touch "$1/x" 2>/dev/null && exit 78
"$2" -c '
import glcomp, sys
for source in sys.argv[1:3]:
    glcomp.load(source).save(sys.argv[3])
    print(glcomp.load(sys.argv[3]).state()["0.bias"].tolist())
' "$4" "$3" "$1/b"
cat "$1/b/data.txt"
ls -A "$1"
"""


@pytest.mark.skipif(shutil.which("unshare") is None or os.geteuid() != 0, reason="needs unshare and root")
def test_a_real_mount_point_in_a_read_only_parent_saves(
    programs: dict[str, glcomp.Program], tmp_path: Path
) -> None:
    """The same with real mounts (a private mount namespace: tmpfs at the parent, made read-only,
    and another tmpfs at the bundle directory); skipped where mounts are not allowed."""
    a, b = tmp_path / "a", tmp_path / "b"
    programs["a"].save(a)
    programs["b"].save(b)
    parent = tmp_path / "volume"
    parent.mkdir()
    run = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", _MOUNTED, "sh", str(parent), sys.executable,
         str(a), str(b)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )  # fmt: skip
    if run.returncode == 77 or "unshare failed" in run.stderr:
        pytest.skip(f"mounts are not allowed here: {run.stderr.strip()}")
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    biases = [programs[k].state()["0.bias"].tolist() for k in "ba"]
    np.testing.assert_allclose([json.loads(line) for line in lines[:2]], biases, rtol=1e-6)
    assert lines[2:] == ["mine", "b"]  # the user's file kept; nothing but the bundle in the parent


def test_the_directory_is_fsynced_before_and_after_the_switch(
    programs: dict[str, glcomp.Program], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's save renamed without fsyncing the parent: a power loss could lose the renames.
    Now the bundle directory is fsynced after the stored files are renamed into it (before the
    manifest names them) and again after the switch (os.replace of manifest.json)."""
    d = tmp_path / "b"
    programs["a"].save(d)
    events: list[str] = []
    real = {name: getattr(os, name) for name in ("fsync", "rename", "replace")}

    def fsync(fd: int) -> None:
        real["fsync"](fd)
        events.append("fsync dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")

    def moved(name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> None:
            real[name](*args, **kwargs)
            events.append(f"{name} {args[1]}")

        return call

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", moved("rename"))
    monkeypatch.setattr(os, "replace", moved("replace"))
    programs["b"].save(d)
    monkeypatch.undo()
    switch = events.index("replace manifest.json")
    renames = [i for i, e in enumerate(events) if e.startswith("rename ")]
    assert renames and renames[-1] < switch, events
    assert "fsync dir" in events[renames[-1] + 1 : switch], events
    assert events[switch - 1] == "fsync file", events  # the new manifest itself, before the switch
    assert "fsync dir" in events[switch + 1 :], events


def test_disk_full_is_an_error_naming_the_directory_and_keeps_the_old_bundle(
    programs: dict[str, glcomp.Program],
    prints: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENOSPC while writing (once 1000 bytes of the save are written) or at an fsync: a
    GlcompError naming the directory and the cause, the directory exactly as it was, no
    temporary left (saves before format 4 raised a raw OSError)."""
    d = tmp_path / "b"
    programs["a"].save(d)
    before = {p: p.read_bytes() for p in d.iterdir()}
    for where in ("write", "fsync"):
        real = getattr(os, where)
        budget = [1000]

        def full(
            fd: int, *args: Any, real: Any = real, where: str = where, budget: list[int] = budget
        ) -> Any:
            if where == "write":
                budget[0] -= len(args[0])
            if budget[0] < 0 or where == "fsync":
                raise OSError(errno.ENOSPC, "No space left on device")
            return real(fd, *args)

        monkeypatch.setattr(os, where, full)
        with pytest.raises(
            GlcompError, match=rf"^{d}: could not save the bundle \(No space left on device\)"
        ):
            programs["b"].save(d)
        monkeypatch.undo()
        assert {p: p.read_bytes() for p in d.iterdir()} == before, where
        assert _which(d, prints) == "a"


def test_files_named_like_temporaries_are_never_deleted(
    programs: dict[str, glcomp.Program], prints: dict[str, str], tmp_path: Path
) -> None:
    """Beside the bundle, files and folders named like the temporaries of saves before format 4
    (`.b.old-99999-mine` was deleted by the next save); inside it, a file named like a staging
    folder. Saves and loads (a load of a missing bundle looks for a moved-aside one) leave them."""
    d = tmp_path / "b"
    programs["a"].save(d)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    pid = int(dead.stdout)
    (tmp_path / ".b.old-99999-mine").write_bytes(b"a user's file")
    (tmp_path / f".b.tmp-{pid}-x").write_bytes(b"another")
    (tmp_path / f".b.old-{pid}-dir").mkdir()
    (tmp_path / f".b.old-{pid}-dir" / "notes").write_text("not a bundle")
    (tmp_path / f".b.tmp-{pid}-dir").mkdir()
    (d / f"{STAGING_PREFIX}{pid}-0123456789ab").write_bytes(b"a file, not a staging folder")
    before = {p.name: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*") if ".b." in str(p)}
    before[f"{STAGING_PREFIX}{pid}-0123456789ab"] = b"a file, not a staging folder"
    for name in "bc":
        programs[name].save(d)
        assert _which(d, prints) == name
    with pytest.raises(GlcompError, match="not a directory"):
        glcomp.load(tmp_path / "missing")
    after = {p.name: p.read_bytes() if p.is_file() else None for p in tmp_path.rglob("*") if ".b." in str(p)}
    after[f"{STAGING_PREFIX}{pid}-0123456789ab"] = (d / f"{STAGING_PREFIX}{pid}-0123456789ab").read_bytes()
    assert after == before


def test_an_unfinished_first_save_does_not_block_the_next(
    programs: dict[str, glcomp.Program], prints: dict[str, str], tmp_path: Path
) -> None:
    """A first save killed before its switch leaves a directory with the lock file, a staging
    folder and stored files but no manifest: not a user's directory, so the next save goes on."""
    d = tmp_path / "b"
    programs["a"].save(d)
    os.unlink(d / "manifest.json")
    (d / f"{STAGING_PREFIX}1-0123456789ab").mkdir()
    with pytest.raises(GlcompError, match=r"manifest\.json is missing"):
        glcomp.load(d)
    programs["b"].save(d)
    assert _which(d, prints) == "b"
    assert sorted(os.listdir(d)) == _clean_listing(d, [])


# -- format 4 on disk: what loaders refuse, what a save leaves of older formats ------------------------
def test_stored_files_are_checked_like_any_other(programs: dict[str, glcomp.Program], tmp_path: Path) -> None:
    good = tmp_path / "good"
    programs["a"].save(good)
    programs["c"].save(tmp_path / "other")  # a's shaders and program, other weights

    def variant(name: str, change: Callable[[Path], Any]) -> Path:
        d = tmp_path / name
        shutil.copytree(good, d)
        change(d)
        return d

    weights = stored_path(good, "weights.safetensors").name
    cases = {
        "missing": (
            lambda d: (d / weights).unlink(),
            rf"weights\.safetensors \({weights}\) is missing",
        ),
        "another save's": (
            lambda d: shutil.copy(stored_path(tmp_path / "other", "weights.safetensors"), d / weights),
            r"bundle weights\.safetensors: its sha256 does not match",
        ),
        "a symbolic link": (
            lambda d: (
                (d / weights).unlink() or (d / weights).symlink_to(stored_path(good, "weights.safetensors"))
            ),
            "symbolic link",
        ),
        "a FIFO": (lambda d: (d / weights).unlink() or os.mkfifo(d / weights), "not a regular file"),
        "a digest that names no file": (
            lambda d: d.joinpath("manifest.json").write_text(
                (good / "manifest.json")
                .read_text()
                .replace('"weights.safetensors": "', '"weights.safetensors": "/')
            ),
            r"files\.weights\.safetensors must match",
        ),
    }
    for name, (change, message) in cases.items():
        with pytest.raises(GlcompError, match=message):
            read_bundle(variant(name.replace(" ", "_").replace("'", ""), change))


@pytest.mark.parametrize("old_format", [1, 2, 3])
def test_saving_over_an_older_format_removes_only_its_files(
    old_format: int, programs: dict[str, glcomp.Program], prints: dict[str, str], tmp_path: Path
) -> None:
    """Saving over a bundle of format 1-3 writes format 4 and removes the old bundle's files (those
    its manifest names, holding the bytes it records), never anything else: not a file the user
    put in its shaders/ folder, nor one it names whose bytes someone changed."""
    d = tmp_path / "b"
    programs["a"].save(d)
    as_format_3(d)
    if old_format < 3:
        as_format_2(d)
        (d / "shaders" / "mine.txt").write_text("mine")
    if old_format == 1:
        m = json.loads((d / "manifest.json").read_text())
        m.pop("files")
        (d / "program.json").unlink()
        (d / "manifest.json").write_text(json.dumps(m | {"version": 1}))
    if old_format == 3:
        with (d / "program.json").open("a") as f:
            f.write(" ")  # changed since: not the bundle's file any more
    (d / "data.safetensors").write_bytes(b"the user's data")
    if old_format != 3:
        assert _which(d, prints) == "a"
    programs["b"].save(d)
    assert _which(d, prints) == "b"
    kept = {"data.safetensors"} | ({"shaders"} if old_format < 3 else {"program.json"})
    assert sorted(os.listdir(d)) == _clean_listing(d, [d / k for k in kept])
    if old_format < 3:
        assert os.listdir(d / "shaders") == ["mine.txt"]


# -- the browser loads what Python saves ------------------------------------------------------------------
@pytest.mark.browser
def test_the_browser_loads_format_4_from_urls_and_files_and_reloads_a_replaced_bundle(
    page: Any,
    site: Any,
    programs: dict[str, glcomp.Program],
) -> None:
    """In Chromium: a format 4 bundle by URL and as picked files (stored names), a missing stored
    file named in the error, and a load that fetched a manifest whose files a save removed
    before it fetched them (the page's first manifest.json is a's, then b's is on disk) loads
    again, from the new manifest."""
    import base64

    d = site.root / "atomic"
    programs["a"].save(d)
    a_manifest = (d / "manifest.json").read_bytes()
    files = {
        p.name: base64.b64encode(p.read_bytes()).decode()
        for p in d.iterdir()
        if p.suffix in (".json", ".safetensors")
    }
    programs["b"].save(d)  # a's files are gone
    served = []

    def stale_first(route: Any) -> None:
        served.append(route.request.url)
        if len(served) == 1:
            route.fulfill(status=200, body=a_manifest, content_type="application/json")
        else:
            route.continue_()

    page.route("**/bundle/atomic/manifest.json", stale_first)
    x = np.linspace(-1, 1, 30, dtype=np.float32).reshape(6, 5)
    got = _js(
        page,
        """
      const files = Object.entries(arg.files).map(([n, b64]) =>
        new File([Uint8Array.from(atob(b64), (c) => c.charCodeAt(0))], n));
      const out = {};
      const url = await g.Runtime.load('/bundle/atomic/', { quiet: true });
      out.url = Array.from((await url.predict({ x: arg.x })).data);
      url.dispose();
      const picked = await g.Runtime.load(files, { quiet: true });
      out.files = Array.from((await picked.predict({ x: arg.x })).data);
      picked.dispose();
      try { await g.Runtime.load(files.filter((f) => !f.name.startsWith("weights."))); }
      catch (err) { out.missing = err.message; }
      return out;
    """,
        {"files": files, "x": x.tolist()},
    )
    assert len(served) == 2  # a's manifest, then (its weights gone) b's: read again, once
    want = {k: programs[k].runtime("reference").predict(x=x).ravel() for k in "ab"}
    np.testing.assert_allclose(got["url"], want["b"], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["files"], want["a"], rtol=1e-4, atol=1e-5)
    name = stored_name(4, "weights.safetensors", json.loads(a_manifest)["files"]["weights.safetensors"])
    assert got["missing"] == f"bundle: weights.safetensors ({name}) is missing"
