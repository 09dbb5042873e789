"""Known cases: a trained working PLE is judged used, deliberately useless ones unused (an equivalence test), and
each verdict of the rule is reachable."""

from __future__ import annotations

import pytest

from plelab.diagnostics.diagnose import diagnose_model
from plelab.diagnostics.verdict import USED_MARGIN, overall_verdict, used_verdict


def test_working_ple_is_used(working_model, eval_batches):
    r = diagnose_model(working_model, eval_batches)
    assert r["used"]["verdict"] == "used", r["used"]
    assert r["used"]["basis"] == "ablation" and r["used"]["provisional"] is False
    assert [x["verdict"] for x in r["layers"]] == ["used", "used"]
    for x in r["layers"]:
        # Every way of removing PLE hurts, the table shuffle included: the table itself carries the lookup.
        assert min(x[f"ablation_delta_loss_{m}"] for m in ("zero", "shuffle", "table")) > USED_MARGIN
        assert x["injection_ratio"] > 0.1


def test_random_ids_ple_is_unused(random_ids_model, eval_batches):
    r = diagnose_model(random_ids_model, eval_batches)
    # The table shuffle costs nothing and its interval lies inside the margin: unused by the equivalence test.
    assert r["used"]["verdict"] == "unused", r["used"]
    assert [x["verdict"] for x in r["layers"]] == ["unused", "unused"]
    for x in r["layers"]:
        # Shuffling the table rows of random ids changes nothing: the table carries no information.
        assert abs(x["ablation_delta_loss_table"]) < 0.01


def test_closed_gate_ple_is_unused(closed_gate_model, eval_batches):
    r = diagnose_model(closed_gate_model, eval_batches)
    assert r["used"]["verdict"] == "unused"
    for x in r["layers"]:
        assert x["verdict"] == "unused"
        assert x["injection_ratio"] == 0.0
        assert x["gate_near_zero_frac"] == 1.0
        assert x["ablation_delta_loss_zero"] == 0.0


def test_proxies_without_data_are_provisional(working_model, closed_gate_model):
    used = diagnose_model(working_model)
    unused = diagnose_model(closed_gate_model)
    assert used["used"]["basis"] == unused["used"]["basis"] == "proxies"
    assert used["used"]["provisional"] and unused["used"]["provisional"]
    assert "provisional" in used["used"]["reason"]
    assert any("ablation" in n for n in used["notes"])
    assert unused["used"]["verdict"] == "unused"
    assert used["used"]["verdict"] != "unused"
    assert all(x["ablation_delta_loss"] is None for x in used["layers"])


@pytest.mark.parametrize(
    ("delta", "se", "n", "expected"),
    [(0.05, 0.001, 8, "used"),
     # within two standard errors of zero the change is noise, and the interval reaches past the margin: the old
     # rule called this "dead"; nothing is shown either way
     (0.05, 0.03, 8, "not resolved"),
     # a real but tiny dependence: resolved (p ~ 1e-3) with its interval inside +-0.01. Not "unused": one
     # meaning per label, as "better, within margin" is never "equivalent"
     (0.005, 0.001, 8, "used, within margin"),
     (-0.005, 0.001, 8, "harmful, within margin"),
     (0.002, 0.002, 8, "unused"),          # nothing resolved (p 0.35), the 90 % interval inside +-0.01
     (0.009, 0.004, 8, "not resolved"),    # the old rule's "weak": the interval crosses the margin
     (0.002, 0.0195, 8, "not resolved"),   # the old rule's "dead" (delta <= 2 s.e.), an interval of +-0.046
     (-0.05, 0.001, 8, "harmful"),
     (0.02, float("nan"), 1, "not resolved"),   # one batch: no interval, so nothing is shown either way
     (0.0, float("nan"), 1, "not resolved")],
)
def test_used_rule_reaches_every_verdict_and_dead_needs_equivalence(delta, se, n, expected):
    assert used_verdict(delta, se, n)["verdict"] == expected


def test_verdict_lines_label_their_intervals():
    unused = used_verdict(0.002, 0.002, 8)["reason"]
    assert "95 % CI [" in unused and "the 90 % interval [" in unused and "inside +-0.01" in unused
    small = used_verdict(0.005, 0.001, 8)["reason"]
    assert "resolved" in small and "the 90 % interval [" in small
    assert "90 %" not in used_verdict(0.05, 0.001, 8)["reason"]  # no equivalence claimed, none printed


def test_recorded_texts_read_in_todays_names():
    from plelab.diagnostics.verdict import today_names

    assert today_names("predicted not alive, final dead") == "predicted not used, final not used"
    assert today_names("3 alive, 1 weak; dead zone") == "3 used, 1 not used; dead zone"


def test_overall_from_proxies():
    assert overall_verdict(["unused", "used"], None)["verdict"] == "used"
    assert overall_verdict(["unused", "unused"], None)["verdict"] == "unused"
    assert overall_verdict(["unused", "not resolved"], None)["verdict"] == "not resolved"
    assert overall_verdict(["unused"], None)["provisional"] is True
    assert overall_verdict([], None)["verdict"] == "n/a"


def test_batches_with_ids_beyond_the_vocabulary_are_a_clear_error(make_model):
    import torch

    from plelab.model.transformer import TokenIdError

    model = make_model()
    x = torch.full((2, 8), model.config.vocab_size)
    with pytest.raises(TokenIdError, match="token ids must lie in"):
        diagnose_model(model, [(x, x)])
