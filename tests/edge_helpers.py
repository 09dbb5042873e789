"""Models for the edge tests: small PLE models whose every weight matters."""

from __future__ import annotations

import torch

from plelab.model import LanguageModel, load_model_config


def lively_model(*overrides: str, seed: int = 0) -> LanguageModel:
    """A `tiny`-based model with 256 positions whose norms, gates and PLE output norm are randomised.

    A fresh model has norm weights at one (and possibly a silent PLE): randomising them makes a parity
    test fail if any of those weights were dropped or misplaced.
    """
    torch.manual_seed(seed)
    cfg = load_model_config("tiny", ["max_seq_len=256", "init_std=0.08", *overrides])
    model = LanguageModel(cfg).eval()
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(1.0 + 0.5 * torch.randn_like(p))
    return model
