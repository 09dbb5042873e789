"""The trainer on real files: learning, exact resume after kill -9, NaN handling, disk full, bad config."""

from __future__ import annotations

import errno
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from training_helpers import make_dataset, write_config

from plelab.cli.main import main
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer, TrainingStopped

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
DISK_FULL = "/dev/full"  # every write fails with ENOSPC: torch.save then raises its RuntimeError form
needs_dev_full = pytest.mark.skipif(not os.path.exists(DISK_FULL), reason="needs /dev/full (Linux)")


def losses(run: Path) -> dict[int, float]:
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        m = json.loads(line)
        if m.get("loss") is not None and "eval" not in m:
            out[m["step"]] = m["loss"]
    return out


def train_cli(cfg: Path, out: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "plelab", "train", str(cfg), "--out", str(out), "--quiet", *extra]
    return subprocess.Popen(cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def setup(tmp_path):
    make_dataset(tmp_path)
    return tmp_path


def test_training_lowers_the_loss_and_writes_everything(setup):
    cfg = load_train_config(write_config(setup, max_steps=30, lr=1e-2))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    torch.set_num_threads(1)
    final = trainer.run()
    lo = losses(setup / "run")
    assert final["loss"] < lo[1] - 0.5, lo
    assert set(final["final_eval"]["domains"]) == {"numbers", "prose", "val"}  # val: the held-out split
    assert (setup / "run" / "checkpoints" / "LATEST").read_text() == "step_00000030"
    assert len(list((setup / "run" / "checkpoints").glob("step_*"))) == cfg.keep_checkpoints
    line = json.loads((setup / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert {"step", "loss", "lr", "grad_norm", "tokens_per_s", "mfu"} <= set(line)


NGRAM = ('[model.ple]\nindex = "ngram"\ngate = "engram"\nconv_kernel = 4\ncontext = false\n'
         '[model.ple.ngram]\norders = [2, 3]\nheads = 2\n')
"""An n-gram table (hashed rows, lazy Adam over them) with Engram's gate and convolution."""


@pytest.mark.parametrize("table", ["token", "ngram", "ngram-on-disk"])
def test_kill_9_at_a_random_moment_then_resume_gives_the_exact_same_final_loss(setup, table):
    # On disk the table's files are mid-step when the kill lands: resume rebuilds them from the checkpoint.
    cfg = write_config(setup, max_steps=24, ckpt_every=3, **({"ple_table": "disk"} if "disk" in table else {}))
    if table != "token":
        cfg.write_text(cfg.read_text() + NGRAM.replace("[model.ple]\n", "[model.ple]\ntable_init_std = 0.0\n"
                                                       if "disk" in table else "[model.ple]\n"))
    ref = train_cli(cfg, setup / "ref")
    assert ref.wait(timeout=300) == 0, ref.stderr.read()
    rng = random.Random(os.getpid())
    victim = train_cli(cfg, setup / "killed")
    ckpts = setup / "killed" / "checkpoints"
    deadline = time.time() + 120
    while not (ckpts / "LATEST").exists() and victim.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, 1.5))
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    resumed = train_cli(cfg, setup / "killed", "--resume")
    assert resumed.wait(timeout=300) == 0, resumed.stderr.read()
    a, b = losses(setup / "ref"), losses(setup / "killed")
    assert a[24] == b[24]  # bit-for-bit, not approximately
    assert a == b  # and every logged step agrees, with no duplicates from the killed attempt


def test_a_non_finite_loss_skips_the_step_and_training_goes_on(setup):
    cfg = load_train_config(write_config(setup, max_steps=8))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    real_forward = trainer.model.forward

    def poisoned(x, y=None, cache=None, **kw):
        logits, loss = real_forward(x, y, cache, **kw)
        return logits, loss * float("nan") if trainer.step == 3 else loss

    trainer.model.forward = poisoned
    final = trainer.run()
    assert trainer.skipped_steps == 1 and final["step"] == 8
    lines = [json.loads(x) for x in (setup / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any(m.get("skipped") for m in lines)
    assert all(torch.isfinite(p).all() for p in trainer.model.parameters())


def test_too_many_non_finite_losses_stop_with_the_last_checkpoint_intact(setup):
    cfg = load_train_config(write_config(setup, max_steps=20, ckpt_every=4, max_bad_steps=3))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    real_forward = trainer.model.forward
    def poisoned(x, y=None, cache=None, **kw):
        logits, loss = real_forward(x, y, cache, **kw)
        return logits, loss * (float("inf") if trainer.step >= 5 else 1.0)

    trainer.model.forward = poisoned
    with pytest.raises(TrainingStopped, match="non-finite losses in a row"):
        trainer.run()
    from plelab.inference.load import load_model
    from plelab.runs.checkpoint import resolve_checkpoint

    assert resolve_checkpoint(setup / "run").name == "step_00000004"
    model, _ = load_model(setup / "run")  # checksums verified
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_non_finite_last_steps_are_an_error_that_names_the_checkpoint_that_exists(setup):
    cfg = load_train_config(write_config(setup, max_steps=8, ckpt_every=4, max_bad_steps=5))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    real_forward = trainer.model.forward

    def poisoned(x, y=None, cache=None, **kw):
        logits, loss = real_forward(x, y, cache, **kw)
        return logits, loss * (float("nan") if trainer.step >= 6 else 1.0)

    trainer.model.forward = poisoned
    with pytest.raises(TrainingStopped, match="last 2 step.*no final checkpoint.*step_00000004"):
        trainer.run()


def test_a_stop_before_any_checkpoint_says_there_is_none(setup):
    cfg = load_train_config(write_config(setup, max_steps=20, ckpt_every=10, max_bad_steps=3))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    real_forward = trainer.model.forward

    def poisoned(x, y=None, cache=None, **kw):
        logits, loss = real_forward(x, y, cache, **kw)
        return logits, loss * float("inf")

    trainer.model.forward = poisoned
    with pytest.raises(TrainingStopped, match="no intact checkpoint exists"):
        trainer.run()


@pytest.mark.parametrize("form", ["oserror", "safetensors_error", pytest.param("torch_runtime_error",
                                                                             marks=needs_dev_full)])
def test_disk_full_while_checkpointing_is_a_clear_stop(setup, monkeypatch, form):
    cfg = load_train_config(write_config(setup, max_steps=8, ckpt_every=4))
    trainer = Trainer(cfg, setup / "run", quiet=True)
    import plelab.runs.checkpoint as ck

    name = "save" if form == "torch_runtime_error" else "save_file"
    module = ck.torch if form == "torch_runtime_error" else ck
    real_save = getattr(module, name)
    calls = {"n": 0}

    def flaky_save(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            if form == "oserror":
                raise OSError(errno.ENOSPC, "No space left on device")
            if form == "safetensors_error":  # what safetensors raises on a full disk, verbatim
                raise ck.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
            return real_save(args[0], DISK_FULL)  # torch's own RuntimeError for a full disk
        return real_save(*args, **kwargs)

    monkeypatch.setattr(module, name, flaky_save)
    with pytest.raises(TrainingStopped, match="writ.* checkpoint step_00000008.*step_00000004") as info:
        trainer.run()
    assert "disk full" in str(info.value) and "\n" not in str(info.value)
    ckpts = setup / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir() if not p.name.startswith(".")) == ["LATEST", "step_00000004"]
    assert (ckpts / "LATEST").read_text() == "step_00000004"
    assert not [p for p in ckpts.iterdir() if p.name.startswith(".")]  # no half-written temp dir left


@needs_dev_full
def test_disk_full_in_the_cli_is_one_line_and_exit_2(setup, monkeypatch, capsys):
    import plelab.runs.checkpoint as ck
    from plelab.cli.main import main

    real_save = ck.torch.save
    monkeypatch.setattr(ck.torch, "save", lambda obj, path: real_save(obj, DISK_FULL))
    assert main(["train", str(write_config(setup, max_steps=4)), "--out", str(setup / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "disk full" in err and "no intact checkpoint" in err, err


@pytest.mark.parametrize("override", ["model.rope_theta=inf", "weight_decay=nan", "lr=Infinity", "beta1=-inf"])
def test_non_finite_config_values_fail_validation(setup, override):
    from plelab.util.dataclass_config import ConfigError

    with pytest.raises(ConfigError, match="finite"):
        load_train_config(write_config(setup), [override])


@pytest.mark.parametrize("override", ["eval_tokens=-5", "max_bad_steps=0", "warmup_steps=-1", "eval_every=-1",
                                      "diagnostics_every=-1", "weight_decay=-0.1", "grad_clip=-1", "beta1=1",
                                      "beta2=-0.5", "early_warning_fraction=2", "early_warning_fraction=0"])
def test_out_of_range_config_values_fail_validation(setup, override):
    from plelab.util.dataclass_config import ConfigError

    with pytest.raises(ConfigError, match=override.split("=")[0]):
        load_train_config(write_config(setup), [override])


def test_non_finite_values_in_a_config_file_fail_validation(setup):
    from plelab.util.dataclass_config import ConfigError

    path = write_config(setup)
    path.write_text(path.read_text().replace("lr = ", "min_lr_ratio = nan\nlr = "))
    with pytest.raises(ConfigError, match="min_lr_ratio: expected a finite number"):
        load_train_config(path)


def test_cli_bad_inputs_are_one_line(setup, capsys):
    cases = [
        (["--set", "batch_size=0"], "batch_size must be > 0"),
        (["--set", "data=/nonexistent"], "/nonexistent"),
        (["--set", "model.vocab_size=100"], "vocab mismatch"),
        (["--set", "model.num_heads=3"], "does not divide"),
    ]
    cfg = write_config(setup)
    # The first case through the real console entry (a process, its exit status); the rest in this process
    # (the same main(), without paying a Python + torch start-up per case).
    (extra, message), rest = cases[0], cases[1:]
    out = subprocess.run([sys.executable, "-m", "plelab", "train", str(cfg), "--out", str(setup / "x"), *extra],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode == 2, (extra, out.stderr)
    assert message in out.stderr and "Traceback" not in out.stderr, out.stderr
    for extra, message in rest:
        capsys.readouterr()
        assert main(["train", str(cfg), "--out", str(setup / "x"), *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_starting_over_an_existing_run_is_refused(setup):
    cfg = load_train_config(write_config(setup, max_steps=4))
    Trainer(cfg, setup / "run", quiet=True).run()
    with pytest.raises(Exception, match="--resume"):
        Trainer(cfg, setup / "run", quiet=True)


def test_a_step_brings_values_to_the_host_as_often_whatever_the_micro_batches(setup):
    """No device-to-host sync per micro-batch (the ids are checked by the loader, the losses fetched once a step):
    the count of host-bound tensor calls in one step is the same for 1 and 4 micro-batches. kernels=off: the path
    an accelerator takes (the CPU kernels are host code anyway)."""
    from torch.overrides import TorchFunctionMode

    class HostSyncs(TorchFunctionMode):
        def __init__(self):
            super().__init__()
            self.count = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") in {"item", "__bool__", "tolist", "__int__", "__float__", "cpu"}:
                self.count += 1
            return func(*args, **(kwargs or {}))

    counts = {}
    config = write_config(setup)
    for accum in (1, 4):
        cfg = load_train_config(config, [f"grad_accum={accum}", "model.kernels=off"])
        trainer = Trainer(cfg, setup / f"syncs-{accum}", quiet=True)
        trainer.train_step()  # the first step warms up (lazy optimizer state)
        with HostSyncs() as watch:
            assert trainer.train_step() is not None
        counts[accum] = watch.count
        trainer.close()
    assert counts[4] == counts[1], counts
