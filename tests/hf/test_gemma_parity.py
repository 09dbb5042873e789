"""Our Gemma-form PLE against Hugging Face transformers' Gemma 3n and Gemma 4 text models, same weights.

(a) the PLE front end (identity + context, fused) equals Gemma 3n's get_per_layer_inputs +
    project_per_layer_inputs, including ids outside the PLE vocabulary;
(b) a layer's PLE injection equals what Gemma 4's decoder layer does after its FFN (h + y, then
    h *= layer_scalar), and Gemma 3n's in-layer PLE output y (which Gemma 3n adds to AltUp streams 1..K-1).
Every weight is randomised first, norms and zero-initialised scales included (SPEC §7): at HF's
init Gemma 3n's PLE contributes exactly zero and all norm weights are one, so nothing would be tested.
The deliberate-bug tests show the comparison is sharp enough to notice a wrong formula.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F
from parity_helpers import randomise_

pytest.importorskip("transformers")
from transformers.models.gemma3n.configuration_gemma3n import Gemma3nTextConfig  # noqa: E402
from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextModel  # noqa: E402
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4TextModel  # noqa: E402

from plelab.hf.interop import (  # noqa: E402
    HFInteropError,
    gemma_ple_mapping,
    hf_ple_state_dict,
    load_hf_ple_weights,
    mapping_table_markdown,
    ple_config_from_hf,
)
from plelab.model import LanguageModel, load_model_config  # noqa: E402
from plelab.model.norm import RMSNorm  # noqa: E402
from plelab.model.ple import PerLayerInjection, PerLayerInputs  # noqa: E402

TOL = 1e-6
# Bugs must miss by far more than rounding; the subtlest one (exact instead of tanh GELU) still misses by >100x.
BUG_MARGIN = 100 * TOL
V, V_PLE, H, L, DP = 64, 40, 32, 3, 8
COMMON = dict(
    vocab_size=V, vocab_size_per_layer_input=V_PLE, hidden_size=H, hidden_size_per_layer_input=DP,
    num_hidden_layers=L, num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-6,
    layer_types=["full_attention"] * L, max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def gemma3n() -> Gemma3nTextModel:
    cfg = Gemma3nTextConfig(
        **COMMON, intermediate_size=64, laurel_rank=4, altup_num_inputs=2, num_kv_shared_layers=0,
        activation_sparsity_pattern=[0.0] * L,
    )
    torch.manual_seed(0)
    model = Gemma3nTextModel(cfg).eval()
    assert model.layers[0].altup.correct_output_scale.abs().max() == 0  # the zero init SPEC §7 warns about
    randomise_(model, seed=1)
    return model


@pytest.fixture(scope="module")
def gemma4() -> Gemma4TextModel:
    cfg = Gemma4TextConfig(**COMMON, intermediate_size=64, global_head_dim=16)
    torch.manual_seed(0)
    model = Gemma4TextModel(cfg).eval()
    randomise_(model, seed=2)
    return model


def ours_from(hf_model: torch.nn.Module, kernels: str = "off", **ple_overrides) -> LanguageModel:
    """A plelab model shaped like the HF one (the core is a stand-in) with the HF PLE weights loaded.

    kernels="off" (the reference path) unless a test asks for the CPU kernels."""
    overrides = ple_config_from_hf(hf_model.config)
    overrides["ple"].update(ple_overrides)
    cfg = load_model_config(dict(overrides, num_heads=2, ffn=dict(intermediate_size=64), kernels=kernels))
    model = LanguageModel(cfg).eval()
    load_hf_ple_weights(model, hf_model, include_embedding=True)
    return model


def token_ids(seed: int = 3) -> torch.Tensor:
    """(2, 12) ids from the whole vocabulary, guaranteed to include ids inside and outside the PLE vocabulary."""
    ids = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(seed))
    ids[0, :4] = torch.tensor([0, V_PLE - 1, V_PLE, V - 1])
    return ids


def maxdiff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# ---------------------------------------------------------------------------------------------------------------
# (a) front end


def front_end_diff(hf: Gemma3nTextModel, ours: LanguageModel, ids: torch.Tensor) -> float:
    """Max |ours - HF| of the fused per-layer inputs, given the same input embedding."""
    with torch.no_grad():
        x = hf.embed_tokens(ids)  # HF's scaled embedding: x * sqrt(H)
        ref = hf.project_per_layer_inputs(x, hf.get_per_layer_inputs(ids))
        got = ours.per_layer_inputs(ids, x)
    return maxdiff(got, ref)


@pytest.mark.parametrize("kernels", ["off", "on"])
def test_front_end_matches_gemma3n(gemma3n, kernels):
    ours = ours_from(gemma3n, kernels)
    ids = token_ids()
    assert (ids >= V_PLE).any() and (ids < V_PLE).any()
    assert front_end_diff(gemma3n, ours, ids) <= TOL
    with torch.no_grad():
        # The main embedding maps 1:1 too, with embed_scale=True standing for Gemma's x * sqrt(H).
        assert maxdiff(ours.embed_tokens(ids) * math.sqrt(H), gemma3n.embed_tokens(ids)) <= TOL


def test_out_of_vocab_ids_use_row_zero_like_gemma3n(gemma3n):
    # HF Gemma 3n's get_per_layer_inputs masks ids outside [0, vocab_size_per_layer_input) to row 0 itself, so
    # the comparison above already covers them; here we pin the semantics: an out-of-range id behaves as id 0.
    ours = ours_from(gemma3n)
    ids = token_ids()
    oov = ids >= V_PLE
    with torch.no_grad():
        x = gemma3n.embed_tokens(ids)
        got = ours.per_layer_inputs(ids, x)
        as_zero = gemma3n.project_per_layer_inputs(x, gemma3n.get_per_layer_inputs(torch.where(oov, 0, ids)))
        hf_identity = gemma3n.get_per_layer_inputs(ids)
    assert maxdiff(got[oov], as_zero[oov]) <= TOL
    assert torch.equal(hf_identity[oov], gemma3n.get_per_layer_inputs(torch.zeros_like(ids))[oov])


def test_gemma3n_layers_get_our_ple_and_compute_our_injection(gemma3n):
    """Whole Gemma 3n forward: each layer's per_layer_input and its PLE output y equal ours."""
    ours = ours_from(gemma3n)
    ids = token_ids()
    seen: dict[int, dict[str, torch.Tensor]] = {i: {} for i in range(L)}
    hooks = []
    for i, layer in enumerate(gemma3n.layers):
        hooks += [
            layer.register_forward_pre_hook(lambda m, a, i=i: seen[i].update(ple=a[2].clone())),
            layer.per_layer_input_gate.register_forward_pre_hook(lambda m, a, i=i: seen[i].update(h=a[0].clone())),
            layer.post_per_layer_input_norm.register_forward_hook(lambda m, a, o, i=i: seen[i].update(y=o.clone())),
        ]
    try:
        with torch.no_grad():
            gemma3n(input_ids=ids)
            ple = ours.per_layer_inputs(ids, ours.embed_tokens(ids) * math.sqrt(H))
            for i in range(L):
                assert maxdiff(ple[:, :, i], seen[i]["ple"]) <= TOL
                y = ours.layers[i].ple(seen[i]["h"], ple[:, :, i])
                assert maxdiff(y, seen[i]["y"]) <= TOL
                assert y.norm() > 0.1 * seen[i]["h"].norm()  # the PLE path is live, not a silent zero
    finally:
        for h in hooks:
            h.remove()


# ---------------------------------------------------------------------------------------------------------------
# (b) in-layer injection, Gemma 4 (added straight to the residual after the FFN, then h *= layer_scalar)


def gemma4_layer_diffs(hf: Gemma4TextModel, ours: LanguageModel, ids: torch.Tensor) -> tuple[float, float, float]:
    """Max |ours - HF| over layers of (per-layer input, layer output); and the smallest |y| / |h| seen."""
    seen: dict[int, dict[str, torch.Tensor]] = {i: {} for i in range(L)}
    hooks = []
    for i, layer in enumerate(hf.layers):
        hooks += [
            layer.register_forward_pre_hook(lambda m, a, i=i: seen[i].update(ple=a[1].clone())),
            # The input of per_layer_input_gate is exactly h after attention + FFN, right before PLE.
            layer.per_layer_input_gate.register_forward_pre_hook(lambda m, a, i=i: seen[i].update(h=a[0].clone())),
            layer.register_forward_hook(lambda m, a, o, i=i: seen[i].update(out=o.clone())),
        ]
    try:
        with torch.no_grad():
            hf(input_ids=ids)
            ple = ours.per_layer_inputs(ids, ours.embed_tokens(ids) * math.sqrt(H))
            ple_diff = out_diff = 0.0
            strength = math.inf
            for i in range(L):
                h = seen[i]["h"]
                y = ours.layers[i].ple(h, ple[:, :, i])
                # Our model has no layer_scalar (it is 1); HF applies it to the whole residual after PLE.
                expected = (h + y) * hf.layers[i].layer_scalar
                ple_diff = max(ple_diff, maxdiff(ple[:, :, i], seen[i]["ple"]))
                out_diff = max(out_diff, maxdiff(expected, seen[i]["out"]))
                strength = min(strength, (y.norm() / h.norm()).item())
    finally:
        for hk in hooks:
            hk.remove()
    return ple_diff, out_diff, strength


def gemma4_ids() -> torch.Tensor:
    # Gemma 4's get_per_layer_inputs does not mask ids >= vocab_size_per_layer_input (it would index out of
    # range), so the Gemma 4 comparison stays inside the PLE vocabulary; Gemma 3n covers the rest.
    return token_ids() % V_PLE


@pytest.mark.parametrize("kernels", ["off", "on"])
def test_injection_matches_gemma4_decoder_layer(gemma4, kernels):
    ours = ours_from(gemma4, kernels)
    assert not torch.allclose(gemma4.layers[0].layer_scalar, torch.ones(1))
    ple_diff, out_diff, strength = gemma4_layer_diffs(gemma4, ours, gemma4_ids())
    assert ple_diff <= TOL
    assert out_diff <= TOL
    assert strength > 0.1


def test_our_decoder_layer_adds_injection_after_ffn(gemma4):
    """Our DecoderLayer's output is h_after_ffn + ple(h_after_ffn, ple_l), the same placement as Gemma 4."""
    ours = ours_from(gemma4)
    layer = ours.layers[1]
    captured = {}
    hook = layer.ple.register_forward_pre_hook(lambda m, a: captured.update(h=a[0].clone(), ple=a[1].clone()))
    try:
        with torch.no_grad():
            x = torch.randn(2, 5, H, generator=torch.Generator().manual_seed(4))
            cos, sin = ours.rope_cos[:5], ours.rope_sin[:5]
            ple = torch.randn(2, 5, DP, generator=torch.Generator().manual_seed(5))
            out = layer(x, cos, sin, ple)
            h = x + layer.self_attn(layer.input_layernorm(x), cos, sin)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
    finally:
        hook.remove()
    assert maxdiff(captured["h"], h) <= TOL and torch.equal(captured["ple"], ple)
    assert maxdiff(out, h + layer.ple(h, ple)) <= TOL


# ---------------------------------------------------------------------------------------------------------------
# deliberate bugs are caught


def _rmsnorm_one_plus_w(self, x):
    return F.rms_norm(x.float(), (x.shape[-1],), 1 + self.weight.float(), self.eps).type_as(x)


def _gate_exact_gelu(self, h, ple_input=None):
    return F.gelu(self.per_layer_input_gate(h))


def _identity_clamped(self, input_ids, cache=None):
    rows = self.embed_tokens_per_layer(input_ids.clamp(0, self.vocab_size - 1)) * self.embed_scale
    return rows.view(*input_ids.shape, self.num_layers, self.dim)


BUGS = {
    "norm_one_plus_w": (RMSNorm, "forward", _rmsnorm_one_plus_w),
    "gate_exact_gelu": (PerLayerInjection, "gate_values", _gate_exact_gelu),
    "oov_clamped_not_row0": (PerLayerInputs, "identity", _identity_clamped),
}


@pytest.mark.parametrize("bug", ["norm_one_plus_w", "no_fuse_scale", "no_sqrt_dp", "oov_clamped_not_row0"])
def test_front_end_bug_is_caught(gemma3n, monkeypatch, bug):
    ours = ours_from(gemma3n)
    if bug == "no_fuse_scale":
        monkeypatch.setattr(ours.per_layer_inputs, "per_layer_input_scale", 1.0)
    elif bug == "no_sqrt_dp":
        monkeypatch.setattr(ours.per_layer_inputs, "embed_scale", 1.0)
    else:
        monkeypatch.setattr(*BUGS[bug])
    assert front_end_diff(gemma3n, ours, token_ids()) > BUG_MARGIN


# A dropped 1/sqrt(2) is a front-end check only: post_per_layer_input_norm cancels any constant factor on
# ple_input (up to eps), so the layer output moves by just ~2e-4 - caught, but not by a wide margin.
@pytest.mark.parametrize("bug", ["norm_one_plus_w", "gate_exact_gelu", "no_output_norm"])
def test_injection_bug_is_caught(gemma4, monkeypatch, bug):
    ours = ours_from(gemma4)
    if bug == "no_output_norm":
        for layer in ours.layers:
            monkeypatch.setattr(layer.ple, "post_per_layer_input_norm", torch.nn.Identity())
    else:
        monkeypatch.setattr(*BUGS[bug])
    ple_diff, out_diff, _ = gemma4_layer_diffs(gemma4, ours, gemma4_ids())
    assert out_diff > BUG_MARGIN


# ---------------------------------------------------------------------------------------------------------------
# the mapping and the loader


@pytest.mark.parametrize("hf_fixture", ["gemma3n", "gemma4"])
def test_mapping_is_one_to_one_on_real_modules(request, hf_fixture):
    hf = request.getfixturevalue(hf_fixture)
    ours = ours_from(hf)
    rows = gemma_ple_mapping(L, include_embedding=True)
    ours_sd, hf_sd = ours.state_dict(), hf.state_dict()
    for r in rows:
        assert torch.equal(ours_sd[r.ours], hf_sd[r.hf]), r
    ple_names = {n for n in ours_sd if "per_layer" in n}
    assert ple_names == {r.ours for r in rows if "per_layer" in r.ours}  # nothing of ours left unmapped
    table = mapping_table_markdown(gemma_ple_mapping())
    assert "`layers.{i}.ple.per_layer_input_gate.weight` | `layers.{i}.per_layer_input_gate.weight`" in table


def test_load_from_prefixed_safetensors_file(gemma3n, tmp_path):
    from safetensors.torch import save_file

    # The layout of the published multimodal checkpoints: text-model names under model.language_model.
    sd = {f"model.language_model.{k}": v.contiguous() for k, v in gemma3n.state_dict().items()}
    save_file(sd, str(tmp_path / "model.safetensors"))
    ours = LanguageModel(load_model_config(dict(ple_config_from_hf(gemma3n.config), num_heads=2))).eval()
    loaded = load_hf_ple_weights(ours, tmp_path)
    assert len(loaded) == 3 + 3 * L
    hf_name = loaded["layers.2.ple.per_layer_projection.weight"]
    assert hf_name == "model.language_model.layers.2.per_layer_projection.weight"
    ids = token_ids()
    assert front_end_diff(gemma3n, ours, ids) <= TOL
    # A config.json beside the shards (multimodal layout, text part under text_config) is checked too.
    (tmp_path / "config.json").write_text(json.dumps({"text_config": gemma3n.config.to_dict()}))
    cfg = dict(ple_config_from_hf(gemma3n.config), num_heads=2, norm_eps=1e-5)
    with pytest.raises(HFInteropError, match=r"rms_norm_eps=1e-06 but ours is 1e-05 \(set norm_eps\)"):
        load_hf_ple_weights(LanguageModel(load_model_config(cfg)), tmp_path)


def test_load_into_a_subset_of_layers_takes_those_layers_blocks(gemma3n):
    ours = ours_from(gemma3n, layers=[0, 2])
    ids = token_ids()
    with torch.no_grad():
        x = gemma3n.embed_tokens(ids)
        ref = gemma3n.project_per_layer_inputs(x, gemma3n.get_per_layer_inputs(ids))
        got = ours.per_layer_inputs(ids, x)
    assert maxdiff(got, ref[:, :, [0, 2]]) <= TOL
    assert torch.equal(ours.layers[2].ple.per_layer_input_gate.weight, gemma3n.layers[2].per_layer_input_gate.weight)
    assert ours.layers[1].ple is None


def test_export_to_hf_names_round_trips(gemma3n):
    ours = ours_from(gemma3n)
    fresh = Gemma3nTextModel(gemma3n.config).eval()
    result = fresh.load_state_dict(hf_ple_state_dict(ours), strict=False)
    assert not result.unexpected_keys
    ids = token_ids()
    with torch.no_grad():
        x = gemma3n.embed_tokens(ids)
        a = fresh.project_per_layer_inputs(x, fresh.get_per_layer_inputs(ids))
        b = gemma3n.project_per_layer_inputs(x, gemma3n.get_per_layer_inputs(ids))
    assert torch.equal(a, b)


def test_missing_key_is_a_clear_error(gemma3n):
    ours = ours_from(gemma3n)
    sd = dict(gemma3n.state_dict())
    del sd["layers.1.per_layer_projection.weight"]
    with pytest.raises(HFInteropError, match=r"lacks layers\.1\.per_layer_projection\.weight"):
        load_hf_ple_weights(ours, sd)
    with pytest.raises(HFInteropError, match="holds no Gemma per-layer-embedding table"):
        load_hf_ple_weights(ours, {"model.embed_tokens.weight": torch.zeros(V, H)})


def test_shape_mismatch_is_a_clear_error_and_changes_nothing(gemma3n):
    cfg = dict(ple_config_from_hf(gemma3n.config), num_heads=2)
    cfg["ple"] = dict(cfg["ple"], vocab_size=V_PLE + 1)
    ours = LanguageModel(load_model_config(cfg))
    before = {k: v.clone() for k, v in ours.state_dict().items()}
    with pytest.raises(HFInteropError, match=r"embed_tokens_per_layer\.weight has shape \(40, 24\).*ple\.vocab_size"):
        load_hf_ple_weights(ours, gemma3n.state_dict())  # a bare state dict: caught by the shape check
    with pytest.raises(HFInteropError, match=r"vocab_size_per_layer_input=40 but ours is 41 \(set ple.vocab_size\)"):
        load_hf_ple_weights(ours, gemma3n)  # an HF model: caught earlier, from its config
    assert all(torch.equal(v, before[k]) for k, v in ours.state_dict().items())


def test_simple_form_model_is_refused(gemma3n):
    cfg = dict(ple_config_from_hf(gemma3n.config), num_heads=2)
    cfg["ple"] = dict(cfg["ple"], gate="scalar")
    with pytest.raises(HFInteropError, match="need the Gemma form"):
        load_hf_ple_weights(LanguageModel(load_model_config(cfg)), gemma3n)
