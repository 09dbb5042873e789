"""The committed first-round reports recomputed under the new rules: each correction the review made to the
write-ups, checked on the committed files themselves (each of these read the other way under the old code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from plelab.experiments.review import ffn_review, markdown_tables, parse_pm, upgrade_law, visual_review

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture(scope="module")
def ffn():
    return ffn_review((DOCS / "ffn-study" / "report.md").read_text())


@pytest.fixture(scope="module")
def law():
    return upgrade_law(json.loads((DOCS / "deadzone-law" / "law.json").read_text()), draws=4000)


def test_parsing_the_committed_tables():
    assert parse_pm("+0.0124 ± 0.0069 ▲") == (0.0124, 0.0069) and parse_pm("-") is None
    tables = markdown_tables("## A\n\n| x | y \\| z |\n|---|---|\n| 1 | 2 |\n")
    assert tables == [{"heading": "A", "headers": ["x", "y | z"], "rows": [["1", "2"]]}]


def test_ffn_mglu_gap_did_open(ffn):
    """Old: 'MGLU's gap never opened'. At 81.9k tokens it is -0.0504 +- 0.0102 (t = -4.9): open by the rule."""
    first = ffn["first_open"]["mglu1"]
    assert first["tokens"] == "81.9k" and first["t"] == pytest.approx(-4.94, abs=0.01) and first["p"] < 0.05


def test_ffn_moe_is_measurably_worse_alone_and_not_after_holm(ffn):
    """Old: 'no FFN variant with the same bytes can be measurably worse' and MoE 'no difference'."""
    moe = ffn["val"]["moe"]
    assert moe["outcome_alone"] == "worse" and moe["ci95"][0] > 0        # significant on its own
    assert moe["p_holm"] > 0.05 and moe["outcome"] == "not resolved"     # not once the six variants are a family
    assert ffn["macro"]["moe"]["outcome_alone"] == "not resolved"       # the macro: not resolved, never "no difference"
    assert ffn["domain_counts"]["moe"]["old_sign_test_p"] < 1e-4        # what the invalid domain sign test said
    assert ffn["domain_counts"]["moe"]["worse_holm"] == 0


def test_ffn_pruned_is_not_cheaper_than_narrow_and_mglu_is_not_resolved(ffn):
    """Old: 'pruned <= narrow' and 'MGLU not reproduced'."""
    for metric in ("val", "macro"):
        assert ffn[metric]["swiglu_narrow"]["mean"] < ffn[metric]["pruned"]["mean"]
    mglu = ffn["val"]["mglu1"]
    assert mglu["ci95"][0] < 0 < 0.041 < mglu["ci95"][1]                # 0 and the published +0.041 both inside
    narrow = ffn["val"]["swiglu_narrow"]                                 # 'the narrow equals the full one'
    assert narrow["outcome"] == "not resolved" and narrow["ci95"][1] - narrow["ci95"][0] > 0.35


def test_visual_eight_comparisons_none_survives_holm():
    r = visual_review((DOCS / "visual-ple-study" / "report.md").read_text())
    alone = [v for v, t in r["vs_none"].items() if t["outcome_alone"] == "worse"]
    assert len(alone) == 7 and not [v for v, t in r["vs_none"].items() if t["outcome"] != "not resolved"]
    lam01 = r["vs_none"]["fix-aux0.1"]                                   # 'λ = 0.1 removes most of the cost'
    harms = [r["vs_none"][v]["mean"] for v in ("vqvae", "lfq", "bsq", "dct-kmeans", "features-kmeans")]
    assert all(lam01["ci95"][0] < h < lam01["ci95"][1] for h in harms)
    assert r["tables"]["fix-aux1"]["table_vs_gaussian"] == "random-like"
    assert r["tables"]["fix-aux1"]["ablation"]["mean"] > 0.2              # random-like by the tests, yet used
    assert r["fix"]["fix-aux0.1"]["rank_vs_reference"]["mean"] > 0        # rank up: the pre-set rule said 'no'


def test_law_dose_response_resolves_what_the_per_dp_tests_did_not(law):
    """Old: 'no dP at H = 128 clears the test'. Each seed's slope on log2 dP is negative; across seeds, p < 0.05."""
    h128 = next(w for w in law["widths"] if w["H"] == 128 and w["form"] == "simple")
    assert not any(r["gain_significant"] for r in h128["paired"])
    d = h128["dose_response"]
    assert [round(b, 3) for b in d["per_seed"].values()] == [-0.036, -0.059, -0.064]
    assert d["verdict"]["outcome"] == "better" and d["verdict"]["p"] < 0.05


def test_law_collapse_is_not_against_one_and_neither_axis_is_rejected(law):
    """Old: 'dP/H mean z^2 2.0 vs dP 5.1: the gain follows dP/H' (read against 1). Against the simulated nulls
    neither axis is rejected, and dP's 5.1 is one point (H = 32 vs 128 at dP = 1): without it 2.13."""
    ratio, dim = law["collapse"]["dP/H"], law["collapse"]["dP"]
    assert ratio["statistic"] == pytest.approx(2.04, abs=0.01) and dim["statistic"] == pytest.approx(5.10, abs=0.01)
    for axis in (ratio, dim):
        assert axis["p"] > 0.05 and axis["p_independent"] > 0.05 and axis["null_median"] > 1.0
    assert min(dim["leave_one_out"]) == pytest.approx(2.13, abs=0.01)


def test_law_early_rule_and_signals_beside_their_baselines(law):
    """Old: the early rule's 16/21 on H = 128 as a result; 'always alive' gets 20/21. And the signals' rank
    correlations sit beside dP/H alone: 0.72 on the fit widths, 0.81 on the held-out one."""
    base = law["early"]["test"]["base_rate"]
    assert (base["correct"], base["base_correct"], base["beats_base_rate"]) == (16, 20, False)
    trivial = law["early"]["tracks_gain"]
    assert next(iter(trivial["fit"]["dP/H (trivial ranker)"].values()))["rho"] == pytest.approx(0.72, abs=0.01)
    assert next(iter(trivial["test"]["dP/H (trivial ranker)"].values()))["rho"] == pytest.approx(0.81, abs=0.01)


def test_law_on_every_width_and_the_committed_law_file(law):
    """Old: deadzone_law.json fitted the alive constant on H = 32, 64 only. Every width: (1/128, 1/64]."""
    from plelab.experiments.law import law_summary, load_law, suggest

    every = law_summary(law)
    assert every["law"]["c"] == [1 / 128, 1 / 64] and every["fit_widths"] == [32, 64, 128]
    assert every["law_gain"]["consistent"] is False
    committed = load_law()
    assert committed["law"]["c"] == [1 / 128, 1 / 64]                    # plelab/experiments/deadzone_law.json
    advice = suggest(256, committed)
    assert advice["range"] == [2.0, 4.0] and advice["fit_widths"] == [32, 64, 128]
    assert any("does not beat always saying 'alive'" in w for w in advice["warnings"])
