"""Crash-safe file writing: whole files appear atomically (temp + fsync + rename) and survive power loss."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


def sha256_file(path: str | Path) -> str:
    """Hex sha256 of a file, streamed."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def sampled_sha256(path: str | Path, samples: int = 64, block: int = 1 << 16) -> str:
    """Hex sha256 of a file's size and `samples` blocks spread evenly from its start to its end: reads at most
    samples x block bytes, yet tells apart two large files whose contents differ throughout (other weights of the
    same shape), which mtimes and sizes cannot. Not a guarantee against an edit that touches no sampled block."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        for i in range(samples):
            f.seek(max(0, size - block) * i // max(1, samples - 1))
            h.update(f.read(block))
    return h.hexdigest()


def fsync_dir(path: str | Path) -> None:
    """fsync a directory so a rename inside it survives a crash."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Temp names of `atomic_writer` and `staging_dir`: `.NAME.PID.` + mkstemp's 8 random characters + `.tmp`.
_TEMP_NAME = re.compile(r"^\.(?P<name>.+)\.(?P<pid>\d+)\.[a-z0-9_]{8}\.tmp$")


def remove_stale_temp_files(folder: str | Path) -> list[Path]:
    """Delete the temp files and folders `atomic_writer` / `staging_dir` left in `folder` when their process was
    killed; return them.

    Only entries of their naming (`.NAME.PID.XXXXXXXX.tmp`) whose writer PID no longer runs are removed, so a
    write in progress in another process is never touched.
    """
    removed = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        m = _TEMP_NAME.match(entry.name)
        if not m or pid_alive(int(m["pid"])):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        elif entry.is_file(follow_symlinks=False):
            Path(entry.path).unlink(missing_ok=True)
        else:
            continue
        removed.append(Path(entry.path))
    return removed


def staging_dir(target: str | Path) -> Path:
    """A new hidden folder beside `target` to build it in (then `replace_folder`); named with this process's id,
    so if the process is killed the next staging or atomic write into that folder removes it (a model-sized
    leftover otherwise stays forever)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(target.parent)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp"))


def replace_folder(staged: Path, target: Path) -> None:
    """Rename the complete `staged` folder to `target`; an existing `target` folder is first renamed aside (under a
    temp name, so a kill leaves a leftover the next writer removes) and deleted after: never half of either."""
    aside = None
    if target.exists():
        aside = staging_dir(target)
        os.rename(target, aside)  # over the empty folder just made: atomic
    os.rename(staged, target)
    fsync_dir(target.parent)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


@contextlib.contextmanager
def atomic_writer(path: str | Path, mode: int | None = None) -> Iterator[BinaryIO]:
    """Open a temp file next to `path` for binary writing; on success fsync it and rename it over `path`.

    Readers see the old file or the new one, never half of it; an exception removes the temp file, and a
    killed writer's temp file (its PID is in the name) is removed by the next writer into the folder; a full disk
    or quota is a PlelabError naming the file. `mode` defaults to what the umask allows an ordinary new file.
    """
    path = Path(path)
    remove_stale_temp_files(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            from plelab.errors import PlelabError

            raise PlelabError(f"cannot write {path}: {exc.strerror} (the disk or quota is full); nothing was "
                              "written, an earlier file there is kept") from None
        raise
    fsync_dir(path.parent)


def atomic_write_bytes(path: str | Path, data: bytes, mode: int = 0o644) -> None:
    """Write a whole file atomically (see `atomic_writer`)."""
    with atomic_writer(path, mode) as f:
        f.write(data)


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists (used to tell stale lock/staging folders from live ones)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # OverflowError: not a pid this system can have
        return False
    except PermissionError:
        return True
    return True


def resolve_path(path: str | Path) -> Path:
    """Path(path).resolve(), with a loop of symbolic links a PlelabError (one line) instead of a RuntimeError."""
    from plelab.errors import PlelabError

    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):  # Python < 3.13 raises RuntimeError("Symlink loop ..."), later ones OSError
        raise PlelabError(f"{path} is a loop of symbolic links; give a real file or folder") from None


def check_output_path(
    path: str | Path, *, overwrite: bool = False, inputs: tuple[str | Path, ...] = (), is_dir: bool = False,
    run: bool = False,
) -> Path:
    """Refuse (PlelabError, one line, naming the path) an output path that would lose data or cannot be written.

    Refused whatever `overwrite` says: a dangling symlink; a directory where a file goes (or the reverse; a file
    path spelled with a trailing slash); one of the command's `inputs`, or a path inside an input folder; anything
    that is not a regular file or folder (a device, a FIFO, a socket: a rename would put a plain file in its
    place); a path inside a training run's folder (its checkpoints are pruned, its files are the run's own), or
    a run's folder itself unless `run` (the trainer's own output). Refused unless `overwrite`: an existing file
    or non-empty folder. Also a parent folder that is missing-and-uncreatable or not writable.
    """
    from plelab.errors import PlelabError

    if not is_dir and isinstance(path, str) and path.endswith(("/", os.sep)):
        raise PlelabError(f"output {path} ends in '/', so it names a folder; give a file path")
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise PlelabError(f"output {path} is a dangling symbolic link")
    resolved = resolve_path(path)
    landing = resolve_path(Path(os.path.abspath(path)).parent) / path.name  # the entry a rename would replace
    inputs = tuple(item for item in inputs if item is not None and str(item) != "")
    for item in inputs:
        if _same_file(Path(item), path, resolved):
            raise PlelabError(f"output {path} is also an input of this command ({item}); choose another output path")
    for item in inputs:
        folder = resolve_path(item)
        if folder.is_dir() and (resolved.is_relative_to(folder) or landing.is_relative_to(folder)):
            raise PlelabError(f"output {path} is inside the input folder {item}; write it elsewhere")
    run_dir = run_folder_of(path, itself=is_dir and not run)
    if run_dir is not None:
        where = "is the folder of" if resolve_path(run_dir) == resolved else "lies inside"
        raise PlelabError(f"output {path} {where} the training run {run_dir}, whose files are the run's own "
                          "(checkpoints are pruned, config.json is read on resume); write it outside the run")
    if path.exists():
        mode = path.stat().st_mode
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise PlelabError(f"output {path} is {_file_kind(mode)}, not a regular file; plelab replaces only "
                              "regular files, so choose a file path")
        if is_dir and not path.is_dir():
            raise PlelabError(f"output {path} exists and is not a folder")
        if not is_dir and path.is_dir():
            raise PlelabError(f"output {path} is a folder; give a file path")
        if not overwrite and (not is_dir or any(path.iterdir())):
            raise PlelabError(f"output {path} already exists; pass --overwrite to replace it")
    parent = Path(os.path.abspath(path)).parent  # unresolved: a dangling link on the way must be seen
    while not parent.exists():
        if parent.is_symlink():
            raise PlelabError(f"cannot write {path}: {parent} is a dangling symbolic link")
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise PlelabError(f"cannot write {path}: {parent} is not a writable folder")
    return path


def run_folder_of(path: str | Path, *, itself: bool = False) -> Path | None:
    """The training run folder that `path` lies inside (spelled as given or through its links), or None;
    `itself`: `path` being a run folder counts too."""
    absolute = Path(os.path.abspath(path))
    candidates = [*absolute.parents, *resolve_path(path).parents]
    if itself:
        candidates = [absolute, *candidates]
    for folder in dict.fromkeys(candidates):
        if is_run_folder(folder):
            return folder
    return None


def is_run_folder(folder: str | Path) -> bool:
    """Whether `folder` is a training run's: config.json beside metrics.jsonl or checkpoints/ (the names
    plelab.runs.run_dir gives them; a model folder's config.json stands alone)."""
    folder = Path(folder)
    return (folder / "config.json").is_file() and ((folder / "metrics.jsonl").is_file()
                                                   or (folder / "checkpoints").is_dir())


def _file_kind(mode: int) -> str:
    kinds = {stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device", stat.S_ISFIFO: "a FIFO (named pipe)",
             stat.S_ISSOCK: "a socket"}
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def _same_file(item: Path, path: Path, resolved: Path) -> bool:
    """Whether `path` names the input `item` (same resolved path, or the same file by another name)."""
    if resolve_path(item) == resolved:
        return True
    try:
        return os.path.samefile(item, path)  # hard links, case-insensitive file systems
    except OSError:
        return False
