"""The analysis arithmetic on synthetic numbers: seed table, step classes (each one occurs), conclusions."""

from __future__ import annotations

import math

import pytest

from plelab.stats import mean_std
from plelab.studies.deadzone.analysis import classify_steps, conclusion, domain_table, seed_table


def runs(curve: dict[int, list[float]]) -> list[dict]:
    """Finished-run records with losses given per dP (one value per seed)."""
    return [{"name": f"d{d}s{s}", "ple_dim": d, "seed": s, "loss": loss, "params_added": 10 * d, "params_base": 1000}
            for d, losses in curve.items() for s, loss in enumerate(losses, 1)]


def classes(curve: dict[int, list[float]]) -> list[str]:
    return [s["class"] for s in classify_steps(seed_table(runs(curve)))]


def test_seed_table_means_stds_and_delta_with_standard_error():
    table = seed_table(runs({0: [2.0, 2.2], 64: [1.9, 1.9, 2.0]}))
    base, ple = table
    assert (base["n"], ple["n"], ple["params_added"], ple["pct_of_base"]) == (2, 3, 640, 64.0)
    assert base["loss_mean"] == pytest.approx(2.1) and base["loss_std"] == pytest.approx(math.sqrt(0.02))
    assert ple["delta"] == pytest.approx(1.9333333 - 2.1)
    assert ple["delta_se"] == pytest.approx(math.sqrt(0.02 / 2 + ple["loss_std"] ** 2 / 3))
    assert ple["significant"] is False  # -0.167 against a s.e. of 0.104: within 2 s.e.
    assert seed_table(runs({0: [2.0], 8: [1.0]}))[1]["significant"] is None  # one seed: no noise estimate


def test_the_published_curve_gives_dead_zone_transition_and_diminishing_returns_with_a_margin():
    # The published shape with a seed-to-seed std of 0.002: 0 -> 64 small gain, 64 -> 128 flat, 128 -> 256 big.
    noise = [-0.002, 0.0, 0.002]
    curve = {d: [m + e for e in noise] for d, m in {0: 2.155, 64: 2.149, 128: 2.149, 256: 2.132, 512: 2.122}.items()}
    steps = classify_steps(seed_table(runs(curve)), margin=0.005)
    assert [s["class"] for s in steps] == ["improvement", "dead zone", "transition", "diminishing returns"]
    assert steps[2]["gain_per_doubling"] == pytest.approx(0.017)
    assert steps[1]["noise"] == pytest.approx(math.sqrt(2 * 0.002**2 / 3))
    verdict = conclusion(steps)
    assert verdict["dead_zone"] is True and "64 -> 128" in verdict["text"]


def test_within_noise_is_not_a_dead_zone_without_an_equivalence_test():
    # The same curve, no margin: 64 -> 128 is within noise, which the old rule called a dead zone.
    noise = [-0.002, 0.0, 0.002]
    curve = {d: [m + e for e in noise] for d, m in {0: 2.155, 64: 2.149, 128: 2.149, 256: 2.132}.items()}
    steps = classify_steps(seed_table(runs(curve)))
    assert [s["class"] for s in steps] == ["improvement", "not resolved", "transition"]
    verdict = conclusion(steps)
    assert verdict["pattern"] == "not resolved, then transition" and verdict["dead_zone"] is None
    # A margin the interval does not fit inside (3 seeds, s.e. 0.0016: the 90 % interval is +-0.005) is no better.
    assert classify_steps(seed_table(runs(curve)), margin=0.002)[1]["class"] == "not resolved"


def test_worse_and_unmeasurable_steps():
    assert classes({0: [1.0, 1.01], 8: [1.5, 1.51]}) == ["worse"]
    assert classes({0: [1.0], 8: [0.5]}) == ["n/a"]
    assert conclusion(classify_steps(seed_table(runs({0: [1.0], 8: [0.5]}))))["pattern"] == "unknown"


@pytest.mark.parametrize("curve, margin, pattern", [
    ({0: [1.0, 1.01, 1.005], 8: [1.0, 1.01, 1.005], 16: [1.005, 0.995, 1.0]}, 0.05, "flat"),
    ({0: [1.0, 1.01, 1.005], 8: [1.0, 1.01, 1.005], 16: [1.005, 0.995, 1.0]}, None, "not resolved"),
    ({0: [2.0, 2.01, 2.005], 8: [1.5, 1.51, 1.505], 16: [1.5, 1.51, 1.505]}, 0.05, "saturation"),
    ({0: [2.0, 2.01, 2.005], 8: [1.5, 1.51, 1.505], 16: [1.5, 1.51, 1.505]}, None, "gains, then not resolved"),
    ({0: [2.0, 2.01], 8: [1.5, 1.51], 16: [1.3, 1.31]}, None, "monotonic"),
])
def test_conclusions(curve, margin, pattern):
    table = seed_table(runs(curve))
    assert conclusion(classify_steps(table, margin), table)["pattern"] == pattern


def test_a_step_that_costs_loss_is_never_read_as_flat():
    # 0 -> 8 inside the margin, 8 -> 16 worse beyond noise: the old conclusion called this "flat"
    curve = {0: [1.0, 1.01, 1.005], 8: [1.0, 1.01, 1.005], 16: [1.1, 1.11, 1.105]}
    table = seed_table(runs(curve))
    steps = classify_steps(table, 0.05)
    assert [s["class"] for s in steps] == ["dead zone", "worse"]
    result = conclusion(steps, table)
    assert result["pattern"] == "a step worse" and "8 -> 16 raises the loss" in result["text"]
    assert result["dead_zone"] is None


def test_small_steps_that_add_up_beyond_noise_are_called_gradual_not_flat():
    # Each step gains 0.02 against a step noise of ~0.016 (within 2 s.e.), but 0 -> 16 gains 0.04 beyond it.
    curve = {0: [2.0, 2.02, 1.98], 8: [1.98, 2.0, 1.96], 16: [1.96, 1.98, 1.94]}
    table = seed_table(runs(curve))
    steps = classify_steps(table)
    assert [s["class"] for s in steps] == ["not resolved", "not resolved"]
    result = conclusion(steps, table)
    assert result["pattern"] == "gradual" and "dP=16" in result["text"]


def test_per_doubling_gain_decides_the_transition_not_the_raw_step():
    # 8 -> 64 drops 0.3 over 3 doublings (0.1 each); 64 -> 128 drops 0.15 in one: the latter is the transition.
    curve = {8: [3.0, 3.01], 64: [2.7, 2.71], 128: [2.55, 2.56]}
    assert classes(curve) == ["improvement", "transition"]


def test_domain_table_deltas_follow_the_dims():
    points = runs({0: [1.0, 1.0], 8: [1.0, 1.0]})
    evals = {p["name"]: {"a": {"loss": 2.0 - 0.1 * (p["ple_dim"] > 0)}, "b": {"loss": 1.0}} for p in points}
    table = domain_table(points, evals)
    assert table["dims"] == [0, 8] and table["domains"] == ["a", "b"]
    assert table["rows"][0]["delta"] == pytest.approx([0.0, -0.1]) and table["improved_domains"] == [0, 1]
    assert math.isnan(mean_std([1.0])[1])  # no std from one value
