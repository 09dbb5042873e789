"""The callbacks a training config asks for, built in one place for the CLI, sweeps and Python users alike."""

from __future__ import annotations

from collections.abc import Callable

from plelab.training.callbacks import Callback
from plelab.training.config import TrainConfig
from plelab.training.ffn_callbacks import PruningSchedule, RouterStats
from plelab.training.loggers import optional_loggers
from plelab.training.standard_callbacks import Checkpointer, Evaluator, ProgressPrinter, SpeedMonitor


def callbacks_for(cfg: TrainConfig, note: Callable[[str], None] = print) -> list[Callback]:
    """Speed, progress, evaluation and checkpoints, then TensorBoard / W&B / PLE monitor / MoE router statistics /
    pruning schedule when `cfg` asks.

    `note` receives one line per requested logger that cannot be used (not installed).
    """
    callbacks: list[Callback] = [SpeedMonitor(), ProgressPrinter(), Evaluator(), Checkpointer()]
    loggers, notes = optional_loggers(cfg.tensorboard, cfg.wandb)
    callbacks += loggers
    for text in notes:
        note(f"note: {text}")
    if cfg.diagnostics_every and cfg.model.ple.dim:
        from plelab.training.ple_monitor import PLEMonitor

        callbacks.append(PLEMonitor(every=cfg.diagnostics_every, early_fraction=cfg.early_warning_fraction))
    if cfg.model.ffn.kind == "moe":
        callbacks.append(RouterStats())
    if cfg.model.ffn.kind == "pruned":
        callbacks.append(PruningSchedule())
    return callbacks
