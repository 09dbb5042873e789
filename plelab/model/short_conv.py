"""Engram's short convolution over a PLE layer's output: y + SiLU(depthwise causal conv(RMSNorm(y))).

Each of the H channels has its own `kernel` taps, `dilation` positions apart, over the current position and the
ones before it (zeros before the sequence starts). Its taps start at zero, so a new model's PLE output is the
plain one and the convolution grows in as it trains. In a KV-cached decode the normed inputs of the positions
still in reach are kept in the cache (`KVCache.ple_conv`), so token-by-token decoding gives the full forward's
values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.norm import NormFn, RMSNorm, rms_norm

if TYPE_CHECKING:
    from plelab.model.kv_cache import KVCache


class ShortConv(nn.Module):
    """The convolution branch of one PLE layer; forward returns SiLU(conv(RMSNorm(y))) (the caller adds y)."""

    def __init__(self, hidden: int, kernel: int, dilation: int, eps: float, norm_fn: NormFn = rms_norm):
        super().__init__()
        self.kernel, self.dilation = kernel, dilation
        self.span = (kernel - 1) * dilation
        """Positions before the current one the taps reach."""
        self.norm = RMSNorm(hidden, eps, fn=norm_fn)
        self.weight = nn.Parameter(torch.empty(hidden, 1, kernel))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Taps at zero (the branch starts silent), the norm at one."""
        nn.init.zeros_(self.weight)
        self.norm.reset_parameters()

    def forward(self, y: torch.Tensor, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        z = self.norm(y)
        T = y.shape[1]
        if cache is not None:
            past = cache.ple_conv[layer]
            pos = cache.pos
            past[:, pos : pos + T] = z
            start = max(0, pos - self.span)
            z, left = past[:, start : pos + T], self.span - (pos - start)
        else:
            left = self.span
        z = F.pad(z.transpose(1, 2), (left, 0))
        out = F.conv1d(z, self.weight.to(z.dtype), groups=self.weight.shape[0], dilation=self.dilation)
        return F.silu(out[..., -T:].transpose(1, 2))
