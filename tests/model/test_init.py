"""Each module initialises itself; the PLE parts draw from their own generator (paired runs across dP)."""

from __future__ import annotations

import math

import pytest
import torch

from plelab.model import LanguageModel, load_model_config
from plelab.model.config import FFNConfig
from plelab.model.ffn import MGLU, LowRankSwiGLU
from plelab.model.ple import PerLayerInjection, PerLayerInputs

STD = 0.02


def assert_normal(t: torch.Tensor, std: float, name: str = "") -> None:
    """Looks like N(0, std): the right spread, centred, and not a constant."""
    t = t.detach().float()
    assert t.numel() >= 1000, name
    assert abs(t.std().item() / std - 1) < 0.1, f"{name}: std {t.std().item():.4g}, want {std:.4g}"
    assert abs(t.mean().item()) < 0.1 * std, f"{name}: mean {t.mean().item():.4g}"


def test_mglu_on_its_own_is_initialised():
    torch.manual_seed(0)
    ffn = MGLU(64, FFNConfig(kind="mglu", intermediate_size=128, mask_count=2), std=STD, out_std=STD / 4)
    assert_normal(ffn.weight, STD, "weight")
    assert_normal(ffn.mask_logits, STD, "mask_logits")
    assert_normal(ffn.down_proj.weight, STD / 4, "down_proj")
    # Each mask starts as a random half/half split of the shared matrix.
    frac = (ffn.mask_logits > 0).float().mean(dim=(1, 2))
    assert torch.all((frac - 0.5).abs() < 0.02), frac


def test_lowrank_on_its_own_is_initialised():
    torch.manual_seed(0)
    ffn = LowRankSwiGLU(64, FFNConfig(kind="lowrank", intermediate_size=128, rank=32), std=STD)
    for name, p in ffn.named_parameters():
        assert_normal(p, STD, name)  # nn.Linear's default would be U(+-1/sqrt(fan_in)), std 0.07 / 0.1


def test_ple_front_end_on_its_own_is_initialised():
    torch.manual_seed(0)
    cfg = load_model_config("tiny", ["ple.table_init_std=0.05"])
    ple = PerLayerInputs(cfg)
    assert_normal(ple.embed_tokens_per_layer.weight, 0.05, "table")  # nn.Embedding's default is N(0, 1)
    assert_normal(ple.per_layer_model_projection.weight, cfg.init_std, "context projection")
    assert torch.equal(ple.per_layer_projection_norm.weight, torch.ones(cfg.ple.dim))


@pytest.mark.parametrize("gate", ["input", "scalar", "vector"])
def test_ple_injection_on_its_own_is_initialised(gate: str):
    torch.manual_seed(0)
    cfg = load_model_config(
        "tiny", ["hidden_size=64", "ple.dim=32", f"ple.gate={gate}", "ple.gate_init=0.5", "ple.output_norm_init=0"]
    )
    inj = PerLayerInjection(cfg)
    assert_normal(inj.per_layer_projection.weight, cfg.init_std, "projection")
    if gate == "input":
        assert_normal(inj.per_layer_input_gate.weight, cfg.init_std, "gate")
    else:
        assert torch.equal(inj.gate, torch.full((1,) if gate == "scalar" else (cfg.ple.dim,), 0.5))
    # output_norm_init = 0: PLE starts silent, exactly.
    assert torch.equal(inj.post_per_layer_input_norm.weight, torch.zeros(cfg.hidden_size))
    h, ple_in = torch.randn(2, 3, cfg.hidden_size), torch.randn(2, 3, cfg.ple.dim)
    assert inj(h, ple_in).abs().max().item() == 0.0


def test_model_initialises_every_parameter_as_intended():
    torch.manual_seed(0)
    cfg = load_model_config("tiny", ["hidden_size=64", "ffn.intermediate_size=128", "tie_embeddings=false"])
    model = LanguageModel(cfg)
    resid = cfg.init_std / math.sqrt(2 * cfg.num_layers)
    for name, p in model.named_parameters():
        if name.endswith(("norm.weight", "layernorm.weight")):
            assert torch.equal(p, torch.full_like(p, cfg.ple.output_norm_init if "post_per_layer" in name else 1.0))
        elif name.endswith(("o_proj.weight", "down_proj.weight")):
            assert_normal(p, resid, name)
        else:
            assert_normal(p, cfg.ple.table_init_std or cfg.init_std, name)


# ------------------------------------------------------------------------------------------ paired runs


def build(seed: int, dim: int, *extra: str) -> tuple[LanguageModel, torch.Tensor]:
    """A model built after torch.manual_seed(seed), and the next global random number after it."""
    torch.manual_seed(seed)
    model = LanguageModel(load_model_config("tiny", [f"ple.dim={dim}", *extra]))
    return model, torch.rand(4)


def trunk(model: LanguageModel) -> dict[str, torch.Tensor]:
    ple = {id(p) for m in model.modules() if isinstance(m, (PerLayerInputs, PerLayerInjection)) for p in m.parameters()}
    return {n: p for n, p in model.named_parameters() if id(p) not in ple}


NGRAM = ["ple.index=ngram", "ple.ngram.orders=[1,2,3]", "ple.ngram.heads=2", "ple.gate=engram", "ple.conv_kernel=4",
         "ple.context=false", "ple.output_norm=false"]
"""An Engram-form n-gram table (dP a multiple of its 6 heads: 48, 96 below)."""


@pytest.mark.parametrize("extra", [[], ["ple.context=false", "ple.gate=scalar", "ple.layers=[1]"], NGRAM],
                         ids=["gemma", "simple", "ngram-engram"])
def test_trunk_is_bit_identical_at_every_ple_width(extra: list[str]):
    base, rng_after = build(7, 0, *extra)
    ref = trunk(base)
    assert len(ref) == len(list(base.parameters()))  # dP = 0: the whole model is trunk
    for dim in ((48, 96) if "ple.index=ngram" in extra else (16, 64)):
        model, rng = build(7, dim, *extra)
        got = trunk(model)
        assert len(got) < len(list(model.parameters()))
        assert got.keys() == ref.keys()
        for name, p in got.items():
            assert torch.equal(p, ref[name]), f"dP={dim}: {name} differs from dP=0"
        # Whatever the caller draws next (data order, sampling) does not depend on dP either.
        assert torch.equal(rng, rng_after)


def test_ngram_and_engram_parts_are_initialised():
    torch.manual_seed(0)
    cfg = load_model_config("tiny", ["hidden_size=64", "ple.dim=48", "ple.table_init_std=0.05", *NGRAM])
    ple = PerLayerInputs(cfg)
    assert ple.embed_tokens_per_layer.weight.shape == (cfg.ple_table_rows, cfg.ple_row_width)
    assert_normal(ple.embed_tokens_per_layer.weight, 0.05, "n-gram table")
    inj = PerLayerInjection(cfg)
    assert_normal(inj.gate, cfg.init_std, "engram key projection")
    for norm in (inj.gate_key_norm, inj.gate_query_norm, inj.conv.norm):
        assert torch.equal(norm.weight, torch.ones(cfg.hidden_size))
    # The convolution's taps start at zero: its branch adds exactly nothing to a new model.
    assert torch.equal(inj.conv.weight, torch.zeros(cfg.hidden_size, 1, 4))
    assert inj.conv.dilation == 3  # the longest n-gram, as Engram spaces them


def test_another_seed_gives_another_model():
    a, _ = build(7, 16)
    b, _ = build(8, 16)
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        if pa.ndim >= 2:
            assert not torch.equal(pa, pb), name


def test_ple_seed_fixes_the_ple_parameters():
    model, _ = build(7, 16)
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    model.reset_parameters(ple_seed=3)
    first = table.clone()
    model.reset_parameters(ple_seed=3)
    assert torch.equal(table, first)
    model.reset_parameters(ple_seed=4)
    assert not torch.equal(table, first)
