"""Our dP = 0 model against transformers' LlamaForCausalLM, logit for logit, with the same (random) weights."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaForCausalLM  # noqa: E402

from plelab.hf.interop import HFInteropError, hf_llama_config, llama_mapping, load_hf_llama_weights  # noqa: E402
from plelab.model import KVCache, LanguageModel, ModelConfig  # noqa: E402
from plelab.model.config import FFNConfig, PLEConfig  # noqa: E402

# Logits are O(1) (max ~4) with random N(0, 1/fan_in) weights. Against HF's SDPA attention the logits agree to
# ~0; HF's eager attention (its own softmax) differs by ~3e-6, hence a looser bound for the eager reference.
TOL = 1e-5
TOL_SDPA = 1e-6


def config(tie: bool = True, **kw) -> ModelConfig:
    """The reference path (kernels="off") unless a test asks for the CPU kernels."""
    base = dict(
        vocab_size=96, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, max_seq_len=32,
        rope_theta=500.0, norm_eps=1e-5, tie_embeddings=tie, ffn=FFNConfig(intermediate_size=48), kernels="off",
    )
    return ModelConfig(**{**base, **kw})


def random_llama(cfg: ModelConfig, seed: int = 0, attn: str = "eager") -> LlamaForCausalLM:
    """An HF Llama with every weight random (norm weights too, so a wrong norm formula shows)."""
    hf = LlamaForCausalLM(hf_llama_config(cfg, attn_implementation=attn)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in hf.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
    return hf


def ids(cfg: ModelConfig, T: int = 16) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (2, T), generator=torch.Generator().manual_seed(7))


@pytest.mark.parametrize("kernels", ["off", "on"])
@pytest.mark.parametrize("tie,attn,tol", [(True, "eager", TOL), (False, "eager", TOL), (True, "sdpa", TOL_SDPA)])
def test_logits_match_llama(tie, attn, tol, kernels):
    cfg = config(tie, kernels=kernels)
    hf = random_llama(cfg, attn=attn)
    assert hf.config._attn_implementation == attn
    assert hf.config.tie_word_embeddings == tie
    ours = LanguageModel(cfg).eval()
    loaded = load_hf_llama_weights(ours, hf)
    assert set(loaded) == {n for n, _ in ours.named_parameters()}  # every parameter came from HF
    x = ids(cfg)
    with torch.no_grad():
        ref = hf(input_ids=x).logits
        got, _ = ours(x, targets=x)
    assert ref.abs().max() > 1.0  # not a degenerate near-zero comparison
    assert (got - ref).abs().max().item() <= tol


def test_kv_cache_decoding_matches_llama_full_forward():
    cfg = config()
    hf = random_llama(cfg, seed=1)
    ours = LanguageModel(cfg).eval()
    load_hf_llama_weights(ours, hf)
    x = ids(cfg, 10)
    with torch.no_grad():
        ref = hf(input_ids=x).logits
        cache = KVCache.empty(cfg, 2, 10)
        steps = [ours(x[:, :6], cache=cache)[0]] + [ours(x[:, t : t + 1], cache=cache)[0] for t in range(6, 10)]
    got = torch.cat(steps, dim=1)
    assert (got - ref[:, 5:]).abs().max().item() <= TOL


def test_ple_model_with_silent_ple_equals_llama():
    """A PLE model whose injection starts silent (output norm at zero) computes exactly the Llama core."""
    cfg = config(ple=PLEConfig(dim=8, output_norm_init=0.0))
    hf = random_llama(config(), seed=2)
    ours = LanguageModel(cfg).eval()
    loaded = load_hf_llama_weights(ours, hf)
    assert not any("per_layer" in n for n in loaded)
    x = ids(cfg)
    with torch.no_grad():
        assert (ours(x, targets=x)[0] - hf(input_ids=x).logits).abs().max().item() <= TOL


@pytest.mark.parametrize("bug", ["rope_theta", "norm_eps"])
def test_numerics_mismatch_is_caught(bug):
    cfg = config()
    hf = random_llama(cfg, seed=3)
    wrong = config(**({"rope_theta": 10000.0} if bug == "rope_theta" else {"norm_eps": 1e-1}))
    ours = LanguageModel(wrong).eval()
    with pytest.raises(HFInteropError, match=bug):
        load_hf_llama_weights(ours, hf)  # the HF config gives it away
    load_hf_llama_weights(ours, hf.state_dict())  # a bare state dict cannot, but the logits do
    x = ids(cfg)
    with torch.no_grad():
        assert (ours(x, targets=x)[0] - hf(input_ids=x).logits).abs().max().item() > 100 * TOL


def test_loader_errors():
    hf = random_llama(config(tie=False))
    with pytest.raises(HFInteropError, match="tie_embeddings=false"):
        load_hf_llama_weights(LanguageModel(config(tie=True)), hf.state_dict())
    with pytest.raises(HFInteropError, match="swiglu"):
        load_hf_llama_weights(LanguageModel(config(ffn=FFNConfig(kind="mglu", intermediate_size=48))), hf)
    sd = dict(hf.state_dict())
    del sd["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(HFInteropError, match=r"lacks model\.layers\.1\.mlp\.up_proj\.weight"):
        load_hf_llama_weights(LanguageModel(config(tie=False)), sd)
    with pytest.raises(HFInteropError, match="shape"):
        load_hf_llama_weights(LanguageModel(config(tie=False, vocab_size=97)), hf.state_dict())


def test_llama_mapping_names_exist_on_both_sides():
    cfg = config(tie=False)
    hf_names = set(random_llama(cfg).state_dict())
    ours_names = {n for n, _ in LanguageModel(cfg).named_parameters()}
    rows = llama_mapping(cfg.num_layers, tied=False)
    assert {r.ours for r in rows} == ours_names
    assert {"model." + r.hf if r.hf != "lm_head.weight" else r.hf for r in rows} == hf_names
