"""The sweep database's timeline: filled from finished run folders, read back in step order, old databases open."""

from __future__ import annotations

import json
import sqlite3

from sweep_helpers import write_sweep

from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_runner import RESULT_FILE, run_sweep
from plelab.experiments.sweep_store import SCHEMA, SweepStore
from plelab.training.standard_callbacks import timeline_steps


def _point(step: int, loss: float) -> dict:
    return {"step": step, "tokens": 128 * step,
            "domains": {"prose": {"loss": loss, "bpb": loss / 2}, "numbers": {"loss": loss + 1, "bpb": loss}}}


def test_timeline_round_trips_in_step_order_and_a_second_record_replaces_the_first(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, "seed = [1, 2]"))
    with SweepStore(tmp_path / "db.sqlite") as store:
        store.sync_points(sweep.points)
        store.mark_done("seed=1", {"timeline": [_point(8, 3.0), _point(2, 5.0)]})
        store.mark_done("seed=1", {"timeline": [_point(2, 5.5), _point(8, 3.5), _point(4, 4.0)]})
        store.mark_done("seed=2", {})  # a run without a timeline (eval_timeline = 0) adds no rows
        timeline = store.timeline()
    assert list(timeline) == ["seed=1"]
    assert [(p["step"], p["tokens"]) for p in timeline["seed=1"]] == [(2, 256), (4, 512), (8, 1024)]
    assert timeline["seed=1"][0]["domains"] == {"numbers": {"loss": 6.5, "bpb": 5.5}, "prose": {"loss": 5.5,
                                                                                              "bpb": 2.75}}


def test_a_database_from_before_the_timeline_opens_and_gains_it(tmp_path):
    old_schema = SCHEMA.split("CREATE TABLE IF NOT EXISTS timeline")[0]
    path = tmp_path / "sweep.sqlite"
    db = sqlite3.connect(path)
    db.executescript(old_schema)
    db.execute("INSERT INTO runs (name, idx, point, config, status) VALUES ('seed=1', 0, '{}', '{}', 'done')")
    db.commit()
    db.close()
    with SweepStore(path) as store:
        assert store.timeline() == {} and [r["status"] for r in store.runs()] == ["done"]
        store.mark_done("seed=1", {"timeline": [_point(1, 2.0)]})
        assert [p["step"] for p in store.timeline()["seed=1"]] == [1]


def test_a_variant_sweep_records_every_runs_timeline(tiny_data):
    path = write_sweep(tiny_data, "seed = [1]", diagnostics_every=0, max_steps=6, ckpt_every=3, warmup_steps=1,
                       eval_timeline=4)
    path.write_text(path.read_text() + '[variants.swiglu]\n[variants.mglu]\n"model.ffn.kind" = "mglu"\n')
    sweep = load_sweep(path)
    assert run_sweep(sweep, quiet=True, say=lambda _: None) == {"done": 2}
    steps = timeline_steps(sweep.points[0].config)
    assert steps == [1, 2, 3, 6]
    with SweepStore(sweep.db_path) as store:
        timeline, evals, meta = store.timeline(), store.evals(), store.meta()
    assert meta["variants"] == {"swiglu": {}, "mglu": {"model.ffn.kind": "mglu"}} and meta["baseline"] == "swiglu"
    assert list(timeline) == ["variant=mglu,seed=1", "variant=swiglu,seed=1"]
    for name, points in timeline.items():
        assert [p["step"] for p in points] == steps
        assert [p["tokens"] for p in points] == [s * sweep.points[0].config.tokens_per_step for s in steps]
        assert set(points[-1]["domains"]) == set(evals[name])  # the last point is the final evaluation
        assert points[-1]["domains"]["prose"]["loss"] == evals[name]["prose"]["loss"]
        result = json.loads((sweep.run_dir(name) / RESULT_FILE).read_text())
        assert result["timeline"] == points and result["point"]["variant"] == name.split(",")[0].split("=")[1]
