"""Real processes: a fine-tune killed with SIGKILL mid-run resumes to the very losses and adapter of an
uninterrupted run, and torchrun (2 ranks, gloo) trains the adapters to the single-process losses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from finetune_helpers import evals, finetune_argv, train_losses
from safetensors.torch import load_file

from plelab.cli.main import main

pytest.importorskip("peft")

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
LONGER = ["--set", "max_steps=40", "--set", "ckpt_every=10", "--set", "log_every=10"]


@pytest.fixture(scope="module")
def reference(make_gemma, finetune_data, tmp_path_factory):
    """(checkpoint, run dir) of one uninterrupted single-process fine-tune."""
    data, valid = finetune_data
    folder, run = make_gemma("gemma4"), tmp_path_factory.mktemp("ft-ref") / "run"
    assert main(finetune_argv(folder, data, valid, run, *LONGER)) == 0
    return folder, run


def _adapter(run):
    return load_file(str(run / "adapter" / "adapter_model.safetensors"))


def test_sigkill_then_resume_gives_the_same_losses_and_adapter(reference, finetune_data, tmp_path):
    folder, ref = reference
    data, valid = finetune_data
    run = tmp_path / "run"
    argv = finetune_argv(folder, data, valid, run, *LONGER)
    proc = subprocess.Popen([sys.executable, "-m", "plelab", *argv], env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    first = run / "checkpoints" / "step_00000010" / "manifest.json"
    deadline = time.monotonic() + 600
    while not first.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (run / "checkpoints" / "step_00000040").exists()  # killed mid-run
    assert main(["finetune", "--out", str(run), "--resume", "--quiet"]) == 0
    assert train_losses(run) == train_losses(ref)  # exact: same batches, RNG, optimizer state
    assert {s: e["macro"] for s, e in evals(run).items()} == {s: e["macro"] for s, e in evals(ref).items()}
    a, b = _adapter(run), _adapter(ref)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert not list(run.glob(".adapter.*")) and not list((run / "checkpoints").glob(".step_*"))


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_torchrun_ddp_trains_the_adapters_to_the_single_process_losses(reference, finetune_data, tmp_path):
    folder, ref = reference
    data, valid = finetune_data
    run = tmp_path / "run"
    argv = finetune_argv(folder, data, valid, run, *LONGER, "--set", "parallel=ddp")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "plelab", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got, want = train_losses(run), train_losses(ref)
    assert sorted(got) == sorted(want)
    # Each rank takes half of every global batch; the averaged gradient is the single process's up to rounding.
    assert all(abs(got[s] - want[s]) <= 1e-4 * abs(want[s]) for s in want), (got, want)
    a, b = _adapter(run), _adapter(ref)  # Adam amplifies the rounding: 6e-4 of the norm measured after 40 steps
    assert a.keys() == b.keys() and all((a[k] - b[k]).norm() <= 2e-3 * b[k].norm() for k in a)
