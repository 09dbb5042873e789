"""bf16 GEMM inputs with fp32 accumulation (plelab/model/bf16_gemm.py) and the head kernel under them.

The fast path's parity tests: the bf16 head computes its own definition exactly (to fp32 summation order), and
a tiny model's loss and gradients stay within bf16 tolerance of the fp32 reference, with kernels on and off.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest
import torch
import torch.nn.functional as F

from plelab.model import LanguageModel, load_model_config
from plelab.model import bf16_gemm as B
from plelab.model import fused_ops as K
from plelab.model import softmax_xent as S
from plelab.util.device import cpu_bf16_features

NATIVE = bool(cpu_bf16_features()) and B.onednn_rounds_inputs()


def test_round_bf16_is_round_to_nearest_even() -> None:
    one_ulp = 2.0**-7  # bf16 keeps 8 significant bits: the spacing just above 1
    x = torch.tensor([1.0, 1 + one_ulp / 2, 1 + 3 * one_ulp / 2, 1 + one_ulp / 2 + 2**-20, -3.0, 0.0, 1e-3])
    got = B.round_bf16(x)
    assert got.dtype == torch.float32
    # ties go to the even neighbour: 1 + ulp/2 -> 1, 1 + 3ulp/2 -> 1 + 2ulp; just above a tie rounds up
    assert got[:5].tolist() == [1.0, 1.0, 1 + 2 * one_ulp, 1 + one_ulp, -3.0]
    assert got[5] == 0 and torch.equal(B.round_bf16(got), got)
    y = x.clone()
    assert B.round_bf16_(y) is y and torch.equal(y, got)


def test_the_mode_is_scoped_restored_and_per_thread() -> None:
    assert B.active() is None
    with B.bf16_gemms(native=False) as mode:
        assert mode == B.active() == "emulated"
        seen = []
        worker = threading.Thread(target=lambda: seen.append(B.active()))
        worker.start()
        worker.join()
        assert seen == [None]  # another thread's kernels are not switched
        with B.bf16_gemms(native=True) as inner:
            assert inner == ("native" if B.onednn_rounds_inputs() else "emulated")
        assert B.active() == "emulated"
    assert B.active() is None
    before = torch.backends.mkldnn.matmul.fp32_precision
    with B.onednn_bf16_math():
        assert torch.backends.mkldnn.matmul.fp32_precision == "bf16"
    assert torch.backends.mkldnn.matmul.fp32_precision == before


def test_native_mode_needs_the_probe_to_pass() -> None:
    # Where oneDNN would not round (no bf16 support), "native" would silently compute fp32: it falls back.
    with B.bf16_gemms(native=True) as mode:
        assert mode == ("native" if B.onednn_rounds_inputs() else "emulated")


def exact_bf16_head(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor):
    """The bf16 head's definition in fp64: loss, and the gradients of h and w from the bf16-rounded gradient."""
    hr, wr = B.round_bf16(h).double(), B.round_bf16(w).double()
    logits = hr @ wr.T
    valid = t != -100
    loss = F.cross_entropy(logits, t, ignore_index=-100)
    g = torch.softmax(logits, -1)
    g[valid, t[valid]] -= 1
    g[~valid] = 0
    g = B.round_bf16(g.float()).double()
    n = valid.sum()
    return loss, g @ wr / n, g.T @ hr / n


@pytest.mark.parametrize("chunk", [None, 7, 64])
@pytest.mark.parametrize("native", [False, pytest.param(True, marks=pytest.mark.skipif(
    not NATIVE, reason="no bf16 GEMM units here (AMX / AVX512-BF16 with oneDNN)"))])
def test_bf16_head_computes_its_definition(chunk: int | None, native: bool) -> None:
    torch.manual_seed(0)
    h = torch.randn(300, 32, requires_grad=True)
    w = (torch.randn(500, 32) * 0.3).requires_grad_()
    t = torch.randint(0, 500, (300,))
    t[::7] = -100
    with B.bf16_gemms(native=native):
        loss = K.linear_cross_entropy(h, w, t, chunk=chunk)
    (2 * loss).backward()
    ref_loss, ref_gh, ref_gw = exact_bf16_head(h.detach(), w.detach(), t)
    # fp32 sums in another order (and oneDNN's bf16 GEMMs on the native path): fp32 rounding, plus a logit
    # gradient here and there rounded to the other bf16 neighbour where fp32 and fp64 straddle a boundary.
    # (The fp32 head is ~1000x farther from this definition in gradient norm: 2e-3 against 2e-6 relative.)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-6)
    for got, want in ((h.grad.double(), 2 * ref_gh), (w.grad.double(), 2 * ref_gw)):
        torch.testing.assert_close(got, want, rtol=1e-3, atol=5e-7)
        assert (got - want).norm() < 1e-4 * want.norm()


def test_bf16_head_is_within_bf16_tolerance_of_fp32_and_not_equal_to_it() -> None:
    torch.manual_seed(1)
    h0, w0, t = torch.randn(200, 64), torch.randn(1000, 64) * 0.1, torch.randint(0, 1000, (200,))
    grads = {}
    for mode in ("fp32", "bf16"):
        h, w = h0.clone().requires_grad_(), w0.clone().requires_grad_()
        with B.bf16_gemms() if mode == "bf16" else torch.autograd.grad_mode.enable_grad():
            loss = K.linear_cross_entropy(h, w, t)
        loss.backward()
        grads[mode] = (loss.detach(), h.grad, w.grad)
    (l32, gh32, gw32), (l16, gh16, gw16) = grads["fp32"], grads["bf16"]
    assert l16 != l32  # the switch changes the numbers
    torch.testing.assert_close(l16, l32, rtol=2e-3, atol=0)
    for got, want in ((gh16, gh32), (gw16, gw32)):
        assert (got - want).norm() / want.norm() < 1e-2


def test_outside_the_mode_or_off_fp32_the_head_is_unchanged() -> None:
    torch.manual_seed(2)
    h, w, t = torch.randn(40, 16), torch.randn(100, 16), torch.randint(0, 100, (40,))
    plain = K.linear_cross_entropy(h, w, t)
    with B.bf16_gemms():
        fp64 = K.linear_cross_entropy(h.double(), w.double(), t)  # not fp32: no bf16 rounding
    assert torch.equal(K.linear_cross_entropy(h, w, t), plain)
    torch.testing.assert_close(fp64, plain.double(), rtol=1e-6, atol=1e-6)


def model_pair(kernels: str, overrides: list[str]) -> tuple[LanguageModel, LanguageModel]:
    cfg = dataclasses.replace(load_model_config("tiny", overrides), kernels=kernels)
    torch.manual_seed(0)
    ref, fast = LanguageModel(cfg), LanguageModel(cfg)
    fast.load_state_dict(ref.state_dict())
    return ref, fast


@pytest.mark.parametrize("kernels", ["on", "off"])
@pytest.mark.parametrize("overrides", [[], ["tie_embeddings=false", "ple.gate=scalar", "ple.context=false"]])
def test_tiny_model_loss_and_every_gradient_within_bf16_tolerance(kernels: str, overrides: list[str]) -> None:
    ref, fast = model_pair(kernels, overrides)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 256, (4, 24), generator=gen)
    targets = torch.cat([ids[:, 1:], torch.full((4, 1), -100)], dim=1)
    _, loss_ref = ref(ids, targets, return_logits=False)
    loss_ref.backward()
    with B.bf16_gemms():
        _, loss = fast(ids, targets, return_logits=False)
    loss.backward()
    assert loss != loss_ref
    torch.testing.assert_close(loss, loss_ref, rtol=2e-3, atol=0)
    grads = dict(ref.named_parameters())
    for name, p in fast.named_parameters():
        want = grads[name].grad
        assert p.grad is not None and p.grad.dtype == torch.float32, name
        # bf16 inputs (8 significant bits) to the head's GEMMs: ~0.4 % relative error per term, averaged down.
        assert (p.grad.to_dense() - want.to_dense()).norm() <= 2e-2 * want.to_dense().norm() + 1e-9, name


@pytest.mark.skipif(S.backend() != "c", reason="no C compiler here")
def test_the_c_and_torch_softmax_give_the_same_head(monkeypatch) -> None:
    torch.manual_seed(4)
    h, w, t = torch.randn(100, 32), torch.randn(700, 32) * 0.2, torch.randint(0, 700, (100,))
    out = {}
    for use_c in (True, False):
        monkeypatch.setattr(K, "softmax_xent", lambda *a, use_c=use_c, **k: S.softmax_xent(*a, use_c=use_c, **k))
        hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
        with B.bf16_gemms():
            loss = K.linear_cross_entropy(hh, ww, t)
        loss.backward()
        out[use_c] = (loss, hh.grad, ww.grad)
    for a, b in zip(out[True], out[False], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_the_native_branch_runs_on_any_cpu() -> None:
    # Without bf16 units oneDNN leaves the logit gradient unrounded, so this is not the definition here (the
    # test above checks that where the units exist); it runs the branch's code and stays within bf16 tolerance.
    torch.manual_seed(5)
    h = torch.randn(90, 32, requires_grad=True)
    w = (torch.randn(300, 32) * 0.3).requires_grad_()
    t = torch.randint(0, 300, (90,))
    loss = K._LinearCrossEntropy.apply(h, w, t, -100, 32, "native")
    loss.backward()
    ref_loss, ref_gh, ref_gw = exact_bf16_head(h.detach(), w.detach(), t)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-6)
    assert (h.grad.double() - ref_gh).norm() < 1e-2 * ref_gh.norm()
    assert (w.grad.double() - ref_gw).norm() < 1e-2 * ref_gw.norm()
    assert torch.backends.mkldnn.matmul.fp32_precision != "bf16"  # the math mode was switched back off
