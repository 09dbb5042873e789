"""Paired deltas, t tests, intervals and the four-way verdict, on constructed data with known answers."""

import math

import pytest

from plelab.stats import compare, outcome_text, paired, significance, summarize, t_interval, t_test, tost


def test_paired_uses_only_shared_seeds():
    p = paired({1: 2.0, 2: 2.1, 3: 2.2}, {1: 2.1, 2: 2.3, 3: 2.5, 4: 9.9})
    assert p["seeds"] == [1, 2, 3] and p["unpaired"] == [4]
    assert p["mean"] == pytest.approx(0.2) and p["sd"] == pytest.approx(0.1)
    assert p["se"] == pytest.approx(0.1 / math.sqrt(3))
    assert p["per_seed"] == pytest.approx({1: 0.1, 2: 0.2, 3: 0.3})
    # Pairing removes what the seeds share: a constant offset over very different seeds has no spread.
    q = paired({1: 2.0, 2: 2.5, 3: 1.5}, {1: 2.04, 2: 2.54, 3: 1.54})
    assert q["sd"] == pytest.approx(0.0, abs=1e-12) and significance(q["mean"], q["se"], q["n"]) == 1
    one = paired({1: 2.0}, {1: 2.1})
    assert one["n"] == 1 and math.isnan(one["se"]) and significance(one["mean"], one["se"], 1) is None


def test_t_test_and_interval():
    # mean 1, se 0.2, n 5: t = 5 with 4 df, two-sided p = 0.00748 (tables); 95 % CI 1 +- 2.776 * 0.2.
    r = t_test(1.0, 0.2, 5)
    assert r["t"] == pytest.approx(5.0) and r["df"] == 4 and r["p"] == pytest.approx(0.007490, abs=2e-6)
    assert t_interval(1.0, 0.2, 5) == pytest.approx([1 - 2.776445 * 0.2, 1 + 2.776445 * 0.2], abs=1e-6)
    assert t_test(1.0, float("nan"), 3)["p"] is None and t_interval(1.0, 0.1, 1) is None
    assert t_test(0.5, 0.0, 3)["p"] == 0.0 and t_test(0.0, 0.0, 3)["p"] == 1.0


def test_tost_is_the_90_percent_interval_inside_the_margin():
    # mean 0.012, se 0.0069, n 3 (the FFN study's MGLU on val): 90 % interval 0.012 +- 2.92 * 0.0069.
    r = tost(0.0124, 0.0069, 3, margin=0.05)
    lo, hi = r["interval"]
    assert hi == pytest.approx(0.0124 + 2.919986 * 0.0069, abs=1e-6) and r["equivalent"] is True
    assert tost(0.0124, 0.0069, 3, margin=0.03)["equivalent"] is False  # the interval reaches 0.032
    with pytest.raises(ValueError):
        tost(0.0, 0.1, 3, margin=0.0)


def test_not_significant_is_not_no_difference():
    """The old FFN rule read 'not significant' as 'no difference' / 'gap closed'; compare does not."""
    # A large effect measured noisily (the MoE macro: +0.166 +- 0.058, 3 seeds, t = 2.9): not significant, and
    # with no margin stated it is *not resolved*, never "no difference".
    big_noisy = compare(0.166, 0.058, 3)
    assert big_noisy["outcome"] == "not resolved" and big_noisy["ci95"][1] > 0.4
    # Even with a margin, a noisy estimate is not equivalent: its 90 % interval is far wider than the margin.
    assert compare(0.166, 0.058, 3, margin=0.05)["outcome"] == "not resolved"
    # A small effect measured precisely is equivalent to zero within the stated margin.
    assert compare(0.002, 0.001, 5, margin=0.01)["outcome"] == "equivalent"
    # Significant and inside the margin: a real but negligible difference.
    assert compare(0.0041, 0.0005, 3, margin=0.02)["outcome"] == "worse, within margin"
    assert compare(-0.3, 0.02, 3)["outcome"] == "better"
    assert compare(0.3, float("nan"), 1)["outcome"] == "n/a"


def test_compare_with_an_adjusted_p_keeps_the_interval():
    c = compare(0.296, 0.062, 3, p=0.25)  # Holm-adjusted p over a family
    assert c["p"] == pytest.approx(0.0412, abs=5e-4) and c["p_used"] == 0.25 and c["outcome"] == "not resolved"
    assert "not resolved" in outcome_text(c) and "95 % CI" in outcome_text(c)


def test_summarize_drops_non_finite_values():
    s = summarize([1.0, float("nan"), 3.0, None])
    assert s["n"] == 2 and s["mean"] == 2.0 and s["values"] == [1.0, 3.0]
