"""Vision as a trainer plug-in: the `[vision]` training-config section and the trainer it needs.

`VisionTrainConfig` subclasses plelab.training.config.TrainConfig with section "vision", so `load_train_config`
picks it for a config whose `[vision]` names a corpus, once this module is imported (`import plelab.vision`
does; `plelab train`, `plelab sweep` and `plelab train-memory` do). Training itself never imports vision.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from plelab.training.config import TrainConfig
from plelab.util.dataclass_config import ConfigError
from plelab.vision.config import VisionConfig, check_vision_run


@dataclass
class VisionTrainConfig(TrainConfig, section="vision"):
    """A training config with `[vision]` on: `plelab.vision.train.VisionTrainer` trains it (`trainer_class`)."""

    vision: VisionConfig = field(default_factory=VisionConfig)
    """Image + caption training (plelab.vision): the prepared corpus, the visual table's width, the aux loss."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.vision.enabled:
            raise ConfigError("a vision run needs vision.corpus (a folder from `plelab vision prepare`)")
        check_vision_run(self)

    def trainer_class(self) -> type:
        """VisionTrainer."""
        from plelab.vision.train import VisionTrainer

        return VisionTrainer

    def param_counts(self) -> dict[str, int]:
        """count_params of the model a vision run really trains (its visual table and patch embedding included)."""
        from plelab.vision.data import corpus_facts, open_corpus
        from plelab.vision.model import vision_param_counts

        f = corpus_facts(open_corpus(self.vision.corpus, "valid"))
        return vision_param_counts(self.model, self.vision.ple_dim, f["codebook"], f["patches"], f["patch_pixels"],
                                   self.vision.aux_weight > 0, self.vision.pixels)
