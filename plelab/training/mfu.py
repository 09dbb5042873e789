"""Model FLOPs utilisation (MFU): training FLOPs per token, a measured matmul peak, and their ratio.

FLOPs per trained token (forward + backward, the PaLM / nanoGPT convention):

    train_flops_per_token = 6 * N + 12 * L_attn * T * d_attn

- N = `plelab.model.params.train_matmul_macs_per_token(cfg)`: the weight multiply-adds one token's training
  forward runs (attention, FFN, the output head even when tied, PLE projections and input gate). Lookup
  tables (main embedding, PLE table) and norm weights are excluded: a row gather is not arithmetic. Per FFN
  kind, what runs: a MoE token passes through the router and its top_k experts (plus the shared one), not
  all experts; MGLU multiplies by its shared matrix twice per mask (gate W*m_i and up W*(1-m_i)) then by
  down; a pruned FFN runs at intermediate_size until export (`plelab.model.params.ffn_train_macs_per_token`).
  6 = 2 (multiply + add) x 3 (forward, backward w.r.t. inputs, backward w.r.t. weights).
- The attention term counts the two activation-activation matmuls per layer, Q K^T and A V, each
  2 * T * d_attn FLOPs per token in the forward pass (d_attn = num_heads * head_dim), times 3 for
  training. It counts the full T x T score matrix (no halving for the causal mask), as PaLM does, so
  MFU figures compare with the published ones. T is the training sequence length.

The peak is measured, not taken from a data sheet: a square fp32 GEMM on this machine with torch's
current thread count, best of several repeats. MFU = tokens/s * FLOPs per token / peak.
"""

from __future__ import annotations

import math
import time

import torch

from plelab.model.config import ModelConfig
from plelab.model.params import train_matmul_macs_per_token


def measure_matmul_peak(dtype: torch.dtype = torch.float32, size: int = 1024, seconds: float = 1.0) -> float:
    """Achievable matmul FLOP/s here: best of repeated square `size` GEMMs within about `seconds`."""
    if size <= 0 or seconds <= 0:
        raise ValueError(f"size and seconds must be > 0, got size={size}, seconds={seconds}")
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    torch.mm(a, b, out=out)  # warm-up: thread pool start, MKL/oneDNN kernel selection
    flops = 2.0 * size**3
    best = math.inf
    deadline = time.perf_counter() + seconds
    repeats = 0
    # Best-of (not mean) because other processes share the cores: the minimum is the machine's speed.
    while repeats < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - t0)
        repeats += 1
        if repeats >= 1000:
            break
    return flops / best


def train_flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> int:
    """Training FLOPs per token: 6 * weight multiply-adds + 12 * L * T * d_attn (T defaults to cfg.max_seq_len)."""
    T = cfg.max_seq_len if seq_len is None else seq_len
    d_attn = cfg.num_heads * cfg.head_size
    return 6 * train_matmul_macs_per_token(cfg) + 12 * cfg.num_layers * T * d_attn


def mfu(
    tokens_per_s: float, cfg: ModelConfig, peak: float, seq_len: int | None = None, attention: bool = True
) -> float:
    """Fraction of `peak` FLOP/s used at `tokens_per_s`; attention=False gives the 6 * N-only figure."""
    if peak <= 0:
        raise ValueError(f"peak must be > 0, got {peak}")
    per_token = train_flops_per_token(cfg, seq_len) if attention else 6 * train_matmul_macs_per_token(cfg)
    return tokens_per_s * per_token / peak
