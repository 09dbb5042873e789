"""Known cases (issue 4, item 6): a trained working PLE is judged alive, deliberately dead ones dead."""

from __future__ import annotations

import pytest

from plelab.diagnostics.diagnose import diagnose_model
from plelab.diagnostics.verdict import ALIVE_DELTA, DEAD_DELTA, ablation_verdict, overall_verdict


def test_working_ple_is_alive(working_model, eval_batches):
    r = diagnose_model(working_model, eval_batches)
    assert r["verdict"] == "alive", r["overall"]
    assert r["overall"]["basis"] == "ablation"
    assert [x["verdict"] for x in r["layers"]] == ["alive", "alive"]
    for x in r["layers"]:
        # Every way of removing PLE hurts, the table shuffle included: the table itself carries the lookup.
        assert min(x[f"ablation_delta_loss_{m}"] for m in ("zero", "shuffle", "table")) > ALIVE_DELTA
        assert x["injection_ratio"] > 0.1


def test_random_ids_ple_is_dead(random_ids_model, eval_batches):
    r = diagnose_model(random_ids_model, eval_batches)
    assert r["verdict"] == "dead", r["overall"]
    assert [x["verdict"] for x in r["layers"]] == ["dead", "dead"]
    for x in r["layers"]:
        # Shuffling the table rows of random ids changes nothing: the table carries no information.
        assert abs(x["ablation_delta_loss_table"]) < 0.01


def test_closed_gate_ple_is_dead(closed_gate_model, eval_batches):
    r = diagnose_model(closed_gate_model, eval_batches)
    assert r["verdict"] == "dead"
    for x in r["layers"]:
        assert x["verdict"] == "dead"
        assert x["injection_ratio"] == 0.0
        assert x["gate_near_zero_frac"] == 1.0
        assert x["ablation_delta_loss_zero"] == 0.0


def test_proxies_without_data(working_model, closed_gate_model):
    alive = diagnose_model(working_model)
    dead = diagnose_model(closed_gate_model)
    assert alive["overall"]["basis"] == dead["overall"]["basis"] == "proxies"
    assert any("ablation" in n for n in alive["notes"])
    assert dead["verdict"] == "dead"
    assert alive["verdict"] != "dead"
    assert all(x["ablation_delta_loss"] is None for x in alive["layers"])


@pytest.mark.parametrize(
    ("delta", "se", "expected"),
    [(0.05, 0.001, "alive"), (0.05, 0.03, "dead"), (0.005, 0.001, "weak"), (0.009, 0.004, "weak"),
     (DEAD_DELTA, None, "dead"),
     (-0.01, 0.001, "dead"), (0.02, 0.02, "dead")],
)
def test_ablation_rule_has_all_three_outcomes(delta, se, expected):
    # (0.05, se 0.03) is dead: within NOISE_SIGMAS standard errors of zero, the change is noise.
    assert ablation_verdict(delta, se)[0] == expected


def test_overall_from_proxies():
    assert overall_verdict(["dead", "alive"], None)["verdict"] == "alive"
    assert overall_verdict(["dead", "dead"], None)["verdict"] == "dead"
    assert overall_verdict(["dead", "weak"], None)["verdict"] == "weak"
    assert overall_verdict([], None)["verdict"] == "n/a"


def test_batches_with_ids_beyond_the_vocabulary_are_a_clear_error(make_model):
    import torch

    from plelab.model.transformer import TokenIdError

    model = make_model()
    x = torch.full((2, 8), model.config.vocab_size)
    with pytest.raises(TokenIdError, match="token ids must lie in"):
        diagnose_model(model, [(x, x)])
