"""The head kernel's softmax cross-entropy step: C and torch implementations against an fp64 reference."""

from __future__ import annotations

import time

import pytest
import torch

from plelab.model import softmax_xent as S
from plelab.model.bf16_gemm import round_bf16

IMPLS = [pytest.param(False, id="torch"),
         pytest.param(True, id="c", marks=pytest.mark.skipif(S.backend() != "c", reason="no C compiler here"))]


def reference(logits: torch.Tensor, targets: torch.Tensor, ignore: int = -100) -> tuple[torch.Tensor, torch.Tensor]:
    """(per-row loss, softmax - onehot) in fp64; zeros on ignored rows."""
    x = logits.double()
    valid = targets != ignore
    safe = torch.where(valid, targets, 0)
    logp = torch.log_softmax(x, -1)
    nll = torch.where(valid, -logp.gather(1, safe[:, None]).squeeze(1), 0.0)
    g = logp.exp()
    g[torch.arange(len(g)), safe] -= 1
    g[~valid] = 0
    return nll, g


@pytest.mark.parametrize("use_c", IMPLS)
@pytest.mark.parametrize("vocab", [8192, 1001, 3])  # 1001 and 3: rows that are not a multiple of the vector width
def test_loss_and_gradient_match_fp64(use_c: bool, vocab: int) -> None:
    gen = torch.Generator().manual_seed(vocab)
    x = torch.randn(37, vocab, generator=gen) * 4
    t = torch.randint(0, vocab, (37,), generator=gen)
    t[5], t[6] = -100, vocab - 1  # an ignored row; a target in the last (tail) column
    nll_ref, g_ref = reference(x, t)
    nll, g = S.softmax_xent(x.clone(), t, use_c=use_c)
    torch.testing.assert_close(nll.double(), nll_ref, rtol=2e-6, atol=2e-6)
    # p_t - 1 cancels: an absolute error of a few fp32 ulps of 1 at the target column.
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6)
    assert nll[5] == 0 and (g[5] == 0).all()


@pytest.mark.parametrize("use_c", IMPLS)
def test_rounded_gradient_is_the_bf16_rounding_of_the_exact_one(use_c: bool) -> None:
    gen = torch.Generator().manual_seed(0)
    x, t = torch.randn(16, 500, generator=gen) * 3, torch.randint(0, 500, (16,), generator=gen)
    _, exact = S.softmax_xent(x.clone(), t, use_c=use_c)
    _, rounded = S.softmax_xent(x.clone(), t, round_bf16=True, use_c=use_c)
    assert torch.equal(rounded, round_bf16(rounded))  # every value is a bf16 value
    # Rounding the exact gradient gives the same values, but where the fp32 result sits on a rounding boundary.
    assert (rounded != round_bf16(exact)).float().mean() < 1e-3
    torch.testing.assert_close(rounded, exact, rtol=2**-8, atol=1e-30)


@pytest.mark.skipif(S.backend() != "c", reason="no C compiler here")
def test_c_and_torch_agree_and_threads_change_nothing() -> None:
    gen = torch.Generator().manual_seed(1)
    x, t = torch.randn(200, 4096, generator=gen) * 5, torch.randint(0, 4096, (200,), generator=gen)
    t[::7] = -100
    outs = {}
    threads = torch.get_num_threads()
    try:
        for n in (1, 3):
            torch.set_num_threads(n)
            outs[n] = S.softmax_xent(x.clone(), t, round_bf16=True, use_c=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[1][0], outs[3][0]) and torch.equal(outs[1][1], outs[3][1])
    nll, g = S.softmax_xent(x.clone(), t, round_bf16=True, use_c=False)
    torch.testing.assert_close(outs[1][0], nll, rtol=1e-5, atol=1e-5)
    # Rounded values differ only where the two fp32 results straddle a bf16 rounding boundary: by one bf16 ulp.
    assert (outs[1][1] != g).float().mean() < 1e-3
    torch.testing.assert_close(outs[1][1], g, rtol=2**-7, atol=1e-9)


@pytest.mark.parametrize("use_c", IMPLS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_non_finite_logit_gives_a_non_finite_loss(use_c: bool, bad: float) -> None:
    x = torch.randn(3, 100)
    x[1, 40] = bad
    nll, g = S.softmax_xent(x.clone(), torch.tensor([2, 3, 4]), use_c=use_c)
    assert torch.isfinite(nll[[0, 2]]).all() and not torch.isfinite(nll[1])
    assert torch.isfinite(g[[0, 2]]).all() and not torch.isfinite(g[1]).all()


@pytest.mark.parametrize("use_c", IMPLS)
def test_a_target_outside_the_vocabulary_is_refused(use_c: bool) -> None:
    with pytest.raises(ValueError, match="target 10 is outside the vocabulary"):
        S.softmax_xent(torch.randn(2, 10), torch.tensor([1, 10]), use_c=use_c)
    with pytest.raises(ValueError, match="float32"):
        S.softmax_xent(torch.randn(2, 10, dtype=torch.float64), torch.tensor([1, 2]), use_c=use_c)


def test_without_a_compiler_the_torch_path_is_used(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PLELAB_NO_C_KERNELS", "1")
    S._library.cache_clear()
    try:
        assert S.backend() == "torch"
        with pytest.raises(RuntimeError, match="not available"):
            S.softmax_xent(torch.randn(2, 10), torch.tensor([1, 2]), use_c=True)
        x = torch.randn(2, 10)
        nll_ref, g_ref = reference(x, torch.tensor([1, 2]))
        nll, g = S.softmax_xent(x.clone(), torch.tensor([1, 2]))
        torch.testing.assert_close(nll.double(), nll_ref)
        torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-6)
    finally:
        monkeypatch.delenv("PLELAB_NO_C_KERNELS")
        S._library.cache_clear()


@pytest.mark.skipif(S.backend() != "c" or not hasattr(__import__("os"), "fork"), reason="needs the C kernel and fork")
def test_a_forked_child_gets_working_threads() -> None:
    import os

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        S.softmax_xent(torch.randn(64, 50), torch.zeros(64, dtype=torch.int64))  # the parent's pool exists
        pid = os.fork()
        if pid == 0:  # child: the parent's pool has no threads here, so using it would hang
            ok = torch.isfinite(S.softmax_xent(torch.randn(64, 50), torch.zeros(64, dtype=torch.int64))[0]).all()
            os._exit(0 if ok else 1)
        deadline = time.monotonic() + 60
        while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        if done[0] == 0:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung in the softmax kernel's thread pool")
        assert os.waitstatus_to_exitcode(done[1]) == 0
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("use_c", IMPLS)
def test_target_probabilities_below_fp32_range_keep_an_exact_loss(use_c: bool) -> None:
    gen = torch.Generator().manual_seed(2)
    x, t = torch.randn(8, 300, generator=gen) * 40, torch.randint(0, 300, (8,), generator=gen)
    nll_ref, _ = reference(x, t)
    assert nll_ref.max() > 69  # p_target < 1e-30 somewhere: -log(p) from an underflowed p would be wrong
    nll, _ = S.softmax_xent(x.clone(), t, use_c=use_c)
    torch.testing.assert_close(nll.double(), nll_ref, rtol=1e-6, atol=1e-4)
