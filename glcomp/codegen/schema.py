"""The bundle schema: writing a bundle atomically, and reading one back with strict validation.

A bundle is untrusted data. Reading checks the format and version, that every file named lies
inside the bundle directory (no symbolic link inside a bundle is ever followed), that every
texture, program, sampler and state reference resolves, that layouts are self-consistent, that
the weights match the declared state shapes and dtypes, and (format 2 on) that every file has the
sha256 the manifest records. Format 3 keeps every shader in one file, shaders.json (an object of
shader file name -> GLSL source); formats 1 and 2, still read, have one file each under shaders/.
It bounds what a bundle may ask of the GPU before anything is allocated: the textures' total size
(a budget, 2 GiB by default), no texture unused, and every shader loop of the compiler's
constant-bounded form, with the iterations per draw within a budget. Any fault raises GlcompError
naming the file and the field at fault, and nothing else (JSON nesting, sizes and counts are
bounded too). glcomp.js's loader accepts and rejects the same bundles. The manifest itself is
validated by glcomp.format (its JSON Schema and cross-checks), whose names this module re-exports.
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
from bisect import bisect_left
from itertools import accumulate
from pathlib import Path
from typing import Any

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
    packed_shaders,
    shader_path,
    texel_bytes,
    texture_bytes,
    texture_format,
    validate_manifest,
)

FILES = ("manifest.json", "weights.safetensors")
_SHADER = re.compile(r"[A-Za-z0-9_]{1,64}\.(frag|vert)")


# What a save replaces in a bundle directory: the files of format 3, and the shaders/ folder of
# formats 1 and 2 (a save over an old bundle must not leave it behind).
BUNDLE_ENTRIES = ("manifest.json", "weights.safetensors", PROGRAM_FILE, SHADERS_FILE, "shaders")
_TEMP = re.compile(r"^\.(?P<name>.+)\.(tmp|old)-(?P<pid>\d+)-[A-Za-z0-9_]+$")
_ACTIVE: set[str] = set()  # temporaries of saves running in this process
_ACTIVE_LOCK = threading.Lock()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def bundle_files(bundle: Any) -> dict[str, bytes]:
    """The files of `bundle` as bytes, format 3 (its manifest's ``version`` is set to 3):
    shaders.json (every shader, keys sorted), weights, program, then the manifest, which records
    the sha256 of every other file under ``files``. Bundle directories hold no sub-folder."""
    from safetensors.numpy import save

    files: dict[str, bytes] = {}
    for name, source in bundle.shaders.items():
        if not _SHADER.fullmatch(name):
            raise GlcompError(f"refusing to write shader with unsafe name {name!r}")
        if not isinstance(source, str) or not _unicode_ok(source):
            raise GlcompError(f"refusing to write shader {name!r}: its source is not Unicode text")
    files[SHADERS_FILE] = json.dumps(
        dict(sorted(bundle.shaders.items())), indent=1, ensure_ascii=False
    ).encode("utf-8")
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
    manifest["version"] = 3
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
    target = parent / name
    for entry in sorted(entries, key=lambda e: e.name):
        found = _TEMP.match(entry.name)
        if not found or found["name"] != name:
            continue
        pid = int(found["pid"])
        with _ACTIVE_LOCK:
            running = str(entry) in _ACTIVE
        if running or (pid != os.getpid() and _pid_alive(pid)):
            continue
        if entry.is_symlink() or not entry.is_dir():
            continue  # never ours (saves make directories): a user's file, left alone
        aside = entry / "bundle"
        if ".old-" in entry.name and is_bundle_dir(aside):
            if not os.path.lexists(target):
                # A save was killed between its two renames: the old bundle (and the user's
                # files in it) is put back, never deleted.
                try:
                    os.rename(aside, target)
                except OSError:
                    continue
            elif not is_bundle_dir(target):
                continue  # not sure which is the user's: keep both
        shutil.rmtree(entry, ignore_errors=True)


def _write_new(directory_fd: int, name: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(name, flags, 0o644, dir_fd=directory_fd)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _write_tree(root: Path, files: dict[str, bytes]) -> None:
    """Write `files` (plain file names) into the fresh directory `root`, creating every file
    exclusively (O_EXCL, no symbolic link followed). The manifest goes last."""
    order = sorted(files, key=lambda p: (p == "manifest.json", p))
    dfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_NOFOLLOW", 0))
    try:
        for name in order:
            if "/" in name:
                raise GlcompError(f"refusing to write bundle file {name!r}: not a plain file name")
            _write_new(dfd, name, files[name])
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
    over; bundle files of another format are not (a ``shaders/`` folder of format 1 or 2 is gone
    after a save, which writes format 3). Nothing is written through a symbolic link.
    Temporaries are removed on failure, and stale ones of interrupted saves on the next save.
    Refuses a non-empty non-bundle directory.
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


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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
            _fsync_dir(directory.parent)  # the renames themselves survive a power loss
            return
        finally:
            if aside is not None:
                shutil.rmtree(aside, ignore_errors=True)
                with _ACTIVE_LOCK:
                    _ACTIVE.discard(str(aside))
    raise GlcompError(f"{directory}: could not put the bundle in place (other saves kept replacing it)")


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

    def size(self, path: str) -> int | None:
        """The size in bytes of the regular file `path`, or None when it does not exist."""
        folder, _, name = path.rpartition("/")
        dir_fd = self.fd if not folder else self.shaders_dir()
        label = f"shader {name!r}" if folder else repr(name)
        st = None if dir_fd is None else self._stat(name, dir_fd, path, label)
        if st is None:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise GlcompError(f"bundle {path} is not a regular file")
        return st.st_size

    def read(self, path: str, limit: int = MAX_JSON_BYTES) -> bytes | None:
        """The bytes of `path` (``name`` or ``shaders/name``), or None when it does not exist;
        a file larger than `limit` bytes is refused before it is read (its size from stat)."""
        if self.size(path) is None:
            return None
        folder, _, name = path.rpartition("/")
        dir_fd = self.fd if not folder else self.shaders_dir()
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(name, flags, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        except OSError as err:
            raise GlcompError(f"bundle {path}: unreadable ({err.strerror})") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise GlcompError(f"bundle {path} is not a regular file")
            if st.st_size > limit:
                raise GlcompError(f"bundle {path}: larger than {limit} bytes")
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(limit + 1)  # the file may have grown since
        except OSError as err:
            raise GlcompError(f"bundle {path}: unreadable ({err.strerror})") from None
        finally:
            os.close(fd)
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
    and `check_shaders`); no file is read whole before its size is known to be within bounds."""
    directory = Path(directory)
    if not os.path.lexists(directory) and directory.name:
        _clean_stale(Path(os.path.abspath(directory)).parent, directory.name)  # a save killed midway
    reader = _Reader(directory)
    try:
        return _read(reader, texture_budget_bytes, loop_budget, entry_budget)
    finally:
        reader.close()


def weights_limit(manifest: dict[str, Any]) -> int:
    """The most bytes the weights file of the validated `manifest` may hold: its header's
    length and header, and 8 bytes (F64, I64) for every element of every state and counter."""
    elements = sum(math.prod(v["layout"]["shape"]) for v in manifest["states"].values())
    return 8 + MAX_JSON_BYTES + 8 * (elements + len(manifest["counters"]))


def _read(reader: _Reader, texture_budget_bytes: int, loop_budget: int, entry_budget: int) -> Any:
    from glcomp.codegen.bundle import Bundle

    directory = reader.directory
    raw: dict[str, bytes] = {}
    for f in FILES:  # both must exist; the weights are read once the manifest bounds their size
        if reader.size(f) is None:
            raise GlcompError(f"bundle {directory}: {f} is missing")
    data = reader.read("manifest.json")
    if data is None:
        raise GlcompError(f"bundle {directory}: manifest.json is missing")
    manifest = parse_json(data, "manifest.json")
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
            data = reader.read(SHADERS_FILE)
            if data is None:
                raise GlcompError(f"bundle {directory}: {SHADERS_FILE} is missing")
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
    data = reader.read("weights.safetensors", weights_limit(manifest))
    if data is None:
        raise GlcompError(f"bundle {directory}: weights.safetensors is missing")
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
                raise GlcompError(f"bundle {directory}: {PROGRAM_FILE} is missing")
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
