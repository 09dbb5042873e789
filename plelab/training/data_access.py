"""What the trainer needs from plelab.data: batches on the device, the tokenizer file, evaluation domains."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.data.loader import BatchLoader, TokenDataset
from plelab.data.prepare import HELDOUT_DOMAIN, EvalDomain, load_eval_domains
from plelab.data.tokenizer import Tokenizer
from plelab.errors import PlelabError
from plelab.util.device import host_to_device


def split_as_domain(dataset: TokenDataset, name: str = "val") -> EvalDomain:
    """A whole prepared split (e.g. the held-out `val`) as one evaluation domain, documents cut at EOT.

    Laid out like a domain file (EOT, doc 1, EOT, doc 2, EOT, ...), so an evaluation can sample windows over all
    of it (evaluate.sample_windows). The manifest has the split's bytes, not each document's: bytes are shared
    out pro rata by tokens (bits per byte of the whole split is exact, of a part an estimate). Runs recorded
    before this evaluated its first eval_tokens + 1 tokens as one piece.
    """
    stream = dataset.get(0, len(dataset))
    tokens = np.concatenate([[dataset.eot_id], stream]).astype(np.int64)
    ends = np.flatnonzero(tokens[1:] == dataset.eot_id) + 2  # each document's trailing EOT, counted as its end
    if not len(ends) or ends[-1] != len(tokens):
        ends = np.append(ends, len(tokens))
    total_bytes = int(dataset.manifest["splits"][dataset.split]["bytes"])
    byte_ends = np.round(total_bytes * (ends - 1) / max(len(tokens) - 1, 1)).astype(np.int64)
    return EvalDomain(name, tokens, max(1, total_bytes), ends.astype(np.int64), byte_ends)


class TrainingData:
    """Training batches (resumable), the tokenizer file to ship with checkpoints, and evaluation domains."""

    def __init__(self, cfg: Any, device: torch.device):
        if not cfg.data:
            raise PlelabError("no training data: set data = \"DIR\" (a folder from `plelab data prepare`)")
        self.device = device
        self.pin_memory = cfg.pin_memory
        tokenizer = Tokenizer.load(cfg.tokenizer) if cfg.tokenizer else None
        self.dataset = TokenDataset(cfg.data, "train", vocab_size=cfg.model.vocab_size, tokenizer=tokenizer)
        self.tokenizer_path = Path(cfg.tokenizer) if cfg.tokenizer else self.dataset.tokenizer_path
        self.loader = BatchLoader(self.dataset, cfg.batch_size, cfg.context, seed=cfg.seed)
        self.eval_domains: dict[str, EvalDomain] = {}
        if cfg.eval_data:
            tokenizer = Tokenizer.load(self.tokenizer_path)
            cache = Path(cfg.data) / "eval_cache"
            try:
                cache.mkdir(exist_ok=True)
            except OSError:
                cache = None  # read-only data folder: tokenize without caching
            self.eval_domains = load_eval_domains(cfg.eval_data, tokenizer, cache)
        if HELDOUT_DOMAIN not in self.eval_domains:  # the in-domain held-out split too, when it was prepared
            try:
                self.eval_domains[HELDOUT_DOMAIN] = split_as_domain(TokenDataset(cfg.data, "val"))
            except PlelabError:
                pass

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) batch, on the training device."""
        x, y = self.loader.next_batch()
        return host_to_device(x, self.device, self.pin_memory), host_to_device(y, self.device, self.pin_memory)

    def state_dict(self) -> dict[str, Any]:
        """Loader position."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the loader position."""
        self.loader.load_state_dict(state)
