"""Feed-forward variants behind one interface: `build_ffn(config) -> nn.Module` mapping H -> H.

- SwiGLU: down(silu(gate(x)) * up(x)).
- MGLU (Tajima et al. 2025): gate and up share one matrix W, told apart by learned 1-bit masks:
  sum_i silu((W*m_i) x) * ((W*(1-m_i)) x). Masks are real logits binarised by `> 0` in the forward
  pass, with a straight-through (identity) gradient in the backward pass.
- Low-rank SwiGLU: gate and up each factorised H -> r -> F, kept separate (the alternative the
  MGLU post-mortem suggests), down stays full.
- Mixture of experts: top-k routed SwiGLU experts (plelab/model/moe.py).
- Pruned SwiGLU: a SwiGLU whose intermediate units carry a 0/1 `alive` mask that training drives down to
  `prune_to` units (plelab/model/pruning.py scores, removes and exports them as a plain SwiGLU).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.config import FFNConfig
from plelab.model.moe import MoE

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


class PrunedSwiGLU(SwiGLU):
    """SwiGLU of intermediate_size units, each multiplied by a persistent 0/1 `alive` flag after gate * up.

    The flags live in the state dict (so in checkpoints); `plelab.training.ffn_callbacks.PruningSchedule`
    clears them on a schedule and `plelab.model.pruning.export_pruned` keeps only the live units. Counts
    report the shipped width prune_to; training pays for intermediate_size until the units are removed.
    """

    def __init__(self, hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None):
        super().__init__(hidden, cfg, std, out_std)
        self.register_buffer("alive", torch.ones(cfg.intermediate_size))
        # prune_importance = "taylor": the training forward accumulates |sum_tokens h_j * dL/dh_j| here (a buffer,
        # so checkpoints carry it and a resumed run prunes the same units).
        taylor = cfg.prune_importance == "taylor"
        self.register_buffer("taylor_score", torch.zeros(cfg.intermediate_size) if taylor else None)

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """SwiGLU's initialisation, with every unit alive (and no Taylor score yet)."""
        super().reset_parameters(generator)
        if hasattr(self, "alive"):  # SwiGLU.__init__ initialises before the buffers are registered
            self.alive.fill_(1.0)
            if self.taylor_score is not None:
                self.taylor_score.zero_()

    @staticmethod
    def param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
        """{"ffn": weights of the exported prune_to-wide SwiGLU, "ffn_mask": 0} of one block."""
        return {"ffn": 3 * hidden * cfg.prune_to, "ffn_mask": 0}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        if self.taylor_score is not None and self.training and h.requires_grad:
            h.register_hook(self._taylor_hook(h.detach()))
        return self.down_proj(h * self.alive.to(h.dtype))

    def _taylor_hook(self, h: torch.Tensor) -> Callable[[torch.Tensor], None]:
        def accumulate(grad: torch.Tensor) -> None:
            self.taylor_score.add_((h * grad).flatten(0, -2).sum(dim=0).abs().float())

        return accumulate


# Keyed by plelab.model.config.FFN_KINDS (tests/model/test_ffn.py and test_params.py build and count every kind).
_FFN_CLASSES: dict[str, type[SwiGLU | MGLU | LowRankSwiGLU | MoE]] = {
    "swiglu": SwiGLU, "mglu": MGLU, "lowrank": LowRankSwiGLU, "moe": MoE, "pruned": PrunedSwiGLU,
}


def build_ffn(hidden: int, cfg: FFNConfig, std: float = 0.02, out_std: float | None = None) -> nn.Module:
    """Construct (and initialise) the FFN variant named by `cfg.kind`."""
    return _FFN_CLASSES[cfg.kind](hidden, cfg, std, out_std)


def ffn_param_count(hidden: int, cfg: FFNConfig) -> dict[str, int]:
    """Analytic parameter count of one FFN as shipped: {"ffn": weights, "ffn_mask": MGLU mask logits}.

    MoE: all experts (`MoE.active_param_count` gives those a token touches); pruned: the final prune_to-wide
    SwiGLU (`ffn_training_param_count` gives the width trained before the units are removed).
    """
    return _FFN_CLASSES[cfg.kind].param_count(hidden, cfg)


def ffn_training_param_count(hidden: int, cfg: FFNConfig) -> int:
    """Parameters of one FFN module as built for training (pruned: at intermediate_size, before any removal)."""
    if cfg.kind == "pruned":
        return SwiGLU.param_count(hidden, cfg)["ffn"]
    return sum(ffn_param_count(hidden, cfg).values())

