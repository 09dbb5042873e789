"""Gate statistics of a PLE injection: how open the gate that multiplies each layer's PLE vector is."""

from __future__ import annotations

import torch
from torch import nn

GATE_NEAR_ZERO = 1e-2
"""|g| below this counts as a closed gate element (the gate multiplies a PLE vector of RMS ~1)."""


class GateAccumulator:
    """Pools mean |g| and the near-zero fraction of one layer's gate over many forward passes."""

    def __init__(self, near_zero: float = GATE_NEAR_ZERO):
        self.near_zero = near_zero
        self.abs_sum = 0.0
        self.closed = 0
        self.count = 0

    @torch.no_grad()
    def add(self, injection: nn.Module, h: torch.Tensor, ple_input: torch.Tensor | None = None) -> None:
        """Record the gate values the injection module computes for hidden states `h` (and the layer's PLE vector
        `ple_input`, which a gate that reads it, Engram's, needs)."""
        g = (injection.gate_values(h) if ple_input is None else injection.gate_values(h, ple_input)).float()
        if g.dim() <= 1:
            # A learned scalar / vector gate is the same for every token: weight it by the token count.
            g = g.expand(*h.shape[:-1], g.shape[-1])
        self.abs_sum += g.abs().sum().item()
        self.closed += int((g.abs() < self.near_zero).sum().item())
        self.count += g.numel()

    def result(self) -> dict[str, float]:
        """{'gate_mean_abs', 'gate_near_zero_frac'} (NaN before any data)."""
        if not self.count:
            return {"gate_mean_abs": float("nan"), "gate_near_zero_frac": float("nan")}
        return {"gate_mean_abs": self.abs_sum / self.count, "gate_near_zero_frac": self.closed / self.count}
