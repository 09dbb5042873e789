"""The distributions under plelab's tests are scipy.stats'. These check how plelab calls them (degrees of freedom,
sides, the paired s.e.) against scipy's own tests on the same per-seed values, and that every result is what the
hand-written distributions plelab used before gave, to float noise (the values pinned below came from them)."""

import math

import numpy as np
import pytest
from scipy import stats as ss

from plelab.stats import (
    accuracy_vs_base_rate,
    equivalence_power,
    mean_se,
    minimum_detectable_effect,
    power,
    seeds_needed,
    sign_test_p,
    spearman,
    t_critical,
    t_test,
    tost,
)

DELTAS = [0.0131, 0.0102, 0.0163, 0.0090, 0.0144]  # five seeds' paired deltas


def test_t_critical_known_values():
    # Tables: t_{0.975, 2} = 4.303, t_{0.975, 4} = 2.776, t_{0.975, 1} = 12.706: n seeds have n - 1 df.
    assert t_critical(3) == pytest.approx(4.302653, abs=1e-6)
    assert t_critical(5) == pytest.approx(2.776445, abs=1e-6)
    assert t_critical(2) == pytest.approx(12.706205, abs=1e-6)
    assert math.isnan(t_critical(1))


def test_the_paired_t_test_is_scipys_one_sample_test_on_the_deltas():
    mean, se = mean_se(DELTAS)
    ours = t_test(mean, se, len(DELTAS))
    theirs = ss.ttest_1samp(DELTAS, 0.0)
    assert ours["t"] == pytest.approx(theirs.statistic, rel=1e-12) and ours["df"] == theirs.df
    assert ours["p"] == pytest.approx(theirs.pvalue, rel=1e-12)


def test_tost_is_the_larger_of_scipys_two_one_sided_tests():
    mean, se = mean_se(DELTAS)
    margin = 0.02
    low = ss.ttest_1samp(DELTAS, -margin, alternative="greater").pvalue
    high = ss.ttest_1samp(DELTAS, margin, alternative="less").pvalue
    result = tost(mean, se, len(DELTAS), margin)
    assert result["p"] == pytest.approx(max(low, high), rel=1e-12) and result["equivalent"] == (max(low, high) < 0.05)


def test_sign_test_and_mcnemar_are_exact_binomial():
    assert sign_test_p(14, 2) == pytest.approx(2 * (1 + 16 + 120) / 2**16)
    assert sign_test_p(14, 2) < 0.01 < sign_test_p(13, 3)
    assert sign_test_p(16, 0) == sign_test_p(0, 16) and sign_test_p(0, 0) == 1.0
    assert sign_test_p(3, 0) == pytest.approx(0.25)  # three seeds all one way: p = 0.25, never significant
    assert sign_test_p(8, 8) == 1.0
    # McNemar: 10 cases the rule gets right and the base rate wrong... of 16 discordant, the binomial at 1/2
    r = accuracy_vs_base_rate(["a"] * 10 + ["b"] * 6, ["a"] * 12 + ["b"] * 4)
    assert r["mcnemar_p"] == pytest.approx(0.6875)


def test_spearman_with_ties_is_scipys():
    xs, ys = [1, 2, 2, 3, 5, 4], [2, 1, 3, 3, 6, 5]
    assert spearman(xs, ys) == pytest.approx(ss.spearmanr(xs, ys).statistic, rel=1e-12)
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1, 2], [2, 1]) is None


# (arguments, what plelab's hand-written t / normal / binomial gave, the tolerance of "float noise": the t-test
# power was an integral over the chi distribution, now scipy's noncentral t, which it approximated to ~1e-6)
BEFORE = [
    (lambda: t_test(0.0124, 0.0069, 3)["p"], 0.21415036848971725, 1e-12),
    (lambda: t_test(-0.0168, 0.0013, 5)["p"], 0.0002067982902503563, 1e-12),
    (lambda: tost(-0.0291, 0.0037, 5, 0.05)["p"], 0.002419043051194225, 1e-12),
    (lambda: tost(0.0236, 0.0040, 6, 0.02)["p"], 0.7953143998276877, 1e-12),
    (lambda: power(0.041, 0.0119, 3), 0.8326004961119973, 1e-5),
    (lambda: power(0.03, 0.02, 5), 0.7107026746251152, 1e-5),
    (lambda: equivalence_power(0.05, 0.077, 6), 0.08363185941665051, 1e-6),
    (lambda: equivalence_power(0.02, 0.01, 4), 0.8277676188740878, 1e-6),
    (lambda: minimum_detectable_effect(0.0119, 3), 0.03884212990974563, 1e-5),
    (lambda: sign_test_p(9, 7), 0.803619384765625, 1e-12),
    (lambda: spearman([1, 2, 2, 3, 5, 4], [2, 1, 3, 3, 6, 5]), 0.8676470588235294, 1e-12),
]


@pytest.mark.parametrize("call, before, rel", BEFORE)
def test_results_are_what_the_hand_written_distributions_gave(call, before, rel):
    assert call() == pytest.approx(before, rel=rel)
    assert seeds_needed(0.041, 0.0119) == 3


def test_power_is_scipys_noncentral_t():
    for n in (2, 3, 5, 12):
        nc, c = 1.3 * np.sqrt(n), ss.t.ppf(0.975, n - 1)
        assert power(1.3, 1.0, n) == pytest.approx(ss.nct.sf(c, n - 1, nc) + ss.nct.cdf(-c, n - 1, nc), rel=1e-12)


def test_power_far_beyond_the_noise_is_one_not_nan():
    # scipy's noncentral t cdf is NaN far out in the left tail (here at df 4, noncentrality 35.8); the tokens
    # study's dP = 1 arm sat there (effect 0.08, sd 0.005, 5 seeds) and its power and seeds came out blank
    # (the values the hand-written integral gave, as above)
    assert power(0.08, 0.005, 5) == pytest.approx(1.0) and power(8.0, 1.0, 2) == pytest.approx(0.6252781277672481,
                                                                                               rel=1e-5)
    assert seeds_needed(0.08, 0.005) == 2
    assert minimum_detectable_effect(0.005, 5) == pytest.approx(0.008409984821973089, rel=1e-5)
