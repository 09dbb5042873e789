"""Predictors beside their baselines; power, minimum detectable effect and seeds needed."""

import numpy as np
import pytest

from plelab.stats import (
    accuracy_vs_base_rate,
    equivalence_power,
    majority,
    minimum_detectable_effect,
    plan_power,
    power,
    ranker_vs_trivial,
    seeds_for_equivalence,
    seeds_needed,
    spearman,
)


def test_a_rule_right_16_of_21_is_worse_than_always_alive():
    """The law study's early rule on H = 128: 16/21 right looked like a result; 'always alive' gets 20/21."""
    actual = ["alive"] * 20 + ["not alive"]
    predicted = ["alive"] * 15 + ["not alive"] * 5 + ["not alive"]
    r = accuracy_vs_base_rate(predicted, actual, base_class="alive")
    assert (r["correct"], r["base_correct"]) == (16, 20) and r["beats_base_rate"] is False
    assert r["only_rule_right"] == 1 and r["only_base_right"] == 5
    assert r["mcnemar_p"] == pytest.approx(2 * 7 / 64)  # 5 of 6 discordant on the base rule's side
    assert majority(actual) == "alive" and majority([]) is None


def test_ranker_beside_the_trivial_ranker():
    dose = [1, 1, 2, 2, 4, 4, 8, 8]
    gain = [0.1, 0.12, 0.2, 0.18, 0.3, 0.33, 0.4, 0.41]
    signal = [0.5, 0.6, 0.9, 1.0, 1.4, 1.2, 2.0, 2.1]   # mostly dose itself
    r = ranker_vs_trivial(signal, gain, dose)
    assert r["rho"] > 0.9 and r["rho_trivial"] > 0.9 and abs(r["gain_over_trivial"]) < 0.1
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0) and spearman([1, 1, 1], [1, 2, 3]) is None


def test_power_against_simulation():
    rng = np.random.default_rng(0)
    from plelab.stats import t_test

    n, sd, delta = 3, 0.02, 0.03
    sims = rng.normal(delta, sd, size=(20000, n))
    m, s = sims.mean(axis=1), sims.std(axis=1, ddof=1) / np.sqrt(n)
    rejected = np.mean([t_test(a, b, n)["p"] < 0.05 for a, b in zip(m[:4000], s[:4000], strict=True)])
    assert power(delta, sd, n) == pytest.approx(rejected, abs=0.03)


def test_mde_and_seeds_needed_are_consistent():
    sd = 0.0119  # the FFN study's MGLU-on-val spread (s.e. 0.0069 x sqrt(3))
    mde3 = minimum_detectable_effect(sd, 3)
    assert power(mde3, sd, 3) == pytest.approx(0.8, abs=1e-3)
    assert minimum_detectable_effect(sd, 10) < mde3
    n = seeds_needed(0.041, sd)
    assert power(0.041, sd, n) >= 0.8 > power(0.041, sd, n - 1)
    assert seeds_needed(0.0, sd) is None and minimum_detectable_effect(sd, 1) is None
    assert power(0.0, sd, 5) == pytest.approx(0.05, abs=1e-3)  # at no effect, power is the test's level


def test_equivalence_power():
    sd = 0.077  # the narrow-SwiGLU-on-val spread (s.e. 0.0444 x sqrt(3))
    assert equivalence_power(0.02, sd, 3) < 0.01        # 3 seeds cannot show equivalence at 0.02 nats
    n = seeds_for_equivalence(0.05, sd)
    assert equivalence_power(0.05, sd, n) >= 0.8 > equivalence_power(0.05, sd, n - 1)
    p = plan_power(sd, 3, effect=0.041, margin=0.05)
    assert p["seeds_for_effect"] > 3 and p["seeds_for_equivalence"] == n and p["mde"] > 0.1
