"""The one folder lock: an exclusive flock on a file inside the folder, released by the OS even on kill -9.

It guards a run folder (`RUN_LOCK`: the trainer holds it while it trains into the folder, on rank 0 under
torchrun; a sweep takes it, waiting, before it trains one of its runs, so an orphaned run that is finishing its
last step is waited for, not trained over) and a sweep folder (`SWEEP_LOCK`: one `plelab sweep` at a time).
The holder's pid is written into the file, so a refusal can name it. A hold taken with `share=True` lets
later holds in the same process in (a sweep holds a run's lock and builds the Trainer, which takes it again);
any other second hold is refused, in this process as in another.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from plelab.errors import PlelabError

RUN_LOCK = ".train.lock"
"""In a run folder: held by the one process training into it."""
SWEEP_LOCK = ".lock"
"""In a sweep folder: held by the one `plelab sweep` running it."""

_HELD: dict[str, list[int]] = {}
"""{lock file's real path: [descriptor, holds, shared]} of the locks this process holds."""


class FolderBusy(PlelabError):
    """Another process holds the folder's lock."""


class FolderLock:
    """An exclusive flock on FOLDER/NAME; without `wait` a second holder gets `busy(pid)` (a PlelabError).

    share: later holds in this process join this one instead of being refused. Use it as a context manager or
    call `release()`; both are idempotent.
    """

    def __init__(self, folder: str | Path, name: str = RUN_LOCK, *, wait: bool = False, share: bool = False,
                 busy: Callable[[str], PlelabError] | None = None):
        path = Path(folder) / name
        refuse = busy or (lambda pid: FolderBusy(f"{folder} is in use by another process (pid {pid})"))
        self._key: str | None = os.path.realpath(path)
        held = _HELD.get(self._key)
        if held is not None:  # this process holds it already
            if not held[2]:
                self._key = None
                raise refuse(str(os.getpid()))
            held[1] += 1
            return
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            self._key = None
            raise refuse(holder) from None
        except BaseException:
            os.close(fd)
            self._key = None
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[self._key] = [fd, 1, share]

    def release(self) -> None:
        """Let go of this hold (idempotent); the last hold in the process closes the file, which releases the flock."""
        if self._key is None:
            return
        entry = _HELD[self._key]
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[self._key]
            os.close(entry[0])
        self._key = None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
