"""The CPU speed paths compute the same function as the plain formulas they replace."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from plelab.model.loss import linear_cross_entropy
from plelab.model.norm import RMSNorm
from plelab.model.presets import load_model_config
from plelab.model.transformer import LanguageModel, apply_rope, rope_tables


def _reference_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return (x * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


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
    got = linear_cross_entropy(h2, w2, targets, chunk=chunk)
    (3 * got).backward()
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    # Chunked accumulation reorders the sums: agreement to fp32 rounding of the largest terms.
    torch.testing.assert_close(h2.grad, h.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(w2.grad, w.grad, rtol=1e-5, atol=1e-6)


def test_linear_cross_entropy_all_ignored_is_zero() -> None:
    h = torch.randn(4, 8, requires_grad=True)
    loss = linear_cross_entropy(h, torch.randn(10, 8), torch.full((4,), -100))
    loss.backward()
    assert loss.item() == 0.0 and h.grad.abs().max().item() == 0.0


def test_model_fast_loss_path_equals_plain_path() -> None:
    torch.manual_seed(0)
    cfg = load_model_config("tiny")
    model = LanguageModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 24))
    targets = torch.cat([ids[:, 1:], torch.full((2, 1), -100)], dim=1)
    logits, loss = model(ids, targets)
    loss.backward()
    plain = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    none, fast = model(ids, targets, return_logits=False)
    fast.backward()
    assert none is None and logits.shape == (2, 24, cfg.vocab_size)
    torch.testing.assert_close(fast, loss, rtol=1e-6, atol=1e-6)
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, plain[name], rtol=1e-4, atol=1e-7, msg=name)


def test_rope_bit_identical_to_reference_formula() -> None:
    cos, sin = rope_tables(16, 10, 10000.0)
    x = torch.randn(2, 3, 10, 16, requires_grad=True)
    ref = _reference_rope(x, cos, sin)
    g = torch.randn_like(ref)
    (gx_ref,) = torch.autograd.grad(ref, x, g)
    out = apply_rope(x, cos, sin)
    (gx,) = torch.autograd.grad(out, x, g)
    assert torch.equal(out, ref) and torch.equal(gx, gx_ref)
    with torch.no_grad():
        assert torch.equal(apply_rope(x, cos, sin), ref)


def test_rmsnorm_matches_functional() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 5, 32, requires_grad=True)
    g = torch.randn(3, 5, 32)
    ref = F.rms_norm(x, (32,), norm.weight, 1e-6)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, norm.weight), g)
    out = norm(x)
    gx, gw = torch.autograd.grad(out, (x, norm.weight), g)
    assert torch.equal(out, ref)
    torch.testing.assert_close(gx, gx_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-5, atol=1e-6)
    xb = x.detach().bfloat16()
    assert norm(xb).dtype == torch.bfloat16
