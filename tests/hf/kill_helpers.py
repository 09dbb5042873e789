"""Run a plelab command in a child process that is killed (SIGKILL) at the moment a folder it built completely is
about to be renamed into place: the worst moment for leftovers, reached deterministically."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

# The child kills itself when it renames a hidden folder holding model.safetensors (the built model folder).
_CHILD = """
import os, signal, sys
from pathlib import Path

def killing(rename):
    def wrapped(src, dst, *args, **kwargs):
        src = Path(src)
        if src.name.startswith(".") and (src / "model.safetensors").is_file():
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(src, dst, *args, **kwargs)
    return wrapped

os.rename, os.replace = killing(os.rename), killing(os.replace)
from plelab.cli.main import main
main(sys.argv[1:])
"""


def killed_before_rename(argv: list[str]) -> None:
    """Run `plelab ARGV` so that it is killed -9 as it renames its finished model folder into place."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, *argv], capture_output=True, text=True, timeout=300,
                          env=env, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]


def hidden_leftovers(folder: Path, name: str) -> list[Path]:
    """Hidden entries beside folder/name that belong to it (temp or renamed-aside folders)."""
    return [p for p in folder.iterdir() if p.name.startswith(f".{name}.")]
