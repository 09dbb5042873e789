"""Structured pruning: schedule, importance order, export as a plain SwiGLU that computes the same function."""

from __future__ import annotations

import pytest
import torch

from plelab.model import LanguageModel, count_params, load_model_config
from plelab.model.config import FFNConfig
from plelab.model.ffn import PrunedSwiGLU, ffn_param_count, ffn_training_param_count
from plelab.model.pruning import (
    TAYLOR_DECAY,
    PruningError,
    alive_target,
    decay_importance,
    export_pruned,
    prune_to_count,
    pruned_layers,
    shipped_config,
    unit_importance,
)
from plelab.util.dataclass_config import ConfigError

PRUNED = ["ffn.kind=pruned", "ffn.prune_to=24", "ffn.prune_start=0.2", "ffn.prune_end=0.6"]


def test_schedule_is_full_then_linear_then_exactly_prune_to():
    cfg = FFNConfig(kind="pruned", intermediate_size=64, prune_to=24, prune_start=0.2, prune_end=0.6)
    counts = [alive_target(s, 100, cfg) for s in range(101)]
    assert counts[:21] == [64] * 21
    assert counts[60:] == [24] * 41
    assert all(a >= b for a, b in zip(counts, counts[1:], strict=False))
    assert counts[40] == 44  # halfway in steps, halfway in units


def test_lowest_magnitude_units_go_first_and_never_come_back():
    torch.manual_seed(0)
    ffn = PrunedSwiGLU(4, FFNConfig(kind="pruned", intermediate_size=6, prune_to=2))
    with torch.no_grad():
        for j, scale in enumerate([5.0, 1.0, 4.0, 0.5, 3.0, 2.0]):
            ffn.down_proj.weight[:, j] *= scale / ffn.down_proj.weight[:, j].norm()
            ffn.gate_proj.weight[j] /= ffn.gate_proj.weight[j].norm()
            ffn.up_proj.weight[j] /= ffn.up_proj.weight[j].norm()
    assert prune_to_count(ffn, 4) == 2
    assert ffn.alive.tolist() == [1, 0, 1, 0, 1, 1]
    with torch.no_grad():
        ffn.down_proj.weight[:, 1] *= 100  # a removed unit that grows stays removed
    assert prune_to_count(ffn, 3) == 1
    assert ffn.alive.tolist() == [1, 0, 1, 0, 1, 0]
    assert prune_to_count(ffn, 5) == 0


def test_dead_units_contribute_nothing():
    torch.manual_seed(0)
    ffn = PrunedSwiGLU(4, FFNConfig(kind="pruned", intermediate_size=6, prune_to=2))
    x = torch.randn(3, 4)
    with torch.no_grad():
        ffn.alive[2] = 0
        before = ffn(x)
        ffn.gate_proj.weight[2] += 10
    assert torch.equal(ffn(x), before)


def test_taylor_score_accumulates_activation_times_gradient_in_training_only():
    torch.manual_seed(0)
    ffn = PrunedSwiGLU(4, FFNConfig(kind="pruned", intermediate_size=6, prune_to=2, prune_importance="taylor"))
    xs, target = [torch.randn(2, 3, 4) for _ in range(2)], torch.randn(2, 3, 4)
    want = torch.zeros(6)
    for x in xs:
        ffn.train()
        ((ffn(x) - target) ** 2).sum().backward()
        h = (torch.nn.functional.silu(ffn.gate_proj(x)) * ffn.up_proj(x)).detach().requires_grad_()
        (grad,) = torch.autograd.grad(((ffn.down_proj(h) - target) ** 2).sum(), h)
        want += (h * grad).sum(dim=(0, 1)).abs()
    ffn.eval()
    ffn(xs[0]).sum().backward()  # evaluation adds nothing
    assert torch.allclose(ffn.taylor_score, want, rtol=1e-5)
    assert torch.equal(unit_importance(ffn), ffn.taylor_score)
    decay_importance(ffn)
    assert torch.allclose(ffn.taylor_score, TAYLOR_DECAY * want, rtol=1e-5)
    prune_to_count(ffn, 4)
    assert ffn.alive.nonzero().flatten().tolist() == sorted(want.argsort()[2:].tolist())


@pytest.mark.parametrize("importance", ["magnitude", "taylor"])
def test_exported_dense_model_gives_the_pruned_models_logits(importance):
    cfg = load_model_config("tiny", [*PRUNED, f"ffn.prune_importance={importance}"])
    torch.manual_seed(0)
    model = LanguageModel(cfg).eval()
    for ffn in pruned_layers(model):
        prune_to_count(ffn, cfg.ffn.prune_to)
    dense_cfg, state = export_pruned(model, cfg)
    assert (dense_cfg.ffn.kind, dense_cfg.ffn.intermediate_size) == ("swiglu", 24)
    assert dense_cfg == shipped_config(cfg) and shipped_config(dense_cfg) == dense_cfg
    dense = LanguageModel(dense_cfg).eval()
    dense.load_state_dict(state)  # strict: exactly the SwiGLU's keys and shapes
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.allclose(dense(ids)[0], model(ids)[0], atol=1e-6, rtol=0)
    assert sum(p.numel() for p in dense.parameters()) == count_params(cfg)["total"]  # counts report what ships


def test_export_refuses_an_unfinished_schedule():
    cfg = load_model_config("tiny", PRUNED)
    model = LanguageModel(cfg)
    prune_to_count(pruned_layers(model)[0], 30)
    with pytest.raises(PruningError, match="layers.0.mlp.alive has 30 live units"):
        export_pruned(model.state_dict(), cfg)
    with pytest.raises(PruningError, match="kind = 'pruned'"):
        export_pruned(model, load_model_config("tiny"))


def test_counts_report_the_shipped_width_and_training_the_full_width():
    cfg = FFNConfig(kind="pruned", intermediate_size=64, prune_to=24)
    assert ffn_param_count(32, cfg) == {"ffn": 3 * 32 * 24, "ffn_mask": 0}
    assert ffn_training_param_count(32, cfg) == sum(p.numel() for p in PrunedSwiGLU(32, cfg).parameters())


def test_alive_flags_are_in_the_state_dict_and_reset_to_one():
    model = LanguageModel(load_model_config("tiny", PRUNED))
    prune_to_count(pruned_layers(model)[1], 24)
    assert model.state_dict()["layers.1.mlp.alive"].sum() == 24
    model.reset_parameters()
    assert all(f.alive.sum() == 64 for f in pruned_layers(model))


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["ffn.kind=pruned", "ffn.prune_to=64"], "ffn.prune_to"),
        (["ffn.kind=pruned"], "ffn.prune_to"),
        (["ffn.kind=pruned", "ffn.prune_to=8", "ffn.prune_start=0.8", "ffn.prune_end=0.5"], "ffn.prune_start"),
        (["ffn.kind=pruned", "ffn.prune_to=8", "ffn.prune_end=1.5"], "ffn.prune_end"),
        (["ffn.kind=pruned", "ffn.prune_to=8", "ffn.prune_importance=random"], "ffn.prune_importance"),
    ],
)
def test_bad_pruning_settings_are_config_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_model_config("tiny", overrides)
