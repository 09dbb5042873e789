"""Launch real training runs for the distributed tests: torchrun with gloo on the CPU, and one plain process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import make_dataset, write_config  # noqa: E402, F401 - re-exported for the tests

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def launch(cmd: list[str], cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """Run cmd in a session of its own; past timeout, kill the whole session and fail with what it printed.

    Why the session: a timeout kills only torchrun itself, and a rank it started would live on, an orphan holding
    a core for the rest of the suite."""
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, cwd=cwd,
                           start_new_session=True)
    try:
        out, err = job.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        out, err = job.communicate()
        raise AssertionError(f"{' '.join(cmd[:6])} ... still running after {timeout:g} s; its output:\n"
                             + out[-2000:] + err[-3000:]) from None
    return subprocess.CompletedProcess(cmd, job.returncode, out, err)


def torchrun(*args: str, nproc: int = 2, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node N -m plelab ARGS` (a free port each time)."""
    return launch([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
                   "-m", "plelab", *args], cwd, timeout)


def plelab(*args: str, cwd: Path | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
    """`python -m plelab ARGS` in one process."""
    return launch([sys.executable, "-m", "plelab", *args], cwd, timeout)


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
