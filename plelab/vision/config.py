"""The `[vision]` section of a training config: image + caption training with an optional visual PLE table.

The section belongs to `plelab.vision.plugin.VisionTrainConfig`; without it (or without a corpus) a run is a
text run, and the section is left out of the recorded config, so every existing config, checkpoint and sweep
hash stays what it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from plelab.util.dataclass_config import ConfigError

if TYPE_CHECKING:
    from plelab.training.config import TrainConfig


MAX_CODEBOOK = 1 << 16
"""The largest codebook K (patch ids) the lab takes: every visual tokenizer, the codebook statistics and the visual
table grow with K, and 65,536 ids already far exceed what an image set here can fill (MNIST's 60,000 training
images hold 960,000 patches of 7x7, ~15 per id at this K)."""


@dataclass
class VisionConfig:
    """Train `plelab.vision.model.VisionPLEModel` on a prepared image + caption corpus."""

    corpus: str = ""
    """Prepared vision corpus folder (from `plelab vision prepare`); empty = vision off (a text run). A vision
    run reads its images, patch ids and captions from here alone (`data` and `eval_data` stay empty)."""
    ple_dim: int = 0
    """dP of the visual PLE table: K rows indexed by patch id, one dP vector per PLE layer; 0 = no visual PLE.
    Its form (gate, context, output_norm, layers, table_init_std) is the one `[model.ple]` describes."""
    aux_weight: float = 0.0
    """lambda of the auxiliary loss that predicts patch p+1's id from the hidden state at patch p (a head
    H -> K); 0 = off. Logged as `patch_id`, apart from the caption loss."""
    pixels: bool = True
    """Feed each patch's pixels through the linear patch embedding (the continuous patch path). false = ids only:
    the image reaches the model through the visual PLE table alone (patch positions carry their position
    embedding and nothing else), which needs ple_dim > 0."""
    codebook: int | None = None
    """K, the corpus's number of patch ids; None = whatever the corpus has, else checked against it."""
    patches: int | None = None
    """P, patches per image; None = whatever the corpus has, else checked against it."""
    patch_size: int | None = None
    """Side p of a square patch in pixels; None = whatever the corpus has, else checked against it."""

    def __post_init__(self) -> None:
        if self.ple_dim < 0:
            raise ConfigError(f"vision.ple_dim must be >= 0 (0 = no visual PLE), got {self.ple_dim}")
        if not self.aux_weight >= 0:
            raise ConfigError(f"vision.aux_weight must be >= 0 (0 = off), got {self.aux_weight}")
        if self.codebook is not None and not 2 <= self.codebook <= MAX_CODEBOOK:
            raise ConfigError(f"vision.codebook must be in 2..{MAX_CODEBOOK} (or unset), got {self.codebook}")
        for name in ("patches", "patch_size"):
            if getattr(self, name) is not None and getattr(self, name) <= 0:
                raise ConfigError(f"vision.{name} must be > 0 (or unset), got {getattr(self, name)}")
        if not self.pixels and not self.ple_dim:
            raise ConfigError("vision.pixels = false leaves the image only the visual PLE table, and vision.ple_dim "
                              "is 0: the model would never see the image; set vision.ple_dim > 0")
        if not self.corpus and (self.ple_dim or self.aux_weight):
            raise ConfigError("vision.ple_dim / vision.aux_weight are set but vision.corpus is empty; "
                              "name the prepared corpus folder (vision.corpus = \"DIR\")")

    @property
    def enabled(self) -> bool:
        """Whether the run trains the vision model."""
        return bool(self.corpus)


def check_vision_run(cfg: TrainConfig) -> None:
    """Raise ConfigError for the training settings a vision run cannot honour (called when vision is on)."""
    if cfg.data or cfg.eval_data:
        raise ConfigError("a vision run reads vision.corpus (training and held-out split); leave data and "
                          "eval_data empty")
    if cfg.model.ple.dim:
        raise ConfigError(f"model.ple.dim = {cfg.model.ple.dim}: a vision run has no text PLE; the visual table's "
                          "width is vision.ple_dim ([model.ple] still sets its form: gate, context, norm, layers)")
    if cfg.model.ple.vocab_size is not None:
        raise ConfigError("model.ple.vocab_size: the visual table has one row per patch id (the corpus's K); "
                          "leave it unset (vision.codebook checks K)")
    if cfg.init_from_hf:
        raise ConfigError("init_from_hf starts a Gemma 4 text model from its weights; a vision run builds its own "
                          "model from the corpus: leave it empty")
    if cfg.diagnostics_every:
        raise ConfigError("diagnostics_every: the PLE monitor reads the text table, which a vision run does not "
                          "have; set it to 0 and run the visual-table diagnostics on the checkpoint")

