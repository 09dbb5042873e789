"""arch = "gemma4" against transformers' Gemma4ForCausalLM, same weights, logit for logit.

Tiny random configs exercise what plelab builds of Gemma 4: sliding/full layers with a window shorter than
the sequence, full layers with their own head width, kv heads and proportional RoPE, values = keys
(attention_k_eq_v), KV-shared layers with a double-wide FFN, PLE, final logit soft-capping, tied and untied
heads. Every weight is randomised first, norms and layer scalars included: at HF's init every norm weight
and layer scalar is one, and parity would prove nothing about where they sit. Planted bugs (a missing layer
scalar, a norm moved, no value norm, a window one too wide, full RoPE instead of proportional) must fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from parity_helpers import randomise_

pytest.importorskip("transformers")
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM  # noqa: E402

from plelab.hf.interop import (  # noqa: E402
    HFInteropError,
    gemma4_config_from_hf,
    hf_gemma4_config,
    hf_gemma4_state_dict,
    load_hf_gemma4_weights,
)
from plelab.model import KVCache, LanguageModel  # noqa: E402
from plelab.model import gemma4 as g4  # noqa: E402
from plelab.model.config import ConfigError, FFNConfig, Gemma4Config, ModelConfig  # noqa: E402
from plelab.model.params import count_params  # noqa: E402

TOL = 1e-5
BUG_MARGIN = 1e-3
T = 9  # longer than the sliding window (3), so the window matters

CONFIGS = {
    "sliding-full-kEqV-ple-softcap": dict(
        vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=1, head_dim=8, layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=3, hidden_size_per_layer_input=8, vocab_size_per_layer_input=96,
        attention_k_eq_v=True, final_logit_softcapping=5.0, global_head_dim=16, num_global_key_value_heads=2,
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                         "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                            "rope_theta": 1000.0}},
    ),
    "kv-shared-doublewide-untied": dict(
        vocab_size=80, hidden_size=32, intermediate_size=40, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=2, head_dim=16, layer_types=["sliding_attention", "full_attention"] * 2,
        sliding_window=3, hidden_size_per_layer_input=4, vocab_size_per_layer_input=80, num_kv_shared_layers=2,
        use_double_wide_mlp=True, tie_word_embeddings=False, global_head_dim=16,
    ),
    "default-pattern-no-ple": dict(
        vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, global_head_dim=32, sliding_window=4, hidden_size_per_layer_input=0,
    ),
}


def hf_model(name: str, seed: int = 0) -> Gemma4ForCausalLM:
    torch.manual_seed(seed)
    model = Gemma4ForCausalLM(Gemma4TextConfig(**CONFIGS[name])).eval()
    randomise_(model, seed)
    return model


def ours_from(hf: Gemma4ForCausalLM, kernels: str = "off") -> LanguageModel:
    cfg = gemma4_config_from_hf(hf.config)
    cfg.kernels = kernels
    model = LanguageModel(cfg).eval()
    load_hf_gemma4_weights(model, hf.state_dict())
    return model


def ids(vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(seed))


def max_diff(model: LanguageModel, hf: Gemma4ForCausalLM, x: torch.Tensor) -> float:
    with torch.no_grad():
        return (model(x)[0] - hf(x).logits).abs().max().item()


@pytest.mark.parametrize("kernels", ["off", "on"])
@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_match_transformers(name, kernels):
    hf = hf_model(name)
    model = ours_from(hf, kernels)
    x = ids(hf.config.vocab_size)
    assert max_diff(model, hf, x) <= TOL
    # The comparison is not trivially passing: the logits are far from constant.
    assert hf(x).logits.std() > 0.1


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kv_cache_decode_matches_full_forward(name):
    hf = hf_model(name)
    model = ours_from(hf)
    x = ids(hf.config.vocab_size, seed=2)
    with torch.no_grad():
        want = hf(x).logits
        cache = KVCache.empty(model.config, 2, T)
        prefill, _ = model(x[:, :4], cache=cache)
        got = [prefill[:, -1]]
        for t in range(4, T):
            step, _ = model(x[:, t : t + 1], cache=cache)
            got.append(step[:, -1])
    assert (torch.stack(got, 1) - want[:, 3:]).abs().max().item() <= TOL


def _post_norm_inside_residual(self, x, cos, sin, mask, shared, ple_input=None, cache=None):
    x = self.post_attention_layernorm(x + self.self_attn(self.input_layernorm(x), cos, sin, mask, shared, cache))
    x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
    if self.ple is not None:
        x = x + self.ple(x, ple_input)
    return x * self.layer_scalar


def _no_layer_scalar(self, x, cos, sin, mask, shared, ple_input=None, cache=None):
    x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, mask, shared, cache))
    x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
    if self.ple is not None:
        x = x + self.ple(x, ple_input)
    return x


REAL_MASK, REAL_INV_FREQ = g4.attention_mask, g4.rope_inv_freq
BUGS = {
    "no layer scalar": lambda mp: mp.setattr(g4.Gemma4DecoderLayer, "forward", _no_layer_scalar),
    "post-attention norm over the residual": lambda mp: mp.setattr(
        g4.Gemma4DecoderLayer, "forward", _post_norm_inside_residual
    ),
    "no value norm": lambda mp: mp.setattr(g4, "unit_rms_norm", lambda v, eps: v),
    "window one too wide": lambda mp: mp.setattr(
        g4, "attention_mask", lambda q, k, w, device=None: REAL_MASK(q, k, w and w + 1, device)
    ),
    "full RoPE on full layers": lambda mp: mp.setattr(
        g4, "rope_inv_freq", lambda d, theta, fraction=1.0: REAL_INV_FREQ(d, theta)
    ),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bugs_fail_parity(bug, monkeypatch):
    hf = hf_model("sliding-full-kEqV-ple-softcap")
    model = ours_from(hf)
    x = ids(hf.config.vocab_size)
    assert max_diff(model, hf, x) <= TOL
    BUGS[bug](monkeypatch)
    assert max_diff(model, hf, x) > BUG_MARGIN


def test_round_trip_config_and_state_dict():
    # ours -> HF config + weights -> HF model computes the same; the config converts back unchanged.
    hf_src = hf_model("sliding-full-kEqV-ple-softcap", seed=3)
    model = ours_from(hf_src)
    hf_cfg = hf_gemma4_config(model.config)
    assert gemma4_config_from_hf(hf_cfg) == dataclass_without_kernels(model.config)
    hf = Gemma4ForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(hf_gemma4_state_dict(model), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied: HF ties it on load
    hf.tie_weights()
    assert max_diff(model, hf, ids(model.config.vocab_size, seed=4)) <= TOL


def dataclass_without_kernels(cfg: ModelConfig) -> ModelConfig:
    return dataclasses.replace(cfg, kernels="auto")


@pytest.mark.parametrize("name", list(CONFIGS))
def test_parameter_count_is_exact(name):
    cfg = gemma4_config_from_hf(Gemma4TextConfig(**CONFIGS[name]))
    hf = Gemma4ForCausalLM(Gemma4TextConfig(**CONFIGS[name]))
    hf_count = sum(p.numel() for p in hf.parameters())  # a tied head is one parameter
    assert count_params(cfg)["total"] == hf_count == sum(p.numel() for p in LanguageModel(cfg).parameters())


def test_training_loss_paths_agree():
    # The fused head+loss path is skipped when logits are soft-capped; both paths give the same loss.
    hf = hf_model("sliding-full-kEqV-ple-softcap")
    model = ours_from(hf, kernels="on")
    x = ids(hf.config.vocab_size)
    _, loss_fused = model(x[:, :-1], x[:, 1:], return_logits=False)
    logits, loss = model(x[:, :-1], x[:, 1:])
    assert torch.allclose(loss_fused, loss) and torch.isfinite(loss)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(enable_moe_block=True, num_experts=2, top_k_experts=1, moe_intermediate_size=8), "MoE"),
        (dict(hidden_activation="gelu"), "GELU-tanh"),
        (dict(rope_parameters={"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                               "full_attention": {"rope_type": "default", "rope_theta": 1e4}}), "rope_type"),
    ],
)
def test_unsupported_hf_configs_are_refused(change, message):
    c = Gemma4TextConfig(**CONFIGS["kv-shared-doublewide-untied"]).to_dict() | change
    with pytest.raises(HFInteropError, match=message):
        gemma4_config_from_hf(c)


def test_not_gemma4_is_refused():
    with pytest.raises(HFInteropError, match="not a Gemma 4 config"):
        gemma4_config_from_hf({"model_type": "llama", "hidden_size": 32})


def test_config_validation():
    with pytest.raises(ConfigError, match="end with full_attention"):
        ModelConfig(arch="gemma4", num_layers=2,
                    gemma4=Gemma4Config(layer_types=["full_attention", "sliding_attention"]))
    with pytest.raises(ConfigError, match="earlier layer"):
        ModelConfig(arch="gemma4", num_layers=2, gemma4=Gemma4Config(
            layer_types=["sliding_attention", "full_attention"], num_kv_shared_layers=1))
    with pytest.raises(ConfigError, match="ffn.kind=swiglu"):
        ModelConfig(arch="gemma4", ffn=FFNConfig(kind="mglu"))
    with pytest.raises(ConfigError, match="arch must be"):
        ModelConfig(arch="gpt2")


def test_kernel_and_reference_gradients_agree():
    # The CPU kernels (RMSNorm over QK heads included, RoPE with frequency-0 pairs) train the same model.
    hf = hf_model("sliding-full-kEqV-ple-softcap")
    x = ids(hf.config.vocab_size)
    grads = []
    for kernels in ("off", "on"):
        model = ours_from(hf, kernels).train()
        _, loss = model(x[:, :-1], x[:, 1:], return_logits=False)
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], atol=1e-5, rtol=1e-4), name


def test_edge_export_refuses_gemma4(tmp_path):
    from plelab.edge.export import ExportError, ExportOptions, export_model

    model = ours_from(hf_model("default-pattern-no-ple"))
    with pytest.raises(ExportError, match="arch=gemma4"):
        export_model(model, tmp_path / "m.ple", ExportOptions())
    assert not (tmp_path / "m.ple").exists()
