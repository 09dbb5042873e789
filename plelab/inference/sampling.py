"""The one next-token sampler: temperature, then top-k, then top-p, on one row of logits (NumPy only).

`plelab generate` (PyTorch model) and `plelab run` (the torch-free edge runtime) both call `sample`, so the
same settings and seed give the same choice from the same logits. Temperature 0 is greedy (argmax).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from plelab.errors import PlelabError


class SamplingError(PlelabError):
    """Sampling settings out of range, or logits nothing can be sampled from."""


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen; the defaults are those of both `plelab generate` and `plelab run`."""

    temperature: float = 0.8
    """Softmax temperature; 0 = greedy (argmax)."""
    top_k: int = 0
    """Keep only the k most likely tokens (0 = off)."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p (1 = off)."""
    seed: int = 0
    """Seed of the random stream (the same seed and logits give the same tokens)."""

    def __post_init__(self) -> None:
        if not (isinstance(self.temperature, int | float) and math.isfinite(self.temperature)
                and self.temperature >= 0):
            raise SamplingError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise SamplingError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if not (isinstance(self.top_p, int | float) and 0 < self.top_p <= 1):
            raise SamplingError(f"top_p must lie in (0, 1] (1 = off), got {self.top_p!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise SamplingError(f"seed must be an integer >= 0, got {self.seed!r}")

    def rng(self) -> np.random.Generator:
        """A fresh random stream for one generation."""
        return np.random.default_rng(self.seed)


def sample(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """The next token id from one row of logits (V,): greedy at temperature 0, else top-k / top-p sampling."""
    if logits.ndim != 1 or logits.size == 0:
        raise SamplingError(f"sample wants one non-empty row of logits, got shape {logits.shape}")
    if np.isnan(logits).any() or not np.isfinite(logits.max()):
        raise SamplingError("the model produced NaN or infinite logits; nothing can be sampled")
    if sampling.temperature == 0:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < z.size:
        kth = np.partition(z, -sampling.top_k)[-sampling.top_k]
        z[z < kth] = -np.inf  # ties with the k-th logit stay in, as in torch.topk-based samplers
    probs = np.exp(z - z.max())
    if sampling.top_p < 1:
        order = np.argsort(-probs, kind="stable")
        sorted_probs = probs[order]
        cum = np.cumsum(sorted_probs)
        # Keep the smallest prefix whose mass reaches top_p: a token goes when the mass before it already does.
        drop = order[cum - sorted_probs >= sampling.top_p * cum[-1]]
        probs[drop] = 0.0
    # Inverse-CDF draw: one uniform per token, zero-probability tokens can never be picked.
    cdf = np.cumsum(probs)
    pick = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(pick, int(np.argmax(cdf)))  # rounding at the top end: the last token with mass
