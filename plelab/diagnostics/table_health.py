"""Health of the PLE table per layer slice: is there learned structure, or does it look like random noise?

Rows of rare tokens barely move from their initial values, so whole-table numbers mostly measure the
initialisation (SPEC §7). Two views are computed, and each says which rows it used:
  frequent  the table rows of the K most frequent tokens;
  delta     the change since initialisation (table - table_at_init) on the same rows.
Each metric stands beside a random Gaussian baseline of the same shape: the asymptotic theory and an
actual random matrix drawn with a fixed seed.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
import torch
from torch import nn

from plelab.diagnostics.batches import top_tokens
from plelab.diagnostics.hashing import table_row_reads
from plelab.diagnostics.model_parts import ple_layers, ple_table, table_layer_view, unwrap

DEFAULT_TOP_K = 2048
"""Rows (most frequent tokens) each view looks at."""
BASELINE_SEED = 0
"""Seed of the empirical random-Gaussian baseline matrix."""
RANDOM_ERANK_FRACTION = 0.95
"""A slice is random-like if its effective rank is at least this fraction of the random baseline's ..."""
RANDOM_PC1_FACTOR = 3.0
"""... and its PC1 explained variance at most this multiple of the baseline's (the published study's tables read as
"no structure learned" peaked at 0.011 against about 0.004 for a random table: within this factor)."""

DEFINITIONS = {
    "mean_cosine": "mean cosine similarity over all pairs i != j of the selected rows, exact in O(N d) as "
    "(||sum_i u_i||^2 - N) / (N (N - 1)) for unit rows u_i; random baseline 0",
    "cosine_std": "standard deviation of the pairwise cosines, exact from ||U^T U||_F^2; random baseline 1/sqrt(d)",
    "effective_rank": "Roy & Vetterli: exp(entropy) of the singular values normalised to sum 1 (rows not "
    "centred); random baseline ~ m - m^2 / (8 M) with m = min(N, d), M = max(N, d) (a small-m/M expansion: "
    "too low near N = d, where the empirical baseline is the one to trust)",
    "pc1_explained_variance": "largest eigenvalue share of the column-centred rows (sigma_1^2 / sum sigma_i^2); "
    "random baseline ~ (1 + sqrt(d / N))^2 / d",
    "random_like": f"effective rank >= {RANDOM_ERANK_FRACTION} x the empirical baseline's and PC1 <= "
    f"{RANDOM_PC1_FACTOR} x the empirical baseline's",
    "random_empirical": f"the same metrics of an N x d standard Gaussian matrix drawn with seed {BASELINE_SEED}",
}


def mean_pairwise_cosine(rows: torch.Tensor) -> tuple[float, float]:
    """Mean and standard deviation of cos(row_i, row_j) over all pairs i != j (rows must be non-zero)."""
    u = rows.double()
    u = u / u.norm(dim=1, keepdim=True)
    n = u.shape[0]
    s = u.sum(0)
    pairs = n * (n - 1)
    mean = ((s @ s).item() - n) / pairs
    # sum_ij cos_ij^2 = ||U U^T||_F^2 = ||U^T U||_F^2: a d x d product instead of N x N.
    mean_sq = (u.T @ u).pow(2).sum().item() - n
    return mean, math.sqrt(max(mean_sq / pairs - mean * mean, 0.0))


def effective_rank(m: torch.Tensor) -> float:
    """Roy & Vetterli effective rank: exp of the entropy of the normalised singular values."""
    s = torch.linalg.svdvals(m.double())
    p = s / s.sum()
    p = p[p > 0]
    return math.exp(-(p * p.log()).sum().item())


def pc1_explained_variance(m: torch.Tensor) -> float:
    """Share of the total variance along the first principal component of the column-centred rows."""
    c = m.double() - m.double().mean(0, keepdim=True)
    s2 = torch.linalg.svdvals(c).pow(2)
    return (s2[0] / s2.sum()).item()


def matrix_metrics(m: torch.Tensor) -> dict[str, float]:
    """The four health metrics of an N x d matrix."""
    mean, std = mean_pairwise_cosine(m)
    return {
        "mean_cosine": mean,
        "cosine_std": std,
        "effective_rank": effective_rank(m),
        "pc1_explained_variance": pc1_explained_variance(m),
    }


def theory_baseline(n: int, d: int) -> dict[str, float]:
    """Asymptotic values of the metrics for an n x d Gaussian matrix (SPEC §7)."""
    small, big = min(n, d), max(n, d)
    return {
        "mean_cosine": 0.0,
        "cosine_std": 1.0 / math.sqrt(d),
        "effective_rank": small - small * small / (8.0 * big),
        "pc1_explained_variance": min(1.0, (1.0 + math.sqrt(d / n)) ** 2 / d),
    }


@lru_cache(maxsize=64)
def empirical_baseline(n: int, d: int, seed: int = BASELINE_SEED) -> dict[str, float]:
    """The metrics of an actual n x d standard Gaussian matrix drawn with `seed`."""
    g = torch.Generator().manual_seed(seed)
    return matrix_metrics(torch.randn(n, d, generator=g, dtype=torch.float64))


def compare_to_random(m: torch.Tensor) -> dict:
    """Metrics of `m` (zero rows dropped) beside both random baselines, and whether it looks random."""
    m = m[m.double().norm(dim=1) > 0]
    n, d = m.shape
    if n < 2:
        return {"rows": n, "dim": d, "note": "fewer than 2 non-zero rows"}
    metrics = matrix_metrics(m)
    emp = empirical_baseline(n, d)
    random_like = (
        metrics["effective_rank"] >= RANDOM_ERANK_FRACTION * emp["effective_rank"]
        and metrics["pc1_explained_variance"] <= RANDOM_PC1_FACTOR * emp["pc1_explained_variance"]
    )
    return {
        "rows": n, "dim": d, "metrics": metrics, "random_theory": theory_baseline(n, d),
        "random_empirical": emp, "random_like": random_like,
    }


def _view(per_slot: torch.Tensor, rows: torch.Tensor, layers: list[int], slots: dict[int, int], desc: str) -> dict:
    sel = per_slot[rows]
    return {"available": True, "rows": desc, "layers": {i: compare_to_random(sel[:, slots[i]]) for i in layers}}


@torch.no_grad()
def table_health(
    model: nn.Module,
    token_ids: np.ndarray | None = None,
    init_table: np.ndarray | torch.Tensor | None = None,
    top_k: int = DEFAULT_TOP_K,
    freq_source: str = "the given token ids",
    init_note: str = "no initial table given",
) -> dict:
    """Per-layer table health in the 'frequent' and 'delta' views (see module docstring); {} without PLE.

    token_ids: any array of token ids whose frequencies pick the rows (e.g. a training shard);
    init_table: the table at initialisation, same shape as the current one; `init_note` says why it is absent.
    """
    bare = unwrap(model)
    table = ple_table(bare)
    if table is None:
        return {}
    layers, slots = ple_layers(bare), bare.ple_slot
    current = table_layer_view(table.detach().float().cpu(), bare)
    delta = None
    if init_table is not None:
        # A copy: the snapshot is usually a read-only memmap.
        init = torch.from_numpy(np.array(init_table, dtype=np.float32))
        if init.shape != table.shape:
            init_note = f"initial table has shape {tuple(init.shape)}, the model's is {tuple(table.shape)}"
        else:
            delta = current - table_layer_view(init, bare)
    if token_ids is not None:
        counts = table_row_reads(bare, token_ids)
        rows = torch.from_numpy(top_tokens(counts, top_k))
        what = "token ids" if bare.config.ple_layout is None else "n-gram table rows (hashed)"
        tokens = int(counts.sum()) // bare.config.ple_heads  # each token reads one row per head
        desc = f"the {len(rows)} most frequent {what} in {freq_source} ({tokens:,} tokens)"
    elif delta is not None:
        moved = delta.pow(2).sum(dim=(1, 2))
        rows = torch.argsort(moved, descending=True)[: min(top_k, int((moved > 0).sum()))]
        desc = f"the {len(rows)} rows that changed most since initialisation (no token frequencies given)"
    else:
        g = torch.Generator().manual_seed(BASELINE_SEED)
        rows = torch.randperm(table.shape[0], generator=g)[:top_k]
        desc = f"{len(rows)} random rows (no token frequencies given: this mostly measures the initialisation)"
    views = {"frequent": _view(current, rows, layers, slots, desc)}
    if delta is None:
        views["delta"] = {"available": False, "rows": None, "reason": init_note}
    else:
        views["delta"] = _view(delta, rows, layers, slots, f"table - table_at_init on {desc}")
    return {"top_k": top_k, "views": views, "definitions": DEFINITIONS}
