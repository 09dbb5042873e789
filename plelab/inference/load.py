"""Loading a trained model for inference: a run dir or checkpoint -> (model in eval mode, its tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch

from plelab.data.tokenizer import Tokenizer
from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.model.transformer import LanguageModel
from plelab.runs.checkpoint import (
    CheckpointError,
    read_checkpoint_json,
    read_weights,
    resolve_checkpoint,
    verify_checkpoint,
)
from plelab.util.dataclass_config import ConfigError, from_dict


def load_model(path: str | Path, device: str | torch.device = "cpu", verify: bool = True) -> tuple[LanguageModel, dict]:
    """Load (model, config.json dict) from a checkpoint or run dir, checksums verified first."""
    ckpt = resolve_checkpoint(path)
    if verify:
        verify_checkpoint(ckpt)
    meta = read_checkpoint_json(ckpt / "config.json")
    if ((meta.get("train") or {}).get("vision") or {}).get("corpus"):
        raise CheckpointError(f"{path} is a vision run (images and captions, not a text model): `plelab vision "
                              "diagnose` reads it; eval, generate, diagnose and export take text runs")
    finetuned = ((meta.get("train") or {}).get("finetune") or {}).get("hf")
    if finetuned:  # its checkpoints hold the adapters only: the model is the folder plus them
        run = ckpt.parent.parent
        raise CheckpointError(f"{path} is a LoRA fine-tune of {finetuned}, whose checkpoints hold only the adapters: "
                              f"merge it first (plelab finetune --out {run} --merge MERGED), then give the "
                              "merged folder with --hf (diagnose, export, export-gguf, quant-recipe) or load it "
                              "with transformers")
    try:
        cfg = from_dict(ModelConfig, meta["model"])
    except (ConfigError, KeyError, TypeError) as exc:
        raise CheckpointError(f"{ckpt}/config.json has an invalid model config: {exc}") from exc
    with torch.device("meta"):
        model = LanguageModel(cfg)
    model.load_state_dict(read_weights(ckpt, model, device), assign=True)
    # Non-persistent buffers (RoPE tables) were created on meta; rebuild them for real.
    model.rope_cos, model.rope_sin = LanguageModel.rope_buffers(cfg, device)
    model.checkpoint_dir = ckpt
    return model.to(device).eval(), meta


def checkpoint_tokenizer(ckpt_dir: str | Path, vocab_size: int) -> Tokenizer:
    """The tokenizer saved with a checkpoint, checked against the model's vocabulary."""
    path = Path(ckpt_dir) / "tokenizer.json"
    if not path.is_file():
        raise PlelabError(f"{ckpt_dir} has no tokenizer.json; cannot turn text into this model's token ids")
    tok = Tokenizer.load(path)
    if tok.vocab_size > vocab_size:
        raise PlelabError(
            f"tokenizer/model vocab mismatch: tokenizer has {tok.vocab_size} ids, model only {vocab_size}"
        )
    return tok


def load_for_inference(path: str | Path, device: torch.device) -> tuple[LanguageModel, Tokenizer]:
    """(model in eval mode, its tokenizer) from a run dir or checkpoint, checksums verified."""
    model, _ = load_model(path, device=device)
    return model, checkpoint_tokenizer(model.checkpoint_dir, model.config.vocab_size)
