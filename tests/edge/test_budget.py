"""Per-token budgets (active parameters, inference bytes, FLOPs) and FFN widths matched to them."""

from __future__ import annotations

import math

import pytest
import torch

from plelab.edge.budget import (
    BUDGETS,
    FREE_WIDTH,
    BudgetError,
    _largest_at_most,
    active_flops,
    active_params_per_token,
    budget_value,
    inference_bytes,
    match_ffn,
    token_reads,
    with_width,
)
from plelab.edge.export import ExportOptions, layout_for_config, shipped_config
from plelab.edge.placement import items
from plelab.edge.quant import EXPORT_QUANTS
from plelab.model import LanguageModel, load_model_config
from plelab.model.config import FFN_KINDS
from plelab.model.ffn import ffn_param_count
from plelab.model.moe import MoE
from plelab.model.params import count_params, matmul_params

# A model small enough to count by hand: V=16, H=8, L=2, 2 query heads and 1 KV head of width 4, tied, no PLE.
V, H, L = 16, 8, 2
ATTN = 8 * 8 + 8 * 4 + 8 * 4 + 8 * 8  # q, k, v, o
NORMS = 2 * H  # per layer; plus the final norm H
HEAD = V * H  # the tied embedding matrix, a matmul for every token


def hand_cfg(*ffn: str):
    return load_model_config({"vocab_size": V, "hidden_size": H, "num_layers": L, "num_heads": 2,
                              "num_kv_heads": 1, "tie_embeddings": True}, list(ffn))


# kind overrides -> (FFN params a token touches per layer, FFN multiply-adds per layer, FFN values per layer
# stored as matrices, mask elements per layer)
HAND = {
    "swiglu": (["ffn.intermediate_size=12"], 3 * 8 * 12, 3 * 8 * 12, [96, 96, 96], 0),
    "mglu1": (["ffn.kind=mglu", "ffn.intermediate_size=12"], 2 * 96, 2 * 96 + 96, [96, 96], 96),
    # n_m = 4: the shared matrix is used 5 times (4 masked passes + W x), the masks are 4 x 96 bits.
    "mglu4": (["ffn.kind=mglu", "ffn.intermediate_size=12", "ffn.mask_count=4"], 2 * 96, 5 * 96 + 96,
              [96, 96], 4 * 96),
    "lowrank": (["ffn.kind=lowrank", "ffn.intermediate_size=12", "ffn.rank=3"],
                2 * (8 * 3 + 3 * 12) + 12 * 8, 2 * (8 * 3 + 3 * 12) + 12 * 8, [24, 36, 24, 36, 96], 0),
    # Trained at 12 units, ships as a SwiGLU of 5.
    "pruned": (["ffn.kind=pruned", "ffn.intermediate_size=12", "ffn.prune_to=5"], 3 * 8 * 5, 3 * 8 * 5,
               [40, 40, 40], 0),
    # Router 8 x 4, then top_k = 2 of the 4 experts of width 6 (3 x 8 x 6 = 144 each).
    "moe": (["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2", "ffn.expert_size=6"], 32 + 2 * 144,
            32 + 2 * 144, [32] + 2 * [48, 48, 48], 0),
    "moe_shared": (["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2", "ffn.expert_size=6",
                    "ffn.shared_expert=true"], 32 + 3 * 144, 32 + 3 * 144, [32] + 3 * [48, 48, 48], 0),
}


@pytest.mark.parametrize("name", HAND)
def test_active_params_and_flops_by_hand(name):
    overrides, ffn_params, ffn_macs, _, _ = HAND[name]
    cfg = hand_cfg(*overrides)
    assert active_params_per_token(cfg) == L * (ATTN + NORMS + ffn_params) + H + HEAD
    assert active_flops(cfg) == 2 * (L * (ATTN + ffn_macs) + HEAD)


def _bytes(numel: int, dtype: str) -> int:
    """A matrix or row of `numel` values at `dtype` with one fp16 scale per 128 (the export's default group)."""
    codes = {"fp32": 4 * numel, "fp16": 2 * numel, "int8": numel, "int4": (numel + 1) // 2}[dtype]
    return codes + (2 * math.ceil(numel / 128) if dtype.startswith("int") else 0)


@pytest.mark.parametrize("dtype", EXPORT_QUANTS)
@pytest.mark.parametrize("name", HAND)
def test_inference_bytes_by_hand(name, dtype):
    overrides, _, _, ffn_matrices, mask_elements = HAND[name]
    vector = 4 if dtype == "fp32" else 2  # the export keeps norms at fp32 only in an fp32 file
    attention = sum(_bytes(n, dtype) for n in (64, 32, 32, 64))
    ffn = sum(_bytes(n, dtype) for n in ffn_matrices) + mask_elements // 8
    layer = attention + ffn + NORMS * vector
    # The input row, then the tied head: the embedding table read whole, each row with its own scales.
    expected = L * layer + H * vector + _bytes(H, dtype) + V * _bytes(H, dtype)
    assert inference_bytes(hand_cfg(*overrides), dtype) == expected


def test_mglu_masks_are_bits_and_not_params():
    mglu1, mglu4 = hand_cfg(*HAND["mglu1"][0]), hand_cfg(*HAND["mglu4"][0])
    assert inference_bytes(mglu4) - inference_bytes(mglu1) == L * 3 * 96 // 8
    assert active_params_per_token(mglu4) == active_params_per_token(mglu1)
    assert budget_value(mglu4, "ffn_params") == budget_value(mglu1, "ffn_params") == L * 2 * 96


def test_untied_head_counts_the_input_row_apart():
    tied = hand_cfg(*HAND["swiglu"][0])
    untied = load_model_config({"vocab_size": V, "hidden_size": H, "num_layers": L, "num_heads": 2,
                                "num_kv_heads": 1, "tie_embeddings": False, "ffn": {"intermediate_size": 12}})
    assert active_params_per_token(untied) - active_params_per_token(tied) == H
    assert active_flops(untied) == active_flops(tied)


EXPORTABLE = [
    [], ["ffn.kind=mglu"], ["ffn.kind=mglu", "ffn.mask_count=4"], ["ffn.kind=lowrank", "ffn.rank=8"],
    ["tie_embeddings=false"], ["ple.gate=vector", "ple.context=false", "ple.layers=[1]"], ["ple.dim=0"],
    ["ple.vocab_size=100", "ple.gate=scalar", "ple.output_norm=false"],
    ["ffn.kind=moe", "ffn.num_experts=3", "ffn.top_k=2", "ffn.expert_size=24"],
    ["ffn.kind=moe", "ffn.top_k=1", "ffn.shared_expert=true"], ["ffn.kind=pruned", "ffn.prune_to=40"],
    # n-gram tables: S rows per token, each with its own scales
    ["ple.index=ngram", "ple.ngram.orders=[2,3]", "ple.ngram.heads=2"],
    ["ple.index=ngram", "ple.ngram.orders=[1,2,3,4]", "ple.ngram.heads=1", "ple.gate=scalar", "ple.context=false"],
]


@pytest.mark.parametrize("dtype", EXPORT_QUANTS)
@pytest.mark.parametrize("overrides", EXPORTABLE, ids=lambda o: ",".join(o) or "default")
def test_inference_bytes_equal_the_export_planners_bytes_per_token(overrides, dtype):
    # The edge export's own layout and the planner's per-token traffic (KV cache apart) are the reference.
    cfg = load_model_config("tiny", overrides)
    per_token = items(layout_for_config(cfg, ExportOptions(quant=dtype)), context=0, kv_dtype="fp16")
    # The planner spreads an MoE expert's bytes over the tokens (top_k / E each): exact up to float rounding.
    planned = sum(it.bytes_per_token for it in per_token if it.name != "kv_cache")
    assert inference_bytes(cfg, dtype) == pytest.approx(planned, rel=1e-12, abs=0)


@pytest.mark.parametrize("overrides", [
    [], ["ffn.kind=lowrank", "ffn.rank=8"], ["tie_embeddings=false", "ple.gate=scalar"],
    ["arch=gemma4", "num_layers=4", 'gemma4.layer_types=["sliding_attention","full_attention",'
     '"sliding_attention","full_attention"]', "gemma4.num_kv_shared_layers=2", "gemma4.double_wide_mlp=true"],
], ids=["swiglu", "lowrank", "untied-scalar-gate", "gemma4-shared-kv"])
def test_active_flops_are_twice_the_mfu_matmul_params(overrides):
    cfg = load_model_config("tiny", overrides)
    assert active_flops(cfg) == 2 * matmul_params(cfg)


@pytest.mark.parametrize("overrides", [
    [], ["tie_embeddings=false"], ["ffn.kind=mglu", "ffn.mask_count=3"], ["ffn.kind=lowrank", "ffn.rank=8"],
    ["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=3"], ["ffn.kind=moe", "ffn.top_k=1", "ffn.shared_expert=true"],
    ["arch=gemma4", "gemma4.double_wide_mlp=true", "gemma4.num_kv_shared_layers=1", "num_layers=3",
     'gemma4.layer_types=["full_attention","sliding_attention","full_attention"]'],
], ids=["tied", "untied", "mglu3", "lowrank", "moe-top3", "moe-top1-shared", "gemma4"])
def test_active_params_from_the_meta_model(overrides):
    # Build the model on meta and count what a token touches from its real parameters: every dense tensor,
    # top_k / E of each stacked expert tensor, no mask logits, one row of each table (the tied head: all V).
    cfg = load_model_config("tiny", overrides)
    with torch.device("meta"):
        model = LanguageModel(cfg)
    tables = {"embed_tokens.weight", "per_layer_inputs.embed_tokens_per_layer.weight"}
    routed = {f"{prefix}.{n}": m.top_k / m.num_experts for prefix, m in model.named_modules() if isinstance(m, MoE)
              for n in ("gate_proj", "up_proj", "down_proj")}
    dense = sum(p.numel() * routed.get(n, 1) for n, p in model.named_parameters()
                if n not in tables and not n.endswith("mask_logits"))
    rows = cfg.vocab_size * cfg.hidden_size if cfg.tie_embeddings else cfg.hidden_size
    ple_row = len(cfg.ple_layers) * cfg.ple.dim
    assert active_params_per_token(cfg) == dense + rows + ple_row


@pytest.mark.parametrize("overrides", [
    ["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2", "ffn.shared_expert=true"], ["ffn.kind=moe", "ffn.top_k=3"],
    ["ffn.kind=mglu", "ffn.mask_count=2"], ["ffn.kind=lowrank", "ffn.rank=8"], [],
])
def test_ffn_share_agrees_with_the_ffn_modules_own_counts(overrides):
    # MoE's own active count (router + top_k experts + shared); the other kinds' weights, MGLU masks apart.
    cfg = load_model_config("tiny", overrides)
    per_layer = (MoE.active_param_count(cfg.hidden_size, cfg.ffn) if cfg.ffn.kind == "moe"
                 else ffn_param_count(cfg.hidden_size, cfg.ffn)["ffn"])
    ffn = sum(r.param_count for r in token_reads(cfg) if ".mlp." in r.name)
    assert ffn == cfg.num_layers * per_layer


def test_every_ffn_kind_has_a_free_width():
    assert set(FREE_WIDTH) == set(FFN_KINDS)


def test_pruned_counts_as_the_shipped_swiglu():
    pruned = load_model_config("tiny", ["ffn.kind=pruned", "ffn.prune_to=20"])
    dense = load_model_config("tiny", ["ffn.intermediate_size=20"])
    assert shipped_config(pruned).ffn.kind == "swiglu"
    for f in (active_params_per_token, active_flops, inference_bytes):
        assert f(pruned) == f(dense)


# ---------------------------------------------------------------------------------------------------- matching

REFERENCE = ["ffn.intermediate_size=48"]  # tiny with a narrower FFN, so a pruned model (trained at 64) can match
VARIANTS = {
    "swiglu": [],
    "mglu1": ["ffn.kind=mglu"],
    "mglu4": ["ffn.kind=mglu", "ffn.mask_count=4"],
    "lowrank": ["ffn.kind=lowrank", "ffn.rank=4"],
    "pruned": ["ffn.kind=pruned", "ffn.prune_to=8"],
    "moe": ["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2"],
    "moe_shared": ["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=1", "ffn.shared_expert=true"],
}


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("name", VARIANTS)
def test_match_ffn_is_the_largest_width_within_the_budget(name, budget):
    cfg, ref = load_model_config("tiny", VARIANTS[name]), load_model_config("tiny", REFERENCE)
    matched = match_ffn(cfg, ref, budget)
    field = FREE_WIDTH[cfg.ffn.kind]
    width, target = getattr(matched.ffn, field), budget_value(ref, budget)
    assert budget_value(matched, budget) <= target < budget_value(with_width(cfg, width + 1), budget)
    assert budget_value(matched, budget) >= 0.9 * target
    # Only the free width moved.
    assert with_width(matched, getattr(cfg.ffn, field)) == cfg


def test_matched_widths_say_what_each_budget_means():
    ref = load_model_config("tiny", REFERENCE)
    mglu = load_model_config("tiny", ["ffn.kind=mglu"])
    # MGLU's shared matrix halves gate/up parameters: 1.5x the width for the same FFN parameters ...
    assert match_ffn(mglu, ref, "ffn_params").ffn.intermediate_size == 72
    # ... but costs the same multiply-adds as SwiGLU's gate and up, so the FLOP budget keeps the width.
    assert match_ffn(mglu, ref, "active_flops").ffn.intermediate_size == 48
    moe = load_model_config("tiny", VARIANTS["moe"])
    by_params, by_flops = match_ffn(moe, ref, "ffn_params"), match_ffn(moe, ref, "active_flops")
    assert by_params.ffn.expert_size < by_flops.ffn.expert_size  # all 4 experts are stored, 2 are run


def test_match_ffn_at_int4_counts_scales():
    ref, mglu = load_model_config("tiny", REFERENCE), load_model_config("tiny", ["ffn.kind=mglu"])
    matched = match_ffn(mglu, ref, "inference_bytes", "int4")
    assert budget_value(matched, "inference_bytes", "int4") <= budget_value(ref, "inference_bytes", "int4")
    assert (budget_value(with_width(matched, matched.ffn.intermediate_size + 1), "inference_bytes", "int4")
            > budget_value(ref, "inference_bytes", "int4"))


def test_no_width_under_the_budget_is_one_line():
    ref = load_model_config("tiny", ["ffn.intermediate_size=1"])
    moe = load_model_config("tiny", ["ffn.kind=moe", "ffn.num_experts=8"])  # its router alone is over
    with pytest.raises(BudgetError) as err:
        match_ffn(moe, ref, "ffn_params")
    msg = str(err.value)
    assert "\n" not in msg and "moe" in msg and "ffn_params" in msg
    assert f"{budget_value(ref, 'ffn_params'):,}" in msg
    assert f"{budget_value(with_width(moe, 1), 'ffn_params'):,}" in msg


def test_a_width_too_far_below_the_budget_is_refused():
    # prune_to must stay below the trained width 8, and 7 units are far below a 64-wide reference.
    pruned = load_model_config("tiny", ["ffn.kind=pruned", "ffn.intermediate_size=8", "ffn.prune_to=4"])
    with pytest.raises(BudgetError, match="prune_to must stay below intermediate_size=8"):
        match_ffn(pruned, load_model_config("tiny"), "ffn_params")


def test_bad_budget_and_quant():
    cfg = load_model_config("tiny")
    with pytest.raises(BudgetError, match="unknown budget"):
        match_ffn(cfg, cfg, "params")
    with pytest.raises(BudgetError, match="unknown budget"):
        budget_value(cfg, "flops")
    with pytest.raises(BudgetError, match="export quant"):
        inference_bytes(cfg, "bf16")


@pytest.mark.parametrize("value", [lambda w: w * w, lambda w: 10 * (w // 7) + w, lambda w: 3 * w + 5,
                                   lambda w: 2**min(w, 60)])
def test_width_search_agrees_with_brute_force(value):
    for target in (0, 4, 17, 100, 1000, 12345):
        brute = max((w for w in range(1, 20000) if value(w) <= target), default=None)
        for start in (1, 5, 150):
            assert _largest_at_most(value, target, start, cap=1 << 40) == brute
    assert _largest_at_most(value, 10**9, 3, cap=20) == 20


def test_count_params_is_unchanged_for_the_ffn_budget():
    cfg = load_model_config("small-ple", ["ffn.kind=lowrank", "ffn.rank=32"])
    assert budget_value(cfg, "ffn_params") == count_params(cfg)["ffn"]
