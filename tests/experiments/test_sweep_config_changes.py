"""A run's checkpoints and result belong to its config: a changed sweep file is refused or, when asked, redone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweep_helpers import write_sweep

from plelab.cli.main import main
from plelab.errors import PlelabError
from plelab.experiments.sweep import config_hash, load_sweep
from plelab.experiments.sweep_runner import RESULT_FILE, changed_fields, execute_point, prepare, run_sweep
from plelab.experiments.sweep_store import SweepStore
from plelab.training.callbacks import Callback
from plelab.training.config import TrainConfig, train_config_dict

QUIET = dict(quiet=True, say=lambda _: None)
FAST = dict(max_steps=4, ckpt_every=2, log_every=2, diagnostics_every=0)


class _FailAfterCheckpoint(Callback):
    """Raise once the first checkpoint is written: an interrupted run with work to resume."""

    def on_checkpoint(self, trainer, ckpt_dir) -> None:
        raise RuntimeError("stop here")


def test_a_finished_run_whose_config_changed_is_refused_and_its_result_kept(tiny_data):
    path = write_sweep(tiny_data, "seed = [1]", **FAST)
    assert run_sweep(load_sweep(path), **QUIET) == {"done": 1}
    sweep = load_sweep(path, ["base.lr=0.001"])
    result = (sweep.run_dir("seed=1") / RESULT_FILE).read_bytes()
    with pytest.raises(PlelabError, match=r"seed=1 \(lr\).*--restart-changed"):
        run_sweep(sweep, **QUIET)
    assert (sweep.run_dir("seed=1") / RESULT_FILE).read_bytes() == result
    with SweepStore(sweep.db_path) as store:
        (row,) = store.runs()
    assert row["config"]["lr"] == 0.003 and row["status"] == "done"


def test_restart_changed_sets_the_old_run_aside_and_trains_the_new_config(tiny_data, capsys):
    path = write_sweep(tiny_data, "seed = [1]", **FAST)
    assert run_sweep(load_sweep(path), **QUIET) == {"done": 1}
    assert main(["sweep", str(path), "--quiet", "--set", "base.lr=0.001"]) == 2
    assert "seed=1 (lr)" in capsys.readouterr().err
    assert main(["sweep", str(path), "--quiet", "--set", "base.lr=0.001", "--restart-changed"]) == 0
    out = capsys.readouterr().out
    assert "seed=1: config changed (lr)" in out and "0 done, 1 to run" in out
    sweep = load_sweep(path, ["base.lr=0.001"])
    with SweepStore(sweep.db_path) as store:
        (row,) = store.runs()
    assert row["config"]["lr"] == 0.001 and row["status"] == "done" and row["attempts"] == 1
    result = json.loads((sweep.run_dir("seed=1") / RESULT_FILE).read_text())
    assert result["config_hash"] == sweep.points[0].config_hash
    (old,) = (sweep.folder / "superseded").iterdir()
    assert old.name.startswith("seed=1@")
    assert json.loads((old / "sweep_config.json").read_text())["config"]["lr"] == 0.003


def test_a_result_json_left_by_another_config_is_not_recorded_as_this_configs_result(tiny_data):
    path = write_sweep(tiny_data, "seed = [1]", **FAST)
    sweep = load_sweep(path)
    assert run_sweep(sweep, **QUIET) == {"done": 1}
    sweep.db_path.unlink()  # the database is lost (or moved aside); the run folder and its result.json remain
    with pytest.raises(PlelabError, match=r"seed=1 \(max_steps\)"):
        run_sweep(load_sweep(path, ["base.max_steps=6"]), **QUIET)


def test_an_interrupted_run_does_not_resume_under_edited_hyper_parameters(tiny_data):
    path = write_sweep(tiny_data, "seed = [1]", **{**FAST, "max_steps": 6})
    sweep = load_sweep(path)
    store, _ = prepare(sweep)
    with store:
        assert execute_point(sweep, sweep.points[0], store, extra_callbacks=[_FailAfterCheckpoint()]) == "failed"
    assert (sweep.run_dir("seed=1") / "checkpoints").is_dir()
    with pytest.raises(PlelabError, match=r"seed=1 \(lr, warmup_steps\)"):
        run_sweep(load_sweep(path, ["base.lr=0.01", "base.warmup_steps=1"]), **QUIET)
    assert run_sweep(load_sweep(path), **QUIET) == {"done": 1}  # unchanged: it resumes


def test_a_run_that_failed_before_any_work_takes_the_corrected_config(tiny_data):
    missing = tiny_data / "missing"
    path = write_sweep(tiny_data, "seed = [1]", **{**FAST, "data": str(missing)})
    assert run_sweep(load_sweep(path), **QUIET) == {"failed": 1}
    assert run_sweep(load_sweep(path, [f"base.data={json.dumps(str(tiny_data / 'data'))}"]), **QUIET) == {"done": 1}


def test_a_corrupt_database_is_one_line_and_left_untouched(tiny_data, capsys):
    path = write_sweep(tiny_data, "seed = [1]", **FAST)
    db = Path(load_sweep(path).db_path)
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database, just some bytes" * 100)
    for argv in (["sweep", str(path)], ["sweep", str(path), "--status"], ["report", str(db.parent)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "not a readable sweep database" in err, err
    assert db.read_bytes() == b"not a database, just some bytes" * 100
    assert not (db.parent / "sweep.json").exists()


def test_a_field_added_after_the_run_started_counts_only_when_set_off_its_default():
    from plelab.experiments.sweep_store import config_diff

    defaults = {"lr": 1e-3, "model": {"kernels": "auto", "hidden_size": 64}}
    old = {"lr": 1e-3, "model": {"hidden_size": 64}}  # written before `kernels` existed
    assert config_diff(old, {"lr": 1e-3, "model": {"hidden_size": 64, "kernels": "auto"}}, defaults) == []
    assert config_diff(old, {"lr": 1e-3, "model": {"hidden_size": 64, "kernels": "off"}}, defaults) == [
        "model.kernels"]
    assert config_diff(old, {"lr": 2e-3, "model": {"hidden_size": 64, "kernels": "auto"}}) == [
        "lr", "model.kernels"]  # without defaults every new key counts


def test_the_parallel_auto_default_keeps_old_hashes_and_old_runs_unchanged(tiny_data):
    """parallel's default went from "none" to "auto": in one process (where sweeps train) they are the same run."""
    auto, former = train_config_dict(TrainConfig()), train_config_dict(TrainConfig(parallel="none"))
    assert auto["parallel"] == "auto" and config_hash(auto) == config_hash(former)
    assert config_hash(train_config_dict(TrainConfig(parallel="ddp"))) != config_hash(former)
    sweep = load_sweep(write_sweep(tiny_data, "seed = [1]", **FAST))
    (point,) = sweep.points
    old_row = {"status": "done", "config": {**point.config_dict(), "parallel": "none"}}
    assert changed_fields(point, sweep.run_dir(point), old_row) == []
    assert changed_fields(point, sweep.run_dir(point), {**old_row, "config": {**old_row["config"], "lr": 1.0}}) \
        == ["lr"]
