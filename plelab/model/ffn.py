"""Feed-forward variants behind one interface: `build_ffn(config) -> nn.Module` mapping H -> H.

- SwiGLU: down(silu(gate(x)) * up(x)).
- MGLU (Tajima et al. 2025): gate and up share one matrix W, told apart by learned 1-bit masks:
  sum_i silu((W*m_i) x) * ((W*(1-m_i)) x). Masks are real logits binarised by `> 0` in the forward
  pass, with a straight-through (identity) gradient in the backward pass.
- Low-rank SwiGLU: gate and up each factorised H -> r -> F, kept separate (the alternative the
  MGLU post-mortem suggests), down stays full.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.config import FFNConfig

# Every variant takes (hidden, cfg, std, out_std): input-side weights ~ N(0, std), the projection back
# into the residual stream ~ N(0, out_std) (the model passes std / sqrt(2L), as GPT-2 does).


class SwiGLU(nn.Module):
    """The standard gated FFN (Llama / Gemma naming)."""

    def __init__(self, hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None):
        super().__init__()
        self.std, self.out_std = std, std if out_std is None else out_std
        self.gate_proj = nn.Linear(hidden, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, hidden, bias=False)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Gate and up ~ N(0, std), down ~ N(0, out_std)."""
        for lin in (self.gate_proj, self.up_proj):
            nn.init.normal_(lin.weight, std=self.std, generator=generator)
        nn.init.normal_(self.down_proj.weight, std=self.out_std, generator=generator)

    @staticmethod
    def param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
        """{"ffn": weights, "ffn_mask": mask logits} of one block."""
        return {"ffn": 3 * hidden * cfg.intermediate_size, "ffn_mask": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def binary_mask(logits: torch.Tensor) -> torch.Tensor:
    """Hard 0/1 mask `logits > 0` whose gradient flows straight through to the logits."""
    hard = (logits > 0).to(logits.dtype)
    return hard + (logits - logits.detach())


class MGLU(nn.Module):
    """Masked GLU: one shared gate/up matrix split per element by n_m learned binary masks."""

    def __init__(self, hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None):
        super().__init__()
        self.std, self.out_std = std, std if out_std is None else out_std
        self.weight = nn.Parameter(torch.empty(cfg.intermediate_size, hidden))
        self.mask_logits = nn.Parameter(torch.empty(cfg.mask_count, cfg.intermediate_size, hidden))
        self.down_proj = nn.Linear(cfg.intermediate_size, hidden, bias=False)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Shared matrix and mask logits ~ N(0, std), down ~ N(0, out_std)."""
        nn.init.normal_(self.weight, std=self.std, generator=generator)
        # Logits straddle zero so each mask starts as a random half/half split, and sit at the weights'
        # scale so the straight-through updates can flip a mask bit within a few steps.
        nn.init.normal_(self.mask_logits, std=self.std, generator=generator)
        nn.init.normal_(self.down_proj.weight, std=self.out_std, generator=generator)

    @staticmethod
    def param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
        """{"ffn": weights, "ffn_mask": mask logits} of one block."""
        f = cfg.intermediate_size
        return {"ffn": 2 * hidden * f, "ffn_mask": cfg.mask_count * hidden * f}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        masks = binary_mask(self.mask_logits).to(self.weight.dtype)
        out = 0
        for m in masks:
            gate_w = self.weight * m
            up_w = self.weight - gate_w  # W * (1 - m)
            out = out + F.silu(F.linear(x, gate_w)) * F.linear(x, up_w)
        return self.down_proj(out)

    def packed_masks(self) -> np.ndarray:
        """The binarised masks at 1 bit per element (np.packbits over the flattened masks)."""
        return pack_mask(self.mask_logits.detach() > 0)


def pack_mask(mask: torch.Tensor) -> np.ndarray:
    """Pack a boolean tensor to 1 bit per element (uint8, big-endian bit order)."""
    return np.packbits(mask.cpu().numpy().astype(bool).reshape(-1))


def unpack_mask(bits: np.ndarray, shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of `pack_mask`: a boolean tensor of `shape`."""
    n = int(np.prod(shape))
    return torch.from_numpy(np.unpackbits(bits)[:n].astype(bool).reshape(shape))


class LowRankSwiGLU(nn.Module):
    """SwiGLU whose gate and up projections are each factorised through rank r."""

    def __init__(self, hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None):
        super().__init__()
        self.std, self.out_std = std, std if out_std is None else out_std
        r, f = cfg.rank, cfg.intermediate_size
        self.gate_proj_a = nn.Linear(hidden, r, bias=False)
        self.gate_proj_b = nn.Linear(r, f, bias=False)
        self.up_proj_a = nn.Linear(hidden, r, bias=False)
        self.up_proj_b = nn.Linear(r, f, bias=False)
        self.down_proj = nn.Linear(f, hidden, bias=False)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Every factor ~ N(0, std), down ~ N(0, out_std)."""
        for lin in (self.gate_proj_a, self.gate_proj_b, self.up_proj_a, self.up_proj_b):
            nn.init.normal_(lin.weight, std=self.std, generator=generator)
        nn.init.normal_(self.down_proj.weight, std=self.out_std, generator=generator)

    @staticmethod
    def param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
        """{"ffn": weights, "ffn_mask": mask logits} of one block."""
        r, f = cfg.rank, cfg.intermediate_size
        return {"ffn": 2 * (hidden * r + r * f) + f * hidden, "ffn_mask": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate_proj_b(self.gate_proj_a(x))
        up = self.up_proj_b(self.up_proj_a(x))
        return self.down_proj(F.silu(gate) * up)


# Keyed by plelab.model.config.FFN_KINDS (tests/model/test_ffn.py builds and counts every kind).
_FFN_CLASSES: dict[str, type[SwiGLU | MGLU | LowRankSwiGLU]] = {
    "swiglu": SwiGLU, "mglu": MGLU, "lowrank": LowRankSwiGLU,
}


def build_ffn(hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None) -> nn.Module:
    """Construct (and initialise) the FFN variant named by `cfg.kind`."""
    return _FFN_CLASSES[cfg.kind](hidden, cfg, std, out_std)


def ffn_param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
    """Analytic parameter count of one FFN: {"ffn": weights, "ffn_mask": MGLU mask logits}."""
    return _FFN_CLASSES[cfg.kind].param_count(hidden, cfg)
