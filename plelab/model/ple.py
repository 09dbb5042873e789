"""Per-layer embeddings (PLE): both published forms as one configurable mechanism.

Front end (`PerLayerInputs`, once per forward):
    identity = table[ids] * sqrt(dP)                     ids outside the PLE vocab -> row 0
    context  = RMSNorm_dP(W_ctx(inputs_embeds) / sqrt(H))   (optional, Gemma form)
    ple      = (identity + context) / sqrt(2)  or just identity       -> (B, T, L_ple, dP)

In-layer (`PerLayerInjection`, after attention and FFN of layer l):
    g = GELU_tanh(W_gate h)  (Gemma)   or a learned scalar / dP-vector (simple form)
    y = RMSNorm_H(W_proj(g * ple[l]))  (norm optional)            h <- h + y

Module and parameter names match Hugging Face Gemma 3n / Gemma 4 one to one
(see plelab/hf/interop.py), so weights move between the two without renaming logic.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.config import ModelConfig
from plelab.model.norm import NormFn, RMSNorm, rms_norm
from plelab.model.row_init import normal_rows_


class PerLayerInputs(nn.Module):
    """Computes every PLE layer's input vector for a batch of token ids."""

    def __init__(self, cfg: ModelConfig, norm_fn: NormFn = rms_norm):
        super().__init__()
        self.num_layers = len(cfg.ple_layers)
        self.dim = cfg.ple.dim
        self.vocab_size = cfg.ple_vocab_size
        self.std = cfg.init_std
        self.table_std = cfg.ple.table_init_std if cfg.ple.table_init_std is not None else cfg.init_std
        self.embed_tokens_per_layer = nn.Embedding(
            self.vocab_size, self.num_layers * self.dim, sparse=cfg.ple.sparse_grad
        )
        self.embed_scale = math.sqrt(self.dim)
        self.context = cfg.ple.context
        if self.context:
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, self.num_layers * self.dim, bias=False)
            self.per_layer_model_projection_scale = cfg.hidden_size**-0.5
            self.per_layer_projection_norm = RMSNorm(self.dim, eps=cfg.norm_eps, fn=norm_fn)
        self.per_layer_input_scale = 2.0**-0.5
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Table ~ N(0, ple.table_init_std), context projection ~ N(0, init_std), its norm at one.

        A table holding only some rows of the whole (`table_rows`) gets the numbers the whole draw gives them."""
        first, held, total = table_rows(self.embed_tokens_per_layer)
        with torch.no_grad():
            if held != total:
                normal_rows_(self.embed_tokens_per_layer.weight, self.table_std,
                             torch.default_generator if generator is None else generator, first, total)
            else:
                nn.init.normal_(self.embed_tokens_per_layer.weight, std=self.table_std, generator=generator)
        if self.context:
            nn.init.normal_(self.per_layer_model_projection.weight, std=self.std, generator=generator)
            self.per_layer_projection_norm.reset_parameters()

    def identity(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token-identity component, (B, T, L_ple, dP)."""
        in_vocab = (input_ids >= 0) & (input_ids < self.vocab_size)
        ids = torch.where(in_vocab, input_ids, torch.zeros_like(input_ids))
        rows = self.embed_tokens_per_layer(ids) * self.embed_scale
        return rows.view(*input_ids.shape, self.num_layers, self.dim)

    def forward(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor) -> torch.Tensor:
        ple = self.identity(input_ids).to(inputs_embeds.dtype)
        if not self.context:
            return ple
        ctx = self.per_layer_model_projection(inputs_embeds) * self.per_layer_model_projection_scale
        ctx = self.per_layer_projection_norm(ctx.view(*inputs_embeds.shape[:-1], self.num_layers, self.dim))
        return (ctx + ple) * self.per_layer_input_scale


def table_rows(table: nn.Embedding) -> tuple[int, int, int]:
    """(first row, rows held, rows of the whole table) of a PLE table: all of it for an nn.Embedding; a table split
    across processes (plelab.parallel.table.ShardedEmbedding) holds rows [lo, lo + n) of num_rows."""
    return getattr(table, "lo", 0), table.num_embeddings, getattr(table, "num_rows", table.num_embeddings)


class PerLayerInjection(nn.Module):
    """One layer's PLE injection; returns the contribution y that the layer adds to h."""

    def __init__(self, cfg: ModelConfig, norm_fn: NormFn = rms_norm):
        super().__init__()
        H, dP, p = cfg.hidden_size, cfg.ple.dim, cfg.ple
        self.gate_kind, self.gate_init, self.std = p.gate, p.gate_init, cfg.init_std
        if p.gate == "input":
            self.per_layer_input_gate = nn.Linear(H, dP, bias=False)
        else:
            self.gate = nn.Parameter(torch.empty(gate_shape(cfg)))
        self.per_layer_projection = nn.Linear(dP, H, bias=False)
        self.post_per_layer_input_norm = (
            RMSNorm(H, eps=cfg.norm_eps, init=p.output_norm_init, fn=norm_fn) if p.output_norm else nn.Identity()
        )
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Input gate and projection ~ N(0, init_std), a learned gate at ple.gate_init, the norm at
        ple.output_norm_init (0 = PLE starts silent)."""
        if self.gate_kind == "input":
            nn.init.normal_(self.per_layer_input_gate.weight, std=self.std, generator=generator)
        else:
            nn.init.constant_(self.gate, self.gate_init)
        nn.init.normal_(self.per_layer_projection.weight, std=self.std, generator=generator)
        if isinstance(self.post_per_layer_input_norm, RMSNorm):
            self.post_per_layer_input_norm.reset_parameters()

    def gate_values(self, h: torch.Tensor) -> torch.Tensor:
        """The gate g that multiplies the layer's PLE vector (broadcastable to (..., dP))."""
        if self.gate_kind == "input":
            return F.gelu(self.per_layer_input_gate(h), approximate="tanh")
        return self.gate.to(h.dtype)

    def forward(self, h: torch.Tensor, ple_input: torch.Tensor) -> torch.Tensor:
        g = self.gate_values(h) * ple_input
        return self.post_per_layer_input_norm(self.per_layer_projection(g))


def gate_shape(cfg: ModelConfig) -> tuple[int, ...]:
    """Shape of one layer's gate weights: the input gate's (dP, H) matrix, a (1,) scalar or a (dP,) vector."""
    dP = cfg.ple.dim
    return {"input": (dP, cfg.hidden_size), "scalar": (1,), "vector": (dP,)}[cfg.ple.gate]


def ple_param_count(cfg: ModelConfig) -> dict[str, int]:
    """Analytic PLE parameter counts: table, model-level projection (+ norm), per-layer parts."""
    n, dP, H = len(cfg.ple_layers), cfg.ple.dim, cfg.hidden_size
    if n == 0:
        return {"ple_table": 0, "ple_model_projection": 0, "ple_per_layer": 0}
    gate = math.prod(gate_shape(cfg))
    return {
        "ple_table": cfg.ple_vocab_size * n * dP,
        "ple_model_projection": (H * n * dP + dP) if cfg.ple.context else 0,
        "ple_per_layer": n * (gate + dP * H + (H if cfg.ple.output_norm else 0)),
    }
