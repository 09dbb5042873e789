"""The fused ops (plelab/model/fused_ops.py) compute the same function as the reference model."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from plelab.model import KVCache, LanguageModel, load_model_config
from plelab.model import fused_ops as K
from plelab.model.norm import RMSNorm, rms_norm
from plelab.model.transformer import FUSED_OPS, REFERENCE_OPS, apply_rope, rope_tables

# Model variants that exercise every kernel call site: Gemma-form PLE (context norm, input gate, output
# norm), GQA, an untied head, MGLU, and the simple form on a subset of layers.
VARIANTS = {
    "gemma_ple": [],
    "gqa_untied": ["num_kv_heads=2", "tie_embeddings=false", "embed_scale=true"],
    "mglu_simple_gate": ["ffn.kind=mglu", "ple.gate=vector", "ple.context=false", "ple.layers=[1]"],
}


def pair(overrides: list[str]) -> tuple[LanguageModel, LanguageModel]:
    """The same weights on the reference path and on the kernel path."""
    cfg = load_model_config("tiny", overrides)
    torch.manual_seed(0)
    ref = LanguageModel(dataclasses.replace(cfg, kernels="off"))
    fast = LanguageModel(dataclasses.replace(cfg, kernels="on"))
    fast.load_state_dict(ref.state_dict())
    assert ref.ops is REFERENCE_OPS and fast.ops is FUSED_OPS
    return ref, fast


def batch(vocab: int = 256, T: int = 24) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, vocab, (2, T), generator=torch.Generator().manual_seed(1))
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    return ids, targets


@pytest.mark.parametrize("variant", VARIANTS)
def test_loss_and_every_gradient_match_the_reference(variant: str) -> None:
    ref, fast = pair(VARIANTS[variant])
    ids, targets = batch()
    _, loss_ref = ref(ids, targets, return_logits=False)
    loss_ref.backward()
    none, loss = fast(ids, targets, return_logits=False)
    loss.backward()
    assert none is None
    torch.testing.assert_close(loss, loss_ref, rtol=1e-6, atol=1e-6)
    grads = dict(ref.named_parameters())
    for name, p in fast.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        # fp32, different summation orders (chunked head, hand-written backward): rounding only.
        torch.testing.assert_close(p.grad, grads[name].grad, rtol=1e-4, atol=1e-7, msg=name)


@pytest.mark.parametrize("variant", VARIANTS)
def test_logits_through_the_kv_cache_match_the_reference(variant: str) -> None:
    ref, fast = pair(VARIANTS[variant])
    ids, _ = batch(T=20)
    with torch.no_grad():
        full = ref(ids)[0]
        outs = []
        for model in (ref, fast):
            cache = KVCache.empty(model.config, 2, 20)
            steps = [model(ids[:, :7], cache=cache)[0]]
            steps.append(model.hidden_states(ids[:, 7:12], cache=cache)[:, -1:] @ model.output_weight().T)
            steps += [model(ids[:, t : t + 1], cache=cache)[0] for t in range(12, 20)]
            outs.append(torch.cat(steps, 1))
    torch.testing.assert_close(outs[1], outs[0], rtol=0, atol=1e-6)
    # With a cache, each call returns its last position's logits: positions 6, 11, 12, ..., 19.
    torch.testing.assert_close(outs[0], full[:, [6, *range(11, 20)]], rtol=0, atol=1e-5)


def test_the_choice_reaches_every_norm_and_attention() -> None:
    ref, fast = pair([])
    for model, ops in ((ref, REFERENCE_OPS), (fast, FUSED_OPS)):
        norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
        assert len(norms) == 2 * 2 + 1 + 1 + 2  # layer norms, final norm, PLE context norm, PLE output norms
        assert all(m.fn is ops.rms_norm for m in norms)
        assert all(layer.self_attn.rope is ops.rope for layer in model.layers)


def test_auto_means_on_for_the_cpu_only() -> None:
    assert K.fused_ops_enabled("auto", "cpu") and K.fused_ops_enabled("auto", torch.device("cpu"))
    assert not K.fused_ops_enabled("auto", "cuda") and not K.fused_ops_enabled("auto", "meta")
    assert K.fused_ops_enabled("on", "cuda") and not K.fused_ops_enabled("off", "cpu")
    cfg = load_model_config("tiny")
    assert cfg.kernels == "auto" and LanguageModel(cfg).ops is FUSED_OPS
    assert LanguageModel(cfg, device="meta").ops is REFERENCE_OPS
    with torch.device("meta"):  # a skeleton for loading, which will run on the CPU
        skeleton = LanguageModel(cfg, device="cpu")
    assert skeleton.ops is FUSED_OPS and skeleton.embed_tokens.weight.is_meta


class _WeightCats(TorchDispatchMode):
    """Counts concatenations that read a parameter (a weight copied on every call)."""

    def __init__(self, params: list[torch.Tensor]):
        super().__init__()
        self.ptrs = {p.data_ptr() for p in params}
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.cat.default:
            self.count += sum(t.data_ptr() in self.ptrs for t in args[0])
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kernels", ["off", "on"])
def test_forward_copies_no_weights(kernels: str) -> None:
    model = LanguageModel(load_model_config("tiny", [f"kernels={kernels}"]))
    ids, targets = batch()
    with _WeightCats(list(model.parameters())) as mode:
        model(ids, targets, return_logits=False)[1].backward()
    assert mode.count == 0


# ---------------------------------------------------------------------------------------- single fused ops


@pytest.mark.parametrize("chunk", [None, 7, 64])
@pytest.mark.parametrize("scale", [0.05, 4.0])  # 4.0 drives some target probabilities below fp32 range
def test_linear_cross_entropy_matches_plain(chunk: int | None, scale: float) -> None:
    torch.manual_seed(0)
    h0, w0 = torch.randn(50, 16), torch.randn(300, 16) * scale
    targets = torch.randint(0, 300, (50,))
    targets[::6] = -100
    h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    ref = F.cross_entropy(F.linear(h, w), targets, ignore_index=-100)
    (3 * ref).backward()
    h2, w2 = h0.clone().requires_grad_(), w0.clone().requires_grad_()
    got = K.linear_cross_entropy(h2, w2, targets, chunk=chunk)
    (3 * got).backward()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    # Chunked accumulation reorders the sums: agreement to fp32 rounding of the largest terms.
    torch.testing.assert_close(h2.grad, h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-5, atol=1e-6)


def test_linear_cross_entropy_all_ignored_is_zero() -> None:
    h = torch.randn(4, 8, requires_grad=True)
    loss = K.linear_cross_entropy(h, torch.randn(10, 8), torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().max().item() == 0.0


def test_rope_bit_identical_to_reference() -> None:
    cos, sin = rope_tables(16, 10, 10000.0)
    x = torch.randn(2, 3, 10, 16, requires_grad=True)
    ref = apply_rope(x, cos, sin)
    g = torch.randn_like(ref)
    (gx_ref,) = torch.autograd.grad(ref, x, g)
    out = K.rope(x, cos, sin)
    (gx,) = torch.autograd.grad(out, x, g)
    assert torch.equal(out, ref) and torch.equal(gx, gx_ref)
    with torch.no_grad():
        assert torch.equal(K.rope(x, cos, sin), ref)


def test_rmsnorm_matches_reference_and_functional() -> None:
    torch.manual_seed(0)
    w = torch.empty(32).uniform_(0.5, 1.5).requires_grad_()
    x = torch.randn(3, 5, 32, requires_grad=True)
    g = torch.randn(3, 5, 32)
    ref = rms_norm(x, w, 1e-6)
    assert torch.equal(ref, F.rms_norm(x, (32,), w, 1e-6))
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, w), g)
    out = K.rms_norm(x, w, 1e-6)
    gx, gw = torch.autograd.grad(out, (x, w), g)
    assert torch.equal(out, ref)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-6)
    xb = x.detach().bfloat16()
    assert K.rms_norm(xb, w, 1e-6).dtype == torch.bfloat16
    assert torch.equal(K.rms_norm(xb, w, 1e-6), rms_norm(xb, w, 1e-6))
