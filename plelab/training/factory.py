"""Which Trainer a config needs: the one place the CLI and sweeps choose it."""

from __future__ import annotations

from plelab.training.config import TrainConfig
from plelab.training.trainer import Trainer


def trainer_class(cfg: TrainConfig) -> type[Trainer]:
    """VisionTrainer when `cfg.vision` is on (images + captions), else the text Trainer."""
    if cfg.vision.enabled:
        from plelab.vision.train import VisionTrainer  # vision code loads only for vision runs

        return VisionTrainer
    return Trainer
