"""RMSNorm computed in fp32, `x * rsqrt(mean(x^2) + eps) * w` (plain w, not Gemma's 1 + w)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

NormFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The reference formula over the last dimension, in fp32, cast back to x's dtype."""
    # Low-precision activations lose the small mean-square; fp32 keeps it (as HF Llama / Gemma do).
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension with a learned weight (initialised to `init`)."""

    def __init__(self, dim: int, eps: float = 1e-6, init: float = 1.0, fn: NormFn = rms_norm):
        super().__init__()
        self.eps, self.init, self.fn = eps, init, fn
        self.weight = nn.Parameter(torch.empty(dim))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Every weight at `init` (1 = identity scale; 0 silences whatever the norm feeds)."""
        nn.init.constant_(self.weight, self.init)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.weight, self.eps)
