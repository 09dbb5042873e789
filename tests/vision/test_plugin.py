"""Vision as a trainer plug-in: [vision] selects VisionTrainConfig (and so VisionTrainer), a text config stays a
TrainConfig recording exactly what it did before the section existed, and training never needs vision."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from plelab.training.config import PLUGIN_SECTIONS, TrainConfig, load_train_config, train_config_dict
from plelab.training.trainer import Trainer, trainer_for
from plelab.util.dataclass_config import ConfigError
from plelab.vision.plugin import VisionTrainConfig
from plelab.vision.train import VisionTrainer


def test_text_configs_get_the_trainer_and_vision_configs_the_vision_trainer():
    assert trainer_for(TrainConfig()) is Trainer
    cfg = load_train_config({"vision": {"corpus": "corpus", "ple_dim": 8}})
    assert type(cfg) is VisionTrainConfig and trainer_for(cfg) is VisionTrainer
    assert PLUGIN_SECTIONS["vision"] is VisionTrainConfig


def test_a_vision_section_without_a_corpus_is_a_text_run_recorded_without_it():
    cfg = load_train_config({"vision": {"corpus": "", "codebook": 256}, "max_steps": 7})
    assert type(cfg) is TrainConfig
    assert train_config_dict(cfg) == train_config_dict(load_train_config({"max_steps": 7}))
    with pytest.raises(ConfigError, match="vision.corpus"):
        load_train_config({"vision": {"ple_dim": 4}})


def test_a_vision_override_on_a_text_config_makes_a_vision_run():
    cfg = load_train_config({"max_steps": 7}, ["vision.corpus=c", "vision.ple_dim=4"])
    assert type(cfg) is VisionTrainConfig and cfg.vision.ple_dim == 4 and cfg.max_steps == 7


def test_training_alone_does_not_know_the_vision_section():
    """Without the plug-in imported the section is an unknown field (training never imports plelab.vision)."""
    code = ("import sys; from plelab.training.config import load_train_config\n"
            "from plelab.training.trainer import Trainer\n"
            "assert not any(m.startswith('plelab.vision') for m in sys.modules)\n"
            "try:\n    load_train_config({'vision': {'corpus': 'c'}})\n"
            "except Exception as e:\n    print(type(e).__name__, e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, check=True).stdout
    assert out.startswith("ConfigError") and "vision" in out
