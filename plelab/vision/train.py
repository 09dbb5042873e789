"""VisionTrainer: the Trainer's loop, checkpoints and exact resume, on images + captions.

What changes from a text run: the batch source (`VisionData`: a corpus's training split in seeded, resumable
order), the model (`VisionPLEModel`) and evaluation (`measure_eval`: the caption loss on the whole held-out
split). Two callbacks are swapped when the data is built (before any checkpoint state is restored, so resume
sees the final list): the Evaluator becomes `CaptionEvaluator` (the same cadence, under the state key vision
checkpoints use) and ProgressPrinter becomes `VisionProgress` (no bits per byte, which a caption loss has no
byte count for). The PLE monitor
is never added: a vision config has no text PLE (model.ple.dim = 0 and diagnostics_every = 0, checked by
the config), and the visual table's diagnostics run on checkpoints.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.runs.checkpoint import (
    CheckpointError,
    read_checkpoint_json,
    read_weights,
    resolve_checkpoint,
    verify_checkpoint,
)
from plelab.training.optim import model_config_for
from plelab.training.standard_callbacks import Evaluator, ProgressPrinter
from plelab.training.trainer import Trainer
from plelab.util.dataclass_config import ConfigError, from_dict
from plelab.util.device import autocast_context
from plelab.vision.data import VisionData
from plelab.vision.model import VisionPLEModel, visual_model_config

EVAL_DOMAIN = "captions"


@torch.no_grad()
def caption_loss(model: VisionPLEModel, data: VisionData, batch_size: int, autocast=None) -> dict[str, float]:
    """{"loss": mean next-token NLL (nats) over every held-out caption token, "tokens": their number}."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    for inputs, targets in data.heldout_batches(batch_size):
        with autocast if autocast is not None else contextlib.nullcontext():
            _, loss = model(inputs, targets, return_logits=False)
        n = int((targets != -100).sum())
        total, count = total + float(loss) * n, count + n
    model.train(was_training)
    return {"loss": total / max(count, 1), "tokens": count}


class CaptionEvaluator(Evaluator):
    """The Evaluator of a vision run: the same cadence and bookkeeping, under the name (the key of its state)
    that vision checkpoints have always used; what it measures is `VisionTrainer.measure_eval`."""


class VisionProgress(ProgressPrinter):
    """ProgressPrinter, with evaluation lines that show the caption loss."""

    def on_eval(self, trainer: Any, results: dict[str, Any]) -> None:
        trainer.log_line(f"eval step {trainer.step}: caption loss {results['macro']['loss']:.4f}")


def vision_callbacks(callbacks: list[Any]) -> list[Any]:
    """The text run's callbacks with the domain Evaluator and ProgressPrinter swapped for their vision forms."""
    swap = {Evaluator: CaptionEvaluator, ProgressPrinter: VisionProgress}
    return [swap[type(cb)]() if type(cb) in swap else cb for cb in callbacks]


class VisionTrainer(Trainer):
    """Trains `VisionPLEModel` on `cfg.vision.corpus` (one process; everything else as `Trainer`)."""

    def build_data(self, cfg: Any) -> VisionData:
        """The corpus's training split as a resumable batch source (and the vision callbacks swapped in)."""
        if self.world.distributed:
            raise PlelabError("vision runs train in one process; run without torchrun")
        self.callbacks = vision_callbacks(self.callbacks)
        return VisionData(cfg, self.device)

    def measure_eval(self, max_tokens: int | None, heldout_only: bool = False) -> dict[str, Any]:
        """The caption loss on the whole held-out split whatever max_tokens says (it is small and deterministic;
        it is the only domain, so heldout_only changes nothing), in the shape the sweep runner records
        ({"domains": {"captions": {loss, tokens}}, "macro": {loss}})."""
        cfg = self.config
        scores = caption_loss(self.model, self.data, cfg.batch_size, autocast_context(self.device, cfg.dtype))
        return {"domains": {EVAL_DOMAIN: scores}, "macro": {"loss": scores["loss"]}}

    def build_model(self, cfg: Any) -> VisionPLEModel:
        """The multimodal model, its visual table shaped by the corpus (K rows) and cfg.vision.ple_dim."""
        facts = self.data.facts
        trunk = visual_model_config(model_config_for(cfg), cfg.vision.ple_dim, facts["codebook"])
        return VisionPLEModel(trunk, facts["patches"], facts["patch_pixels"], facts["codebook"],
                              cfg.vision.aux_weight, device=self.device, pixels=cfg.vision.pixels)


def load_vision_model(path: str | Path, device: str | torch.device = "cpu") -> tuple[VisionPLEModel, dict[str, Any]]:
    """(model in eval mode, config.json dict) from a vision run dir or checkpoint, checksums verified first."""
    ckpt = resolve_checkpoint(path)
    verify_checkpoint(ckpt)
    meta = read_checkpoint_json(ckpt / "config.json")
    vision = (meta.get("train") or {}).get("vision") or {}
    if not vision.get("corpus"):
        raise CheckpointError(f"{ckpt} is not a vision run's checkpoint (its config has no [vision] corpus)")
    try:
        trunk = from_dict(ModelConfig, meta["model"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{ckpt}/config.json has an invalid model config: {exc}") from exc
    # P and p*p are the corpus's; the weights carry them, so the corpus need not be at hand.
    pixels = bool(vision.get("pixels", True))
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        patches = f.get_slice("patch_pos").get_shape()[0]
        patch_pixels = f.get_slice("patch_embed.weight").get_shape()[1] if pixels else 0
    with torch.device("meta"):
        model = VisionPLEModel(trunk, patches, patch_pixels, trunk.ple_vocab_size, float(vision.get("aux_weight", 0)),
                               pixels=pixels)
    model.load_state_dict(read_weights(ckpt, model, device), assign=True)
    # Non-persistent buffers (RoPE tables) were created on meta; rebuild them for real.
    model.trunk.rope_cos, model.trunk.rope_sin = model.trunk.rope_buffers(trunk, device)
    return model.to(device).eval(), meta
