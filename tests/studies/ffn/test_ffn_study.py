"""The FFN study's rules on constructed numbers: paired s.e., verdicts, the illusory-convergence flag, missing data."""

from __future__ import annotations

import json
import math

import pytest

from plelab.stats import significance, t_critical
from plelab.studies.ffn.analysis import (
    PUBLISHED_DOMAINS,
    analyze_study,
    gap_status,
    illusory_convergence,
    paired_delta,
)

DOMAINS = list(PUBLISHED_DOMAINS)  # the 16 evaluation domains of ../shared/data/valid
SEEDS = (1, 2, 3)
# Seed-to-seed wobble the pair shares (same data order), and a small one it does not.
SHARED = {1: 0.00, 2: 0.07, 3: -0.05}
OWN = {1: 0.002, 2: -0.003, 3: 0.001}


def finals(shift, seeds=SEEDS, heldout: float | None = None) -> dict:
    """{"base": ..., "var": ...}: base losses from the published table, var = base + shift(domain, seed)."""
    out: dict = {"base": {}, "var": {}}
    for s in seeds:
        base = {d: {"loss": b + SHARED[s], "bpb": (b + SHARED[s]) / 2} for d, (b, _) in PUBLISHED_DOMAINS.items()}
        var = {d: {"loss": r["loss"] + shift(d, s), "bpb": (r["loss"] + shift(d, s)) / 2} for d, r in base.items()}
        if heldout is not None:
            base["val"], var["val"] = {"loss": 2.0, "bpb": 1.0}, {"loss": 2.0 + heldout, "bpb": 1.0}
        out["base"][s], out["var"][s] = base, var
    return out


def test_paired_se_on_a_hand_example():
    # deltas 0.1, 0.2, 0.3: mean 0.2, sd 0.1, s.e. 0.1 / sqrt(3); seed 4 has no baseline partner and is left out
    p = paired_delta({1: 2.0, 2: 2.1, 3: 2.2}, {1: 2.1, 2: 2.3, 3: 2.5, 4: 9.9})
    assert p["n"] == 3 and p["seeds"] == [1, 2, 3]
    assert p["delta"] == pytest.approx(0.2) and p["se"] == pytest.approx(0.1 / math.sqrt(3))
    # 0.2 / 0.0577 = 3.5 s.e.: beyond "2 s.e." but within t(0.975, 2) = 4.303, so not significant with 3 seeds
    assert t_critical(3) == pytest.approx(4.303, abs=5e-4) and significance(p["delta"], p["se"], p["n"]) == 0
    assert significance(0.3, 0.0577, 3) == 1 and significance(-0.3, 0.0577, 3) == -1
    # Pairing removes what a seed shares: base varies by 0.5 across seeds, the delta does not.
    p = paired_delta({1: 2.0, 2: 2.5, 3: 1.5}, {1: 2.04, 2: 2.54, 3: 1.54})
    assert p["delta"] == pytest.approx(0.04) and p["se"] == pytest.approx(0.0, abs=1e-12)
    one = paired_delta({1: 2.0}, {1: 2.1})
    assert one["n"] == 1 and math.isnan(one["se"]) and significance(one["delta"], one["se"], 1) is None


def test_domains_that_share_a_run_are_not_sixteen_independent_samples():
    """One seed's variant run is bad everywhere, the other two seeds disagree: every domain's mean Δ is > 0, so
    the old rule's sign test over the 16 domains gave p = 3e-5 ('uniform'), as it did for the study's MoE. The
    domains share each run; at the level of seeds (the macro's paired t test) nothing is resolved."""
    per_seed = {1: 0.30, 2: -0.02, 3: 0.03}
    a = analyze_study(finals(lambda d, s: per_seed[s] + 0.001 * DOMAINS.index(d)), "base")
    v = a["variants"]["var"]
    assert v["domains_positive"] == 16                     # what the old sign test counted: p = 2 / 2**16
    assert v["macro_p"] > 0.05 and v["verdict"] == "not resolved"
    assert "sign_test_p" not in v                          # no p value is printed for a count that is not a test


def test_uniform_plus_004_on_all_16_domains_is_uniform_degradation():
    a = analyze_study(finals(lambda d, s: 0.04 + OWN[s]), "base")
    v = a["variants"]["var"]
    assert v["verdict"] == "uniform degradation"
    assert v["domains_worse"] == 16 and v["domains_positive"] == 16 and v["domains_total"] == 16
    assert v["macro_delta"] == pytest.approx(0.04 + sum(OWN.values()) / 3)
    assert a["variants"]["base"]["verdict"] == "baseline" and a["variants"]["base"]["macro_delta"] == 0


def test_the_published_deltas_read_as_uniform_degradation():
    a = analyze_study(finals(lambda d, s: PUBLISHED_DOMAINS[d][1] - PUBLISHED_DOMAINS[d][0] + OWN[s]), "base")
    assert a["variants"]["var"]["verdict"] == "uniform degradation"


def test_mixed_signs_are_a_trade_off():
    a = analyze_study(finals(lambda d, s: (0.05 if DOMAINS.index(d) % 2 else -0.05) + OWN[s]), "base")
    v = a["variants"]["var"]
    assert v["verdict"] == "trade-off" and v["domains_worse"] == 8 and v["domains_better"] == 8
    assert significance(v["macro_delta"], v["macro_delta_se"], v["n_pairs"]) == 0


def test_uniform_gain_non_uniform_degradation_and_no_difference():
    assert analyze_study(finals(lambda d, s: -0.03 + OWN[s]), "base")["variants"]["var"]["verdict"] == "uniform gain"
    # 10 domains clearly worse, 6 a hair better within noise: the macro is worse, the sign test (10/16) is not met.
    noise = {1: 0.01, 2: -0.013, 3: 0.0}
    mixed = analyze_study(finals(lambda d, s: 0.04 + OWN[s] if DOMAINS.index(d) < 10 else noise[s]), "base")
    v = mixed["variants"]["var"]
    assert (v["domains_positive"], v["domains_worse"], v["domains_better"]) == (10, 10, 0)
    assert v["verdict"] == "degradation (not uniform)"
    # Per-seed deltas +0.01, -0.01, 0 on every domain: mean 0, nothing significant. The old rule said "no
    # difference"; without a margin stated beforehand that is "not resolved", with one it is an equivalence test.
    shift = {1: 0.01, 2: -0.01, 3: 0.0}
    flat = analyze_study(finals(lambda d, s: shift[s]), "base")["variants"]["var"]
    assert flat["verdict"] == "not resolved" and flat["domains_worse"] == flat["domains_better"] == 0
    assert analyze_study(finals(lambda d, s: shift[s]), "base", margin=0.05)["variants"]["var"]["verdict"] == \
        "equivalent"
    assert analyze_study(finals(lambda d, s: shift[s]), "base", margin=0.01)["variants"]["var"]["verdict"] == \
        "not resolved"  # the 90 % interval (+-0.017) does not fit inside +-0.01


def test_a_large_noisy_difference_is_not_resolved_not_no_difference():
    """The study's MoE macro: +0.166 +- 0.058 over 3 seeds (t = 2.9). The old verdict was 'no difference'."""
    per_seed = {1: 0.166 - 0.10, 2: 0.166, 3: 0.166 + 0.10}
    v = analyze_study(finals(lambda d, s: per_seed[s]), "base", margin=0.02)["variants"]["var"]
    assert v["macro_delta"] == pytest.approx(0.166) and v["verdict"] == "not resolved"
    assert v["macro_ci95"][0] < 0 < 0.3 < v["macro_ci95"][1]


def test_several_variants_are_one_family():
    """Each of six variants at p ~ 0.03 alone: the old rule called each significant; Holm over the six does not."""
    per_seed = {1: 0.10 - 0.02, 2: 0.10, 3: 0.10 + 0.02}
    data = finals(lambda d, s: per_seed[s])
    alone = analyze_study(data, "base")["variants"]["var"]
    assert alone["macro_p"] < 0.05 and alone["macro_significant"] == 1
    for k in range(5):
        data[f"var{k}"] = data["var"]
    six = analyze_study(data, "base")["variants"]["var"]
    assert six["macro_p"] == pytest.approx(alone["macro_p"]) and six["macro_p_holm"] > 0.05
    assert six["macro_significant"] == 0


def test_heldout_split_is_a_row_but_not_in_the_macro_or_the_counts():
    a = analyze_study(finals(lambda d, s: 0.04 + OWN[s], heldout=-1.0), "base")
    v = a["variants"]["var"]
    assert list(a["domains"])[-1] == "val" and a["domains"]["val"]["var"]["delta"] == pytest.approx(-1.0)
    assert v["heldout_delta"] == pytest.approx(-1.0)
    assert v["domains_total"] == 16 and v["domains_better"] == 0 and v["macro_delta"] > 0.03


def _timeline(gaps: dict[int, list[float]], tokens=(1e5, 2e5, 4e5, 8e5, 1.6e6)) -> dict:
    """Baseline and variant timelines whose per-seed macro gap at tokens[i] is gaps[seed][i]."""
    out: dict = {"base": {}, "var": {}}
    for s, gs in gaps.items():
        out["base"][s] = [{"step": i, "tokens": t, "domains": {d: {"loss": 3.0 - 0.1 * i + SHARED[s], "bpb": 1.0}
                                                               for d in DOMAINS}} for i, t in enumerate(tokens)]
        out["var"][s] = [{"step": i, "tokens": t, "domains": {d: {"loss": 3.0 - 0.1 * i + SHARED[s] + g, "bpb": 1.0}
                                                              for d in DOMAINS}} for i, (t, g) in
                         enumerate(zip(tokens, gs, strict=True))]
    return out


def test_a_gap_that_closes_and_reopens_is_flagged_illusory_convergence():
    # The published shape: +0.08, then 0.00 (closed), then +0.18 and +0.04.
    gaps = {s: [g + OWN[s] for g in (0.08, 0.0, 0.18, 0.10, 0.04)] for s in SEEDS}
    a = analyze_study(finals(lambda d, s: 0.04 + OWN[s]), "base", timelines=_timeline(gaps), margin=0.02)
    v = a["variants"]["var"]
    assert v["illusory_convergence"] is True
    assert v["illusory_at"]["closed_tokens"] == 2e5 and v["illusory_at"]["reopened_tokens"] == 4e5
    points = a["timeline"]["var"]
    assert [p["tokens"] for p in points] == [1e5, 2e5, 4e5, 8e5, 1.6e6]
    assert points[2]["gap"] == pytest.approx(0.18 + sum(OWN.values()) / 3) and points[2]["n"] == 3
    assert all(p["gap"] == 0 for p in a["timeline"]["base"])
    assert "illusory_convergence" in a["rules"]
    # Without a margin no gap is ever 'closed': the old rule called a gap closed when it was merely not significant.
    b = analyze_study(finals(lambda d, s: 0.04 + OWN[s]), "base", timelines=_timeline(gaps))["variants"]["var"]
    assert b["illusory_convergence"] is False and b["first_open"]["tokens"] == 1e5


@pytest.mark.parametrize("shape", [(0.08, 0.06, 0.05, 0.05, 0.04),   # never closes
                                   (0.08, 0.04, 0.02, 0.0, 0.0),     # closes and stays closed
                                   (0.0, 0.0, 0.0, 0.0, 0.002),      # never opens beyond the tolerance
                                   (0.0, 0.0, 0.05, 0.1, 0.2),       # opens from zero: never converged
                                   (-0.05, 0.0, -0.06, -0.05, 0.0)])  # better, equal, better: never worse
def test_gaps_that_do_not_close_and_reopen_are_not_flagged(shape):
    gaps = {s: [g + OWN[s] for g in shape] for s in SEEDS}
    a = analyze_study(finals(lambda d, s: OWN[s]), "base", timelines=_timeline(gaps), margin=0.01)
    assert a["variants"]["var"]["illusory_convergence"] is False and a["variants"]["var"]["illusory_at"] is None


def test_a_timeline_scored_on_the_heldout_split_alone_reads_that_split_at_every_point():
    # eval_timeline_domains = "heldout": every point but the last holds only "val"; the last (the final, full
    # evaluation) holds val and the domains, whose macro gap differs: the curve stays on val all along.
    gaps = {s: [g + OWN[s] for g in (0.08, 0.05, 0.03, 0.02, 0.02)] for s in SEEDS}
    timelines = _timeline(gaps)
    for runs in timelines.values():
        for points in runs.values():
            for p in points[:-1]:
                p["domains"] = {"val": {"loss": p["domains"][DOMAINS[0]]["loss"], "bpb": 1.0}}
            last = points[-1]["domains"]
            last["val"] = {"loss": last[DOMAINS[0]]["loss"], "bpb": 1.0}
            for d in DOMAINS:
                last[d] = {"loss": last[d]["loss"] + (0.3 if runs is timelines["var"] else 0.0), "bpb": 1.0}
    points = analyze_study(finals(lambda d, s: 0.02 + OWN[s]), "base", timelines=timelines)["timeline"]["var"]
    assert [p["metric"] for p in points] == ["val"] * 5
    assert points[0]["gap"] == pytest.approx(0.08 + sum(OWN.values()) / 3) and points[0]["n"] == 3
    assert points[-1]["gap"] == pytest.approx(0.02 + sum(OWN.values()) / 3)  # not the macro's +0.3
    assert points[-1]["loss"] == pytest.approx(
        sum(timelines["var"][s][-1]["domains"]["val"]["loss"] for s in SEEDS) / len(SEEDS))
    # A final point without the split pairs nothing rather than switching metric.
    for runs in timelines.values():
        for points in runs.values():
            del points[-1]["domains"]["val"]
    points = analyze_study(finals(lambda d, s: 0.02 + OWN[s]), "base", timelines=timelines)["timeline"]["var"]
    assert points[-1]["metric"] == "val" and points[-1]["n"] == 0


OPEN = {"tokens": 0, "gap": 0.08, "se": 0.001, "n": 3, "per_seed": {1: 0.079, 2: 0.08, 3: 0.081}}


def test_a_reopening_within_the_noise_of_the_change_is_not_flagged():
    # Closed at point 1, then +0.05 at point 2 but with seed-to-seed spread too large for 3 seeds to resolve.
    points = [OPEN, {"tokens": 1, "gap": 0.0, "se": 0.001, "n": 3, "per_seed": {1: 0.0, 2: 0.001, 3: -0.001}},
              {"tokens": 2, "gap": 0.05, "se": 0.04, "n": 3, "per_seed": {1: 0.12, 2: 0.01, 3: 0.02}}]
    assert illusory_convergence(points, margin=0.01) is None
    # Point 2 is significantly worse, but point 1's mean (0.004) is so noisy that it is not inside the margin
    # by TOST: not closed (the old rule called it closed for being within 0.005 of 0), so no flag.
    points = [OPEN, {"tokens": 1, "gap": 0.004, "se": 0.027, "n": 3, "per_seed": {1: -0.05, 2: 0.03, 3: 0.032}},
              {"tokens": 2, "gap": 0.03, "se": 0.0006, "n": 3, "per_seed": {1: 0.029, 2: 0.03, 3: 0.031}}]
    assert significance(points[2]["gap"], points[2]["se"], 3) == 1
    assert illusory_convergence(points, margin=0.01) is None
    # A gap resolved inside the margin (0.004 +- 0.0006, p 0.02) is real: "open, within margin", never closed
    points[1].update(se=0.000577, per_seed={1: 0.003, 2: 0.004, 3: 0.005})
    assert gap_status(points[1], 0.01)["status"] == "open, within margin"
    assert illusory_convergence(points, margin=0.01) is None
    # Closed: nothing resolved and the interval inside the margin (0.001 +- 0.0006, p 0.23)
    points[1].update(gap=0.001, se=0.000577, per_seed={1: 0.0, 2: 0.001, 3: 0.002})
    assert gap_status(points[1], 0.01)["status"] == "closed"
    found = illusory_convergence(points, margin=0.01)
    assert (found["open_tokens"], found["closed_tokens"], found["reopened_tokens"]) == (0, 1, 2)
    # Without the open point before it, the same closed-then-worse pair is a gap opening, not a convergence.
    assert illusory_convergence(points[1:], margin=0.01) is None
    assert illusory_convergence(points) is None  # no margin: nothing is ever closed


def test_missing_seeds_and_variants_get_a_clear_note_and_no_verdict():
    data = finals(lambda d, s: 0.04 + OWN[s])
    data["lonely"] = {1: data["var"][1], 7: data["var"][2]}  # seed 7 has no baseline run
    data["var"][3] = {d: r for d, r in data["var"][3].items() if d != "code"}
    a = analyze_study(data, "base", variants=["base", "var", "lonely", "moe"])
    assert a["variants"]["moe"]["verdict"] == "n/a" and a["variants"]["moe"]["runs"] == 0
    assert a["variants"]["lonely"]["verdict"] == "n/a" and a["variants"]["lonely"]["n_pairs"] == 1
    assert a["variants"]["var"]["verdict"] == "uniform degradation"
    assert a["domains"]["code"]["var"]["n"] == 2
    notes = "\n".join(a["notes"])
    assert "variant 'moe' has no finished runs yet" in notes
    assert "seed(s) [7] have no baseline run" in notes and "'lonely': 1 paired seed(s), fewer than 2" in notes
    assert "variant 'var' seed 3 has no evaluation on ['code']" in notes
    none = analyze_study({"var": data["var"]}, "base")
    assert "the baseline 'base' has no finished runs" in none["notes"][0]
    assert none["variants"]["var"]["verdict"] == "n/a" and none["variants"]["var"]["macro_delta"] is None


def test_json_shape_and_types():
    gaps = {s: [0.05 + OWN[s]] * 5 for s in SEEDS}
    costs = {"base": {"params": 1000, "active_params_per_token": 900, "inference_bytes": 1800},
             "var": {"params": 800, "active_params_per_token": 700, "inference_bytes": 1500}}
    decode = {"var": {"tokens_per_s": 123.4, "bytes_per_token": 1500}}
    a = analyze_study(finals(lambda d, s: 0.04 + OWN[s], heldout=0.01), "base", timelines=_timeline(gaps),
                      costs=costs, decode=decode)
    a = json.loads(json.dumps(a, allow_nan=False))  # plain JSON: no NaN, no tuples, string keys
    assert {"variants", "domains", "timeline", "rules"} <= set(a)
    for v in a["variants"].values():
        assert isinstance(v["params"], int) and isinstance(v["active_params_per_token"], int)
        assert isinstance(v["inference_bytes"], int) and isinstance(v["domains_worse"], int)
        assert isinstance(v["macro_delta"], float) and isinstance(v["macro_delta_se"], float)
        assert isinstance(v["verdict"], str)
    assert isinstance(a["variants"]["var"]["tokens_per_s"], float)
    assert isinstance(a["variants"]["var"]["bytes_per_token"], int)
    assert isinstance(a["variants"]["var"]["illusory_convergence"], bool)
    assert set(a["domains"]) == set(DOMAINS) | {"val"}
    for cells in a["domains"].values():
        assert set(cells) == {"base", "var"}
        assert all(isinstance(cells["var"][k], float) for k in ("delta", "se", "delta_bpb"))
    assert all({"tokens", "gap", "se"} <= set(p) for pts in a["timeline"].values() for p in pts)
    assert all(isinstance(r, str) for r in a["rules"].values())
