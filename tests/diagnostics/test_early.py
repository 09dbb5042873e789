"""The early predictor on constructed trajectories with a known answer, and the monitor logging its candidates."""

from __future__ import annotations

import pytest
from test_monitor import FakeTrainer, drive

from plelab.diagnostics.early import (
    SIGNALS,
    apply_rule,
    choose_rule,
    describe_rule,
    evaluate_rule,
    run_signals,
    signals_at,
    spearman,
    tracks_gain,
)
from plelab.training.ple_monitor import PLEMonitor

TOTAL = 200


def trajectory(trough: float, recovered: float, movement: float) -> list[dict]:
    """Logged lines every 10 steps: the injection ratio falls to `trough` by step 30, then climbs to `recovered`."""
    lines = []
    for step in range(10, TOTAL + 1, 10):
        ratio = 0.05 - (0.05 - trough) * step / 30 if step <= 30 else trough + (recovered - trough) * (step - 30) / 170
        lines.append({"step": step, "loss": 9.0, "ple/injection_ratio/mean": ratio, "ple/table_movement": movement,
                      "ple/grad_ratio_gate/layer0": 0.1, "ple/grad_ratio_gate/layer1": 0.3})
    return lines


def run(alive: bool, movement: float) -> dict:
    """A run whose recovery after the trough says whether it ends alive; table movement is noise here."""
    lines = trajectory(0.002, 0.2 if alive else 0.0025, movement)
    return {"signals": run_signals(lines, TOTAL), "verdict": "used" if alive else "unused"}


def test_signals_are_read_at_the_fraction_from_lines_logged_by_then():
    lines = trajectory(0.002, 0.2, 0.3)
    at = signals_at(lines, TOTAL, 0.1)
    assert at["step"] == 20 and at["reached"]
    assert at["values"]["injection_ratio"] == pytest.approx(lines[1]["ple/injection_ratio/mean"])
    assert at["values"]["grad_ratio_gate"] == pytest.approx(0.2)  # mean over layers
    assert at["values"]["ablation_delta"] is None  # not logged
    later = signals_at(lines, TOTAL, 0.2)["values"]["injection_recovery"]
    assert later == pytest.approx((0.002 + 0.198 * 10 / 170) / 0.002)  # climbing out of the trough
    assert set(run_signals(lines[:5], TOTAL)) == {0.05, 0.1, 0.15, 0.2}
    assert set(run_signals(lines[:2], TOTAL)) == {0.05, 0.1}  # a run stopped at step 20 has no later fractions


def test_choose_rule_finds_the_signal_that_separates_and_the_earliest_fraction():
    runs = [run(alive, movement) for alive, movement in
            [(True, 0.1), (True, 0.5), (True, 0.3), (False, 0.4), (False, 0.2), (False, 0.6)]]
    rule = choose_rule(runs)
    # Up to 15 % (step 30, the trough) every run has the same ratio; at 20 % the alive runs have climbed out.
    assert rule["fraction"] == 0.2 and rule["signal"] in ("injection_ratio", "injection_recovery")
    assert rule["fit_accuracy"] == 1.0
    held_out = [run(True, 0.9), run(False, 0.05), run(True, 0.2)]
    result = evaluate_rule(rule, held_out)
    base = result.pop("base_rate")
    assert result == {"correct": 3, "n": 3, "accuracy": 1.0, "missing": 0,
                      "confusion": {"predicted used, final used": 2, "predicted not used, final not used": 1}}
    # Beside the base-rate rule (the fit runs' majority; a tie goes to the first run's class, alive): 2/3.
    assert rule["majority"] == "used" and (base["base_correct"], base["beats_base_rate"]) == (2, True)
    assert "at 20% of training" in describe_rule(rule)


def test_old_weak_and_dead_count_as_not_used_and_a_missing_signal_is_counted_apart():
    rule = {"signal": "ablation_delta", "fraction": 0.1, "threshold": 0.01}
    runs = [{"signals": {0.1: {"ablation_delta": 0.02}}, "verdict": "weak"},
            {"signals": {0.1: {"ablation_delta": 0.005}}, "verdict": "dead"},
            {"signals": {}, "verdict": "alive"},
            {"signals": {0.1: {"ablation_delta": 0.5}}, "verdict": None}]  # no final verdict: not scored
    result = evaluate_rule(rule, runs)
    assert (result["correct"], result["n"], result["missing"]) == (1, 2, 1)
    assert apply_rule(rule, None) is None and apply_rule(rule, 0.011) == "used"
    assert choose_rule([{"signals": {}, "verdict": "alive"}]) is None
    same = [{"signals": {0.1: {"ablation_delta": v}}, "verdict": "dead"} for v in (0.1, 0.2)]
    assert choose_rule(same)["one_class"] == "not used"  # nothing to separate: no fitted threshold (next test)
    assert choose_rule([*same, {"signals": {0.1: {"ablation_delta": 0.3}}, "verdict": "alive"}])["threshold"] > 0.2


def test_runs_that_all_end_alive_get_the_verdicts_own_line_at_the_earliest_fraction_it_holds():
    """Trained models can all end alive: a fitted threshold would sit anywhere below the data, so the rule keeps
    the final verdict's 0.01-nat line and only picks the fraction; its note says the dead side is untested."""
    def alive_run(early_deltas: dict[float, float]) -> dict:
        return {"signals": {f: {"ablation_delta": d, "table_movement": 1.0} for f, d in early_deltas.items()},
                "verdict": "alive"}

    # At 5 % (the injection trough) nothing shows yet; at 10 % two of three runs cross 0.01; at 15 % all do.
    runs = [alive_run({0.05: 0.0, 0.1: 0.02, 0.15: 0.05, 0.2: 0.1}),
            alive_run({0.05: 0.001, 0.1: 0.005, 0.15: 0.03, 0.2: 0.2}),
            alive_run({0.05: -0.0, 0.1: 0.04, 0.15: 0.08, 0.2: 0.3})]
    rule = choose_rule(runs)
    assert (rule["signal"], rule["fraction"], rule["threshold"]) == ("ablation_delta", 0.15, 0.01)
    assert (rule["fit_correct"], rule["fit_n"], rule["one_class"]) == (3, 3, "used")
    assert "untested" in describe_rule(rule) and "not fitted" in describe_rule(rule)
    # Held out, it is scored like any rule, and a run that ends dead is scored too when one exists.
    held_out = [alive_run({0.15: 0.02}), alive_run({0.15: 0.004}),
                {"signals": {0.15: {"ablation_delta": 0.003}}, "verdict": "dead"}]
    assert evaluate_rule(rule, held_out)["confusion"] == {"predicted used, final used": 1,
                                                          "predicted not used, final used": 1,
                                                          "predicted not used, final not used": 1}


def test_monitor_logs_every_candidate_signal(tmp_path, make_model, chain, eval_batches):
    model = make_model()
    logged = [m for m in drive(FakeTrainer(model, tmp_path, 20), PLEMonitor(every=10, eval_batches=eval_batches),
                               chain, 20) if "ple/injection_ratio/mean" in m]
    assert [m["step"] for m in logged] == [10, 20]
    assert 0 < logged[0]["ple/table_movement"] < logged[1]["ple/table_movement"]  # the table leaves its init
    assert all(isinstance(m["ple/ablation_delta"], float) for m in logged)
    values = run_signals(logged, 20, (1.0,))[1.0]
    missing = [name for name, v in values.items() if v is None and name != "injection_recovery"]
    assert missing == [], missing
    assert set(values) == set(SIGNALS)


def test_diagnose_early_without_and_with_a_measured_rule(tmp_path, monkeypatch, capsys):
    import json

    from plelab.cli.main import main
    from plelab.studies.law import analysis as law

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"max_steps": TOTAL}))
    (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(m) for m in trajectory(0.002, 0.2, 0.3)) + "\n")
    monkeypatch.setattr(law, "LAW_FILE", tmp_path / "none.json")
    assert main(["diagnose", str(run_dir), "--early"]) == 0
    out = capsys.readouterr().out
    assert "no early rule has been measured yet" in out and "injection_ratio" in out
    rule = {"signal": "injection_ratio", "fraction": 0.2, "threshold": 0.01, "test_correct": 17, "test_n": 18,
            "test_widths": [128]}
    (tmp_path / "law.json").write_text(json.dumps({"early_rule": rule}))
    monkeypatch.setattr(law, "LAW_FILE", tmp_path / "law.json")
    assert main(["diagnose", str(run_dir), "--early"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("early prediction: used") and "17/18" in out and "[128]" in out
    assert main(["diagnose", str(tmp_path), "--early"]) == 2
    assert "metrics.jsonl" in capsys.readouterr().err


def test_table_movement_is_the_relative_frobenius_change_read_in_chunks(tmp_path, make_model, monkeypatch):
    import torch

    from plelab.training import ple_monitor as M

    monkeypatch.setattr(M, "MOVEMENT_CHUNK_ROWS", 7)  # several chunks and a ragged last one
    model = make_model()
    monitor = PLEMonitor(every=10)
    monitor.on_train_start(FakeTrainer(model, tmp_path, 10))
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    init = table.detach().clone()
    assert monitor._table_movement(model) == 0.0
    with torch.no_grad():
        table[3].add_(0.5)
    expected = ((table.detach() - init).norm() / init.norm()).item()
    assert monitor._table_movement(model) == pytest.approx(expected, rel=1e-5)


def test_spearman_on_known_orders_and_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833)  # ties share their mean rank (scipy's)
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def test_tracks_gain_ranks_the_signal_that_follows_the_final_gain():
    """Ablation at 10 % grows with the final gain; table movement is unrelated to it; at 5 % nothing is logged."""
    gains = [0.05, 0.1, 0.2, 0.3, 0.4]
    runs = [{"gain": g, "signals": {0.1: {"ablation_delta": g / 4, "table_movement": m}}}
            for g, m in zip(gains, [0.3, 0.1, 0.5, 0.2, 0.4], strict=True)]
    runs.append({"gain": None, "signals": {0.1: {"ablation_delta": 9.0}}})  # no dP = 0 partner: left out
    result = tracks_gain(runs, (0.05, 0.1))
    assert result["ablation_delta"][0.1] == {"rho": pytest.approx(1.0), "n": 5}
    assert abs(result["table_movement"][0.1]["rho"]) < 0.5
    assert result["ablation_delta"][0.05] == {"rho": None, "n": 0}


def test_the_committed_rule_reads_in_todays_names_in_json():
    """A rule recorded under the old class names (alive) is shown to scripts as used / not used."""
    import json

    from plelab.diagnostics.early import predict_run

    rule = {"signal": "ablation_delta", "fraction": 0.15, "threshold": 0.01, "one_class": "alive",
            "test_base_class": "alive", "note": "every fit run ended alive: ... own alive line"}
    shown = predict_run([], 100, rule)["rule"]
    assert shown["one_class"] == shown["test_base_class"] == "used" and "alive" not in json.dumps(shown)
    assert rule["one_class"] == "alive"  # the committed record itself is not rewritten
