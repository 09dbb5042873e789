"""`plelab outcomes`: a study's registered verdicts recomputed from its sweep folder or its committed records."""

from __future__ import annotations

import json

from sweep_helpers import VARIANTS, fake_study

from plelab.cli.main import main
from plelab.experiments.outcomes import outcome_rows, study_outcomes
from plelab.experiments.sweep_store import SweepStore


def test_outcomes_match_the_report_from_the_folder_and_from_its_records(tmp_path, capsys):
    study = fake_study(tmp_path / "study", VARIANTS)
    with SweepStore(study / "sweep.sqlite") as store:
        store.db.execute("UPDATE runs SET train_seconds = 1800, tokens = 1000000 WHERE status = 'done'")
        store.db.commit()
    from_folder = study_outcomes(study)
    assert from_folder["status"] == "registered" and from_folder["runs_done"] == from_folder["runs_total"] == 6
    assert from_folder["compute"]["train_core_hours"] == 3.0 and from_folder["compute"]["tokens"] == 6_000_000
    results = {r["name"]: r for r in from_folder["evaluation"]["results"]}
    assert results["mglu_val"]["outcome"] == "worse" and results["mglu_val"]["prediction"] == "hit"

    assert main(["report", str(study), "--out", str(tmp_path / "report"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    registered = {r["name"]: r for r in report["plan"]["evaluation"]["results"]}
    for name, r in results.items():  # the same numbers the report prints
        assert r["test"]["mean"] == registered[name]["test"]["mean"] and r["outcome"] == registered[name]["outcome"]
    from_records = study_outcomes(tmp_path / "report" / "records.json")
    assert from_records["compute"] == from_folder["compute"]  # the records file carries what the study cost
    assert outcome_rows([from_records]) == outcome_rows([from_folder])

    assert main(["outcomes", str(study), str(tmp_path / "report" / "records.json"), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.count("| ffn-test | mglu_val | val | 3 |") == 2 and out.count("3.00 core-hours of training") == 2
    assert "interim" not in out


def test_a_records_file_from_before_the_training_figures_says_it_has_no_compute(tmp_path, capsys):
    study = fake_study(tmp_path / "study", VARIANTS)
    assert main(["report", str(study), "--out", str(tmp_path / "report"), "--json"]) == 0
    capsys.readouterr()
    records = tmp_path / "report" / "records.json"
    rec = json.loads(records.read_text())
    for run in rec["plan_inputs"]["runs"]:  # what records files written before 2026-12-03 kept per run
        for key in ("train_seconds", "steps", "tokens"):
            del run[key]
    records.write_text(json.dumps(rec))
    assert study_outcomes(records)["compute"] is None
    assert main(["outcomes", str(records)]) == 0
    assert "compute: not recorded (a records file written before records kept it" in capsys.readouterr().out


def test_an_unfinished_study_says_its_outcomes_are_interim(tmp_path, capsys):
    study = fake_study(tmp_path / "study", VARIANTS, done=("swiglu",))
    assert main(["outcomes", str(study)]) == 0
    assert "(unfinished: every outcome above is interim)" in capsys.readouterr().out


def test_a_missing_source_is_one_line(tmp_path, capsys):
    assert main(["outcomes", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert "no such sweep folder or records file" in err and "\n" not in err
    (tmp_path / "notes").mkdir()
    assert main(["outcomes", str(tmp_path / "notes")]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not a sweep folder (it has no sweep.sqlite)" in err and "\n" not in err
    assert not (tmp_path / "notes" / "sweep.sqlite").exists()


def test_a_test_behind_a_gate_that_did_not_pass_says_so_in_its_outcome():
    test = {"n": 2, "mean": -0.003, "se": 0.002, "ci95": [-0.02, 0.02], "p_used": 1.0}
    results = [{"name": "gate", "gate": True, "metric": "val", "test": test, "outcome": "not resolved",
                "predicted": "worse", "prediction": "unresolved"},
               {"name": "behind", "metric": "val", "test": test, "outcome": "equivalent", "predicted": None,
                "prediction": None, "gated": "not interpreted: the gate gate came out not resolved, not worse"}]
    rows = outcome_rows([{"source": "x", "evaluation": {"name": "s", "results": results}}])
    assert rows[0][7] == "not resolved" and rows[1][7] == "equivalent (gate not passed)"
