"""GEMMs with bf16 inputs and fp32 accumulation on any CPU: in hardware where it has bf16, else emulated.

A product of two bf16 numbers is exact in fp32 (8 + 8 significant bits < 24), so an fp32 GEMM of inputs
first rounded to bf16 (round-to-nearest-even) computes what a bf16 x bf16 -> fp32 GEMM computes, up to
the order of the fp32 sums. That makes one numeric definition possible on every machine:

- native: a CPU with AMX-BF16 or AVX512-BF16. Matmuls run on fp32 tensors under oneDNN's bf16 math mode
  (`torch.backends.mkldnn.matmul.fp32_precision = "bf16"`), which rounds the inputs to bf16 itself (the
  same round-to-nearest-even) and accumulates in fp32 on the bf16 units. The mode allows that rounding but
  does not promise it: torch sends GEMMs under 16^3 multiply-adds to its own fp32 BLAS, and oneDNN on an AMX
  CPU ran GEMMs with <= 8 rows or an inner dimension < 32 in fp32. So callers round every input themselves
  (rounding a bf16 value again changes nothing) and let native mode bring only the speed.
- emulated: any other CPU. The inputs are rounded explicitly and the GEMM runs in fp32: the same numbers,
  at fp32 speed. (torch's own bf16 GEMM on such a CPU runs ~100x slower than fp32: measured here.)

The two differ by summation order only (and by AMX flushing bf16 denormals, below 1e-38, to zero).
`bf16_gemms(native)` switches the mode on for the code it encloses; `active()` tells a kernel which
mode, if any, is on. Used by the fused head + cross-entropy (plelab.model.fused_ops) under the training
precision `bf16-head`.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch

_state = threading.local()


def active() -> str | None:
    """"native" or "emulated" inside `bf16_gemms`, else None."""
    return getattr(_state, "mode", None)


@contextlib.contextmanager
def bf16_gemms(native: bool = False) -> Iterator[str]:
    """Within: kernels that support it take bf16-rounded GEMM inputs with fp32 accumulation.

    native: the CPU computes bf16 in hardware (plelab's device probe says so); the mode is then "native"
    only if this torch build really rounds in oneDNN's bf16 math mode (`onednn_rounds_inputs`), else
    "emulated". Yields the mode.
    """
    mode = "native" if native and onednn_rounds_inputs() else "emulated"
    previous = active()
    _state.mode = mode
    try:
        yield mode
    finally:
        _state.mode = previous


def round_bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to the nearest bf16 value (ties to even), kept in x's dtype (a new tensor)."""
    return x.to(torch.bfloat16).to(x.dtype)


def round_bf16_(x: torch.Tensor) -> torch.Tensor:
    """`round_bf16` in place; returns x."""
    return x.copy_(x.to(torch.bfloat16))


@contextlib.contextmanager
def onednn_bf16_math() -> Iterator[None]:
    """fp32 matmuls inside run in oneDNN's bf16 math mode (inputs rounded to bf16, fp32 accumulation)."""
    matmul = torch.backends.mkldnn.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "bf16"
    try:
        yield
    finally:
        matmul.fp32_precision = previous


def linear_fp32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x @ weight.T for 2-D fp32 CPU tensors through oneDNN's fp32 inner product where this torch has it,
    else torch.mm. For the emulated mode: on an AVX2 AMD CPU the head's forward GEMM (K = H = 64) ran 1.7x
    faster there than in torch.mm's MKL (54 against 92 ms per step, under load). The choice is fixed per
    process (never timed), so a resumed run computes the same sums."""
    if onednn_linear_works():
        return torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
    return torch.mm(x, weight.t())


@functools.cache
def onednn_linear_works() -> bool:
    """Whether `linear_fp32` goes through oneDNN here (this torch has the op and it computes x @ weight.T)."""
    op = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if op is None or not torch.backends.mkldnn.is_available():
        return False
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(24, 40, generator=gen), torch.randn(72, 40, generator=gen)
    try:
        y = op(x, w, None, "none", [], "")
    except (RuntimeError, TypeError, ValueError):
        return False
    return y.shape == (24, 72) and y.dtype == torch.float32 and bool(torch.allclose(y, x @ w.t(), atol=1e-4))


@functools.cache
def onednn_rounds_inputs() -> bool:
    """Whether, in this process, fp32 matmuls in bf16 math mode round their inputs to bf16.

    Checked on the three call forms the head kernel makes (mm into a row slice through `out=`, mm with a
    transposed operand, addmm_ with a transposed operand), with an input whose bf16 rounding changes the
    result: 1 + 2^-12 is 1 in bf16. False where torch lacks the mode, has no oneDNN, or does not route these
    matmuls to it (a CPU without bf16 support).
    """
    n = 32
    a = torch.full((n, n), 1 + 2**-12)
    ones = torch.ones(n, n)
    try:
        with onednn_bf16_math():
            out = torch.empty(2 * n, n)
            torch.mm(a, ones.t(), out=out[n:])
            second = torch.mm(ones, a)
            third = torch.zeros(n, n).addmm_(a.t(), ones)
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return False
    return all(bool((r == n).all()) for r in (out[n:], second, third))
