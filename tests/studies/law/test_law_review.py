"""The dead-zone law's committed first-round law.json upgraded under the current rules: each correction the review
made to the write-up, checked on the committed file itself (each of these read the other way under the old code)."""

from __future__ import annotations

import json

import pytest
from sweep_helpers import STUDIES

from plelab.studies.law.analysis import law_summary, load_law, suggest
from plelab.studies.law.review import upgrade_law


@pytest.fixture(scope="module")
def law():
    return upgrade_law(json.loads((STUDIES / "law" / "deadzone-law" / "law.json").read_text()), draws=4000)


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
    every = law_summary(law)
    assert every["law"]["c"] == [1 / 128, 1 / 64] and every["fit_widths"] == [32, 64, 128]
    assert every["law_gain"]["consistent"] is False
    committed = load_law()
    assert committed["law"]["c"] == [1 / 128, 1 / 64]                    # plelab/studies/law/deadzone_law.json
    advice = suggest(256, committed)
    assert advice["range"] == [2.0, 4.0] and advice["fit_widths"] == [32, 64, 128]
    assert any("does not beat always saying 'used'" in w for w in advice["warnings"])
