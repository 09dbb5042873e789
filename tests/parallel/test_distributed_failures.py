"""Failures under torchrun: a killed rank stops the job cleanly; bad input is one line from rank 0, exit 2."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_helpers import ENV, losses, make_dataset, ok, plelab, rel_close, torchrun, write_config

from plelab.runs.checkpoint import newest_verified_checkpoint, verify_checkpoint


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dist_fail")
    make_dataset(root)
    write_config(root, max_steps=40, ckpt_every=2, keep_checkpoints=2, warmup_steps=2, log_every=1,
                 eval_data="", dtype="fp32", device="cpu", parallel="ddp")
    return root


def rank_pid(launcher: int, rank: int) -> int | None:
    """The pid of torchrun worker `rank` (a child of the launcher, found by its RANK variable)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            env = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == launcher and f"RANK={rank}".encode() in env:
            return int(entry.name)
    return None


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("plelab train: error:")]


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_kill_9_of_one_rank_stops_the_job_keeps_the_checkpoint_and_resume_continues_exactly(root):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "plelab", "train", "train.toml", "--out", "run", "--quiet"]
    job = subprocess.Popen(cmd, cwd=root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpts = root / "run" / "checkpoints"
    deadline = time.monotonic() + 120
    while not (ckpts / "step_00000004").is_dir() and time.monotonic() < deadline and job.poll() is None:
        time.sleep(0.02)
    pid = rank_pid(job.pid, 1)
    assert pid is not None and job.poll() is None, "the run ended before it could be killed"
    os.kill(pid, signal.SIGSTOP)  # freeze it mid-run first, so the kill lands while rank 0 waits on it
    killed_after = max(losses(root / "run"))
    os.kill(pid, signal.SIGKILL)
    _, err = job.communicate(timeout=120)
    assert job.returncode != 0
    said = [line for line in err.splitlines() if "another rank died or stopped responding" in line]
    assert said and "continue with --resume" in said[0], err[-2000:]
    assert killed_after < 40
    newest, skipped = newest_verified_checkpoint(root / "run")
    assert not skipped
    verify_checkpoint(newest)  # the last complete checkpoint is intact
    before = losses(root / "run")
    ok(torchrun("train", "--out", "run", "--resume", "--quiet", cwd=root))
    after = losses(root / "run")
    assert sorted(after) == list(range(1, 41))
    step = int(newest.name.removeprefix("step_"))
    for s in range(step + 1, max(before) + 1):  # same ranks, same batches: bit-identical continuation
        assert after[s] == before[s], (s, after[s], before[s])
    ok(plelab("train", "train.toml", "--out", "ref", "--quiet", "--set", "parallel=none", cwd=root))
    rel_close(after, losses(root / "ref"))


def test_sigterm_to_torchrun_makes_every_rank_save_the_same_step(root):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "plelab",
           "train", "train.toml", "--out", "term", "--quiet", "--set", "max_steps=400", "--set", "ckpt_every=100"]
    job = subprocess.Popen(cmd, cwd=root, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = root / "term" / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and job.poll() is None and \
            (not metrics.is_file() or len(metrics.read_text().splitlines()) < 3):
        time.sleep(0.02)
    job.send_signal(signal.SIGTERM)  # what Slurm sends before the time limit
    job.communicate(timeout=120)
    newest, skipped = newest_verified_checkpoint(root / "term")
    assert not skipped and int(newest.name.removeprefix("step_")) == max(losses(root / "term")) < 400


def test_world_size_not_dividing_the_batch_is_one_line_exit_2_and_writes_nothing(root):
    proc = torchrun("train", "train.toml", "--out", "odd", "--set", "batch_size=3", cwd=root)
    assert error_lines(proc) == [
        "plelab train: error: batch_size 3 is the global batch and must be divisible by the world size 2; "
        "pick a multiple of 2"]
    assert "exitcode  : 2" in proc.stderr
    assert not (root / "odd").exists()


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_sharded_checkpoint_with_a_missing_shard_is_refused(root, tmp_path):
    ok(torchrun("train", "train.toml", "--out", "short", "--quiet", "--set", "max_steps=2", cwd=root))
    run = shutil.copytree(root / "short", tmp_path / "short")
    ckpt = run / "checkpoints" / "step_00000002"
    (ckpt / "__1_0.distcp").unlink()
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file()}
    proc = plelab("eval", str(ckpt), "--data", str(root / "valid"))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert "__1_0.distcp is missing" in proc.stderr
    proc = torchrun("train", "--out", str(run), "--resume", "--set", "max_steps=4")
    assert len(error_lines(proc)) == 1 and "__1_0.distcp is missing" in error_lines(proc)[0]
    assert "exitcode  : 2" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*") if p.is_file() and p.name != ".train.lock"} == \
        {p: t for p, t in before.items() if p.name != ".train.lock"}


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_resume_with_a_changed_model_shape_is_one_line_exit_2(root):
    if not (root / "short").is_dir():
        ok(torchrun("train", "train.toml", "--out", "short", "--quiet", "--set", "max_steps=2", cwd=root))
    before = {p: p.stat().st_mtime_ns for p in (root / "short").rglob("*") if p.is_file()}
    proc = torchrun("train", "--out", "short", "--resume", "--set", "model.ple.dim=4", cwd=root)
    lines = error_lines(proc)
    assert len(lines) == 1 and "cannot change model.ple.dim on resume" in lines[0]
    assert "exitcode  : 2" in proc.stderr
    after = {p: p.stat().st_mtime_ns for p in (root / "short").rglob("*") if p.is_file()}
    assert {p: t for p, t in after.items() if p.name != ".train.lock"} == \
        {p: t for p, t in before.items() if p.name != ".train.lock"}
