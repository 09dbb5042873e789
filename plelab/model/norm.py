"""RMSNorm computed in fp32, `x * rsqrt(mean(x^2) + eps) * w` (plain w, not Gemma's 1 + w)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dimension; statistics always in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Low-precision activations lose the small mean-square; fp32 keeps it (as HF Gemma does).
        return F.rms_norm(x.float(), (x.shape[-1],), self.weight.float(), self.eps).type_as(x)
