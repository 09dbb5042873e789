"""Per-layer embeddings (PLE): the published forms as one configurable mechanism.

Front end (`PerLayerInputs`, once per forward):
    identity = table[rows(ids)] * sqrt(dP)                  token index: rows = the ids (outside the table -> row 0)
                                                            n-gram index: S rows per position, one per hash head,
                                                            layer l's part = the heads' slices l side by side
    context  = RMSNorm_dP(W_ctx(inputs_embeds) / sqrt(H))   (optional, Gemma form)
    ple      = (identity + context) / sqrt(2)  or just identity       -> (B, T, L_ple, dP)

In-layer (`PerLayerInjection`, after attention and FFN of layer l):
    g = GELU_tanh(W_gate h)  (Gemma)   or a learned scalar / dP-vector (simple form)
        or sigmoid(signed-sqrt(<RMSNorm(W_key e), RMSNorm(h)> / sqrt(H)))  (Engram, e = ple[l])
    y = RMSNorm_H(W_proj(g * ple[l]))  (norm optional)
    y = y + SiLU(conv(RMSNorm(y)))     (optional short causal convolution, plelab/model/short_conv.py)
    h <- h + y

Module and parameter names match Hugging Face Gemma 3n / Gemma 4 one to one
(see plelab/hf/interop.py), so weights move between the two without renaming logic.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.config import ModelConfig
from plelab.model.norm import NormFn, RMSNorm, rms_norm
from plelab.model.ple_index import TableIndex
from plelab.model.row_init import normal_rows_
from plelab.model.short_conv import ShortConv

if TYPE_CHECKING:
    from plelab.model.kv_cache import KVCache


class PerLayerInputs(nn.Module):
    """Computes every PLE layer's input vector for a batch of token ids."""

    def __init__(self, cfg: ModelConfig, norm_fn: NormFn = rms_norm):
        super().__init__()
        self.num_layers = len(cfg.ple_layers)
        self.dim = cfg.ple.dim
        self.std = cfg.init_std
        self.table_std = cfg.ple.table_init_std if cfg.ple.table_init_std is not None else cfg.init_std
        self.index = TableIndex(cfg)
        self.heads = cfg.ple_heads
        self.vocab_size = cfg.ple_vocab_size if cfg.ple_layout is None else None
        """Rows of a token table (ids at or past it read row 0); None for an n-gram table."""
        self.embed_tokens_per_layer = nn.Embedding(cfg.ple_table_rows, cfg.ple_row_width, sparse=cfg.ple.sparse_grad)
        self.embed_scale = math.sqrt(self.dim)
        self.context = cfg.ple.context
        if self.context:
            self.per_layer_model_projection = nn.Linear(cfg.hidden_size, self.num_layers * self.dim, bias=False)
            self.per_layer_model_projection_scale = cfg.hidden_size**-0.5
            self.per_layer_projection_norm = RMSNorm(self.dim, eps=cfg.norm_eps, fn=norm_fn)
        self.per_layer_input_scale = 2.0**-0.5
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Table ~ N(0, ple.table_init_std), context projection ~ N(0, init_std), its norm at one; the id map read.

        A table holding only some rows of the whole (`table_rows`) gets the numbers the whole draw gives them, and
        one that initialises itself (`reset_rows`, e.g. a table kept on disk) is asked to."""
        table = self.embed_tokens_per_layer
        first, held, total = table_rows(table)
        own = getattr(table, "reset_rows", None)
        self.index.reset_parameters()
        with torch.no_grad():
            if own is not None:
                own(self.table_std, torch.default_generator if generator is None else generator)
            elif held != total:
                normal_rows_(self.embed_tokens_per_layer.weight, self.table_std,
                             torch.default_generator if generator is None else generator, first, total)
            else:
                nn.init.normal_(self.embed_tokens_per_layer.weight, std=self.table_std, generator=generator)
        if self.context:
            nn.init.normal_(self.per_layer_model_projection.weight, std=self.std, generator=generator)
            self.per_layer_projection_norm.reset_parameters()

    def identity(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Table component, (B, T, L_ple, dP). With a KV cache the ids go into it first, so an n-gram position
        still sees the ids before it that earlier calls brought."""
        skip = 0
        if cache is not None and self.index.history:
            pos, T = cache.pos, input_ids.shape[1]
            cache.ple_ids[:, pos : pos + T] = input_ids
            start = max(0, pos - self.index.history)
            input_ids, skip = cache.ple_ids[:, start : pos + T], pos - start
        rows = self.embed_tokens_per_layer(self.index.rows(input_ids, skip)) * self.embed_scale
        B, T, S = rows.shape[:3]
        if S == 1:
            return rows.view(B, T, self.num_layers, self.dim)
        # (B, T, S, L, dP / S) -> layer l takes slice l of every head, heads side by side.
        return rows.view(B, T, S, self.num_layers, self.dim // S).transpose(2, 3).reshape(B, T, self.num_layers,
                                                                                           self.dim)

    def forward(self, input_ids: torch.Tensor, inputs_embeds: torch.Tensor,
                cache: KVCache | None = None) -> torch.Tensor:
        ple = self.identity(input_ids, cache).to(inputs_embeds.dtype)
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
            # engram: the key projection dP -> H (a matrix, so gradient and decay treat it as the input gate's).
            self.gate = nn.Parameter(torch.empty(gate_shape(cfg)))
        if p.gate == "engram":
            self.gate_key_norm = RMSNorm(H, eps=cfg.norm_eps, fn=norm_fn)
            self.gate_query_norm = RMSNorm(H, eps=cfg.norm_eps, fn=norm_fn)
        self.per_layer_projection = nn.Linear(dP, H, bias=False)
        self.post_per_layer_input_norm = (
            RMSNorm(H, eps=cfg.norm_eps, init=p.output_norm_init, fn=norm_fn) if p.output_norm else nn.Identity()
        )
        self.conv = (ShortConv(H, p.conv_kernel, conv_dilation(cfg), cfg.norm_eps, norm_fn) if p.conv_kernel
                     else None)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Input gate, Engram key and projection ~ N(0, init_std), a learned gate at ple.gate_init, the output norm
        at ple.output_norm_init (0 = PLE starts silent), the other norms at one, convolution taps at zero."""
        if self.gate_kind == "input":
            nn.init.normal_(self.per_layer_input_gate.weight, std=self.std, generator=generator)
        elif self.gate_kind == "engram":
            nn.init.normal_(self.gate, std=self.std, generator=generator)
            self.gate_key_norm.reset_parameters()
            self.gate_query_norm.reset_parameters()
        else:
            nn.init.constant_(self.gate, self.gate_init)
        nn.init.normal_(self.per_layer_projection.weight, std=self.std, generator=generator)
        if isinstance(self.post_per_layer_input_norm, RMSNorm):
            self.post_per_layer_input_norm.reset_parameters()
        if self.conv is not None:
            self.conv.reset_parameters()

    def gate_values(self, h: torch.Tensor, ple_input: torch.Tensor | None = None) -> torch.Tensor:
        """The gate g that multiplies the layer's PLE vector (broadcastable to (..., dP)); the Engram gate reads
        the PLE vector too (ple_input) and is one value per position."""
        if self.gate_kind == "input":
            return F.gelu(self.per_layer_input_gate(h), approximate="tanh")
        if self.gate_kind == "engram":
            if ple_input is None:
                raise ValueError("the engram gate depends on the layer's PLE vector: pass ple_input")
            key = self.gate_key_norm(F.linear(ple_input, self.gate.to(ple_input.dtype)))
            s = (key * self.gate_query_norm(h)).sum(-1, keepdim=True) * h.shape[-1] ** -0.5
            # Engram's signed square root: large scores move the sigmoid less.
            return torch.sigmoid(s.sign() * s.abs().clamp_min(1e-6).sqrt())
        return self.gate.to(h.dtype)

    def forward(self, h: torch.Tensor, ple_input: torch.Tensor, cache: KVCache | None = None,
                layer: int = 0) -> torch.Tensor:
        g = self.gate_values(h, ple_input) * ple_input
        y = self.post_per_layer_input_norm(self.per_layer_projection(g))
        return y if self.conv is None else y + self.conv(y, cache, layer)


def conv_dilation(cfg: ModelConfig) -> int:
    """Spacing of the short convolution's taps: the longest n-gram (Engram), 1 for the token index."""
    layout = cfg.ple_layout
    return layout.max_order if layout is not None else 1


def gate_shape(cfg: ModelConfig) -> tuple[int, ...]:
    """Shape of one layer's gate weights: the input gate's (dP, H) matrix, a (1,) scalar, a (dP,) vector, or the
    Engram gate's (H, dP) key projection (its two H-wide norms apart)."""
    dP, H = cfg.ple.dim, cfg.hidden_size
    return {"input": (dP, H), "scalar": (1,), "vector": (dP,), "engram": (H, dP)}[cfg.ple.gate]


def ple_layer_parts(cfg: ModelConfig) -> dict[str, int]:
    """Parameters of one layer's PLE injection by kind: matrices (gate, key, projection) and the rest (learned
    scalar / vector gates, norms, convolution taps), which take part in no matmul."""
    H, dP, p = cfg.hidden_size, cfg.ple.dim, cfg.ple
    gate = math.prod(gate_shape(cfg))
    matrix_gate = p.gate in ("input", "engram")
    other = (0 if matrix_gate else gate) + (2 * H if p.gate == "engram" else 0) + (H if p.output_norm else 0)
    other += (H * p.conv_kernel + H) if p.conv_kernel else 0
    return {"matmul": dP * H + (gate if matrix_gate else 0), "other": other}


def ple_param_count(cfg: ModelConfig) -> dict[str, int]:
    """Analytic PLE parameter counts: table, model-level projection (+ norm), per-layer parts."""
    n, dP, H = len(cfg.ple_layers), cfg.ple.dim, cfg.hidden_size
    if n == 0:
        return {"ple_table": 0, "ple_model_projection": 0, "ple_per_layer": 0}
    return {
        "ple_table": cfg.ple_table_rows * cfg.ple_row_width,
        "ple_model_projection": (H * n * dP + dP) if cfg.ple.context else 0,
        "ple_per_layer": n * sum(ple_layer_parts(cfg).values()),
    }
