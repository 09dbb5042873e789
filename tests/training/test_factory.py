"""trainer_class: the text Trainer for text configs, VisionTrainer when [vision] is on."""

from __future__ import annotations

from plelab.training.config import TrainConfig, load_train_config
from plelab.training.factory import trainer_class
from plelab.training.trainer import Trainer
from plelab.vision.train import VisionTrainer


def test_text_configs_get_the_trainer_and_vision_configs_the_vision_trainer():
    assert trainer_class(TrainConfig()) is Trainer
    cfg = load_train_config({"vision": {"corpus": "corpus", "ple_dim": 8}})
    assert trainer_class(cfg) is VisionTrainer
