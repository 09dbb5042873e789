"""Where diagnostic data comes from: batches cut from a token array, random batches, token frequencies."""

from __future__ import annotations

import numpy as np
import torch

from plelab.diagnostics.data_sources import DiagnosticDataError

FREQ_CHUNK = 1 << 24
"""Tokens counted per bincount call, so a memory-mapped shard is never loaded whole."""


def batches_from_tokens(
    tokens: np.ndarray, batch_size: int, seq_len: int, n_batches: int, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, y) next-token batches from random windows of a 1-D token array (deterministic in `seed`)."""
    tokens = np.asarray(tokens).reshape(-1)
    span = len(tokens) - seq_len - 1
    if span < 0:
        raise DiagnosticDataError(f"the data holds {len(tokens):,} tokens, fewer than one window of {seq_len + 1} "
                                  f"(sequence length {seq_len} + 1); give more data or a smaller --seq-len")
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        starts = rng.integers(0, span + 1, size=batch_size)
        window = np.stack([np.asarray(tokens[s : s + seq_len + 1], dtype=np.int64) for s in starts])
        t = torch.from_numpy(window)
        out.append((t[:, :-1], t[:, 1:]))
    return out


def random_batches(vocab_size: int, batch_size: int, seq_len: int, n_batches: int, seed: int = 0) -> list:
    """Uniform random token ids (x only): enough for injection and gate statistics, useless for losses."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, vocab_size, (batch_size, seq_len), generator=g), None) for _ in range(n_batches)]


def token_frequencies(token_ids: np.ndarray, num_rows: int) -> np.ndarray:
    """Count of each PLE row among `token_ids`; ids outside [0, num_rows) count for row 0, as the model maps them."""
    flat = np.asarray(token_ids).reshape(-1)
    counts = np.zeros(num_rows, dtype=np.int64)
    for start in range(0, len(flat), FREQ_CHUNK):
        chunk = np.asarray(flat[start : start + FREQ_CHUNK]).astype(np.int64)
        chunk[(chunk < 0) | (chunk >= num_rows)] = 0
        counts += np.bincount(chunk, minlength=num_rows)
    return counts


def top_tokens(counts: np.ndarray, k: int) -> np.ndarray:
    """Ids of the (up to) k most frequent rows that occur at all, most frequent first."""
    order = np.argsort(-counts, kind="stable")[:k]
    return order[counts[order] > 0]
