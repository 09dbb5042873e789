"""Structured pruning of SwiGLU intermediate units: importance, schedule, removal and export as a plain SwiGLU.

A `pruned` FFN (plelab.model.ffn.PrunedSwiGLU) trains at intermediate_size with a 0/1 `alive` flag per unit.
Between prune_start and prune_end (fractions of max_steps) the number of live units falls linearly from
intermediate_size to prune_to; at each step the live units of lowest importance are cleared, per layer.
Importance "magnitude" of unit j is |gate_proj row j| * |up_proj row j| * |down_proj column j| (L2 norms),
the unit's largest possible contribution up to the activation's scale. Importance "taylor" is the first-order
estimate of the loss change on removing unit j, |sum over a micro-batch's tokens of h_j * dL/dh_j|, summed
by the training forward and decayed by TAYLOR_DECAY after every step (a memory of ~10 steps).

What ships is `export_pruned`'s SwiGLU of width prune_to, so parameter counts report that width; the
training cost (steps, tokens, FLOPs) includes the pre-pruning phase at the full width.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.model.config import FFNConfig, ModelConfig
from plelab.model.ffn import PrunedSwiGLU


class PruningError(PlelabError):
    """A pruned model cannot be exported (its schedule has not finished)."""


def alive_target(step: int, max_steps: int, cfg: FFNConfig) -> int:
    """Live units per layer the schedule asks for after `step` of `max_steps` optimizer steps."""
    full, final = cfg.intermediate_size, cfg.prune_to
    start, end = round(cfg.prune_start * max_steps), round(cfg.prune_end * max_steps)
    if step >= end:
        return final
    if step <= start:
        return full
    return full - int((full - final) * (step - start) / (end - start))


TAYLOR_DECAY = 0.9


def unit_importance(ffn: PrunedSwiGLU) -> torch.Tensor:
    """Importance of each intermediate unit (F,): the accumulated Taylor score when the FFN keeps one, else
    the magnitude gate row norm * up row norm * down column norm."""
    if ffn.taylor_score is not None:
        return ffn.taylor_score.clone()
    with torch.no_grad():
        return (ffn.gate_proj.weight.float().norm(dim=1) * ffn.up_proj.weight.float().norm(dim=1)
                * ffn.down_proj.weight.float().norm(dim=0))


def decay_importance(ffn: PrunedSwiGLU) -> None:
    """End of a step: fade the accumulated Taylor score (nothing to do for magnitude importance)."""
    if ffn.taylor_score is not None:
        ffn.taylor_score.mul_(TAYLOR_DECAY)


def prune_to_count(ffn: PrunedSwiGLU, target: int) -> int:
    """Clear the live units of lowest importance until `target` remain (ties: lower index first); returns
    how many were removed. Already removed units never come back."""
    alive = ffn.alive.bool()
    excess = int(alive.sum()) - target
    if excess <= 0:
        return 0
    score = unit_importance(ffn).masked_fill(~alive, float("inf"))
    victims = score.argsort(stable=True)[:excess]
    with torch.no_grad():
        ffn.alive[victims] = 0
    return excess


def pruned_layers(model: nn.Module) -> list[PrunedSwiGLU]:
    """The model's pruned FFNs, in module order."""
    return [m for m in model.modules() if isinstance(m, PrunedSwiGLU)]


def shipped_config(cfg: ModelConfig) -> ModelConfig:
    """The config of the model as it ships: a pruned FFN becomes the plain SwiGLU of width prune_to (other
    kinds unchanged)."""
    if cfg.ffn.kind != "pruned":
        return cfg
    return dataclasses.replace(cfg, ffn=FFNConfig(kind="swiglu", intermediate_size=cfg.ffn.prune_to))


def export_pruned(model_or_state: nn.Module | dict[str, Any], cfg: ModelConfig) -> tuple[ModelConfig, dict[str, Any]]:
    """(config, state dict) of the plain `swiglu` model of width prune_to that computes what the pruned one does.

    Every FFN must have exactly prune_to live units (its schedule has finished), else PruningError.
    """
    if cfg.ffn.kind != "pruned":
        raise PruningError(f"export_pruned needs a model with ffn.kind = 'pruned', got {cfg.ffn.kind!r}")
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    out = {k: v for k, v in state.items() if not k.endswith(("mlp.alive", "mlp.taylor_score"))}
    for key, alive in state.items():
        if not key.endswith("mlp.alive"):
            continue
        keep = alive.nonzero().flatten()
        if keep.numel() != cfg.ffn.prune_to:
            raise PruningError(f"{key} has {keep.numel()} live units, not ffn.prune_to = {cfg.ffn.prune_to}: "
                               "pruning has not finished (train to prune_end first)")
        prefix = key[: -len("alive")]
        for name in ("gate_proj.weight", "up_proj.weight"):
            out[prefix + name] = state[prefix + name][keep].clone()
        out[prefix + "down_proj.weight"] = state[prefix + "down_proj.weight"][:, keep].clone()
    return shipped_config(cfg), out
