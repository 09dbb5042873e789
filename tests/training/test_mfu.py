"""MFU helpers: the FLOPs formula on hand-computed configs, and a quick, sane peak measurement."""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from plelab.model.config import FFN_KINDS
from plelab.model.ffn import build_ffn
from plelab.model.params import ffn_train_macs_per_token, train_matmul_macs_per_token
from plelab.model.presets import load_model_config
from plelab.training import mfu as mfu_module
from plelab.training.mfu import machine_peak, measure_matmul_peak, mfu, train_flops_per_token

# H=256, 4 layers, 8 heads (head dim 32) / 4 kv heads, SwiGLU 688, V=8192, tied, T=256: the benchmark size.
BENCH = dict(
    vocab_size=8192, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4, max_seq_len=256,
    ffn=dict(intermediate_size=688),
)


def test_flops_per_token_by_hand() -> None:
    cfg = load_model_config(BENCH)
    # Per layer: q 256*256 + k,v 2*256*128 + o 256*256 = 196,608; FFN 3*256*688 = 528,384.
    # Head 8192*256 = 2,097,152 (counted although tied). Embedding lookup and norms excluded.
    matmul = 4 * (196_608 + 528_384) + 2_097_152
    assert matmul == 4_997_120
    attention = 12 * 4 * 256 * 256  # 12 * L * T * (heads * head_dim)
    assert train_flops_per_token(cfg) == 6 * matmul + attention == 33_128_448
    assert train_flops_per_token(cfg, seq_len=128) == 6 * matmul + attention // 2


# The BENCH model with another FFN -> that FFN's multiply-adds per token in one layer, counted by hand.
FFN_BY_HAND = {
    "swiglu": ([], 3 * 256 * 688),
    # n_m = 2: the forward runs gate (W*m_i) x and up (W*(1-m_i)) x per mask, then down: 2 * 2 + 1 matmuls.
    "mglu": (["ffn.kind=mglu", "ffn.mask_count=2"], (2 * 2 + 1) * 256 * 688),
    "lowrank": (["ffn.kind=lowrank", "ffn.rank=32"], 2 * (256 * 32 + 32 * 688) + 688 * 256),
    # Router 256 x 4, then 2 routed experts and the shared one, each 3 x 256 x 64; the 2 unrouted ones idle.
    "moe": (["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2", "ffn.expert_size=64", "ffn.shared_expert=true"],
            256 * 4 + (2 + 1) * 3 * 256 * 64),
    # Trains at intermediate_size = 688 (the dead units still run) until export removes them.
    "pruned": (["ffn.kind=pruned", "ffn.prune_to=300"], 3 * 256 * 688),
}


@pytest.mark.parametrize("kind", FFN_BY_HAND)
def test_flops_per_token_by_hand_for_every_ffn_kind(kind: str) -> None:
    overrides, ffn = FFN_BY_HAND[kind]
    cfg = load_model_config(BENCH, overrides)
    matmul = 4 * (196_608 + ffn) + 2_097_152
    assert train_matmul_macs_per_token(cfg) == matmul
    assert train_flops_per_token(cfg) == 6 * matmul + 12 * 4 * 256 * 256


def test_every_ffn_kind_is_counted_by_hand() -> None:
    assert set(FFN_BY_HAND) == set(FFN_KINDS)


@pytest.mark.parametrize("kind", FFN_BY_HAND)
def test_flops_per_token_match_what_a_training_step_of_the_ffn_runs(kind: str) -> None:
    """torch's FLOP counter over one FFN's forward and backward agrees with 6 x its counted multiply-adds."""
    overrides, _ = FFN_BY_HAND[kind]
    cfg = load_model_config(BENCH, [*overrides, "hidden_size=32", "ffn.intermediate_size=24",
                                    *(["ffn.expert_size=8"] if kind == "moe" else []),
                                    *(["ffn.rank=4"] if kind == "lowrank" else []),
                                    *(["ffn.prune_to=10"] if kind == "pruned" else [])])
    torch.manual_seed(0)
    ffn = build_ffn(cfg.hidden_size, cfg.ffn).train()
    tokens = 40
    x = torch.randn(tokens, cfg.hidden_size, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        ffn(x).square().sum().backward()
    assert counter.get_total_flops() == 6 * tokens * ffn_train_macs_per_token(cfg.hidden_size, cfg.ffn)


def test_flops_include_ple_projections_not_table() -> None:
    base = load_model_config(BENCH)
    ple = load_model_config(BENCH, ["ple.dim=128"])
    # PLE adds the context projection (H x L*dP) and, per layer, gate (H x dP) + projection (dP x H);
    # matmul_params also carries the PLE norms' few weights (dP + L*H), negligible. The 4M-row table is out.
    added = 256 * 4 * 128 + 4 * (2 * 256 * 128)
    norms = 128 + 4 * 256
    assert 6 * added <= train_flops_per_token(ple) - train_flops_per_token(base) <= 6 * (added + norms)


def test_mfu_is_a_fraction_of_peak() -> None:
    cfg = load_model_config(BENCH)
    per_token = train_flops_per_token(cfg)
    assert mfu(1000.0, cfg, peak=per_token * 1000.0) == pytest.approx(1.0)
    assert mfu(1000.0, cfg, peak=1e12, attention=False) == pytest.approx(1000.0 * 6 * 4_997_120 / 1e12)
    with pytest.raises(ValueError):
        mfu(1.0, cfg, peak=0.0)


def test_measure_peak_is_quick_and_positive() -> None:
    t0 = time.perf_counter()
    peak = measure_matmul_peak(size=128, seconds=0.2)
    assert time.perf_counter() - t0 < 2.0
    assert math.isfinite(peak) and peak > 0
    with pytest.raises(ValueError):
        measure_matmul_peak(size=0)


def test_the_peak_is_the_best_this_cpu_has_measured_kept_per_precision_and_threads(tmp_path, monkeypatch):
    cache = tmp_path / "peaks.json"
    measured = iter([5e9, 2e9, 7e9, 3e9])  # the second start shares the cores with another run
    monkeypatch.setattr(mfu_module, "measure_matmul_peak", lambda **kw: next(measured))
    got = [machine_peak(cache=cache) for _ in range(3)]
    assert [g["peak"] for g in got] == [5e9, 5e9, 7e9] and [g["measurements"] for g in got] == [1, 2, 3]
    assert got[1]["measured"] == 2e9 and got[1]["note"] == ""
    bf16 = machine_peak(torch.bfloat16, cache=cache)  # another precision: a peak of its own
    assert bf16["peak"] == 3e9 and bf16["measurements"] == 1 and bf16["dtype"] == "bfloat16"
    entries = json.loads(cache.read_text())
    assert sorted(e["best"] for e in entries.values()) == [3e9, 7e9]
    assert all(e["threads"] == torch.get_num_threads() for e in entries.values())


def test_an_unreadable_peak_cache_is_left_alone_and_said(tmp_path, monkeypatch):
    cache = tmp_path / "peaks.json"
    cache.write_text("{not json")
    monkeypatch.setattr(mfu_module, "measure_matmul_peak", lambda **kw: 4e9)
    got = machine_peak(cache=cache)
    assert got["peak"] == 4e9 and "unreadable" in got["note"] and cache.read_text() == "{not json"
