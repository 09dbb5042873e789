"""`plelab train` cannot lose a run: locked run dirs, no silent overwrite, recorded resume changes, leftovers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from training_helpers import make_dataset, write_config

from plelab.cli.main import main
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


@pytest.fixture
def setup(tmp_path):
    make_dataset(tmp_path)
    return tmp_path


def train(capsys, *argv: str) -> tuple[int, str, str]:
    """Run `plelab train ARGV --quiet` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    rc = main(["train", *argv, "--quiet"])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(err: str, *needles: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def steps_logged(run: Path) -> list[int]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [m["step"] for m in lines if "loss" in m]


def test_a_second_train_on_a_busy_run_dir_is_refused_and_the_first_is_unharmed(setup):
    cfg = write_config(setup, max_steps=8)
    first = Trainer(load_train_config(cfg), setup / "run", quiet=True)  # holds the run dir from here on
    second = subprocess.run([sys.executable, "-m", "plelab", "train", str(cfg), "--out", str(setup / "run")],
                            capture_output=True, text=True, env=ENV, timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    one_line_error(second.stderr, "in use by another training process", f"pid {os.getpid()}")
    first.run()
    assert steps_logged(setup / "run") == list(range(1, 9))
    assert (setup / "run" / "checkpoints" / "LATEST").read_text() == "step_00000008"


def test_train_into_a_folder_that_is_not_this_run_is_refused_unless_overwrite(setup, capsys):
    cfg = write_config(setup, max_steps=4)
    foreign = setup / "notes"
    foreign.mkdir()
    (foreign / "config.json").write_text('{"mine": true}')
    (foreign / "metrics.jsonl").write_text("precious\n")
    for extra in ((), ("--overwrite",)):  # a config.json that is not a run's is never replaced
        rc, _, err = train(capsys, str(cfg), "--out", str(foreign), *extra)
        assert rc == 2
        one_line_error(err, "holds config.json, which is not a plelab run's", "pick a new --out")
    assert (foreign / "config.json").read_text() == '{"mine": true}'
    assert (foreign / "metrics.jsonl").read_text() == "precious\n"

    other = setup / "other"
    other.mkdir()
    (other / "paper.txt").write_text("draft")
    rc, _, err = train(capsys, str(cfg), "--out", str(other))
    assert rc == 2
    one_line_error(err, "not a plelab run")
    assert train(capsys, str(cfg), "--out", str(other), "--overwrite")[0] == 0
    assert (other / "paper.txt").read_text() == "draft"  # overwrite replaces the run, not unrelated files
    assert steps_logged(other) == [1, 2, 3, 4]

    rc, _, err = train(capsys, str(cfg), "--out", str(other))  # a finished run: only --resume or --overwrite
    assert rc == 2
    one_line_error(err, "--resume")
    assert train(capsys, str(cfg), "--out", str(other), "--overwrite", "--set", "max_steps=2")[0] == 0
    assert steps_logged(other) == [1, 2]
    assert sorted(p.name for p in (other / "checkpoints").iterdir()) == ["LATEST", "step_00000002"]


def test_resume_applies_allowed_changes_and_records_them(setup, capsys):
    cfg = write_config(setup, max_steps=4)
    run = setup / "run"
    assert train(capsys, str(cfg), "--out", str(run))[0] == 0
    assert train(capsys, "--out", str(run), "--resume", "--set", "max_steps=6", "--set", "log_every=2")[0] == 0
    assert steps_logged(run) == [1, 2, 3, 4, 5, 6]
    assert json.loads((run / "config.json").read_text())["max_steps"] == 6
    history = [json.loads(x) for x in (run / "config_history.jsonl").read_text().splitlines()]
    assert history == [{"step": 4, "time": history[0]["time"], "changes": {
        "log_every": {"old": 4, "new": 2}, "max_steps": {"old": 4, "new": 6}}}]
    # A plain resume afterwards keeps the recorded max_steps (nothing left to do, nothing new recorded).
    assert train(capsys, "--out", str(run), "--resume")[0] == 0
    assert len((run / "config_history.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(("override", "field"), [("lr=0.1", "lr"), ("model.hidden_size=64", "model.hidden_size"),
                                                 ("seed=7", "seed")])
def test_resume_refuses_other_changes_in_one_line(setup, capsys, override, field):
    cfg = write_config(setup, max_steps=4)
    run = setup / "run"
    assert train(capsys, str(cfg), "--out", str(run))[0] == 0
    before = (run / "config.json").read_text()
    rc, _, err = train(capsys, "--out", str(run), "--resume", "--set", "max_steps=8", "--set", override)
    assert rc == 2
    one_line_error(err, f"cannot change {field} on resume")
    assert (run / "config.json").read_text() == before
    assert not (run / "config_history.jsonl").exists()


def test_resume_of_a_missing_run_is_an_error(setup, capsys):
    cfg = write_config(setup, max_steps=4)
    rc, _, err = train(capsys, str(cfg), "--out", str(setup / "typo"), "--resume")
    assert rc == 2
    one_line_error(err, "typo does not exist", "drop --resume")
    assert not (setup / "typo").exists()


def test_resume_skips_a_corrupt_newest_checkpoint_and_says_so(setup, capsys):
    cfg = write_config(setup, max_steps=8, ckpt_every=4)
    run = setup / "run"
    assert train(capsys, str(cfg), "--out", str(run))[0] == 0
    ref = (run / "metrics.jsonl").read_text()
    weights = run / "checkpoints" / "step_00000008" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-10])
    capsys.readouterr()
    assert main(["train", "--out", str(run), "--resume"]) == 0
    out = capsys.readouterr().out
    assert "skipping step_00000008: " in out and "checksum" in out
    assert "resumed from" in out and "step_00000004" in out
    assert (run / "metrics.jsonl").read_text().count('"step": 8, "loss"') == 1
    assert [json.loads(x)["loss"] for x in (run / "metrics.jsonl").read_text().splitlines() if "eval" not in x] == [
        json.loads(x)["loss"] for x in ref.splitlines() if "eval" not in x]


def test_leftovers_of_killed_writers_and_pruners_are_removed_on_the_next_run(setup, capsys):
    cfg = write_config(setup, max_steps=4)
    run = setup / "run"
    assert train(capsys, str(cfg), "--out", str(run))[0] == 0
    ckpts = run / "checkpoints"
    half = ckpts / "step_00000002"  # a prune killed after the manifest went
    shutil.copytree(ckpts / "step_00000004", half)
    (half / "manifest.json").unlink()
    (ckpts / ".step_00000006.tmpab12").mkdir()  # a save killed mid-write
    (ckpts / ".step_00000001.deleting").mkdir()
    (ckpts / ".LATEST.x1y2.tmp").write_text("step_")
    assert train(capsys, "--out", str(run), "--resume", "--set", "max_steps=5")[0] == 0
    assert sorted(p.name for p in ckpts.iterdir()) == ["LATEST", "step_00000004", "step_00000005"]


def test_a_kill_during_pruning_never_leaves_a_half_checkpoint(setup, monkeypatch):
    import plelab.runs.checkpoint as ck

    cfg = load_train_config(write_config(setup, max_steps=8, ckpt_every=4, keep_checkpoints=1))
    real_rmtree = shutil.rmtree

    def killed_rmtree(path, *args, **kwargs):
        (Path(path) / "manifest.json").unlink()
        raise KeyboardInterrupt  # as if killed part-way through the delete

    trainer = Trainer(cfg, setup / "run", quiet=True)
    monkeypatch.setattr(ck.shutil, "rmtree", killed_rmtree)
    with pytest.raises(KeyboardInterrupt):
        trainer.run()
    monkeypatch.setattr(ck.shutil, "rmtree", real_rmtree)
    ckpts = setup / "run" / "checkpoints"
    assert all((p / "manifest.json").is_file() for p in ckpts.glob("step_*"))


@pytest.mark.parametrize("suffix", [".toml", ".yaml", ".json"])
def test_a_non_utf8_config_file_is_one_line(setup, capsys, suffix):
    bad = setup / f"bad{suffix}"
    bad.write_bytes(b"max_steps = 4\n# caf\xe9 \xff\n")
    rc, _, err = train(capsys, str(bad), "--out", str(setup / "run"))
    assert rc == 2
    one_line_error(err, "not UTF-8")


def test_an_unknown_or_unavailable_device_is_one_line(setup, capsys):
    cfg = write_config(setup, max_steps=4)
    rc, _, err = train(capsys, str(cfg), "--out", str(setup / "run"), "--set", "device=foo")
    assert rc == 2
    one_line_error(err, "unknown device 'foo'")
    assert not (setup / "run").exists()


def test_a_replaced_tokenizer_in_the_prepared_data_is_refused(setup, capsys):
    from plelab.data.tokenizer import Tokenizer

    cfg = write_config(setup, max_steps=2)
    Tokenizer.byte_level(extra_special_tokens=["<|other|>"]).save(setup / "data" / "tokenizer.json")
    rc, _, err = train(capsys, str(cfg), "--out", str(setup / "run"))
    assert rc == 2
    one_line_error(err, "data/tokenizer.json is not the tokenizer", "was prepared with", "prepare the data again")
    assert not (setup / "run").exists()
