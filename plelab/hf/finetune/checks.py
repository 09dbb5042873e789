"""Everything a fine-tune can be refused for, checked before any file is written (one PlelabError line each)."""

from __future__ import annotations

from pathlib import Path

from plelab.data.loader import TokenDataset
from plelab.data.tokenizer import Tokenizer, tokenizer_difference
from plelab.errors import PlelabError
from plelab.hf.checkpoint import HFCheckpoint
from plelab.hf.finetune.config import FinetuneConfig
from plelab.hf.finetune.model import target_paths


def check_finetune_inputs(cfg: FinetuneConfig, ckpt: HFCheckpoint) -> list[str]:
    """The adapted layer paths, after checking the targets, the data and its tokenizer against the checkpoint."""
    paths = target_paths(ckpt, cfg.finetune)
    if not cfg.data:
        raise PlelabError("no training data: give --data DIR, a folder from `plelab data prepare SOURCES "
                          f"--tokenizer {ckpt.tokenizer_json} --out DIR`")
    tokenizer = Tokenizer.load(cfg.tokenizer)
    data = TokenDataset(cfg.data, "train")
    # Compared by what decides the ids, not by the file's bytes: transformers re-saves a tokenizer.json with an
    # empty post-processor, and data prepared with either file is the same data.
    diff = tokenizer_difference(Tokenizer.load(data.tokenizer_path), tokenizer)
    if diff:
        raise PlelabError(f"{cfg.data} was tokenized with another tokenizer than {ckpt.tokenizer_json} (the "
                          f"checkpoint's: {diff}); prepare it again with `plelab data prepare SOURCES --tokenizer "
                          f"{ckpt.tokenizer_json} --out DIR`")
    data.check_compatible(vocab_size=cfg.model.vocab_size)
    if cfg.eval_data and not Path(cfg.eval_data).exists():
        raise PlelabError(f"eval_data {cfg.eval_data}: no such folder")
    return paths
