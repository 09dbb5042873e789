"""Sweep snapshots: a finished sweep's database survives as SQL text and seeds a new folder that trains nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from plelab.cli.main import main
from plelab.errors import PlelabError
from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_runner import run_sweep
from plelab.experiments.sweep_snapshot import logs_dir, read_header, restore_snapshot, write_snapshot
from plelab.experiments.sweep_store import SweepStore
from plelab.studies.deadzone.analysis import analyze_sweep


def _elsewhere(finished_sweep: Path, out: Path):
    """The finished sweep's own points, with another sweep folder (as on a new machine)."""
    return load_sweep(finished_sweep / "sweep.json", out=str(out))


def _contents(db: Path) -> tuple:
    with SweepStore(db, readonly=True) as store:
        runs = [{k: v for k, v in r.items() if k not in ("pid", "host")} for r in store.runs()]
        return runs, store.evals(), store.timeline(), store.meta()


def test_a_snapshot_restores_every_finished_run_and_the_sweep_trains_nothing(finished_sweep, tmp_path):
    snap = tmp_path / "snap.sql"
    header = write_snapshot(load_sweep(finished_sweep / "sweep.json"), snap)
    assert header.pop("logs_written") == 0 and header["runs"] == {"done": 4} and read_header(snap) == header
    before = snap.read_bytes()
    assert write_snapshot(load_sweep(finished_sweep / "sweep.json"), snap)["unchanged"]  # same runs: file kept
    assert snap.read_bytes() == before
    (data_path, identity), = header["data"].items()
    assert Path(data_path).name == "data" and len(identity["tokenizer_sha256"]) == 64
    assert identity["shards"].keys() == {"train", "val"}

    sweep = _elsewhere(finished_sweep, tmp_path / "new")
    result = restore_snapshot(sweep, snap)
    assert result["restored"] == {"done": 4}
    assert _contents(sweep.db_path) == _contents(finished_sweep / "sweep.sqlite")
    assert run_sweep(sweep, quiet=True, say=lambda _: None) == {"done": 4}
    assert not (sweep.folder / "runs").exists()  # nothing was trained again

    # the report reads the restored records, and says which of its plots lack the runs' training logs
    restored, original = analyze_sweep(sweep.folder), analyze_sweep(finished_sweep)
    assert [g["table"] for g in restored["groups"]] == [g["table"] for g in original["groups"]]
    assert not any("no run folder" in n for n in original["notes"])
    assert any(n.startswith("4 of 4 finished runs have no run folder on this disk") for n in restored["notes"])


def test_unfinished_runs_come_back_pending_and_train_from_their_start(finished_sweep, tmp_path):
    sweep = _elsewhere(finished_sweep, tmp_path / "a")
    first = tmp_path / "first.sql"
    write_snapshot(load_sweep(finished_sweep / "sweep.json"), first)
    restore_snapshot(sweep, first)
    db = sqlite3.connect(sweep.db_path)
    with db:  # as if the snapshot were taken while this run trained
        db.execute("UPDATE runs SET status = 'running', pid = 12345 WHERE name = 'seed=2,dim=8'")
    db.close()
    second = tmp_path / "second.sql"
    assert write_snapshot(sweep, second)["runs"] == {"done": 3, "running": 1}

    again = _elsewhere(finished_sweep, tmp_path / "b")
    assert restore_snapshot(again, second)["restored"] == {"done": 3, "pending": 1}
    assert run_sweep(again, quiet=True, say=lambda _: None) == {"done": 4}
    assert [p.name for p in (again.folder / "runs").iterdir()] == ["seed=2,dim=8"]
    with SweepStore(again.db_path, readonly=True) as store:
        assert store.row("seed=2,dim=8")["steps"] == 12


def test_restore_refuses_and_writes_nothing(finished_sweep, tmp_path):
    snap = tmp_path / "snap.sql"
    write_snapshot(load_sweep(finished_sweep / "sweep.json"), snap)

    with pytest.raises(PlelabError, match="exists: a snapshot seeds only"):
        restore_snapshot(load_sweep(finished_sweep / "sweep.json"), snap)

    header, body = snap.read_text().split("\n", 1)
    info = json.loads(header.split(" ", 2)[2])
    other_data = {path: {**ident, "tokenizer_sha256": "0" * 64} for path, ident in info["data"].items()}
    cases = {
        "other-data": ("-- plelab-sweep-snapshot/1 " + json.dumps({**info, "data": other_data}) + "\n" + body,
                       "differs from the data the snapshot's runs were trained on"),
        "other-sweep": ("-- plelab-sweep-snapshot/1 " + json.dumps({**info, "sweep": "another"}) + "\n" + body,
                        "is a snapshot of sweep 'another'"),
        "not-one": ("CREATE TABLE x (a);\n", "is not a plelab sweep snapshot"),
        "damaged": (header + "\n" + body[: len(body) // 2], "does not load as a sweep database"),
    }
    for name, (text, message) in cases.items():
        bad = tmp_path / f"{name}.sql"
        bad.write_text(text)
        sweep = _elsewhere(finished_sweep, tmp_path / name)
        with pytest.raises(PlelabError, match=message):
            restore_snapshot(sweep, bad)
        assert [p.name for p in sweep.folder.glob("*")] in ([], [".lock"])  # at most the restore's lock file


def test_snapshot_and_restore_from_the_command_line(finished_sweep, tmp_path, capsys):
    snap = tmp_path / "snap.sql"
    source = str(finished_sweep / "sweep.json")
    assert main(["sweep", source, "--snapshot", str(snap)]) == 0
    assert f"wrote {snap} (4 done)" in capsys.readouterr().out
    assert main(["sweep", source, "--out", str(tmp_path / "new"), "--restore", str(snap), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["restored"] == {"done": 4}
    assert main(["sweep", source, "--out", str(tmp_path / "none"), "--snapshot", str(snap)]) != 0
    assert "has no database yet" in capsys.readouterr().err
    assert json.loads(snap.read_text().split(" ", 2)[2].split("\n")[0])["runs"] == {"done": 4}  # kept as it was


def test_training_logs_travel_with_the_snapshot_when_asked(finished_sweep, tmp_path):
    snap = tmp_path / "snap.sql"
    source = load_sweep(finished_sweep / "sweep.json")
    assert write_snapshot(source, snap, logs=True)["logs_written"] == 4
    assert write_snapshot(source, snap, logs=True)["logs_written"] == 0  # a finished run's log is kept once
    assert sorted(p.name for p in logs_dir(snap).iterdir())[0] == "seed=1,dim=0.metrics.jsonl.gz"

    sweep = _elsewhere(finished_sweep, tmp_path / "new")
    assert restore_snapshot(sweep, snap)["logs_restored"] == 4
    for name in ("seed=1,dim=0", "seed=2,dim=8"):
        assert (sweep.run_dir(name) / "metrics.jsonl").read_bytes() == \
            (finished_sweep / "runs" / name / "metrics.jsonl").read_bytes()
    assert not any("no run folder" in n for n in analyze_sweep(sweep.folder)["notes"])
    assert run_sweep(sweep, quiet=True, say=lambda _: None) == {"done": 4}
    assert not list(sweep.folder.glob("runs/*/checkpoints"))  # a folder holding only its log is not retrained

    damaged = logs_dir(snap) / "seed=1,dim=8.metrics.jsonl.gz"
    damaged.write_bytes(damaged.read_bytes()[:20])
    again = _elsewhere(finished_sweep, tmp_path / "again")
    with pytest.raises(PlelabError, match="is damaged"):
        restore_snapshot(again, snap)
    assert not again.db_path.exists() and not (again.folder / "runs").exists()


def test_a_snapshot_replaces_only_its_own_sweeps_earlier_snapshot(finished_sweep, tmp_path):
    source = load_sweep(finished_sweep / "sweep.json")
    notes = tmp_path / "notes.md"
    notes.write_text("not a snapshot\n")
    with pytest.raises(PlelabError, match="exists and is not a sweep snapshot"):
        write_snapshot(source, notes)
    assert notes.read_text() == "not a snapshot\n"

    other = tmp_path / "other.sql"
    write_snapshot(source, other)
    text = other.read_text().replace('"sweep": ', '"sweep": "another", "was": ', 1)
    other.write_text(text)
    with pytest.raises(PlelabError, match="is a snapshot of sweep 'another'"):
        write_snapshot(source, other)
    assert other.read_text() == text
