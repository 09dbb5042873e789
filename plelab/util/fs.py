"""Crash-safe file writing: whole files appear atomically (temp + fsync + rename) and survive power loss."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write a file via temp file + fsync + rename: readers see the old or the new file, never half."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, mode)  # mkstemp makes 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (used to tell stale lock/staging folders from live ones)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_output_path(
    path: str | Path, *, overwrite: bool = False, inputs: tuple[str | Path, ...] = (), is_dir: bool = False
) -> Path:
    """Refuse (PlelabError, one line) an output path that would lose data or cannot be written; return it.

    Refused: a dangling symlink, a directory where a file goes (or the reverse), a path equal to one of the
    command's `inputs` (never, even with overwrite), an existing file or non-empty folder unless `overwrite`,
    and a parent folder that is missing-and-uncreatable or not writable.
    """
    from plelab.errors import PlelabError

    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise PlelabError(f"output {path} is a dangling symbolic link")
    resolved = path.resolve()
    for item in inputs:
        if item is not None and Path(item).resolve() == resolved:
            raise PlelabError(f"output {path} is also an input of this command; choose another output path")
    if path.exists():
        if is_dir and not path.is_dir():
            raise PlelabError(f"output {path} exists and is not a folder")
        if not is_dir and path.is_dir():
            raise PlelabError(f"output {path} is a folder; give a file path")
        if not overwrite and (not is_dir or any(path.iterdir())):
            raise PlelabError(f"output {path} already exists; pass --overwrite to replace it")
    parent = resolved.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PlelabError(f"cannot write {path}: {parent} is not a writable folder")
    return path
