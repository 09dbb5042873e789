"""The decoder-only language model: RoPE, GQA attention, a configurable FFN, optional PLE.

A reference implementation: single-device code that knows nothing of training, checkpoints or
parallelism, written with the plain formulas. The whole forward pass, layer by layer:

    x   = embed(ids) [* sqrt(H)]
    ple = PerLayerInputs(ids, x)                          (only when dP > 0; token or n-gram index)
    for layer l:
        x = x + attn(norm(x))
        x = x + ffn(norm(x))
        x = x + PerLayerInjection_l(x, ple[:, :, l])     (only on PLE layers)
    logits = head(norm(x))

`embed` is the first line and `run_layers` the loop and final norm, so a caller with inputs of its own
(plelab.vision: image patches, a PLE table indexed by patch ids) runs the same layers.

That is `arch = "llama"`; `arch = "gemma4"` swaps the layers for transformers' Gemma 4 block
(plelab/model/gemma4.py: sandwich norms, QK-norm, sliding/full attention, layer scalar), always scales the
embedding and may soft-cap the logits.

`ModelConfig.kernels` swaps three of the functions (RMSNorm, RoPE, head + cross-entropy) for CPU
fused ops computing the same math (plelab/model/fused_ops.py); the choice is made once, at construction.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from plelab.errors import PlelabError, token_id_message
from plelab.model import bf16_gemm, fused_ops
from plelab.model.config import ModelConfig
from plelab.model.ffn import build_ffn
from plelab.model.gemma4 import Gemma4DecoderLayer, gemma4_layers
from plelab.model.kv_cache import KVCache
from plelab.model.norm import NormFn, RMSNorm, rms_norm
from plelab.model.ple import PerLayerInjection, PerLayerInputs

Tensor = torch.Tensor


class TokenIdError(PlelabError, ValueError):
    """Token ids outside the model's vocabulary."""


def check_token_ids(ids: Tensor | np.ndarray | Sequence[int], vocab_size: int) -> None:
    """Raise TokenIdError if any id is outside [0, vocab_size).

    Called where batches and prompts are made (the data loader, evaluation, generation, diagnostics), on host
    arrays: a min and a max per batch, never a device-to-host sync inside the model's forward pass."""
    arr = ids.detach().cpu().numpy() if isinstance(ids, Tensor) else np.asarray(ids)
    if arr.size == 0:
        return
    if int(arr.min()) < 0 or int(arr.max()) >= vocab_size:
        flat = arr.reshape(-1)
        raise TokenIdError(token_id_message(vocab_size, flat[(flat < 0) | (flat >= vocab_size)][:5].tolist()))


def rope_tables(head_dim: int, length: int, theta: float, device=None) -> tuple[Tensor, Tensor]:
    """cos/sin tables (length, head_dim) in the half-rotation (Llama / Gemma) layout."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    freqs = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(x: Tensor) -> Tensor:
    """(x1, x2) -> (-x2, x1) over the two halves of the last dimension."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate (..., T, D) by position; cos/sin are (T, D) fp32 tables, the result has x's dtype."""
    return (x * cos + rotate_half(x) * sin).to(x.dtype)


def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """Mean fp32 cross-entropy of (..., V) logits against (...) targets; `ignore_index` entries skipped."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)


def linear_cross_entropy(h: Tensor, weight: Tensor, targets: Tensor, ignore_index: int = -100) -> Tensor:
    """`cross_entropy` of the logits h @ weight.T (what fused_ops.linear_cross_entropy fuses)."""
    if bf16_gemm.active() is not None:  # bf16 head GEMMs exist only as the fused kernel
        return fused_ops.linear_cross_entropy(h, weight, targets, ignore_index)
    return cross_entropy(F.linear(h, weight), targets, ignore_index)


@dataclass(frozen=True)
class Ops:
    """The functions that have a CPU kernel; a model holds one set, chosen from `ModelConfig.kernels`."""

    rms_norm: NormFn
    rope: Callable[[Tensor, Tensor, Tensor], Tensor]
    head_loss: Callable[[Tensor, Tensor, Tensor], Tensor]


REFERENCE_OPS = Ops(rms_norm, apply_rope, linear_cross_entropy)
FUSED_OPS = Ops(fused_ops.rms_norm, fused_ops.rope, fused_ops.linear_cross_entropy)


class Attention(nn.Module):
    """Grouped-query self-attention through scaled_dot_product_attention."""

    def __init__(self, cfg: ModelConfig, rope: Callable[[Tensor, Tensor, Tensor], Tensor] = apply_rope):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = cfg.num_heads, cfg.kv_heads, cfg.head_size
        self.rope = rope
        # The output projection writes into the residual stream, which sums 2L such writes (GPT-2).
        self.std, self.out_std = cfg.init_std, cfg.init_std / math.sqrt(2 * cfg.num_layers)
        H = cfg.hidden_size
        self.q_proj = nn.Linear(H, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(H, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, H, bias=False)
        self.reset_parameters()

    def reset_parameters(self, generator: torch.Generator | None = None) -> None:
        """q, k, v ~ N(0, init_std); o ~ N(0, init_std / sqrt(2L))."""
        for lin in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(lin.weight, std=self.std, generator=generator)
        nn.init.normal_(self.o_proj.weight, std=self.out_std, generator=generator)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, cache: KVCache | None = None, layer: int = 0) -> Tensor:
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = self.rope(q, cos, sin), self.rope(k, cos, sin)
        mask, causal = None, T > 1
        if cache is not None:
            start = cache.pos
            cache.keys[layer][:, :, start : start + T] = k
            cache.values[layer][:, :, start : start + T] = v
            k = cache.keys[layer][:, :, : start + T]
            v = cache.values[layer][:, :, : start + T]
            if start > 0 and T > 1:
                # New queries see everything cached plus the causal part of themselves.
                causal = False
                mask = torch.ones(T, start + T, dtype=torch.bool, device=x.device).tril(start)
        # GQA inside SDPA: no expanded copies of k/v (and no sum over the copies in backward).
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=self.n_kv != self.n_heads
        )
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class DecoderLayer(nn.Module):
    """Pre-norm attention + FFN, then (on PLE layers) the per-layer-embedding injection."""

    def __init__(self, cfg: ModelConfig, has_ple: bool, ops: Ops = REFERENCE_OPS):
        super().__init__()
        H, eps, std = cfg.hidden_size, cfg.norm_eps, cfg.init_std
        self.input_layernorm = RMSNorm(H, eps, fn=ops.rms_norm)
        self.self_attn = Attention(cfg, ops.rope)
        self.post_attention_layernorm = RMSNorm(H, eps, fn=ops.rms_norm)
        self.mlp = build_ffn(H, cfg.ffn, std, std / math.sqrt(2 * cfg.num_layers))
        self.ple = PerLayerInjection(cfg, ops.rms_norm) if has_ple else None

    def reset_parameters(self, ple_generator: torch.Generator | None = None) -> None:
        """The trunk's parts from the global RNG; the PLE injection from `ple_generator`."""
        for part in (self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp):
            part.reset_parameters()
        if self.ple is not None:
            self.ple.reset_parameters(ple_generator)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ple_input: Tensor | None = None,
                cache: KVCache | None = None, layer: int = 0) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, cache, layer)
        x = x + self.mlp(self.post_attention_layernorm(x))
        if self.ple is not None:
            x = x + self.ple(x, ple_input, cache, layer)
        return x


class LanguageModel(nn.Module):
    """Decoder-only LM with optional per-layer embeddings; `forward` returns (logits, loss).

    `device` is where the model runs: it decides `kernels = "auto"` and receives the weights (default:
    torch's default device). Weights are initialised on the CPU whatever the device, so one seed gives one
    model everywhere. On the meta device (`device="meta"` or under `torch.device("meta")`) the model is an
    uninitialised skeleton, to be filled by `load_state_dict(..., assign=True)`; under `torch.device("meta")`
    `device` still names where it will run, for the kernel choice.
    """

    def __init__(self, cfg: ModelConfig, device: torch.device | str | None = None):
        super().__init__()
        self.config = cfg
        target = torch.device(device) if device is not None else torch.get_default_device()
        skeleton = "meta" in (target.type, torch.get_default_device().type)
        self.ops = FUSED_OPS if fused_ops.fused_ops_enabled(cfg.kernels, target) else REFERENCE_OPS
        # Built on meta and initialised once below: the submodules' own initialisation at construction
        # would draw from the global RNG in an order that depends on dP (and be thrown away anyway).
        with torch.device("meta"):
            ple_layers = cfg.ple_layers
            self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.per_layer_inputs = PerLayerInputs(cfg, self.ops.rms_norm) if ple_layers else None
            # Slot of each layer in the packed PLE tensor (absent where the layer has no PLE).
            self.ple_slot = {layer: i for i, layer in enumerate(ple_layers)}
            if cfg.arch == "gemma4":
                layers = (
                    Gemma4DecoderLayer(cfg, i, i in self.ple_slot, self.ops.rms_norm, self.ops.rope)
                    for i in range(cfg.num_layers)
                )
            else:
                layers = (DecoderLayer(cfg, i in self.ple_slot, self.ops) for i in range(cfg.num_layers))
            self.layers = nn.ModuleList(layers)
            self.norm = RMSNorm(cfg.hidden_size, cfg.norm_eps, fn=self.ops.rms_norm)
            self.lm_head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        cos, sin = self.rope_buffers(cfg, "meta")
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if not skeleton:
            self.materialize(target)

    def materialize(self, device: torch.device | str | None = None) -> LanguageModel:
        """Give a meta-device skeleton real weights: allocated and initialised on the CPU from the global RNG, as
        the constructor does for a real device, then moved to `device`; returns self.

        A part swapped in before (a PLE table holding only some rows: plelab.parallel) gets the numbers the
        whole model would give it, so nothing bigger than that part is ever allocated."""
        self.to_empty(device="cpu")
        self.rope_cos, self.rope_sin = self.rope_buffers(self.config, "cpu")
        self.reset_parameters()
        return self.to(device if device is not None else torch.get_default_device())

    @staticmethod
    def rope_buffers(cfg: ModelConfig, device=None) -> tuple[Tensor, Tensor]:
        """The RoPE cos/sin tables for `cfg.max_seq_len` positions (empty for gemma4, whose two attention kinds
        have tables of their own, made per forward by plelab.model.gemma4.layer_rope)."""
        length = 0 if cfg.arch == "gemma4" else cfg.max_seq_len
        return rope_tables(cfg.head_size, length, cfg.rope_theta, device)

    def rope_slice(self, start: int, length: int, device=None) -> tuple[Tensor, Tensor]:
        """cos/sin rows for positions start..start+length, from the buffers when they are long enough."""
        if start + length > self.rope_cos.shape[0]:
            cos, sin = rope_tables(self.config.head_size, start + length, self.config.rope_theta, device)
        else:
            cos, sin = self.rope_cos, self.rope_sin
        return cos[start : start + length], sin[start : start + length]

    def reset_parameters(self, ple_seed: int | None = None) -> None:
        """Initialise every weight, each module by its own `reset_parameters`, in a fixed order.

        The trunk (embedding, attention, FFN, norms, head) draws from torch's global RNG, the PLE parts
        from a generator of their own seeded with `ple_seed` (default: one draw of the global RNG, made at
        every dP, dP = 0 included). So after `torch.manual_seed(s)` the trunk is bit-identical whatever
        dP is, and so is the global RNG state left behind (data order, sampling, ...).
        """
        cfg = self.config
        if ple_seed is None:
            ple_seed = int(torch.randint(0, 2**62, (1,)))
        ple_gen = torch.Generator(device=self.embed_tokens.weight.device).manual_seed(ple_seed)
        nn.init.normal_(self.embed_tokens.weight, std=cfg.init_std)
        if self.per_layer_inputs is not None:
            self.per_layer_inputs.reset_parameters(ple_gen)
        for layer in self.layers:
            layer.reset_parameters(ple_gen)
        self.norm.reset_parameters()
        if self.lm_head is not None:
            nn.init.normal_(self.lm_head.weight, std=cfg.init_std)

    def output_weight(self) -> Tensor:
        """The (V, H) output-head matrix (the input embedding when tied)."""
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def check_ids(self, input_ids: Tensor | np.ndarray | Sequence[int]) -> None:
        """Raise TokenIdError if any id is outside [0, vocab_size) (see `check_token_ids`: call it where the ids are
        made, on the host; the forward pass does not check)."""
        check_token_ids(input_ids, self.config.vocab_size)

    def hidden_states(self, input_ids: Tensor, cache: KVCache | None = None) -> Tensor:
        """Final normed hidden states (B, T, H). Ids are not checked here (no device-to-host sync per step, no
        graph break under compile): whoever makes the batch checks them (`check_token_ids`)."""
        x = self.embed(input_ids)
        ple = self.per_layer_inputs(input_ids, x, cache=cache) if self.per_layer_inputs is not None else None
        return self.run_layers(x, ple, cache)

    def embed(self, input_ids: Tensor) -> Tensor:
        """Token embeddings (B, T, H) as the first layer reads them (scaled by sqrt(H) where the config says)."""
        x = self.embed_tokens(input_ids)
        if self.config.scales_embedding:
            x = x * math.sqrt(self.config.hidden_size)
        return x

    def run_layers(self, x: Tensor, ple: Tensor | None = None, cache: KVCache | None = None) -> Tensor:
        """Final normed hidden states (B, T, H) of the decoder layers run on embeddings `x` (B, T, H).

        ple: the packed (B, T, L_ple, dP) PLE inputs (what `per_layer_inputs` returns; None for a model without
        PLE). Split from `hidden_states` so a caller can build its own embeddings and PLE vectors
        (plelab.vision: image patches, and a table indexed by patch ids).
        """
        T = x.shape[1]
        ples = [ple[:, :, self.ple_slot[i]] if ple is not None and i in self.ple_slot else None
                for i in range(len(self.layers))]
        if self.config.arch == "gemma4":
            x = gemma4_layers(self.layers, self.config, x, ples, cache)
        else:
            cos, sin = self.rope_slice(cache.pos if cache is not None else 0, T, x.device)
            for i, layer in enumerate(self.layers):
                x = layer(x, cos, sin, ples[i], cache, i)
        if cache is not None:
            cache.pos += T
        return self.norm(x)

    def logits(self, h: Tensor) -> Tensor:
        """The output head on final hidden states, soft-capped where the config says so (Gemma 4)."""
        logits = F.linear(h, self.output_weight())
        cap = self.config.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward(
        self,
        input_ids: Tensor,
        targets: Tensor | None = None,
        cache: KVCache | None = None,
        return_logits: bool = True,
    ) -> tuple[Tensor | None, Tensor | None]:
        """(logits, loss); targets = -100 are ignored. With targets and return_logits=False the logits
        are not returned, which lets the fused ops fuse the head into the loss (the training path)."""
        h = self.hidden_states(input_ids, cache)
        if targets is None:
            return self.logits(h[:, -1:] if cache is not None else h), None
        # The fused head + loss kernel knows no soft-capping.
        if not return_logits and self.config.logit_softcap is None:
            return None, self.ops.head_loss(h, self.output_weight(), targets)
        logits = self.logits(h)
        return (logits if return_logits else None), cross_entropy(logits, targets)
