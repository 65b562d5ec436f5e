"""Atomic file writes: a reader sees the old file or the new one, never a part of either.

The bytes go to a fresh temporary beside the target, are fsynced, renamed over the target, and the
directory is fsynced so the rename survives a power loss (where the filesystem allows it).
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync the file or directory `path` (a directory: so renames in it are durable); nothing where
    the filesystem refuses."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the rename itself is done
    finally:
        os.close(fd)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace `path` by a file holding `data` atomically (see the module docstring). Raises the
    OSError of a failed write with no temporary left behind."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_path(path.parent)
    return path
