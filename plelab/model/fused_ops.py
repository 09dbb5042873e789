"""Fused ops: the same functions as the reference model, with hand-written backward passes (CPU speed paths).

Switched on by `ModelConfig.kernels` ("auto" = on for a model built for the CPU, the only device they
were measured on: `benchmarks/bench_train_step.py`). Each replaces one reference formula and is tested
against it (tests/model/test_fused_ops.py). The config field keeps its name, `kernels`
(run configs record it):

- `rms_norm`: plelab.model.norm.rms_norm. On CPU, the composite's autograd graph makes ~10 extra passes
  over the activations; this saves only x and 1/rms and does 3 forward and ~7 backward passes.
- `rope`: plelab.model.transformer.apply_rope. The gradient of a rotation is the inverse rotation, so
  backward is one more rotation instead of the chunk/neg/cat graph (about half the passes over q and k).
- `linear_cross_entropy`: F.cross_entropy(h @ W.T, targets). The plain path materialises (N, V) logits,
  log_softmax another (N, V), its backward a third (plus a zero-filled one). Here each chunk of rows
  goes head GEMM -> softmax (in place into p - onehot) -> the two gradient GEMMs while its (chunk, V)
  block is still in cache, and the gradients are produced during the forward pass (the Liger-kernel /
  cut-cross-entropy idea), so backward only scales them. No logits are returned. Inside
  `plelab.model.bf16_gemm.bf16_gemms` (training dtype bf16-head) its three GEMMs take bf16-rounded inputs with
  fp32 accumulation, and the softmax step is plelab.model.softmax_xent (one vectorised C pass per row).
"""

from __future__ import annotations

import contextlib

import torch
from torch.autograd.function import once_differentiable

from plelab.model import bf16_gemm
from plelab.model.config import KernelsSetting
from plelab.model.softmax_xent import softmax_xent


def fused_ops_enabled(setting: KernelsSetting, device: torch.device | str | None = None) -> bool:
    """Whether a model built for `device` (None = torch's default device) uses the fused ops."""
    if setting != "auto":
        return setting == "on"
    return torch.device(device if device is not None else torch.get_default_device()).type == "cpu"


class _RMSNorm(torch.autograd.Function):
    """RMSNorm whose forward is bit-identical to the reference in fp32; gradients agree to rounding."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf, wf = x.float(), weight.float()
        rstd = torch.rsqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (xf * rstd * wf).to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, weight, rstd = ctx.saved_tensors
        xf, wf, g = x.float(), weight.float(), grad.float()
        xhat = xf * rstd
        grad_w = None
        if ctx.needs_input_grad[1]:
            grad_w = (g * xhat).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            gw = g * wf
            # d/dx of x*rstd: rstd * (gw - xhat * mean(gw * xhat)).
            dot = torch.mean(gw * xhat, dim=-1, keepdim=True)
            grad_x = torch.addcmul(gw, xhat, dot, value=-1).mul_(rstd).to(x.dtype)
        return grad_x, grad_w, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`x * rsqrt(mean(x^2) + eps) * w` in fp32 with a hand-written backward."""
    return _RMSNorm.apply(x, weight, eps)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    # x*cos + cat(-x2, x1)*sin without materialising the rotated copy (sign=-1: the transpose).
    # Products are rounded before the add (no addcmul/FMA) so results are bit-identical to the
    # reference formula.
    half = x.shape[-1] // 2
    out = x * cos  # in the promoted dtype (fp32 tables): cast once at the end, as the reference does
    x1, x2 = x[..., :half], x[..., half:]
    lo, hi = out[..., :half], out[..., half:]
    if sign > 0:
        lo.sub_(x2 * sin[..., :half])
        hi.add_(x1 * sin[..., half:])
    else:
        lo.add_(x2 * sin[..., :half])
        hi.sub_(x1 * sin[..., half:])
    return out.to(x.dtype)


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rotate(grad, cos, sin, sign=-1.0), None, None


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (..., T, D) by position, bit-identical to the reference; backward is the inverse rotation."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _RoPE.apply(x, cos, sin)
    return _rotate(x, cos, sin)


# Below this a target probability's log loses precision (fp32 normal range ends near 1e-38).
_TINY = 1e-30


def _chunk_rows(vocab: int, rows: int) -> int:
    # About 16 MB of fp32 logits per chunk (512 rows at V = 8192), never fewer than 256 rows: the
    # weight-gradient GEMM accumulates a full (V, H) block per chunk, so thin chunks cost memory
    # traffic, and the (rows, V) head GEMM runs slowest when its output block is very small or huge.
    return min(rows, max(256, (1 << 22) // max(vocab, 1)))


def _bf16_chunk_rows(vocab: int, rows: int) -> int:
    # ~8 MB of fp32 logits per chunk (256 rows at V = 8192), at most 256 rows and never fewer than 16: under
    # load here (AVX2, 512 KB L2) 128-256 rows ran the H = 64-128 heads fastest, 32 rows 1.3-1.6x slower
    # (the weight-gradient GEMM then has too short an inner dimension).
    return min(rows, max(16, min(256, (1 << 21) // max(vocab, 1))))


def _bf16_chunks(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, chunk: int,
                 mode: str, grad_h: torch.Tensor | None, grad_w: torch.Tensor | None) -> torch.Tensor:
    """The chunk loop with bf16 GEMM inputs (mode "native" or "emulated", plelab.model.bf16_gemm) and fp32
    accumulation: returns the summed loss, fills grad_h and accumulates grad_w (both unscaled)."""
    h, weight = bf16_gemm.round_bf16(h), bf16_gemm.round_bf16(weight)
    loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
    # Emulated, with oneDNN's fp32 inner product: grad_w^T = h^T g chunk by chunk (12-19 % faster than
    # addmm_ into grad_w at H = 64-128 here), transposed once at the end.
    grad_w_t = None
    if grad_w is not None and mode == "emulated" and bf16_gemm.onednn_linear_works():
        grad_w_t = torch.zeros(weight.shape[1], weight.shape[0], dtype=torch.float32, device=h.device)
    with bf16_gemm.onednn_bf16_math() if mode == "native" else contextlib.nullcontext():
        for start in range(0, h.shape[0], chunk):
            hc = h[start : start + chunk]
            g = torch.mm(hc, weight.t()) if mode == "native" else bf16_gemm.linear_fp32(hc, weight)
            # The logit gradient is rounded to bf16 here in both modes (loss and gradient in one vectorised
            # pass per row): oneDNN's bf16 math mode allows rounding but does not promise it. On an AMX CPU
            # it left grad_h's GEMM unrounded for chunks of <= 8 rows and grad_w's for < 32 (its inner
            # dimension): 1.7e-3 off the definition, as far as the fp32 head is.
            # With every GEMM input already bf16, whichever kernel oneDNN picks differs by summation order only.
            nll, g = softmax_xent(g, targets[start : start + chunk], ignore_index, round_bf16=True)
            loss_sum += nll.sum()
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[start : start + chunk])
            if grad_w_t is not None:
                grad_w_t.add_(bf16_gemm.linear_fp32(hc.t().contiguous(), g.t()))
            elif grad_w is not None:
                grad_w.addmm_(g.t(), hc)
    if grad_w_t is not None:
        grad_w.copy_(grad_w_t.t())
    return loss_sum


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int, chunk: int,
                bf16: str | None = None):
        n_valid = (targets != ignore_index).sum()
        denom = n_valid.clamp(min=1).to(torch.promote_types(h.dtype, torch.float32))
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(h) if need_h else None
        # Softmax and accumulations in at least fp32 (fp64 stays fp64).
        acc = torch.promote_types(h.dtype, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        loss_sum = torch.zeros((), dtype=acc, device=h.device)
        if bf16 is not None:  # fp32 h and weight; the loop below then runs over no chunk
            loss_sum += _bf16_chunks(h, weight, targets, ignore_index, chunk, bf16, grad_h, grad_w)
        for start in range(0, h.shape[0] if bf16 is None else 0, chunk):
            hc, tc = h[start : start + chunk], targets[start : start + chunk]
            valid = tc != ignore_index
            safe_t = torch.where(valid, tc, torch.zeros_like(tc)).unsqueeze(1)
            # softmax, then loss = -log p[target]: one fewer pass over (chunk, V) than log_softmax + exp.
            p = torch.softmax(torch.mm(hc, weight.t()).to(acc), dim=-1)
            p_t = p.gather(1, safe_t).squeeze(1)
            if bool(((p_t < _TINY) & valid).any()):
                # A target probability that (nearly) underflows: take the exact log-softmax for this chunk.
                nll = -torch.log_softmax(torch.mm(hc, weight.t()).to(acc), dim=-1).gather(1, safe_t).squeeze(1)
            else:
                nll = -torch.log(p_t)
            loss_sum += torch.where(valid, nll, torch.zeros_like(nll)).sum()
            if grad_h is None and grad_w is None:
                continue
            # d(loss_sum)/d(logits) = softmax - onehot on valid rows, 0 on ignored ones (in place).
            g = p
            g.scatter_add_(1, safe_t, -valid.to(g.dtype).unsqueeze(1))
            ignored = (~valid).nonzero().squeeze(1)
            if ignored.numel():
                g.index_fill_(0, ignored, 0.0)
            g = g.to(h.dtype)
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[start : start + chunk])
            if grad_w is not None:
                if g.dtype == acc:
                    grad_w.addmm_(g.t(), hc)
                else:  # low-precision GEMM, fp32 accumulation across chunks
                    grad_w.add_(torch.mm(g.t(), hc))
        # The 1/N of the mean is applied once to the (small) gradients, not to every logit.
        inv = 1.0 / denom
        if grad_h is not None:
            grad_h.mul_(inv.to(grad_h.dtype))
        if grad_w is not None:
            grad_w = grad_w.mul_(inv).to(weight.dtype)
        ctx.save_for_backward(grad_h, grad_w)
        return loss_sum / denom

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        grad_h, grad_w = ctx.saved_tensors
        gh = grad_h * grad_out.to(grad_h.dtype) if grad_h is not None else None
        gw = grad_w * grad_out.to(grad_w.dtype) if grad_w is not None else None
        return gh, gw, None, None, None, None


def linear_cross_entropy(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100, chunk: int | None = None
) -> torch.Tensor:
    """Mean cross-entropy of `h @ weight.T` against `targets`, in row chunks, without storing logits.

    h: (N, H) or (..., H); weight: (V, H); targets: matching (N,) or (...), `ignore_index` entries skipped.
    All targets ignored gives 0 (not NaN). Under autocast the head GEMMs run in the autocast dtype, as
    F.linear would; the softmax is always fp32. Inside `plelab.model.bf16_gemm.bf16_gemms` (fp32 h and
    weight, no autocast) the three GEMMs take bf16-rounded inputs (h, weight and the logit gradients) and
    accumulate in fp32; softmax, loss and the gradients returned stay fp32.
    """
    h2 = h.reshape(-1, h.shape[-1])
    t = targets.reshape(-1)
    if t.shape[0] != h2.shape[0]:
        raise ValueError(f"targets have {t.shape[0]} entries for {h2.shape[0]} rows of hidden states")
    dev = h2.device.type
    bf16 = bf16_gemm.active() if h2.dtype == weight.dtype == torch.float32 and dev == "cpu" else None
    if bf16 is not None and not torch.is_autocast_enabled(dev):
        rows = chunk if chunk is not None else _bf16_chunk_rows(weight.shape[0], h2.shape[0])
        return _LinearCrossEntropy.apply(h2, weight, t, ignore_index, rows, bf16)
    rows = chunk if chunk is not None else _chunk_rows(weight.shape[0], h2.shape[0])
    if torch.is_autocast_enabled(dev):
        # A custom Function sees autocast too, and `out=` GEMMs cannot follow it: cast once, outside.
        dt = torch.get_autocast_dtype(dev)
        with torch.autocast(dev, enabled=False):
            return _LinearCrossEntropy.apply(h2.to(dt), weight.to(dt), t, ignore_index, rows)
    return _LinearCrossEntropy.apply(h2, weight, t, ignore_index, rows)
