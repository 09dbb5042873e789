"""Holm's correction and per-seed dose-response slopes, with cases where the old per-test rule misread the data."""

import pytest

from plelab.stats import compare, dose_response, holm, mean_se, slope, t_test


def test_holm_step_down():
    h = holm([0.01, 0.04, 0.03, None, 0.005])
    # sorted: 0.005 x4 = 0.02, 0.01 x3 = 0.03, 0.03 x2 = 0.06, 0.04 x1 -> max(0.06, 0.04) = 0.06
    assert h["adjusted"][4] == pytest.approx(0.02) and h["adjusted"][0] == pytest.approx(0.03)
    assert h["adjusted"][2] == pytest.approx(0.06) and h["adjusted"][1] == pytest.approx(0.06)
    assert h["adjusted"][3] is None and h["m"] == 4
    assert h["reject"] == [True, False, False, None, True]


def test_eight_comparisons_at_three_seeds_none_survives_holm():
    """The visual study's eight comparisons: each p < 0.05 alone, none after Holm (|t| > 12.6 needed)."""
    table = [(0.0092, 0.0008), (0.0111, 0.0023), (0.0107, 0.0010), (0.0095, 0.0009), (0.0050, 0.0011),
             (0.0164, 0.0018), (0.0021, 0.0027), (0.0091, 0.0012)]
    ps = [t_test(m, se, 3)["p"] for m, se in table]
    assert sum(p < 0.05 for p in ps) == 7
    assert not any(holm(ps)["reject"])


def test_slope_basics():
    assert slope([0, 1, 2], [1, 3, 5]) == pytest.approx(2.0)
    assert slope([1, 1], [0, 1]) is None


def test_shared_reference_hides_a_dose_response_that_per_seed_slopes_find():
    """Every dose is tested against one reference run per seed; one strong reference (seed 1's) drags every
    delta of that seed up, so no per-dose t test clears 5 % with 3 seeds, yet each seed's loss falls with dose."""
    doses = [1, 2, 4, 8, 16, 32, 64]
    offsets = {1: 0.12, 2: 0.0, 3: -0.02}   # seed 1's reference run is unusually good
    slopes = {1: -0.036, 2: -0.059, 3: -0.064}
    deltas = {d: {s: offsets[s] + slopes[s] * (d.bit_length() - 1) for s in offsets} for d in doses}
    per_dose = [compare(*mean_se(list(deltas[d].values())), 3)["outcome"] for d in doses]
    assert "better" not in per_dose          # the old rule: "no dP clears the test"
    dr = dose_response(deltas)
    assert dr["per_seed"] == pytest.approx(slopes)
    assert dr["negative"] == 3 and dr["verdict"]["outcome"] == "better"


def test_dose_response_needs_two_doses_per_seed():
    dr = dose_response({0: {1: 0.0}, 4: {1: -0.1, 2: -0.2}})
    assert dr["n"] == 0 and dr["verdict"]["outcome"] == "n/a"
    with pytest.raises(ValueError):
        dose_response({1: {1: 0.0}}, transform="sqrt")
