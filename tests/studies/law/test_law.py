"""The dead-zone law on constructed sweep results with a known answer: paired deltas, brackets, fit, prediction."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from plelab.diagnostics.early import run_signals
from plelab.diagnostics.verdict import USED as USED_VERDICTS
from plelab.errors import PlelabError
from plelab.runs.metrics import read_metrics
from plelab.studies.deadzone.analysis import paired_table
from plelab.studies.law.analysis import (
    bracket_of,
    bracket_text,
    collapse,
    fit_law,
    gather,
    law_analysis,
    law_summary,
    outcome,
    predict,
    prediction_record,
    suggest,
    thresholds,
    trained_criterion,
)

RATIOS = (1 / 32, 1 / 16, 1 / 8, 1 / 4)
SEEDS = (1, 2, 3)


def _signals(alive: bool, ratio: float) -> dict:
    # The early signal separates alive from not at every width with one threshold (0.01); table movement does not.
    inj = 0.02 + ratio if alive else 0.004
    return {f: {"injection_ratio": inj, "table_movement": 0.5} for f in (0.05, 0.1, 0.15, 0.2)}


def width_runs(width: int, c: float, form: str = "simple", gain: float = 0.05) -> list[dict]:
    """Records as law.gather makes them: PLE alive in every seed and a clear loss gain from dP/H > c on."""
    runs = []
    for seed in SEEDS:
        noise = 0.001 * (seed - 2)  # shared by every dP of the seed: pairing cancels it
        base = 5.0 + 0.3 * (seed - 2)  # seed-to-seed spread far above the gain: unpaired means would hide it
        runs.append({"name": f"H{width}-d0-s{seed}", "H": width, "form": form, "layers": 4, "vocab": 8192,
                     "max_steps": 100, "ple_dim": 0, "seed": seed, "heldout": base, "loss": base + 1,
                     "domains_macro": base + 1, "verdict": None, "ablation_delta": None,
                     "trained": {"trained": True}, "signals": {}})
        for r in RATIOS:
            dim = int(width * r)
            alive = r > c
            runs.append({"name": f"H{width}-d{dim}-s{seed}", "H": width, "form": form, "layers": 4, "vocab": 8192,
                         "max_steps": 100, "ple_dim": dim, "seed": seed,
                         "heldout": base - (gain if alive else 0.0) + noise * (1 if dim % 2 else -1) * 0.1,
                         "loss": base + 1 - (gain if alive else 0.0), "domains_macro": base + 1,
                         "verdict": "alive" if alive else ("weak" if seed == 1 else "dead"),
                         "ablation_delta": 0.05 if alive else 0.001, "trained": {"trained": True},
                         "signals": _signals(alive, r)})
    return runs


def test_paired_deltas_cancel_what_the_seed_shares():
    points = [{"ple_dim": d, "seed": s, "loss": 5 + s + (-0.2 - 0.01 * s if d else 0)} for d in (0, 8)
              for s in (1, 2, 3)]
    (row,) = paired_table(points)
    assert row["deltas"] == pytest.approx([-0.21, -0.22, -0.23])
    assert row["delta_mean"] == pytest.approx(-0.22) and row["delta_se"] == pytest.approx(0.01 / math.sqrt(3))
    assert row["gain_significant"] is True  # 38 s.e., though the seeds' losses differ by 1 nat
    # A gain of 3.5 s.e. with 3 seeds is not significant: the paired t-test's line is t(0.975, 2) = 4.30 s.e.
    spread = [{"ple_dim": d, "seed": s, "loss": 5 + s + (-0.1 * s if d else 0)} for d in (0, 8) for s in (1, 2, 3)]
    (row,) = paired_table(spread)
    assert row["delta_mean"] / row["delta_se"] == pytest.approx(-2 * math.sqrt(3))
    assert row["t"] == pytest.approx(4.303, abs=5e-4) and row["gain_significant"] is False
    points.append({"ple_dim": 8, "seed": 4, "loss": 1.0})  # no dP = 0 run for seed 4: left out, counted
    assert paired_table(points)[0]["unpaired"] == 1


def test_brackets_on_the_grid():
    assert bracket_of([0, 2, 4, 8], 4) == (2.0, 4.0)
    assert bracket_of([0, 2, 4, 8], 2) == (0.0, 2.0)  # the smallest tested dP already works
    assert bracket_of([0, 2, 4, 8], None) == (8.0, math.inf)


def test_thresholds_need_every_seed_alive_and_report_exceptions_above():
    runs = width_runs(64, 1 / 16)
    t = thresholds(runs, "heldout")
    assert t["alive"]["first"] == 8 and t["alive"]["bracket"] == [4.0, 8.0]
    assert t["gain"]["first"] == 8 and t["alive"]["exceptions"] == []
    for r in runs:  # one seed weak at dP = 8: the threshold moves up, and dP = 16 stays the first all-alive
        if r["ple_dim"] == 8 and r["seed"] == 2:
            r["verdict"] = "weak"
    assert thresholds(runs, "heldout")["alive"]["bracket"] == [8.0, 16.0]


def test_law_fit_is_the_intersection_of_the_widths_brackets():
    law = fit_law({32: (2, 4), 64: (4, 8)})
    assert law["consistent"] and law["c"] == [1 / 16, 1 / 8] and law["estimate"] == pytest.approx(math.sqrt(1 / 128))
    assert predict(law, 128) == [8.0, 16.0]
    narrower = fit_law({32: (2, 8), 64: (8, 16)})  # (1/16, 1/4] and (1/8, 1/4]
    assert narrower["c"] == [1 / 8, 1 / 4]
    broken = fit_law({32: (1, 2), 64: (8, 16)})  # (1/32, 1/16] and (1/8, 1/4]: no single c
    assert not broken["consistent"] and predict(broken, 128) is None and "do not overlap" in broken["reason"]


def test_bracket_text_writes_ratios_as_fractions_below_one_and_plainly_above():
    assert bracket_text([1, 2], 128) == "(1, 2], dP/H 1/128–1/64"
    assert bracket_text([64, None], 128) == "> 64 (none tested met it), dP/H 1/2–∞"
    assert bracket_text([32, 64], 32) == "(32, 64], dP/H 1–2"  # not "1/0.5"
    assert bracket_text([0, 1], 32) == "(0, 1], dP/H 0–1/32" and bracket_text(None) == "-"


def test_outcome_is_overlap_of_brackets():
    assert outcome([8, 16], [8, 16]) == "hit"
    assert outcome([8, 16], [16, 32]) == "miss"  # (16, 32] starts where (8, 16] ends
    assert outcome([6, 12], [8, 16]) == "hit"
    assert outcome(None, [8, 16]) == "no prediction" and outcome([8, 16], None) == "not run"


@pytest.mark.parametrize("c128, expected", [(1 / 16, "hit"), (1 / 4 - 1e-9, "miss")])
def test_study_predicts_the_third_width_then_scores_it(c128, expected):
    fit = width_runs(32, 1 / 16) + width_runs(64, 1 / 16)
    before = law_analysis(fit, predict_widths=[128])
    assert before["fit_widths"] == [32, 64] and before["primary_loss"] == "heldout"
    assert before["law"]["alive"]["c"] == [1 / 16, 1 / 8]  # alive from 1/8 on at both: c in (1/16, 1/8]
    pred = {p["criterion"]: p for p in before["predictions"]}
    assert pred["alive"]["bracket"] == [8.0, 16.0] and pred["alive"]["outcome"] == "not run"
    assert before["early"]["rule"]["signal"] == "injection_ratio" and before["early"]["fit"]["accuracy"] == 1.0
    frozen = prediction_record(before)
    after = law_analysis(fit + width_runs(128, c128), prediction=frozen)
    assert {p["criterion"]: p["outcome"] for p in after["predictions"]} == {"alive": expected, "gain": expected}
    assert after["early"]["test"]["accuracy"] == 1.0 and after["early"]["test"]["n"] == 12
    assert after["early"]["post_hoc"]["fit"]["n"] == 36  # refitted on all three widths: in-sample, labelled so
    assert before["early"]["post_hoc"] is None
    # Each run's gain is against its own seed's dP = 0 run (JSON keys: fractions as text): the injection ratio
    # ranks it, table movement does not.
    tracking = after["early"]["tracks_gain"]
    injection = tracking["fit"]["injection_ratio"]["0.1"]
    assert injection["n"] == 24 and injection["rho"] > 0.8
    assert tracking["fit"]["table_movement"]["0.1"]["rho"] is None  # constant: no ranking
    assert tracking["test"]["injection_ratio"]["0.1"]["n"] == 12
    summary = law_summary(after)
    assert summary["widths_tested"] == [32, 64, 128] and summary["early_rule"]["test_correct"] == 12
    assert [m["H"] for m in summary["measured"]] == [32, 64, 128]
    assert summary["measured"][0] == {"H": 32, "alive": [2.0, 4.0], "gain": [2.0, 4.0]}


def test_gemma_form_is_its_own_row_and_unpaired_loss_is_said():
    runs = width_runs(32, 1 / 16) + width_runs(64, 1 / 16) + width_runs(64, 1 / 8, form="gemma")
    runs[0]["heldout"] = None
    out = law_analysis(runs)
    assert [(w["H"], w["form"]) for w in out["widths"]] == [(32, "simple"), (64, "simple"), (64, "gemma")]
    assert out["primary_loss"] == "loss" and "held-out split was not evaluated" in out["notes"][0]
    assert out["widths"][2]["thresholds"]["alive"]["bracket"] == [8.0, 16.0]
    with pytest.raises(PlelabError, match="fit width"):
        law_analysis(runs, fit_widths=[32, 128])


def test_trained_criterion():
    bent = [9 - 4 * (1 - math.exp(-i / 8)) for i in range(100)]  # flat for the last half
    still_falling = [9 - 0.04 * i for i in range(100)]
    assert trained_criterion(bent)["trained"] is True and trained_criterion(bent)["doubling_drop"] < 0.01
    assert trained_criterion(still_falling)["trained"] is False
    # from x = 50 to the mean of the last 5 % of points (centred on x = 98): 48 steps of 0.04
    assert trained_criterion(still_falling)["doubling_drop"] == pytest.approx(0.04 * 48)
    assert trained_criterion(still_falling)["late_share"] == pytest.approx(17 / 95)  # window centres 2, 80, 97
    assert trained_criterion([5, 5, 5])["trained"] is None
    assert trained_criterion([5.0] * 10)["trained"] is False
    # (step, loss) pairs, e.g. a held-out timeline at log-spaced steps: L(T/2) is interpolated in log step.
    timeline = [(75, 7.0), (150, 6.0), (300, 5.5), (600, 5.3), (1200, 5.2), (1500, 5.19)]
    r = trained_criterion(timeline)
    assert r["doubling_drop"] == pytest.approx(5.3 - (5.3 - 5.2) * math.log(750 / 600) / math.log(2) - 5.19)


def test_the_trained_criterion_fails_an_undertrained_run_the_old_one_passed():
    """A cosine-decayed run: most of the fall from ln V happens early, the learning rate is small over the last
    20 % of steps, yet the loss still drops ~0.4 nats between half the tokens and the end. The old rule (late 20 %
    fall < 10 % of the whole fall) called it trained; the new one (fall over the last doubling <= 0.05) does not."""
    steps = list(range(25, 1501, 25))

    def loss(t):
        progress = min(1.0, t / 1500)
        lr = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))  # cosine to 0.1x
        return 5.0 + 4.0 * math.exp(-t / 60) + 1.0 * (1 - progress) ** 1.5 + 0.02 * lr

    r = trained_criterion([(t, loss(t)) for t in steps])
    assert r["late_share"] < 0.10                     # the old criterion's number: it passed
    assert r["doubling_drop"] > 0.3 and r["trained"] is False


def test_suggest_says_when_there_is_no_law_or_the_width_is_outside():
    none = suggest(256, None)
    assert not none["measured"] and "no law has been measured yet" in none["warnings"][0]
    assert none["published"][0]["scaled"] == [12.8, 25.6]  # SPEC §3's (128, 256] at H = 2560, scaled to 256
    law = {"law": {"consistent": True, "c": [1 / 32, 1 / 16]}, "widths_tested": [32, 64, 128]}
    inside, outside = suggest(64, law), suggest(2560, law)
    assert inside["range"] == [2.0, 4.0] and inside["warnings"] == []
    assert "outside the tested widths" in outside["warnings"][0]


def test_gather_reads_a_real_sweep(finished_sweep):
    runs = gather(finished_sweep)
    assert sorted((r["ple_dim"], r["seed"]) for r in runs) == [(0, 1), (0, 2), (8, 1), (8, 2)]
    ple = [r for r in runs if r["ple_dim"]]
    assert all(r["verdict"] in USED_VERDICTS and r["trained"]["trained"] is not None
               for r in ple)
    assert all(r["train_seconds"] > 0 for r in runs)
    for r in ple:  # 12 steps logged every 4: the candidates exist from a third of training on (the monitor logs them)
        metrics, _ = read_metrics(Path(r["dir"]))
        values = run_signals(metrics, 12, (0.5,))[0.5]
        assert values["table_movement"] > 0 and values["ablation_delta"] is not None, values
        assert values["injection_ratio"] > 0 and values["grad_ratio_table"] > 0
    with pytest.raises(PlelabError, match="no sweep.sqlite"):
        gather(finished_sweep / "runs")


def test_report_law_freezes_the_prediction_once_then_scores_it(finished_sweep, tmp_path, capsys):
    from plelab.cli.main import main

    study = tmp_path / "study"
    shutil.copytree(finished_sweep, study / "h-tiny")
    assert main(["report", str(study), "--law", "--predict", "4096"]) == 0
    out = capsys.readouterr().out
    assert "prediction frozen" in out and (study / "prediction.json").is_file()
    frozen = json.loads((study / "prediction.json").read_text())
    assert [p["H"] for p in frozen["predictions"]] == [4096, 4096]
    for name in ("law.md", "law.html", "law.json", "deadzone_law.json", "plots/law_vs_ratio.png",
                 "plots/law_vs_dim.png"):
        assert (study / name).is_file(), name
    assert main(["report", str(study), "--law", "--predict", "4096"]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert main(["report", str(study), "--law"]) == 0
    assert capsys.readouterr().out.count("-> measured -: not run") == 2  # one line per criterion
    assert json.loads((study / "prediction.json").read_text()) == frozen
    # Every run's record beside the report: the law analysis recomputed from it without the sweep folders.
    assert main(["report", str(study / "records.json"), "--out", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    assert json.loads((tmp_path / "again" / "law.json").read_text()) == json.loads((study / "law.json").read_text())
    width = json.loads((study / "law.json").read_text())["widths"][0]["H"]
    assert main(["report", str(study), "--law", "--predict", str(width), "--out", str(tmp_path / "o")]) == 2
    assert "never overwritten" in capsys.readouterr().err
    (study / "prediction.json").unlink()  # predicting a width that has already run is refused too
    assert main(["report", str(study), "--law", "--predict", str(width), "--out", str(tmp_path / "o")]) == 2
    assert "no gemma-form width" in capsys.readouterr().err


def test_params_suggest_ple_reads_the_committed_law(monkeypatch, tmp_path, capsys):
    from plelab.cli.main import main
    from plelab.studies.law import analysis as L

    monkeypatch.setattr(L, "LAW_FILE", tmp_path / "missing.json")
    assert main(["params", "tiny", "--suggest-ple"]) == 0
    assert "no law has been measured yet" in capsys.readouterr().out
    law = {"law": {"consistent": True, "c": [1 / 16, 1 / 8]}, "widths_tested": [32, 64, 128], "fit_widths": [32, 64],
           "predictions": [{"H": 128, "criterion": "alive", "outcome": "hit"}],
           "early_rule": {"test_accuracy": 0.9}}
    monkeypatch.setattr(L, "LAW_FILE", tmp_path / "law.json")
    (tmp_path / "law.json").write_text(json.dumps(law))
    assert main(["params", "tiny", "--suggest-ple", "--set", "hidden_size=64"]) == 0
    out = capsys.readouterr().out
    assert ("used in every seed (dependence, not benefit): dP >= 8 at every measured width; dP <= 4: not used in "
            "every seed") in out
    assert "H=128 used: hit" in out and "90%" in out and "warning" not in out
    assert main(["params", "tiny", "--suggest-ple", "--set", "hidden_size=64", "--json"]) == 0
    scripted = capsys.readouterr().out  # what a script reads says used / pays, as the text does
    assert '"criterion": "used"' in scripted and "alive" not in scripted
    assert main(["params", "seed-3b", "--suggest-ple"]) == 0
    assert "outside the tested widths" in capsys.readouterr().out
    # Alive at the smallest dP of every width: the law is an upper bound, and says so instead of "dP <= 0: dead".
    law["law"]["c"] = [0.0, 1 / 64]
    (tmp_path / "law.json").write_text(json.dumps(law))
    assert main(["params", "tiny", "--suggest-ple", "--set", "hidden_size=128"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[1]
    assert head.startswith("used in every seed (dependence, not benefit): dP >= 2; the smallest dP tested")
    assert "from above, not its location" in head
    assert main(["params", "tiny", "--suggest-ple", "--set", "hidden_size=32"]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("used in every seed (dependence, not benefit): any dP")
    # The gain missed on the held-out width: said as a warning, with every width's measured brackets beside it.
    law["predictions"].append({"H": 128, "criterion": "gain", "bracket": [2, 4], "measured": [16, 32],
                               "outcome": "miss"})
    law["measured"] = [{"H": 32, "alive": [0, 1], "gain": [0, 1]}, {"H": 128, "alive": [1, 2], "gain": [16, None]}]
    (tmp_path / "law.json").write_text(json.dumps(law))
    assert main(["params", "tiny", "--suggest-ple", "--set", "hidden_size=64"]) == 0
    out = capsys.readouterr().out
    assert "warning: the loss-gain prediction missed at H = 128 (predicted dP* in (2, 4], measured (16, 32])" in out
    assert "the smallest such dP per measured width): H=32 (0, 1]; H=128 > 16 (none tested met it)" in out
    assert out.splitlines()[1].startswith("pays ")  # benefit first, dependence after it


def test_sweep_report_has_the_paired_table(finished_sweep, tmp_path):
    from plelab.studies.deadzone.analysis import analyze_sweep
    from plelab.studies.deadzone.report import write_report

    analysis = analyze_sweep(finished_sweep)
    (row,) = analysis["groups"][0]["paired"]["loss"]
    assert row["n"] == 2 and row["ple_dim"] == 8
    write_report(analysis, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "Pays: paired Δ vs dP=0, same seed (macro over the evaluation domains)" in md


def test_predicting_a_width_that_has_already_run_is_refused(monkeypatch, tmp_path):
    from plelab.studies.law import report as law_report

    runs = width_runs(32, 1 / 16) + width_runs(64, 1 / 16) + width_runs(128, 1 / 16)
    monkeypatch.setattr(law_report, "gather", lambda folder: runs)
    with pytest.raises(PlelabError, match="already has finished runs"):
        law_report.law_report_analysis(tmp_path, predict=[128])
    assert not (tmp_path / "prediction.json").exists()
    analysis, _ = law_report.law_report_analysis(tmp_path, predict=[256])  # fit on 32, 64, 128
    assert any(p["H"] == 256 for p in analysis["predictions"])
    assert json.loads((tmp_path / "prediction.json").read_text())["fit_widths"] == [32, 64, 128]


def _gain_curve(width: int, gain_of) -> dict:
    """A width table whose paired delta at dP is -gain_of(dP, width) over 3 seeds, s.e. 0.01."""
    spread = [-0.01 * math.sqrt(3), 0.0, 0.01 * math.sqrt(3)]  # sd 0.01 sqrt(3): s.e. 0.01
    return {"H": width, "form": "simple",
            "paired": [{"ple_dim": d, "delta_mean": -gain_of(d, width), "delta_se": 0.01, "seeds": [1, 2, 3],
                        "deltas": [-gain_of(d, width) + e for e in spread]} for d in (1, 2, 4, 8, 16)]}


@pytest.mark.parametrize("truth, other", [("dP/H", "dP"), ("dP", "dP/H")])
def test_collapse_finds_the_axis_the_widths_share(truth, other):
    """Gains that depend only on dP/H coincide across widths on that axis (z ~ 0) and not on dP, and vice versa."""
    def gain_of(dim: int, width: int) -> float:
        x = dim / width if truth == "dP/H" else dim
        return 0.1 * math.log2(1 + 64 * x) if truth == "dP/H" else 0.1 * math.log2(1 + x)

    axes = collapse([_gain_curve(32, gain_of), _gain_curve(64, gain_of), {"H": 64, "form": "gemma", "paired": []}],
                    "simple")
    assert axes["dP/H"]["k"] == 4 and axes["dP"]["k"] == 5  # dP/H 1/32..1/4 and dP 1..16 are shared
    assert axes[truth]["chi2_per_point"] == pytest.approx(0.0, abs=1e-12)
    assert axes[other]["chi2_per_point"] > 9  # 3 s.e. apart on average
    assert axes[truth]["p"] == pytest.approx(1.0) and axes[other]["p"] < 0.01  # against the simulated null
    shared = {tuple(p["ple_dim"]) for p in axes["dP/H"]["points"]}
    assert shared == {(2, 4), (4, 8), (8, 16), (1, 2)}  # H = 32's dP vs H = 64's dP at the same ratio
