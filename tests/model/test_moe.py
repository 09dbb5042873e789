"""Mixture of experts: routing reaches exactly k experts, dropless output = a naive loop, balance loss, capacity."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import plelab.model.moe as moe_module
from plelab.model.config import FFNConfig
from plelab.model.moe import MoE, router_stats
from plelab.util.dataclass_config import ConfigError

H = 8


def make(**fields) -> MoE:
    torch.manual_seed(0)
    cfg = FFNConfig(kind="moe", intermediate_size=12, num_experts=4, top_k=2, **fields)
    return MoE(H, cfg, std=0.5, out_std=0.5)


def naive(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Per-token loop over the renormalised top-k experts, straight from the definition."""
    out = torch.zeros_like(x)
    probs = (x @ moe.router.weight.T).softmax(-1)
    for t in range(x.shape[0]):
        w, e = probs[t].topk(moe.top_k)
        for weight, i in zip(w / w.sum(), e.tolist(), strict=True):
            h = F.silu(moe.gate_proj[i] @ x[t]) * (moe.up_proj[i] @ x[t])
            out[t] += weight * (moe.down_proj[i] @ h)
    if moe.shared_gate_proj is not None:
        out += F.silu(x @ moe.shared_gate_proj.T) * (x @ moe.shared_up_proj.T) @ moe.shared_down_proj.T
    return out


@pytest.mark.parametrize("shared", [False, True])
def test_dropless_output_equals_a_per_token_loop(shared):
    moe = make(shared_expert=shared)
    x = torch.randn(2, 7, H)
    assert torch.allclose(moe(x), naive(moe, x.reshape(-1, H)).reshape(x.shape), atol=1e-5)


def test_each_token_reaches_exactly_k_distinct_experts(monkeypatch):
    moe = make()
    x = torch.randn(20, H)
    seen: list[torch.Tensor] = []
    real = moe_module.expert_forward

    def spy(rows, gate, up, down):
        expert = next(i for i in range(moe.num_experts) if gate.data_ptr() == moe.gate_proj[i].data_ptr())
        seen.append(torch.cdist(rows, x).argmin(dim=1) * moe.num_experts + expert)  # (token, expert) ids
        return real(rows, gate, up, down)

    monkeypatch.setattr(moe_module, "expert_forward", spy)
    moe(x)
    pairs = torch.cat(seen)
    assert pairs.unique().numel() == pairs.numel() == 20 * moe.top_k  # no (token, expert) pair twice
    assert torch.equal(torch.bincount(pairs // moe.num_experts, minlength=20), torch.full((20,), moe.top_k))


def test_balance_loss_is_one_times_the_weight_for_a_uniform_router_and_larger_when_skewed():
    moe = make(router_aux_weight=0.5, router_z_weight=0.0)
    x = torch.randn(64, H) + 1
    with torch.no_grad():
        moe.router.weight.zero_()  # every expert probability 1/E
    moe.train()
    moe(x)
    assert moe.aux_losses["moe_balance"].item() == pytest.approx(0.5, abs=1e-6)
    assert moe.aux_losses["moe_z"].item() == 0.0
    with torch.no_grad():
        moe.router.weight[0] = 1.0  # expert 0 attracts every token (x is mostly positive)
    moe(x)
    assert moe.aux_losses["moe_balance"].item() > 0.5 * 1.5


def test_z_loss_is_mean_squared_logsumexp():
    moe = make(router_aux_weight=0.0, router_z_weight=2.0)
    x = torch.randn(10, H)
    moe.train()
    moe(x)
    want = 2.0 * torch.logsumexp(x @ moe.router.weight.T, -1).square().mean()
    assert moe.aux_losses["moe_z"].item() == pytest.approx(want.item(), rel=1e-5)


def test_eval_forward_sets_no_aux_losses_and_gradients_reach_the_router():
    moe = make()
    moe.train()
    x = torch.randn(10, H)
    out = moe(x)
    (out.square().sum() + sum(moe.aux_losses.values())).backward()
    assert moe.router.weight.grad.abs().sum() > 0
    moe.eval()
    moe(x)
    assert moe.aux_losses == {}


def test_capacity_drops_are_counted_and_the_kept_assignments_match_the_reference():
    moe = make(capacity_factor=0.5)
    x = torch.randn(16, H) + 1
    with torch.no_grad():
        moe.router.weight[0] = 1.0  # crowd expert 0 so capacity binds
    moe.train()
    out = moe(x)
    cap = math.ceil(0.5 * 16 * 2 / 4)
    assert moe.capacity(16) == cap
    _, _, experts = moe.route(x)
    counts = torch.bincount(experts.reshape(-1), minlength=4)
    dropped = (counts - counts.clamp(max=cap)).sum().item() / (16 * 2)
    assert dropped > 0
    assert moe.last_stats["dropped"].item() == pytest.approx(dropped)
    assert router_stats(moe)["moe_dropped"] == pytest.approx(dropped)
    # A dropless twin differs exactly on the dropped assignments' tokens and agrees on the others.
    free = make()
    free.load_state_dict(moe.state_dict())
    full = free(x)
    flat = experts.reshape(-1)
    order = flat.argsort(stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel()) - (counts.cumsum(0) - counts)[flat[order]]
    hit = (rank >= cap).reshape(16, 2).any(dim=1)
    assert torch.allclose(out[~hit], full[~hit], atol=1e-6)
    assert not torch.allclose(out[hit], full[hit], atol=1e-6)


def test_router_stats_report_load_extremes_and_entropy():
    moe = make()
    with torch.no_grad():
        moe.router.weight.zero_()
    moe.train()
    moe(torch.randn(32, H))
    stats = router_stats(moe)
    assert stats["moe_router_entropy"] == pytest.approx(math.log(4), rel=1e-5)
    assert 0 <= stats["moe_load_min"] <= 0.25 <= stats["moe_load_max"] <= 1
    assert stats["moe_dropped"] == 0.0
    assert router_stats(torch.nn.Linear(2, 2)) == {}


def test_counts_total_and_active_parameters():
    cfg = FFNConfig(kind="moe", intermediate_size=12, num_experts=4, top_k=2, expert_size=6, shared_expert=True)
    moe = MoE(H, cfg)
    assert MoE.param_count(H, cfg)["ffn"] == sum(p.numel() for p in moe.parameters()) == H * 4 + 5 * 3 * H * 6
    assert MoE.active_param_count(H, cfg) == H * 4 + 3 * 3 * H * 6


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(top_k=5, num_experts=4), "ffn.top_k"),
        (dict(num_experts=0), "ffn.num_experts"),
        (dict(expert_size=-1), "ffn.expert_size"),
        (dict(capacity_factor=-0.5), "ffn.capacity_factor"),
        (dict(router_aux_weight=float("nan")), "ffn.router_aux_weight"),
        (dict(kind="mixture"), "ffn.kind"),
    ],
)
def test_bad_moe_settings_are_config_errors(fields, message):
    with pytest.raises(ConfigError, match=message):
        FFNConfig(**{"kind": "moe", **fields})
