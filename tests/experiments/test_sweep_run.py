"""Running sweeps: the database records everything, finished runs are skipped, a kill -9 is survived."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sweep_helpers import write_sweep

from plelab.cli.main import main
from plelab.diagnostics.verdict import USED as USED_VERDICTS
from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_runner import SweepLocked, run_sweep, sweep_lock, sweep_status, training_left
from plelab.experiments.sweep_store import SweepStore
from plelab.runs.metrics import read_metrics

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}


def sweep_cli(path: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "plelab", "sweep", str(path), "--quiet", *extra], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def assert_each_step_logged_once(run_dir: Path, max_steps: int) -> None:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m["step"] for m in lines if "eval" not in m]
    assert steps == list(range(1, max_steps + 1)), steps


def test_the_database_holds_config_status_summary_and_per_domain_evaluation(finished_sweep):
    with SweepStore(finished_sweep / "sweep.sqlite") as store:
        runs, evals, meta = store.runs(), store.evals(), store.meta()
    assert [r["name"] for r in runs] == ["seed=1,dim=0", "seed=1,dim=8", "seed=2,dim=0", "seed=2,dim=8"]
    assert meta["grid"] == {"seed": [1, 2], "model.ple.dim": [0, 8]}
    for r in runs:
        assert r["status"] == "done" and r["attempts"] == 1 and r["error"] is None
        assert r["config"]["model"]["ple"]["dim"] == r["ple_dim"] == r["point"]["model.ple.dim"]
        assert r["config"]["seed"] == r["seed"] and r["steps"] == 12 and r["tokens"] == 12 * 4 * 32
        assert r["params_total"] == r["params_base"] + r["params_added"]
        assert (r["params_added"] > 0) == (r["ple_dim"] > 0)
        assert set(evals[r["name"]]) == {"numbers", "prose", "val"}  # val: the held-out split
        summary = r["summary"]["final_eval"]
        assert r["eval_loss"] == summary["macro"]["loss"]
        assert evals[r["name"]]["prose"]["loss"] == summary["domains"]["prose"]["loss"]
        if r["ple_dim"]:  # PLEMonitor ran: early and final verdicts recorded
            used = USED_VERDICTS
            assert r["verdict_final"] in used and r["verdict_early"] in used
            assert r["early_matches"] in (0, 1)
        else:
            assert r["verdict_final"] is None
    db = sqlite3.connect(finished_sweep / "sweep.sqlite")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_a_rerun_skips_finished_runs(finished_sweep, capsys):
    before = {p: p.stat().st_mtime_ns for p in finished_sweep.glob("runs/*/metrics.jsonl")}
    assert main(["sweep", str(finished_sweep.parent / "sweep.toml"), "--quiet"]) == 0
    assert "4 done, 0 to run" in capsys.readouterr().out
    assert {p: p.stat().st_mtime_ns for p in finished_sweep.glob("runs/*/metrics.jsonl")} == before
    with SweepStore(finished_sweep / "sweep.sqlite") as store:
        assert all(r["attempts"] == 1 for r in store.runs())


def test_status_json_counts_and_progress(finished_sweep, capsys):
    assert main(["sweep", str(finished_sweep.parent / "sweep.toml"), "--status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"] == {"done": 4} and status["progress"] == 1.0
    assert [r["step"] for r in status["runs"]] == [12] * 4


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_kill_9_mid_sweep_then_rerun_finishes_every_run_exactly_once(tiny_data):
    path = write_sweep(tiny_data, '"model.ple.dim" = [0, 8, 16]', max_steps=16, ckpt_every=2)
    sweep = load_sweep(path)
    second = sweep.run_dir(sweep.points[1])
    victim = sweep_cli(path)
    for line in victim.stdout:  # one line per run start and end
        if "dim=0: done" in line:
            break
    deadline = time.time() + 120
    while not (second / "checkpoints" / "LATEST").exists() and time.time() < deadline:
        time.sleep(0.02)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    status = {r["name"]: r for r in sweep_status(sweep)["runs"]}
    assert status["dim=0"]["status"] == "done"
    assert status["dim=8"]["status"] == "interrupted" and 0 < status["dim=8"]["step"] < 16
    assert status["dim=16"]["status"] == "pending"
    rate = status["dim=0"]["train_seconds"] / status["dim=0"]["step"]
    left = (16 - status["dim=8"]["step"] + 16) * rate  # one at a time
    assert sweep_status(sweep)["training_left_seconds"] == pytest.approx(left)
    first_done = (sweep.run_dir(sweep.points[0]) / "metrics.jsonl").stat().st_mtime_ns

    again = sweep_cli(path)
    out = again.communicate(timeout=600)[0]
    assert again.returncode == 0, out
    assert "1 done, 2 to run" in out
    with SweepStore(sweep.db_path) as store:
        runs = {r["name"]: r for r in store.runs()}
        evals = store.evals()
    assert {n: (r["status"], r["attempts"]) for n, r in runs.items()} == {
        "dim=0": ("done", 1), "dim=8": ("done", 2), "dim=16": ("done", 1)}
    assert (sweep.run_dir(sweep.points[0]) / "metrics.jsonl").stat().st_mtime_ns == first_done
    for point in sweep.points:
        assert_each_step_logged_once(sweep.run_dir(point), 16)
        assert len(evals[point.name]) == 3
    assert "resumed from" in (second / "train.log").read_text()


def test_subprocess_runs_in_parallel_and_a_failing_run_is_recorded_not_fatal(tiny_data, capsys):
    path = write_sweep(tiny_data, f'data = ["{tiny_data / "data"}", "{tiny_data / "missing"}"]',
                       options="parallel = 2", diagnostics_every=0, max_steps=6)
    assert main(["sweep", str(path), "--quiet"]) == 1
    status = sweep_status(load_sweep(path))
    by_status = {r["status"]: r for r in status["runs"]}
    assert set(by_status) == {"done", "failed"}
    assert "missing" in by_status["failed"]["error"]
    assert status["counts"] == {"done": 1, "failed": 1}
    train, evals = read_metrics(load_sweep(path).folder / "runs" / by_status["done"]["name"])
    assert len(train) == 6 and len(evals) == 1
    capsys.readouterr()
    assert main(["sweep", str(path), "--status"]) == 0
    assert "failed" in capsys.readouterr().out


@pytest.mark.parametrize("options", ["", "subprocess = true"])
def test_a_failed_run_prints_its_reason_and_a_retry_that_succeeds_removes_its_error_file(tiny_data, options,
                                                                                           capsys):
    import shutil

    later = tiny_data / "later"
    path = write_sweep(tiny_data, "seed = [1]", options=options, data=str(later), eval_data="", diagnostics_every=0,
                       max_steps=2)
    assert main(["sweep", str(path), "--quiet"]) == 1
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "seed=1: failed" in x)
    assert str(later) in line and "error.txt" in line, out  # the reason, not just "failed"
    run_dir = load_sweep(path).folder / "runs" / "seed=1"
    assert (run_dir / "error.txt").is_file()
    shutil.copytree(tiny_data / "data", later)
    assert main(["sweep", str(path), "--quiet"]) == 0
    assert "seed=1: done" in capsys.readouterr().out
    assert not (run_dir / "error.txt").exists()  # no stale traceback beside a finished run


def test_a_second_sweep_process_on_the_same_folder_is_refused(finished_sweep):
    sweep = load_sweep(finished_sweep.parent / "sweep.toml")
    with sweep_lock(sweep.folder), pytest.raises(SweepLocked, match="is running"):
        run_sweep(sweep, say=lambda _: None)


def test_training_left_uses_each_variants_own_pace_and_the_parallelism():
    def run(variant, status, step, seconds=None):
        return {"variant": variant, "status": status, "step": step, "max_steps": 100, "train_seconds": seconds}

    runs = [run("fast", "done", 100, 10.0), run("slow", "done", 100, 40.0), run("fast", "pending", 0),
            run("slow", "interrupted", 50), run("new", "pending", 0)]
    # fast 0.1 s/step x 100, slow 0.4 x 50, new at the overall 0.25 x 100; two at a time
    assert training_left(runs, 2) == pytest.approx((10 + 20 + 25) / 2)
    assert training_left([run("fast", "pending", 0)], 2) is None  # nothing finished: no pace to go by
    # a running run's recent pace (what the machine gives now) wins over its variant's finished runs', which keep
    # whatever load they trained under; a variant with neither takes the recent paces' median
    assert training_left(runs, 2, {"slow": 0.2}) == pytest.approx((10 + 10 + 20) / 2)
    assert training_left([run("fast", "pending", 0)], 1, {"fast": 0.05}) == pytest.approx(5)
