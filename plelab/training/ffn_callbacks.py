"""Trainer callbacks of the FFN variants: MoE router statistics and the structured-pruning schedule."""

from __future__ import annotations

from typing import Any

from plelab.model.moe import router_stats
from plelab.model.pruning import alive_target, decay_importance, prune_to_count, pruned_layers
from plelab.training.callbacks import Callback, register_callback


class RouterStats(Callback):
    """Adds moe_load_max, moe_load_min, moe_router_entropy and moe_dropped (last micro-batch, mean over MoE
    layers; see plelab.model.moe.router_stats) to every step's metrics."""

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        metrics.update(router_stats(trainer.model))


class PruningSchedule(Callback):
    """After each optimizer step, clears the least important live units of every pruned FFN down to the
    schedule's count (plelab.model.pruning.alive_target) and logs `ffn_alive`, the live share of the units.

    Stateless: the schedule is a function of the step, and the live flags (and Taylor scores) are model
    buffers saved in every checkpoint, so a resumed run prunes exactly as an uninterrupted one.
    """

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        layers = pruned_layers(trainer.model)
        if not layers:
            return
        target = alive_target(trainer.step, trainer.config.max_steps, trainer.config.model.ffn)
        for ffn in layers:
            prune_to_count(ffn, target)
            decay_importance(ffn)
        metrics["ffn_alive"] = sum(float(f.alive.sum()) for f in layers) / sum(f.alive.numel() for f in layers)


register_callback("router_stats", lambda cfg, note: RouterStats() if cfg.model.ffn.kind == "moe" else None)
register_callback("pruning", lambda cfg, note: PruningSchedule() if cfg.model.ffn.kind == "pruned" else None)
