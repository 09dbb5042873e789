"""Mixture of experts FFN (torchtitan / OLMoE style): top-k routed SwiGLU experts, optional shared expert.

Router: a bias-free linear H -> E, softmax over the E experts (in fp32), the top-k probabilities kept and
renormalised to sum to 1 per token. Experts run dropless by default: the (token, expert) assignments are
sorted by expert and each expert runs once on its contiguous slice, so the cost is k expert passes per token
(never E) and there is no Python loop over tokens. With `capacity_factor` c > 0 each expert keeps at most
ceil(c * T * k / E) assignments of the T tokens in the call, in batch order, and drops the rest.

Training objective of its own (plelab.training.trainer.auxiliary_losses collects it): the Switch / OLMoE
load-balancing loss E * sum_i f_i * P_i (f_i: share of assignments routed to expert i, P_i: mean router
probability of i; exactly 1 when the router is uniform) and the router z-loss mean(logsumexp(logits)^2).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.config import FFNConfig


def expert_forward(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One SwiGLU expert on rows `x`: down(silu(gate x) * up x), weights in nn.Linear layout."""
    return F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)


class MoE(nn.Module):
    """Top-k routed SwiGLU experts (stacked weights, one slice per expert) plus an optional shared expert."""

    def __init__(self, hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None):
        super().__init__()
        self.std, self.out_std = std, std if out_std is None else out_std
        E, F_, self.top_k = cfg.num_experts, cfg.expert_width, cfg.top_k
        self.num_experts, self.capacity_factor = E, cfg.capacity_factor
        self.aux_weight, self.z_weight = cfg.router_aux_weight, cfg.router_z_weight
        self.router = nn.Linear(hidden, E, bias=False)
        self.gate_proj = nn.Parameter(torch.empty(E, F_, hidden))
        self.up_proj = nn.Parameter(torch.empty(E, F_, hidden))
        self.down_proj = nn.Parameter(torch.empty(E, hidden, F_))
        if cfg.shared_expert:
            self.shared_gate_proj = nn.Parameter(torch.empty(F_, hidden))
            self.shared_up_proj = nn.Parameter(torch.empty(F_, hidden))
            self.shared_down_proj = nn.Parameter(torch.empty(hidden, F_))
        else:
            self.shared_gate_proj = self.shared_up_proj = self.shared_down_proj = None
        self.aux_losses: dict[str, torch.Tensor] = {}
        # Last training batch's routing, detached: per-expert load share, mean router entropy, dropped share.
        self.last_stats: dict[str, torch.Tensor] = {}
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Router, gate and up ~ N(0, std); down projections ~ N(0, out_std)."""
        inputs = [self.router.weight, self.gate_proj, self.up_proj, self.shared_gate_proj, self.shared_up_proj]
        for w in inputs:
            if w is not None:
                nn.init.normal_(w, std=self.std, generator=generator)
        for w in (self.down_proj, self.shared_down_proj):
            if w is not None:
                nn.init.normal_(w, std=self.out_std, generator=generator)

    @staticmethod
    def param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
        """{"ffn": router + all experts + shared expert, "ffn_mask": 0} of one block (total, not active)."""
        experts = cfg.num_experts + int(cfg.shared_expert)
        return {"ffn": hidden * cfg.num_experts + experts * 3 * hidden * cfg.expert_width, "ffn_mask": 0}

    @staticmethod
    def active_param_count(hidden: int, cfg: FFNConfig) -> int:
        """Parameters one token touches: the router, its top_k experts and the shared expert."""
        experts = cfg.top_k + int(cfg.shared_expert)
        return hidden * cfg.num_experts + experts * 3 * hidden * cfg.expert_width

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(router logits (T, E) in fp32, renormalised top-k weights (T, k), expert ids (T, k)) for rows x."""
        logits = self.router(x).float()
        weights, experts = logits.softmax(dim=-1).topk(self.top_k, dim=-1)
        return logits, weights / weights.sum(dim=-1, keepdim=True), experts

    def capacity(self, tokens: int) -> int | None:
        """Most assignments one expert keeps for `tokens` tokens (None = dropless)."""
        if not self.capacity_factor:
            return None
        return math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        logits, weights, experts = self.route(x)
        flat = experts.reshape(-1)  # assignment a = token * k + slot
        order = flat.argsort(stable=True)  # stable: within an expert, batch order decides who is dropped
        counts = torch.bincount(flat, minlength=self.num_experts)
        cap = self.capacity(x.shape[0])
        if cap is not None:
            starts = counts.cumsum(0) - counts
            rank_in_expert = torch.arange(order.numel(), device=x.device) - starts[flat[order]]
            order = order[rank_in_expert < cap]
            kept = counts.clamp(max=cap)
        else:
            kept = counts
        rows = order // self.top_k
        slices = x[rows].split(kept.tolist())
        outs = [expert_forward(xs, self.gate_proj[e], self.up_proj[e], self.down_proj[e])
                for e, xs in enumerate(slices)]
        routed = torch.cat(outs) * weights.reshape(-1)[order, None].to(outs[0].dtype)
        out = torch.zeros(x.shape[0], shape[-1], dtype=routed.dtype, device=x.device).index_add_(0, rows, routed)
        if self.shared_gate_proj is not None:
            out = out + expert_forward(x, self.shared_gate_proj, self.shared_up_proj, self.shared_down_proj)
        if self.training:
            self._record(logits, counts, kept)
        else:
            self.aux_losses = {}
        return out.reshape(shape).to(x.dtype)

    def _record(self, logits: torch.Tensor, counts: torch.Tensor, kept: torch.Tensor) -> None:
        probs = logits.softmax(dim=-1)
        assigned = counts.sum()
        load = counts.float() / assigned
        balance = self.num_experts * (load * probs.mean(dim=0)).sum()
        z = torch.logsumexp(logits, dim=-1).square().mean()
        self.aux_losses = {"moe_balance": self.aux_weight * balance, "moe_z": self.z_weight * z}
        entropy = -(probs * probs.clamp_min(1e-12).log()).sum(dim=-1).mean()
        dropped = 1 - kept.sum().float() / assigned
        self.last_stats = {"load": load.detach(), "entropy": entropy.detach(), "dropped": dropped.detach()}

    def extra_repr(self) -> str:
        e, f, h = self.gate_proj.shape
        return f"experts={e}, top_k={self.top_k}, width={f}, hidden={h}, shared={self.shared_gate_proj is not None}"


def router_stats(model: nn.Module) -> dict[str, Any]:
    """moe_load_max / moe_load_min (assignment share of the busiest / idlest expert), moe_router_entropy and
    moe_dropped, each averaged over the MoE layers' last training batch; {} for a model without MoE."""
    stats = [m.last_stats for m in model.modules() if isinstance(m, MoE) and m.last_stats]
    if not stats:
        return {}
    n = len(stats)
    return {
        "moe_load_max": sum(float(s["load"].max()) for s in stats) / n,
        "moe_load_min": sum(float(s["load"].min()) for s in stats) / n,
        "moe_router_entropy": sum(float(s["entropy"]) for s in stats) / n,
        "moe_dropped": sum(float(s["dropped"]) for s in stats) / n,
    }
