"""The transformers Gemma 3n / Gemma 4 text model of a checkpoint, with its PLE table left on disk.

The model is built with a one-row table (so the (V_ple, L x dP) table is never allocated), the other
text-model weights are copied in row chunks from the shards, and the table module is replaced by a
StreamedEmbedding that preads the rows each batch needs. Vision and audio towers are not loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from plelab.hf.checkpoint import TABLE_SUFFIX, HFCheckpoint, HFCheckpointError
from plelab.util.safetensors import TensorInfo, gather_rows, read_rows, read_tensor

COPY_CHUNK_BYTES = 16 << 20
"""Bytes of a weight read at a time while loading (the biggest tensor is never whole twice)."""
LOGIT_CHUNK = 128
"""Positions whose logits exist at once in `lm_loss` (a 262k vocabulary makes full logits GBs)."""


class StreamedEmbedding(nn.Module):
    """nn.Embedding(...) * scale whose rows are read from a safetensors file on each call."""

    def __init__(self, info: TensorInfo, scale: float, dtype: torch.dtype):
        super().__init__()
        self.info, self.scale, self.dtype = info, scale, dtype
        self.num_embeddings, self.embedding_dim = info.shape
        self.row_transform = None
        """Optional (n, width) float32 -> float32 applied to the rows read (the quantization recipe stores them
        in a format and reads them back this way, row by row, as the exports quantize the table)."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.detach().reshape(-1).cpu().numpy()
        if len(flat) and (flat.min() < 0 or flat.max() >= self.num_embeddings):
            raise IndexError(f"token id {int(flat.max())} outside the PLE table's {self.num_embeddings} rows")
        rows = gather_rows(self.info, flat)
        if self.row_transform is not None:
            rows = torch.from_numpy(self.row_transform(rows.numpy()))
        rows = rows.to(self.dtype) * torch.tensor(self.scale, dtype=self.dtype)
        return rows.view(*ids.shape, self.embedding_dim).to(ids.device)

    def read_rows(self, ids: np.ndarray) -> torch.Tensor:
        """Unscaled float32 rows `ids` (table health reads the stored values)."""
        return gather_rows(self.info, ids)


def _classes(family: str):
    try:
        if family == "gemma3n":
            from transformers import Gemma3nForCausalLM, Gemma3nTextConfig
            return Gemma3nForCausalLM, Gemma3nTextConfig
        from transformers import Gemma4ForCausalLM, Gemma4TextConfig
        return Gemma4ForCausalLM, Gemma4TextConfig
    except ImportError as exc:
        raise HFCheckpointError(f"reading a Gemma checkpoint needs transformers>=5 (pip install 'plelab[hf]'): "
                                f"{exc}") from None


def _copy_in(param: torch.Tensor, info: TensorInfo) -> None:
    if not info.shape:
        param.copy_(read_tensor(info))
        return
    step = max(1, COPY_CHUNK_BYTES // max(1, info.row_bytes))
    for a in range(0, info.shape[0], step):
        b = min(info.shape[0], a + step)
        param[a:b].copy_(read_rows(info, a, b))


def _chunk_loss_sum(h: torch.Tensor, y: torch.Tensor, head: nn.Module, cap: float | None) -> torch.Tensor:
    logits = head(h).float()
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return F.cross_entropy(logits, y, reduction="sum")


def chunked_lm_loss(h: torch.Tensor, y: torch.Tensor, head: nn.Module, cap: float | None = None,
                    chunk: int = LOGIT_CHUNK) -> tuple[torch.Tensor, int]:
    """(mean cross-entropy of head(h) against targets y >= 0, their count), `chunk` positions' logits at a time.

    With gradients on, each chunk is recomputed in backward (activation checkpointing), so training keeps
    only the hidden states, never the (tokens x vocabulary) logits: 4.3 GB for 4,096 tokens of a 262k vocabulary.
    """
    valid = y >= 0
    n = int(valid.sum())
    if n == 0:
        return h.new_zeros((), dtype=torch.float32), 0
    hv, yv = h[valid], y[valid]
    total = h.new_zeros((), dtype=torch.float32)
    grad = torch.is_grad_enabled() and (hv.requires_grad or any(p.requires_grad for p in head.parameters()))
    for a in range(0, n, chunk):
        part = (hv[a : a + chunk], yv[a : a + chunk], head, cap)
        total = total + (checkpoint(_chunk_loss_sum, *part, use_reentrant=False) if grad else _chunk_loss_sum(*part))
    return total / n, n


@dataclass
class HFTextModel:
    """A loaded text model, its checkpoint, and where its PLE lives."""

    lm: nn.Module
    ckpt: HFCheckpoint

    @property
    def text(self) -> nn.Module:
        """The decoder (Gemma3nTextModel / Gemma4TextModel)."""
        return self.lm.model

    @property
    def layers(self) -> nn.ModuleList:
        """Decoder layers; each has per_layer_input_gate, act_fn, per_layer_projection, post_per_layer_input_norm."""
        return self.text.layers

    @property
    def table(self) -> StreamedEmbedding:
        """The streamed PLE table module."""
        return self.text.embed_tokens_per_layer

    def lm_loss(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(mean next-token loss over targets >= 0, their count), logits computed a chunk of positions at a time."""
        h = self.text(input_ids=x, use_cache=False).last_hidden_state
        cap = getattr(self.lm.config, "final_logit_softcapping", None)
        return chunked_lm_loss(h, y, self.lm.lm_head, cap)

    def parameter_bytes(self) -> int:
        """Bytes of the in-memory parameters and buffers (everything but the streamed table)."""
        seen, total = set(), 0
        for t in [*self.lm.parameters(), *self.lm.buffers()]:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total


def text_model_skeleton(ckpt: HFCheckpoint, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", attn_implementation: str = "eager") -> nn.Module:
    """The checkpoint's *ForCausalLM with uninitialised weights in `dtype` on `device`, its output head tied to the
    embedding when the config says so, and a one-row PLE table (the real table stays on disk); device "meta"
    allocates nothing, e.g. to list module names or count parameters."""
    model_cls, config_cls = _classes(ckpt.family)
    from transformers.initialization import no_init_weights

    try:
        cfg = config_cls.from_dict(dict(ckpt.text_config))
    except (ValueError, TypeError, KeyError) as exc:
        raise HFCheckpointError(f"{ckpt.path}: transformers rejects the text config ({exc})") from None
    cfg._attn_implementation = attn_implementation
    real_rows, pad = cfg.vocab_size_per_layer_input, cfg.pad_token_id
    cfg.vocab_size_per_layer_input = 1  # a one-row stand-in: the real table stays on disk
    # The embeddings' padding_idx only shapes training gradients, and a pad id >= 1 does not fit a one-row table.
    cfg.pad_token_id = None
    default = torch.get_default_dtype()
    try:  # built in place in its dtype and on its device: never a float32 copy of the whole model in RAM
        torch.set_default_dtype(dtype)
        with no_init_weights(), torch.device(device):
            lm = model_cls(cfg)
    finally:
        torch.set_default_dtype(default)
        cfg.vocab_size_per_layer_input, cfg.pad_token_id = real_rows, pad
    if getattr(cfg, "tie_word_embeddings", True):  # no_init_weights also skips transformers' tying
        lm.lm_head.weight = lm.model.embed_tokens.weight
    return lm


def load_text_model(ckpt: HFCheckpoint, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                    attn_implementation: str = "eager") -> HFTextModel:
    """The checkpoint's text model in `dtype` on `device`, eval mode, its PLE table streamed from disk.

    attn_implementation: "eager" (the reference path; SDPA's masks differ across transformers versions) or
    "sdpa" (no T x T attention matrix kept for backward: what fine-tuning uses)."""
    lm = text_model_skeleton(ckpt, dtype, device, attn_implementation)
    cfg = lm.config
    tied = bool(getattr(cfg, "tie_word_embeddings", True))  # tied by the skeleton: one tensor, read once
    lm.to(dtype).eval().requires_grad_(False)
    missing, used = [], {TABLE_SUFFIX}
    state = lm.state_dict(keep_vars=True)
    with torch.no_grad():
        for name, param in state.items():
            if name == f"model.{TABLE_SUFFIX}" or (tied and name == "lm_head.weight"):
                continue
            info = ckpt.lm_head if name == "lm_head.weight" else ckpt.tensors.get(name.removeprefix("model."))
            if info is None:
                missing.append(ckpt.prefix + name.removeprefix("model.") if name != "lm_head.weight" else name)
                continue
            if tuple(param.shape) != info.shape:
                raise HFCheckpointError(f"{ckpt.path}: config/weights mismatch: {ckpt.prefix}"
                                        f"{name.removeprefix('model.')} has shape {info.shape}, config.json "
                                        f"implies {tuple(param.shape)}")
            _copy_in(param, info)
            used.add(name.removeprefix("model."))
    # Published Gemma 3n / 4 shards also hold k/v projections and norms of the KV-shared layers, which
    # transformers' classes do not build and list as ignorable; they are not a mismatch.
    ignorable = [re.compile(p) for p in getattr(lm.model, "_keys_to_ignore_on_load_unexpected", None) or []]
    extra = sorted(k for k in set(ckpt.tensors) - used if not any(p.search(k) for p in ignorable))
    if missing or extra:
        names = missing[:3] if missing else [ckpt.prefix + e for e in extra[:3]]
        what = (f"lacks {len(missing)} tensor(s) the config implies" if missing
                else f"holds {len(extra)} text tensor(s) the config does not")
        what += f": {', '.join(names)}"
        raise HFCheckpointError(f"{ckpt.path}: config/weights mismatch: the checkpoint {what}")
    scale = float(ckpt.ple_dim) ** 0.5  # Gemma scales the per-layer rows by sqrt(dP), as its ScaledWordEmbedding
    lm.model.embed_tokens_per_layer = StreamedEmbedding(ckpt.table, scale, dtype)
    return HFTextModel(lm, ckpt)
