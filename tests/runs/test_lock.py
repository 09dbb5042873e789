"""The one folder lock: exclusive across processes and within one, shared only where a holder lets it be."""

from __future__ import annotations

import subprocess
import sys

import pytest

from plelab.runs.lock import RUN_LOCK, FolderBusy, FolderLock
from plelab.runs.run_dir import RunDirError, RunLock

HOLD = ("import sys, time; from plelab.runs.lock import FolderLock; lock = FolderLock(sys.argv[1]); "
        "print('held', flush=True); time.sleep(60)")


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy, match=f"pid {holder.pid}"):
            FolderLock(tmp_path)
        with pytest.raises(RunDirError, match=f"in use by another training process \\(pid {holder.pid}\\)"):
            RunLock(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    with FolderLock(tmp_path):  # the OS released it with the killed process
        assert (tmp_path / RUN_LOCK).read_text().strip().isdigit()


def test_within_a_process_only_a_shared_hold_lets_a_second_one_in(tmp_path):
    first = RunLock(tmp_path)
    with pytest.raises(RunDirError):
        RunLock(tmp_path)
    first.release()
    first.release()  # idempotent
    with FolderLock(tmp_path, wait=True, share=True):
        inner = RunLock(tmp_path)  # a sweep's hold, then its Trainer's
        inner.release()
        other = subprocess.run([sys.executable, "-c", "import sys; from plelab.runs.lock import FolderLock; "
                                "FolderLock(sys.argv[1])", str(tmp_path)], capture_output=True, text=True)
        assert other.returncode != 0 and "FolderBusy" in other.stderr  # another process is still refused
    RunLock(tmp_path).release()  # free again


def test_the_sweep_folder_lock_is_another_file(tmp_path):
    with FolderLock(tmp_path, ".lock"), FolderLock(tmp_path, RUN_LOCK):
        pass
