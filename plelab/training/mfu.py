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

The peak is measured, not taken from a data sheet: a square GEMM (the run's precision) on this machine with
torch's current thread count, best of several repeats. One start's measurement reads low when other processes
share the cores, which would make the MFU read high, so the peak a run divides by is the best any run has measured
on this CPU (model, features, torch version, precision, threads), kept in plelab's cache folder
(`machine_peak`). MFU = tokens/s * FLOPs per token / peak.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from pathlib import Path
from typing import Any

import torch

from plelab.model.config import ModelConfig
from plelab.model.params import train_matmul_macs_per_token
from plelab.util.cbuild import cache_root, cpu_identity
from plelab.util.fs import atomic_write_bytes

PEAKS_FILE = "gemm_peaks.json"
"""In plelab's cache folder: the best GEMM peak measured per CPU, precision and thread count."""


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


def _cpu_model() -> str:
    for line in cpu_identity().splitlines():
        if line.startswith(("model name:", "CPU part:")):
            return line.split(":", 1)[1].strip()
    return cpu_identity().splitlines()[0]


def _read_peaks(path: Path) -> dict[str, Any] | None:
    """The cached peaks ({} when there are none yet; None when the file is unreadable, so it is left alone)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def machine_peak(dtype: torch.dtype = torch.float32, seconds: float = 0.3,
                 cache: Path | None = None) -> dict[str, Any]:
    """The GEMM peak to compute MFU against: this start's measurement, and the best any run measured on this CPU.

    Returns {"peak": the best (what MFU divides by), "measured": this start's, "measurements": how many runs the
    best is the best of, "cpu", "threads", "dtype", "file", "note"}. The cache (PLELAB_CACHE, PEAKS_FILE) is keyed
    by the CPU's model and features, torch's version, the precision and the thread count; a cache that cannot be
    read or written is left as it is, and the peak is this start's alone (said in "note").
    """
    measured = measure_matmul_peak(dtype=dtype, seconds=seconds)
    threads = torch.get_num_threads()
    name = str(dtype).removeprefix("torch.")
    ident = hashlib.sha256(f"{cpu_identity()}\ntorch {torch.__version__}".encode()).hexdigest()[:16]
    key = f"{ident}/{name}/{threads}"
    path = cache or cache_root().parent / PEAKS_FILE  # beside the compiled helpers: $PLELAB_CACHE, ~/.cache/plelab
    out = {"peak": measured, "measured": measured, "measurements": 1, "cpu": _cpu_model(), "threads": threads,
           "dtype": name, "file": str(path), "note": ""}
    peaks = _read_peaks(path)
    if peaks is None:
        return {**out, "note": f"{path} is unreadable: this start's peak alone (delete the file to keep a best)"}
    entry = peaks.get(key) if isinstance(peaks.get(key), dict) else {}
    best = max(float(entry.get("best", 0.0)), measured)
    count = int(entry.get("measurements", 0)) + 1
    # Read again just before writing: runs starting together each keep the larger best.
    latest = (_read_peaks(path) or {}).get(key)
    if isinstance(latest, dict):
        best = max(best, float(latest.get("best", 0.0)))
    peaks[key] = {"cpu": out["cpu"], "torch": torch.__version__, "dtype": name, "threads": threads, "best": best,
                  "measurements": count}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, json.dumps(peaks, indent=1, sort_keys=True).encode())
    except OSError as exc:
        return {**out, "peak": best, "measurements": count, "note": f"{path} not written ({exc.strerror})"}
    return {**out, "peak": best, "measurements": count}


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
