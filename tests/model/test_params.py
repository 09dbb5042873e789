"""Parameter accounting reproduces the published tables exactly and agrees with the built model."""

from __future__ import annotations

import pytest
import torch

from plelab.edge.export import shipped_config
from plelab.model import LanguageModel, count_params, load_model_config
from plelab.model.config import FFN_KINDS, PLE_GATES
from plelab.model.params import sweep_ple, with_ple_dim
from plelab.model.presets import PRESETS


def test_seed_3b_base_and_ple_256():
    cfg = load_model_config("seed-3b")
    assert count_params(cfg)["total"] == 2_458_421_760
    c = count_params(with_ple_dim(cfg, 256))
    assert c["ple_table"] == 819_986_432
    assert c["ple_model_projection"] == 20_971_776
    assert c["ple_per_layer"] == 42_024_960
    assert c["ple_added"] == 882_983_168
    assert round(100 * c["ple_added"] / c["base_total"], 2) == 35.92


def test_seed_3b_sweep_matches_published_table():
    rows = sweep_ple(load_model_config("seed-3b"), [0, 64, 128, 256, 512])
    assert [r["ple_added"] for r in rows] == [0, 220_807_232, 441_532_544, 882_983_168, 1_765_884_416]
    assert [round(r["pct_of_base"], 2) for r in rows] == [0.0, 8.98, 17.96, 35.92, 71.83]
    assert all(0.92 < r["table_share_of_added"] < 0.94 for r in rows[1:])  # "about 93 %"


def test_esp32_edge_reference():
    c = count_params(load_model_config("esp32-28m"))
    assert c["total"] == 28_869_920
    assert c["ple_table"] == 25_165_824
    assert c["embedding"] == 3_145_728
    assert c["rest"] == 558_368


def test_gemma3n_e2b_ple_parts():
    cfg = load_model_config(
        "seed-3b", ["hidden_size=2048", "num_layers=30", "ple.dim=256", "ple.vocab_size=262144"]
    )
    c = count_params(cfg)
    assert (c["ple_table"], c["ple_model_projection"], c["ple_per_layer"]) == (2_013_265_920, 15_728_896, 31_518_720)


VARIANTS = [
    [],
    ["ffn.kind=mglu", "ffn.mask_count=2"],
    ["ffn.kind=lowrank", "ffn.rank=8"],
    ["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2", "ffn.shared_expert=true", "ffn.expert_size=16"],
    ["ple.gate=scalar", "ple.context=false", "ple.output_norm=false"],
    ["ple.gate=vector", "ple.layers=[0]"],
    ["tie_embeddings=false", "ple.dim=0"],
    ["ple.index=ngram", "ple.vocab_size=none", "ple.ngram.heads=2", "ple.gate=engram", "ple.conv_kernel=4",
     "ple.context=false"],
    ["ple.index=ngram", "ple.vocab_size=none", "ple.ngram.orders=[1,2,3,4]", "ple.ngram.heads=1",
     "ple.layers=[0]"],
    ["arch=gemma4"],
    ["arch=gemma4", "num_layers=4", 'gemma4.layer_types=["sliding_attention","full_attention","sliding_attention",'
     '"full_attention"]', "gemma4.attention_k_eq_v=true", "gemma4.full_kv_heads=1", "gemma4.full_head_dim=32",
     "gemma4.num_kv_shared_layers=2", "gemma4.double_wide_mlp=true", "tie_embeddings=false"],
]


@pytest.mark.parametrize("preset", list(PRESETS))
@pytest.mark.parametrize("overrides", VARIANTS, ids=lambda o: ",".join(o) or "default")
def test_analytic_count_equals_meta_model(preset, overrides):
    cfg = load_model_config(preset, overrides)
    with torch.device("meta"):
        model = LanguageModel(cfg)
    built = sum(p.numel() for p in model.parameters())
    assert count_params(cfg)["total"] == built
    ple_built = sum(p.numel() for n, p in model.named_parameters() if "per_layer" in n or ".ple." in n)
    assert count_params(cfg)["ple_added"] == ple_built


@pytest.mark.parametrize("kind", FFN_KINDS)
@pytest.mark.parametrize("gate", PLE_GATES)
def test_every_listed_ffn_kind_and_gate_builds_and_counts(kind, gate):
    # The lists in plelab/model/config.py are the only ones: each entry must build, run and be counted.
    cfg = load_model_config("tiny", [f"ffn.kind={kind}", "ffn.rank=8", "ffn.prune_to=24", f"ple.gate={gate}"])
    model = LanguageModel(cfg)
    # Counts are of the model that ships: a pruned FFN as the plain SwiGLU of width prune_to.
    shipped = LanguageModel(shipped_config(cfg)) if kind == "pruned" else model
    assert count_params(cfg)["total"] == sum(p.numel() for p in shipped.parameters())
    assert model(torch.tensor([[1, 2, 3]]))[0].shape == (1, 3, cfg.vocab_size)
