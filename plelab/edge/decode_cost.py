"""Measured decode cost of a trained run (or a .ple file): greedy tokens per second and bytes read per token.

A run dir or checkpoint is exported to a temporary .ple (atomically, removed afterwards); a .ple file is used
as it is. Both runtimes decode `tokens` tokens greedily after a fixed prompt:

    numpy  plelab.edge.runtime.EdgeModel: the prompt and one decode step are warm-up, then `tokens` single-token
           steps are timed with perf_counter; the traffic counter is reset after the warm-up, so bytes per
           token are those of the timed decode steps (the resident float32 copies it really reads: equal to
           the stored bytes for an fp32 export).
    c      plelab/edge/c (plerun --json): every position is a single-token step; plerun times positions 1..end
           (position 0 warms the caches) and counts the stored bytes of every position.

Bytes per token count what a token reads: the dense weights (MoE: only the experts it is routed to; MGLU: the
shared matrix once plus the 1-bit masks), its row-table records and the KV cache at its position, which is
also reported alone (`kv_bytes_per_token`) so weight traffic can be compared across variants.
Timings mean something only on an otherwise idle machine.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from plelab.edge.format import PleFile
from plelab.edge.runtime import EdgeModel, Traffic
from plelab.errors import PlelabError

RUNTIMES = ("numpy", "c")
PROMPT = (1, 2, 3, 4, 5, 6, 7, 8)  # a fixed prompt (ids modulo the vocabulary), so runs decode comparably


class DecodeCostError(PlelabError):
    """A decode measurement that cannot be made (bad arguments, a model too short for the tokens asked)."""


def measure_decode(source: str | Path, tokens: int = 64, runtime: str = "numpy", threads: int = 1,
                   quant: str = "fp32") -> dict[str, Any]:
    """Decode `tokens` tokens greedily from `source` (run dir, checkpoint or .ple) and measure the cost.

    Returns {"tokens_per_s", "bytes_per_token", "kv_bytes_per_token", "bytes_per_token_by_tier", "runtime",
    "ffn_kind", "ffn_origin", "tokens", "threads", "quant", "file_bytes"}; `quant` applies when exporting.
    """
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise DecodeCostError(f"tokens must be an integer >= 1, got {tokens!r}")
    if runtime not in RUNTIMES:
        raise DecodeCostError(f"runtime must be one of {', '.join(RUNTIMES)}, got {runtime!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise DecodeCostError(f"threads must be an integer >= 1, got {threads!r}")
    path = Path(source)
    if path.is_file():
        return _measure(path, tokens, runtime, threads)
    from plelab.edge.export import ExportOptions, export_source

    with tempfile.TemporaryDirectory(prefix="plelab-decode-") as tmp:
        out = Path(tmp) / "model.ple"
        export_source(str(path), out, ExportOptions(quant=quant), with_tokenizer=False)
        return _measure(out, tokens, runtime, threads)


def _measure(path: Path, tokens: int, runtime: str, threads: int) -> dict[str, Any]:
    with PleFile(path, verify="core") as f:
        lay = f.layout
    m, d = lay.model, lay.derived
    prompt = [i % m["vocab_size"] for i in PROMPT]
    positions = len(prompt) + tokens + 1  # the prompt, one warm-up step, the timed steps
    if positions > m["max_seq_len"]:
        raise DecodeCostError(f"{len(prompt)} prompt + 1 warm-up + {tokens} tokens exceed the model's context of "
                              f"{m['max_seq_len']} positions; ask for fewer tokens")
    kv_per_position = 2 * m["num_layers"] * d["kv_heads"] * d["head_dim"] * 4  # float32 K and V, both runtimes
    if runtime == "numpy":
        if threads != 1:
            raise DecodeCostError("threads applies to the C runtime; the NumPy runtime uses its BLAS's threads "
                                  "(OMP_NUM_THREADS)")
        speed, by_tier, first = _numpy_decode(path, prompt, tokens)
        last = first + tokens - 1
    else:
        from plelab.edge import c_engine

        r = c_engine.run(path, prompt, positions, threads=threads, verify="core")
        speed, first, last = r["tok_per_s"], 0, positions - 1
        by_tier = {tier: v["bytes_per_token"] for tier, v in r["traffic"].items()}
    kv = kv_per_position * (first + last + 2) / 2  # position p reads p + 1 positions of K and V: the mean
    origin = lay.source.get("ffn_origin", {}).get("kind")
    return {"tokens_per_s": speed, "bytes_per_token": round(sum(by_tier.values())),
            "kv_bytes_per_token": round(kv), "bytes_per_token_by_tier": by_tier, "runtime": runtime,
            "ffn_kind": origin or m["ffn"]["kind"], "ffn_origin": origin, "file_ffn_kind": m["ffn"]["kind"],
            "tokens": tokens, "threads": threads, "quant": lay.quant["dtype"], "file_bytes": lay.file_bytes}


def _numpy_decode(path: Path, prompt: list[int], tokens: int) -> tuple[float, dict[str, float], int]:
    """(tokens/s, bytes per token by tier, first counted position) of greedy decoding in the NumPy runtime."""
    with EdgeModel(path, verify="core") as rt:
        cache = rt.new_cache(len(prompt) + tokens + 1)
        logits = rt.forward(prompt, cache)[-1]
        logits = rt.forward([int(np.argmax(logits))], cache)[-1]  # warm-up step: first-touch costs stay out
        first = cache.pos
        rt.traffic = Traffic()
        t0 = time.perf_counter()
        for _ in range(tokens):
            logits = rt.forward([int(np.argmax(logits))], cache)[-1]
        elapsed = time.perf_counter() - t0
    return tokens / elapsed, rt.traffic.per_token()["bytes_per_token"], first
