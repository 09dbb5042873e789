"""The third round's cross-width report on constructed runs: each width's registered outcomes, and the timeline's
paired gain against tokens per non-embedding parameter, recomputed from its records."""

from __future__ import annotations

import json

import pytest

from plelab.cli.main import main
from plelab.experiments.plan import load_plan, register_plan
from plelab.experiments.sweep import RESOLVED_FILE, load_sweep
from plelab.experiments.sweep_store import SweepStore
from plelab.studies.onset.analysis import non_embedding_params
from plelab.studies.registry import choose_study

PLAN = {"plan": {"name": "onset-test", "margin": 0.01, "comparisons": [
    {"name": "gain_dp1", "where": {"model.ple.dim": 1}, "reference_where": {"model.ple.dim": 0}, "metric": "val",
     "predicted": "equivalent", "hits": ["equivalent"]}]}}
STEPS = (2, 4, 8)


def _width(root, hidden: int, gain_at_end: float):
    """A finished width sweep: dP 0 and 1 x seeds 1-3; dP 1's gain shrinks from 0.1 to gain_at_end over the steps."""
    sweep = load_sweep({"sweep": {"out": str(root / f"h{hidden}"), "name": f"deadzone-onset-h{hidden}"},
                        "base": {"model": {"preset": "tiny", "hidden_size": hidden}, "max_steps": 8},
                        "grid": {"seed": [1, 2, 3], "model.ple.dim": [0, 1]}})
    sweep.folder.mkdir(parents=True)
    (sweep.folder / RESOLVED_FILE).write_text(json.dumps(sweep.resolved_dict()))
    with SweepStore(sweep.db_path) as store:
        store.set_meta(name=f"deadzone-onset-h{hidden}", grid=sweep.grid)
        store.sync_points(sweep.points)
        register_plan(store, load_plan(PLAN), "plan.toml")
        for p in sweep.points:
            seed, dim = p.values["seed"], p.values["model.ple.dim"]
            gains = dict(zip(STEPS, (0.1, 0.05, gain_at_end), strict=True))
            loss = {s: 5.0 - 0.1 * s + 0.001 * seed - (gains[s] + 0.0005 * seed if dim else 0.0) for s in STEPS}
            timeline = [{"step": s, "tokens": 1000 * s, "domains": {"val": {"loss": loss[s], "bpb": 1.0}}}
                        for s in STEPS]
            store.mark_done(p.name, {"final_eval": {"domains": {"val": {"loss": loss[8], "bpb": 1.0, "tokens": 9}}},
                                     "timeline": timeline, "steps": 8, "tokens": 8000,
                                     "train_seconds": 600.0})


def test_the_round_reports_each_width_and_the_gain_against_tokens_per_parameter(tmp_path, capsys):
    _width(tmp_path / "round", 32, 0.02)
    _width(tmp_path / "round", 64, 0.004)
    assert choose_study(tmp_path / "round").name == "onset"
    assert main(["report", str(tmp_path / "round"), "--json"]) == 0
    a = json.loads(capsys.readouterr().out)
    h32, h64 = sorted(a["widths"], key=lambda w: w["hidden_size"])
    # at the end, H = 64's gain (0.004-0.006 by seed) is inside the margin; H = 32's (0.02) is a resolved gain
    assert h64["plan"]["evaluation"]["results"][0]["outcome"] in ("equivalent", "better, within margin")
    assert h32["plan"]["evaluation"]["results"][0]["outcome"] == "better"
    end = [r for r in h64["gains"] if r["step"] == 8][0]
    assert end["gain"] == pytest.approx(0.005) and end["n"] == 3
    with SweepStore(tmp_path / "round" / "h64" / "sweep.sqlite", readonly=True) as store:
        model = store.runs()[0]["config"]["model"]
    _, non_embedding = non_embedding_params(model)
    assert end["tokens_per_non_embedding"] == pytest.approx(8000 / non_embedding)
    assert [r["gain"] for r in h32["gains"]] == pytest.approx([0.101, 0.051, 0.021])
    # the curve's description: H = 64's gain enters the margin at the last point, as a resolved gain (not equivalent)
    assert end["outcome"] == "better, within margin"
    (c64,) = h64["crossings"]
    assert c64["below_margin"] == {"step": 8, "tokens_per_non_embedding": end["tokens_per_non_embedding"],
                                   "stays": True}
    assert c64["equivalent"] is None and h32["crossings"][0]["below_margin"] is None
    md = (tmp_path / "round" / "report.md").read_text()
    assert "first point equivalent" in md and "not at any point" in md
    assert "H = 64" in md and "Gain against tokens (description)" in md
    # six runs a width at 600 s each: one hour of training, stated per width
    assert h64["compute"] == {"train_core_hours": 1.0, "steps": 48, "tokens": 48000}
    assert md.count("Compute: 1.0 hours of training, the 6 finished runs' training wall times summed") == 2
    assert (tmp_path / "round" / "plots" / "gain_vs_tokens.png").is_file()
    assert main(["report", str(tmp_path / "round" / "records.json"), "--out", str(tmp_path / "again"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["widths"] == a["widths"]


@pytest.mark.parametrize("outcomes, reading", [
    ({"gain_dp1": "equivalent", "doubling_1_to_2": "equivalent", "doubling_2_to_4": "better",
      "doubling_4_to_16": "better, within margin"}, "hit"),
    ({"gain_dp1": "better, within margin", "doubling_1_to_2": "equivalent", "doubling_2_to_4": "better",
      "doubling_4_to_16": "better"}, "miss"),      # a resolved gain below the margin is still a gain
    ({"gain_dp1": "equivalent", "doubling_1_to_2": "better", "doubling_2_to_8": "better"}, "miss"),
    ({"gain_dp1": "equivalent", "doubling_1_to_2": "not resolved", "doubling_2_to_8": "better"}, "unresolved"),
    ({"gain_dp1": "equivalent", "doubling_1_to_2": "equivalent", "doubling_2_to_8": "not resolved"}, "unresolved"),
    ({"gain_dp1": "equivalent", "doubling_1_to_2": "worse", "doubling_2_to_8": "better"}, "unresolved"),
    ({"gain_dp1": "equivalent"}, None),            # the plan lacks the tests the reading combines
    ({"gain_dp1": "n/a", "doubling_1_to_2": "n/a", "doubling_2_to_8": "n/a"}, "n/a"),  # one seed in: nothing to read
])
def test_the_dead_zone_reading_follows_its_registered_rule(outcomes, reading):
    from plelab.studies.onset.analysis import deadzone_reading

    assert deadzone_reading(outcomes) == reading


def test_the_compute_paragraph_says_when_nothing_has_finished():
    from plelab.experiments.outcomes import training_compute
    from plelab.experiments.plan_report import compute_block

    assert compute_block(training_compute([{"status": "pending"}]), 0)[1] == "Compute: no run has finished yet."
    assert "not recorded" in compute_block(training_compute([{"status": "done", "train_seconds": None}]), 1)[1]


def _row(step: int, gain: float, outcome: str) -> dict:
    return {"ple_dim": 1, "ratio": 1 / 64, "step": step, "tokens_per_non_embedding": step / 10, "gain": gain,
            "outcome": outcome}


def test_a_crossing_is_the_first_point_inside_the_margin_and_says_whether_the_curve_stays_there():
    from plelab.studies.onset.analysis import crossings

    rows = [_row(100, 0.03, "better"), _row(200, 0.008, "equivalent"), _row(300, 0.012, "not resolved"),
            _row(400, 0.004, "equivalent")]
    (c,) = crossings(rows, 0.01)
    assert c["below_margin"] == {"step": 200, "tokens_per_non_embedding": 20.0, "stays": False}  # 0.012 at 300
    assert c["equivalent"] == {"step": 200, "tokens_per_non_embedding": 20.0, "stays": False}
    assert c["last"]["outcome"] == "equivalent"
    # a gain below the margin but resolved from 0 is below the margin, never equivalent
    (c,) = crossings([_row(100, 0.006, "better, within margin")], 0.01)
    assert c["below_margin"]["step"] == 100 and c["equivalent"] is None
    assert crossings(rows, None) == []  # no registered margin, no crossing
