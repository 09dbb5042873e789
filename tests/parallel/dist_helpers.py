"""Launch real training runs for the distributed tests: torchrun with gloo on the CPU, and one plain process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import make_dataset, write_config  # noqa: E402, F401 - re-exported for the tests

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def torchrun(*args: str, nproc: int = 2, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node N -m plelab ARGS` (a free port each time)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "plelab", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=cwd, timeout=timeout)


def plelab(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m plelab ARGS` in one process."""
    return subprocess.run([sys.executable, "-m", "plelab", *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=timeout)


def losses(run: Path) -> dict[int, float]:
    """{step: loss} from a run's metrics.jsonl."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("loss") is not None:
            out[m["step"]] = m["loss"]
    return out


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """proc, asserting it succeeded (its output in the failure message)."""
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def rel_close(a: dict[int, float], b: dict[int, float], rel: float = 1e-5) -> None:
    """Same steps, and every loss equal within `rel` relative."""
    assert sorted(a) == sorted(b)
    for step in a:
        assert abs(a[step] - b[step]) <= rel * abs(b[step]), (step, a[step], b[step])
