"""The decoder-only language model: RoPE, GQA attention, a configurable FFN, optional PLE.

Single-device code that knows nothing of training, checkpoints or parallelism. The whole forward
pass, layer by layer:

    x   = embed(ids) [* sqrt(H)]
    ple = PerLayerInputs(ids, x)                          (only when dP > 0)
    for layer l:
        x = x + attn(norm(x))
        x = x + ffn(norm(x))
        x = x + PerLayerInjection_l(x, ple[:, :, l])     (only on PLE layers)
    logits = head(norm(x))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from plelab.errors import PlelabError
from plelab.model.config import ModelConfig
from plelab.model.ffn import build_ffn
from plelab.model.loss import linear_cross_entropy
from plelab.model.norm import RMSNorm
from plelab.model.ple import PerLayerInjection, PerLayerInputs


class TokenIdError(PlelabError, ValueError):
    """Token ids outside the model's vocabulary."""


def rope_tables(head_dim: int, length: int, theta: float, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (length, head_dim) in the half-rotation (Llama / Gemma) layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (..., T, D) by position: x * cos + rotate_half(x) * sin; cos/sin broadcast as (T, D) or (T, 1, D)."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _RoPE.apply(x, cos, sin)
    return _rope(x, cos, sin)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float = 1.0) -> torch.Tensor:
    # x*cos + cat(-x2, x1)*sin without materialising the rotated copy (sign=-1: the transpose).
    # Products are rounded before the add (no addcmul/FMA) so results are bit-identical to the
    # reference formula, and so to Hugging Face Llama.
    half = x.shape[-1] // 2
    out = x * cos  # in the promoted dtype (fp32 tables): cast once at the end, as the reference does
    x1, x2 = x[..., :half], x[..., half:]
    lo, hi = out[..., :half], out[..., half:]
    if sign > 0:
        lo.sub_(x2 * sin[..., :half])
        hi.add_(x1 * sin[..., half:])
    else:
        lo.add_(x2 * sin[..., :half])
        hi.sub_(x1 * sin[..., half:])
    return out.to(x.dtype)


class _RoPE(torch.autograd.Function):
    """RoPE with its (linear, orthogonal) backward written out: the autograd graph of the chunk/neg/cat
    form costs about twice the passes over q and k on CPU. The gradient is the inverse rotation."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rope(x, cos, sin)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rope(grad, cos, sin, sign=-1.0), None, None


@dataclass
class KVCache:
    """Preallocated keys/values for every layer; `pos` tokens are filled."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    pos: int = 0

    @classmethod
    def empty(cls, cfg: ModelConfig, batch: int, length: int, device=None, dtype=torch.float32) -> KVCache:
        """Allocate a cache for `batch` sequences of up to `length` tokens."""
        shape = (batch, cfg.kv_heads, length, cfg.head_size)
        return cls(
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)],
            [torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.num_layers)],
        )

    @property
    def capacity(self) -> int:
        """Longest sequence the cache holds."""
        return self.keys[0].shape[2]


class Attention(nn.Module):
    """Grouped-query self-attention through scaled_dot_product_attention."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.kv_heads, cfg.head_size
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, H, bias=False)

    def forward(self, x, cos, sin, cache: KVCache | None = None, layer: int = 0) -> torch.Tensor:
        B, T, _ = x.shape
        nh, nkv = self.n_heads, self.n_kv
        # One GEMM for q, k and v (weights concatenated per call, a few hundred KB): one bigger GEMM
        # runs faster than three thin ones on CPU, and backward gets one input-gradient GEMM instead
        # of three plus two adds. Parameters keep their separate (HF-compatible) names.
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        # split (not slicing): its backward is one cat, where each slice's backward zero-fills a full copy.
        qk, v = F.linear(x, w).view(B, T, nh + 2 * nkv, self.head_dim).split([nh + nkv, nkv], dim=2)
        # RoPE on q and k together, in (B, T, heads, D) layout: half the elementwise launches.
        q, k = apply_rope(qk, cos[:, None], sin[:, None]).split([nh, nkv], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        mask, causal = None, True
        if cache is not None:
            start = cache.pos
            cache.keys[layer][:, :, start : start + T] = k
            cache.values[layer][:, :, start : start + T] = v
            k = cache.keys[layer][:, :, : start + T]
            v = cache.values[layer][:, :, : start + T]
            if start > 0:
                # New queries see everything cached plus the causal part of themselves.
                causal = False
                mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start) if T > 1 else None
        # The CPU flash kernel handles GQA itself: no expanded k/v copies, no sum over the copies in backward.
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal and mask is None and T > 1, enable_gqa=nkv != nh
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class DecoderLayer(nn.Module):
    """Pre-norm attention + FFN, then (on PLE layers) the per-layer-embedding injection."""

    def __init__(self, cfg: ModelConfig, has_ple: bool):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.mlp = build_ffn(cfg.hidden_size, cfg.ffn)
        self.ple = PerLayerInjection(cfg) if has_ple else None

    def forward(self, x, cos, sin, ple_input=None, cache=None, layer: int = 0) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
        x = x + self.mlp(self.post_attention_layernorm(x))
        if self.ple is not None:
            x = x + self.ple(x, ple_input)
        return x


class LanguageModel(nn.Module):
    """Decoder-only LM with optional per-layer embeddings; `forward` returns (logits, loss)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg
        ple_layers = cfg.ple_layers
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.per_layer_inputs = PerLayerInputs(cfg) if ple_layers else None
        # Slot of each layer in the packed PLE tensor (None where the layer has no PLE).
        self.ple_slot = {layer: i for i, layer in enumerate(ple_layers)}
        self.layers = nn.ModuleList(DecoderLayer(cfg, i in self.ple_slot) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps)
        self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = self.rope_buffers(cfg)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.reset_parameters()

    @staticmethod
    def rope_buffers(cfg: ModelConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The RoPE cos/sin tables for `cfg.max_seq_len` positions."""
        return rope_tables(cfg.head_size, cfg.max_seq_len, cfg.rope_theta, device)

    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights, residual outputs scaled by 1/sqrt(2L), norms at one."""
        cfg = self.config
        std = cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                nn.init.ones_(p)
            elif name.endswith("mask_logits"):
                nn.init.normal_(p, std=std)
            elif name.endswith(".gate"):
                nn.init.constant_(p, cfg.ple.gate_init)
            elif name.endswith(("o_proj.weight", "down_proj.weight")):
                nn.init.normal_(p, std=std / math.sqrt(2 * cfg.num_layers))
            elif name.endswith("embed_tokens_per_layer.weight"):
                nn.init.normal_(p, std=cfg.ple.table_init_std if cfg.ple.table_init_std is not None else std)
            else:
                nn.init.normal_(p, std=std)
        for layer in self.layers:
            if layer.ple is not None and isinstance(layer.ple.post_per_layer_input_norm, RMSNorm):
                nn.init.constant_(layer.ple.post_per_layer_input_norm.weight, cfg.ple.output_norm_init)

    def output_weight(self) -> torch.Tensor:
        """The (V, H) output-head matrix (the input embedding when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def check_ids(self, input_ids: torch.Tensor) -> None:
        """Raise TokenIdError if any id is outside [0, vocab_size)."""
        # One host sync on the happy path; min/max are only computed for the error message.
        if bool(((input_ids < 0) | (input_ids >= self.config.vocab_size)).any()):
            lo, hi = int(input_ids.min()), int(input_ids.max())
            raise TokenIdError(
                f"token ids must lie in [0, {self.config.vocab_size}); got min {lo}, max {hi} "
                "(is the tokenizer the one this model was built for?)"
            )

    def hidden_states(self, input_ids: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
        """Final normed hidden states (B, T, H)."""
        self.check_ids(input_ids)
        B, T = input_ids.shape
        start = cache.pos if cache is not None else 0
        if start + T > self.rope_cos.shape[0]:
            cos, sin = rope_tables(self.config.head_size, start + T, self.config.rope_theta, input_ids.device)
        else:
            cos, sin = self.rope_cos, self.rope_sin
        cos, sin = cos[start : start + T], sin[start : start + T]
        x = self.embed_tokens(input_ids)
        if self.config.embed_scale:
            x = x * math.sqrt(self.config.hidden_size)
        ple = self.per_layer_inputs(input_ids, x) if self.per_layer_inputs is not None else None
        for i, layer in enumerate(self.layers):
            slot = self.ple_slot.get(i)
            x = layer(x, cos, sin, ple[:, :, slot] if slot is not None else None, cache, i)
        if cache is not None:
            cache.pos += T
        return self.norm(x)

    def forward(
        self,
        input_ids: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        return_logits: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits, loss); targets = -100 are ignored. return_logits=False (with targets) is the fast
        training path: head + cross-entropy fused in row chunks, same loss and gradients, logits None."""
        h = self.hidden_states(input_ids, cache)
        if targets is None:
            return F.linear(h[:, -1:] if cache is not None else h, self.output_weight()), None
        if not return_logits:
            return None, linear_cross_entropy(h, self.output_weight(), targets, ignore_index=-100)
        logits = F.linear(h, self.output_weight())
        loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=-100)
        return logits, loss

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        generator: torch.Generator | None = None,
    ):
        """Yield (B, 1) tensors of sampled tokens one at a time, using a KV cache."""
        B, T = input_ids.shape
        length = T + max_new_tokens
        dtype = self.embed_tokens.weight.dtype
        cache = KVCache.empty(self.config, B, length, input_ids.device, dtype)
        logits, _ = self(input_ids, cache=cache)
        for _ in range(max_new_tokens):
            nxt = sample_next(logits[:, -1].float(), temperature, top_k, top_p, generator)
            yield nxt
            if cache.pos >= length:
                break
            logits, _ = self(nxt, cache=cache)


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Pick the next token from (B, V) logits: greedy at temperature 0, else top-k / top-p sampling."""
    if temperature <= 0:
        return logits.argmax(-1, keepdim=True)
    logits = logits / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix reaching top_p
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
    probs = logits.softmax(-1)
    return torch.multinomial(probs, 1, generator=generator)
