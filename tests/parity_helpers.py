"""Randomising a model before a parity test: at init HF's norms are ones and several PLE parts exactly zero,
so a comparison of freshly built models proves little."""

from __future__ import annotations

import math

import torch


def randomise_(module: torch.nn.Module, seed: int, layer_scalars: bool = True) -> None:
    """1-D weights (norms, AltUp's zero-init scale) ~ U(0.5, 1.5), matrices ~ N(0, 1/fan_in), and with
    `layer_scalars` Gemma 4's layer_scalar buffers (ones at init, learned in real checkpoints) ~ U(0.5, 1.5)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(p.shape[-1]))
        if layer_scalars:
            for name, b in module.named_buffers():
                if name.endswith("layer_scalar"):
                    b.copy_(torch.rand(b.shape, generator=g) + 0.5)
