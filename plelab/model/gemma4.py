"""The Gemma 4 decoder block (`ModelConfig.arch = "gemma4"`), computing what transformers' Gemma4TextModel does.

One layer, with `n(.)` an RMSNorm (weight used as-is, x * w) and `v_norm` one without a weight:

    a = attn(n_in(x))             q = rope(q_norm(W_q a)), k = rope(k_norm(W_k a)), v = v_norm(W_v a)
                                  scores q.k (scale 1: QK-norm sets it), causal, sliding layers windowed
    x = x + n_post_attn(a)
    x = x + n_post_ffn(W_down(gelu_tanh(W_gate n_pre_ffn(x)) * W_up n_pre_ffn(x)))
    x = x + PerLayerInjection(x, ple[l])                 (PLE layers; plelab/model/ple.py)
    x = x * layer_scalar

Sliding and full-attention layers differ in RoPE (base, rotated share of the head) and may differ in head
width and key/value heads. With `num_kv_shared_layers` the last layers reuse the keys/values of the last
earlier layer of their kind; with `attention_k_eq_v` the full layers' values are their keys before norm and
RoPE. Parameter names are transformers' (see plelab/hf/interop.py). Around the layers
(plelab/model/transformer.py): the embedding is scaled by sqrt(H), and the logits are soft-capped when
`final_logit_softcap` is set.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from plelab.model.config import ModelConfig
from plelab.model.ffn import SwiGLU
from plelab.model.norm import NormFn, RMSNorm
from plelab.model.ple import PerLayerInjection

if TYPE_CHECKING:
    from plelab.model.kv_cache import KVCache

Tensor = torch.Tensor
Rope = Callable[[Tensor, Tensor, Tensor], Tensor]
# Per attention kind, the keys/values a KV-shared layer reuses (filled by the layer that computes them).
SharedKV = dict[str, tuple[Tensor, Tensor]]


def rope_inv_freq(head_dim: int, theta: float, rotary_fraction: float = 1.0) -> Tensor:
    """RoPE inverse frequencies (head_dim / 2,); past `rotary_fraction` of the pairs they are 0 (no rotation),
    as transformers' "proportional" RoPE has it (exponents stay k / head_dim)."""
    rotated = int(rotary_fraction * head_dim // 2)
    inv = 1.0 / (theta ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float32) / head_dim))
    return torch.cat([inv, torch.zeros(head_dim // 2 - rotated)])


def layer_rope(cfg: ModelConfig, kind: str, start: int, length: int, device=None) -> tuple[Tensor, Tensor]:
    """cos/sin (length, D) for positions start.. of the layers of attention kind `kind`."""
    if kind == "full_attention":
        _, head_dim = cfg.attention_shape(cfg.layer_types.index("full_attention"))
        inv = rope_inv_freq(head_dim, cfg.gemma4.full_rope_theta, cfg.gemma4.full_rotary_fraction)
    else:
        inv = rope_inv_freq(cfg.head_size, cfg.rope_theta)
    pos = torch.arange(start, start + length, dtype=torch.float32, device=device)
    emb = torch.outer(pos, inv.to(device)).repeat(1, 2)
    return emb.cos(), emb.sin()


def attention_mask(q_len: int, kv_len: int, window: int | None, device=None) -> Tensor | None:
    """Boolean (q_len, kv_len) mask for queries at the last q_len of kv_len positions: causal, and within
    `window` positions when given; None when SDPA's own causal flag says the same."""
    start = kv_len - q_len
    if (window is None or kv_len <= window) and start == 0:
        return None
    q = torch.arange(start, kv_len, device=device)[:, None]
    k = torch.arange(kv_len, device=device)[None, :]
    mask = k <= q
    return mask & (q - k < window) if window is not None else mask


def unit_rms_norm(x: Tensor, eps: float) -> Tensor:
    """RMSNorm without a weight (Gemma 4's v_norm), in fp32 like `rms_norm`."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


class GeGLU(SwiGLU):
    """Gemma's gated FFN: down(gelu_tanh(gate(x)) * up(x)); weights, init and count as SwiGLU."""

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.gelu(self.gate_proj(x), approximate="tanh") * self.up_proj(x))


class Gemma4Attention(nn.Module):
    """QK-normed, V-normed grouped-query attention with scale 1, optionally reusing another layer's keys/values."""

    def __init__(self, cfg: ModelConfig, layer: int, norm_fn: NormFn, rope: Rope):
        super().__init__()
        g = cfg.gemma4
        self.layer, self.kind = layer, cfg.layer_types[layer]
        self.n_heads = cfg.num_heads
        self.n_kv, self.head_dim = cfg.attention_shape(layer)
        self.rope = rope
        self.eps = cfg.norm_eps
        self.shared = cfg.kv_source(layer) != layer
        # The last layer of each kind that computes keys/values hands them to the shared layers.
        self.stores = not self.shared and layer in {cfg.kv_source(i) for i in range(cfg.num_layers)}
        self.std, self.out_std = cfg.init_std, cfg.init_std / (2 * cfg.num_layers) ** 0.5
        H, D = cfg.hidden_size, self.head_dim
        self.q_proj = nn.Linear(H, self.n_heads * D, bias=False)
        self.q_norm = RMSNorm(D, cfg.norm_eps, fn=norm_fn)
        if not self.shared:
            self.k_proj = nn.Linear(H, self.n_kv * D, bias=False)
            self.v_proj = None if g.attention_k_eq_v and self.kind == "full_attention" else (
                nn.Linear(H, self.n_kv * D, bias=False)
            )
            self.k_norm = RMSNorm(D, cfg.norm_eps, fn=norm_fn)
        self.o_proj = nn.Linear(self.n_heads * D, H, bias=False)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """Projections ~ N(0, init_std), the output one ~ N(0, init_std / sqrt(2L)), QK-norms at one."""
        for lin in (self.q_proj, getattr(self, "k_proj", None), getattr(self, "v_proj", None)):
            if lin is not None:
                nn.init.normal_(lin.weight, std=self.std, generator=generator)
        nn.init.normal_(self.o_proj.weight, std=self.out_std, generator=generator)
        self.q_norm.reset_parameters()
        if not self.shared:
            self.k_norm.reset_parameters()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, shared: SharedKV,
                cache: KVCache | None = None) -> Tensor:
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim))
        q = self.rope(q.transpose(1, 2), cos, sin)
        if self.shared:
            k, v = shared[self.kind]
        else:
            k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim)
            v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim) if self.v_proj is not None else k
            k = self.rope(self.k_norm(k).transpose(1, 2), cos, sin)
            v = unit_rms_norm(v, self.eps).transpose(1, 2)
            if cache is not None:
                start = cache.pos
                cache.keys[self.layer][:, :, start : start + T] = k
                cache.values[self.layer][:, :, start : start + T] = v
                k = cache.keys[self.layer][:, :, : start + T]
                v = cache.values[self.layer][:, :, : start + T]
            if self.stores:
                shared[self.kind] = k, v
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, scale=1.0,
            enable_gqa=self.n_kv != self.n_heads,
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class Gemma4DecoderLayer(nn.Module):
    """Sandwich-normed attention and FFN, the PLE injection, then the layer scalar (see the module docstring)."""

    def __init__(self, cfg: ModelConfig, layer: int, has_ple: bool, norm_fn: NormFn, rope: Rope):
        """`norm_fn` and `rope` are the model's choice of reference or kernel functions."""
        super().__init__()
        H, eps, std = cfg.hidden_size, cfg.norm_eps, cfg.init_std
        self.input_layernorm = RMSNorm(H, eps, fn=norm_fn)
        self.self_attn = Gemma4Attention(cfg, layer, norm_fn, rope)
        self.post_attention_layernorm = RMSNorm(H, eps, fn=norm_fn)
        self.pre_feedforward_layernorm = RMSNorm(H, eps, fn=norm_fn)
        ffn = cfg.ffn
        if cfg.gemma4.double_wide_mlp and self.self_attn.shared:
            ffn = dataclasses.replace(ffn, intermediate_size=2 * ffn.intermediate_size)
        self.mlp = GeGLU(H, ffn, std, std / (2 * cfg.num_layers) ** 0.5)
        self.post_feedforward_layernorm = RMSNorm(H, eps, fn=norm_fn)
        self.ple = PerLayerInjection(cfg, norm_fn) if has_ple else None
        # A buffer, as in transformers: saved and loaded, not trained.
        self.register_buffer("layer_scalar", torch.ones(1))

    def reset_parameters(self, ple_generator: torch.Generator | None = None) -> None:
        """The trunk's parts from the global RNG (norms and layer scalar at one); PLE from `ple_generator`."""
        for part in (self.input_layernorm, self.self_attn, self.post_attention_layernorm,
                     self.pre_feedforward_layernorm, self.mlp, self.post_feedforward_layernorm):
            part.reset_parameters()
        self.layer_scalar.fill_(1.0)
        if self.ple is not None:
            self.ple.reset_parameters(ple_generator)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, shared: SharedKV,
                ple_input: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        x = x + self.post_attention_layernorm(self.self_attn(self.input_layernorm(x), cos, sin, mask, shared, cache))
        x = x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        if self.ple is not None:
            x = x + self.ple(x, ple_input, cache, self.self_attn.layer)
        return x * self.layer_scalar


def gemma4_layers(layers: nn.ModuleList, cfg: ModelConfig, x: Tensor, ples: list[Tensor | None],
                  cache: KVCache | None = None) -> Tensor:
    """Run the Gemma 4 layers on the embedded (and scaled) input x; RoPE tables and masks once per kind."""
    T = x.shape[1]
    start = cache.pos if cache is not None else 0
    per_kind = {}
    for kind in set(cfg.layer_types):
        cos, sin = layer_rope(cfg, kind, start, T, x.device)
        window = cfg.gemma4.sliding_window if kind == "sliding_attention" else None
        per_kind[kind] = cos, sin, attention_mask(T, start + T, window, x.device)
    shared: SharedKV = {}
    for i, layer in enumerate(layers):
        x = layer(x, *per_kind[cfg.layer_types[i]], shared, ples[i], cache)
    return x
