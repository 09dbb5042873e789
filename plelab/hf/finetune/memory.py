"""Per-device memory of a LoRA fine-tune (`plelab train-memory --finetune PATH`), with the PLE table on disk (what
`plelab finetune` does) and on the device (what frameworks do), for a checkpoint folder or a config.json alone.

Parameter counts are exact: the checkpoint's transformers model is built on the 'meta' device (no memory),
with peft's adapters on the chosen layers, and counted. Activations are measured the same way: one forward
pass on 'meta' tensors of the micro-batch's shape, with a saved-tensors hook adding up the distinct storages
autograd keeps for backward (parameters excluded), attention through the SDPA path `plelab finetune` uses.
On a real CUDA device the flash / memory-efficient kernels keep the attention output and a log-sum-exp per
head and position; on 'meta' SDPA's math path may keep the T x T probabilities instead, so the measured figure
is an upper bound where that happens (tests/hf/test_finetune_memory_estimate.py compares it with a real CPU pass).
With activation checkpointing, each decoder layer keeps its input and one layer's activations exist at a
time: measured per layer (hooks on the layers), the estimate is the non-layer part + every layer's input +
the largest layer's activations.

Parts (bytes; b = bytes per frozen value, 2 in bf16; W = L x dP; tokens = micro-batch x seq_len):
    frozen_weights       the model without its PLE table, b each (vision / audio towers are never loaded)
    ple_table            V_ple x W x b on the device, 0 on disk
    adapters             LoRA A and B (fp32): 4 per parameter; their gradients 4; AdamW moments 8
    table_delta          finetune.table = sparse: touched rows x W x 12 (value, two moments) + a sparse
                         gradient of tokens x (4 W + 8)
    activations          measured, see above
    ple_rows_transient   the batch's table rows on the device: tokens x W x b (both placements produce them)
    head_transient       one chunk of LOGIT_CHUNK positions' logits, bf16 + fp32 + fp32 gradient
                         (plelab computes the loss a chunk at a time; all positions at once would be
                         tokens x V x (b + 8), reported as head_unchunked_bytes)
    overhead             CUDA context, allocator fragmentation: a fixed allowance (default 3 GiB)
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.hf.checkpoint import HFCheckpoint, read_config, text_config_of
from plelab.hf.finetune.config import FinetuneSettings
from plelab.hf.finetune.model import INTERNAL_PREFIX, lora_config
from plelab.hf.finetune.targets import layer_linear_paths, resolve_targets
from plelab.hf.model import LOGIT_CHUNK, text_model_skeleton

GiB = 1024**3


@dataclass(frozen=True)
class CheckpointShape:
    """What the estimate needs of a checkpoint: its family and text config (a folder, or a config.json alone)."""

    path: Path
    family: str
    text_config: dict[str, Any]
    table_dtype_bytes: int | None = None
    """Bytes per stored table value when the shards are at hand (None for a config.json alone)."""

    @classmethod
    def of(cls, source: str | Path) -> CheckpointShape:
        """From a Hugging Face folder (config.json + shards) or a config.json file."""
        p = Path(source)
        if p.is_file() and p.suffix == ".json":
            import json

            try:
                cfg = json.loads(p.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError) as exc:
                raise PlelabError(f"{p}: not valid JSON ({exc})") from None
            family, text = text_config_of(cfg, p)
            return cls(p, family, text)
        if p.is_dir() and any(p.glob("*.safetensors")):
            ckpt = HFCheckpoint.open(p)
            from plelab.util.safetensors import DTYPES

            return cls(p, ckpt.family, ckpt.text_config, DTYPES[ckpt.table.dtype][1])
        family, text = text_config_of(read_config(p), p)
        return cls(p, family, text)

    @property
    def table_shape(self) -> tuple[int, int]:
        """(V_ple, L x dP)."""
        t = self.text_config
        return t["vocab_size_per_layer_input"], t["num_hidden_layers"] * t["hidden_size_per_layer_input"]


@dataclass
class FinetuneMemoryRequest:
    """What to estimate: the checkpoint shape, the fine-tuning settings and the step's shape."""

    shape: CheckpointShape
    settings: FinetuneSettings = field(default_factory=FinetuneSettings)
    micro_batch: int = 8
    seq_len: int = 512
    bf16: bool = True
    activation_checkpointing: bool = False
    touched_rows: int | None = None
    overhead: float = 3 * GiB
    gpu_memory: float | None = None


@contextlib.contextmanager
def _meta_forward_allowed():
    """transformers' mask code reads two facts from tensor values, which 'meta' tensors lack; training batches
    answer both the same way: no packed sequences, no padding. Everything else it decides as it would."""
    import transformers.masking_utils as masking

    packed, ignore = masking.find_packed_sequence_indices, masking._ignore_causal_mask_sdpa
    masking.find_packed_sequence_indices = lambda position_ids: None
    masking._ignore_causal_mask_sdpa = lambda padding_mask, *args, **kwargs: ignore(None, *args, **kwargs)
    try:
        yield
    finally:
        masking.find_packed_sequence_indices, masking._ignore_causal_mask_sdpa = packed, ignore


class _FlashShaped(torch.autograd.Function):
    """What a fused SDPA kernel (flash / memory-efficient, CUDA and CPU) keeps for backward: q, k, v, the output
    and one float32 log-sum-exp per head and position; its output has the right shape, no values ('meta')."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None  # noqa: ANN001
                ) -> torch.Tensor:
        # (B, T, H, D) in memory, viewed as (B, H, T, D), as the kernels return it: the caller's transpose back
        # and .contiguous() then copy nothing, so o_proj's input is this same storage.
        b, h, t, _ = q.shape
        out = q.new_empty(b, t, h, v.shape[-1]).transpose(1, 2)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        ctx.save_for_backward(q, k, v, out, lse, *([] if mask is None else [mask]))  # a mask is kept too
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # noqa: ANN001, ANN205 - never called (forward-only measurement)
        raise NotImplementedError


def _flash_shaped_attention(module, query, key, value, attention_mask, **kwargs):  # noqa: ANN001, ANN201, ARG001
    """transformers attention interface: (B, H, T, D) inputs -> ((B, T, H, D) output, no weights)."""
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # SDPA takes an additive float mask
        attention_mask = torch.zeros(attention_mask.shape, dtype=query.dtype, device=query.device)
    return _FlashShaped.apply(query, key, value, attention_mask).transpose(1, 2).contiguous(), None


FLASH_SHAPED = "plelab_fused_kernel_shape"  # not "flash": transformers reads that as a kernel name


def _model(shape: CheckpointShape, settings: FinetuneSettings, dtype: torch.dtype, device: str) -> nn.Module:
    """The *ForCausalLM with adapters on `device` ('meta': nothing allocated) and a full-size frozen table."""
    from peft import inject_adapter_in_model
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(FLASH_SHAPED, _flash_shaped_attention)
    AttentionMaskInterface.register(FLASH_SHAPED, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])  # the masks SDPA gets
    attention = FLASH_SHAPED if device == "meta" else settings.attention
    lm = text_model_skeleton(shape, dtype, device, attention)  # duck-typed: family, text_config, path
    rows, width = shape.table_shape
    lm.model.embed_tokens_per_layer = nn.Embedding(rows, width, device=device, dtype=dtype)
    lm.requires_grad_(False)
    paths = resolve_targets(settings.targets, layer_linear_paths(lm.model.layers))
    inject_adapter_in_model(lora_config(settings, paths, INTERNAL_PREFIX), lm)
    for name, p in lm.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()
    lm.plelab_paths = paths
    return lm


def saved_activation_bytes(lm: nn.Module, batch: int, seq_len: int, device: str = "meta"
                           ) -> tuple[int, dict[int, int], int]:
    """(bytes autograd keeps after one forward + the chunked loss's input, bytes per decoder layer, bytes of one
    layer's input) for input ids of (batch, seq_len); distinct storages, parameters and buffers excluded."""
    frozen = {t.untyped_storage()._cdata for t in [*lm.parameters(), *lm.buffers()]}
    seen: dict[int, tuple[int, int]] = {}
    current = [-1]

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st._cdata not in frozen and st._cdata not in seen:
            seen[st._cdata] = (current[0], st.nbytes())
        return t

    def enter(i: int):
        return lambda module, args: current.__setitem__(0, i)

    handles = [layer.register_forward_pre_hook(enter(i)) for i, layer in enumerate(lm.model.layers)]
    handles.append(lm.model.norm.register_forward_pre_hook(lambda module, args: current.__setitem__(0, -1)))
    ids = torch.zeros((batch, seq_len), dtype=torch.long, device=device)
    try:
        with _meta_forward_allowed() if device == "meta" else contextlib.nullcontext():
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                h = lm.model(input_ids=ids, use_cache=False).last_hidden_state
    finally:
        for handle in handles:
            handle.remove()
    per_layer: dict[int, int] = {}
    for layer, nbytes in seen.values():
        per_layer[layer] = per_layer.get(layer, 0) + nbytes
    # The chunked loss keeps the final hidden states (its checkpointed chunks recompute the logits).
    total = sum(per_layer.values()) + h.numel() * h.element_size()
    streams = int(shape_streams(lm))
    layer_input = streams * batch * seq_len * lm.config.hidden_size * h.element_size()
    return total, {i: n for i, n in per_layer.items() if i >= 0}, layer_input


def shape_streams(lm: nn.Module) -> int:
    """Residual streams a decoder layer takes (Gemma 3n's AltUp keeps altup_num_inputs, Gemma 4 one)."""
    return getattr(lm.config, "altup_num_inputs", 1) if hasattr(lm.model, "altup_projections") else 1


def finetune_memory(req: FinetuneMemoryRequest) -> dict[str, Any]:
    """The estimate as a JSON-friendly dict (see the module docstring for every part)."""
    dtype = torch.bfloat16 if req.bf16 else torch.float32
    b = 2 if req.bf16 else 4
    s = req.settings
    base = resolve_dtype_bytes(s.base_dtype, req.bf16)
    lm = _model(req.shape, s, dtype, "meta")
    rows, width = req.shape.table_shape
    table = rows * width
    lora = sum(p.numel() for n, p in lm.named_parameters() if "lora_" in n)
    frozen = sum(p.numel() for n, p in lm.named_parameters() if "lora_" not in n) - table
    act, per_layer, layer_input = saved_activation_bytes(lm, req.micro_batch, req.seq_len)
    if req.activation_checkpointing and per_layer:
        act = act - sum(per_layer.values()) + len(per_layer) * layer_input + max(per_layer.values())
    tokens = req.micro_batch * req.seq_len
    vocab = req.shape.text_config["vocab_size"]
    touched = min(rows, req.touched_rows if req.touched_rows is not None else rows)
    parts = {
        "frozen_weights": frozen * base,
        "ple_table": table * base,
        "adapters": 4 * lora, "adapter_gradients": 4 * lora, "adapter_optimizer": 8 * lora,
        "table_delta": 12 * touched * width if s.table == "sparse" else 0,
        "table_delta_gradient": tokens * (4 * width + 8) if s.table == "sparse" else 0,
        "activations": act,
        "ple_rows_transient": tokens * width * b,
        "head_transient": min(tokens, LOGIT_CHUNK) * vocab * (b + 8),
        "overhead": req.overhead,
    }
    on_device = {**parts, "total": sum(parts.values())}
    on_disk = {**parts, "ple_table": 0}
    on_disk["total"] = sum(v for k, v in on_disk.items())
    result: dict[str, Any] = {
        "model": {"source": str(req.shape.path), "family": req.shape.family,
                  "frozen_params_without_table": frozen, "ple_table_params": table, "table_shape": [rows, width],
                  "lora_params": lora, "adapted": lm.plelab_paths, "rank": s.rank},
        "step": {"micro_batch": req.micro_batch, "seq_len": req.seq_len, "tokens": tokens,
                 "compute": "bf16" if req.bf16 else "fp32", "frozen_bytes_per_value": base,
                 "activation_checkpointing": req.activation_checkpointing,
                 "table": s.table, "touched_rows": touched if s.table == "sparse" else None},
        "table_on_disk_bytes": on_disk,
        "table_on_device_bytes": on_device,
        "table_saving_bytes": on_device["total"] - on_disk["total"],
        "head_unchunked_bytes": tokens * vocab * (b + 8),
        "activation_bytes_per_token": act / tokens,
    }
    if req.shape.table_dtype_bytes is not None:
        result["model"]["table_bytes_on_disk"] = table * req.shape.table_dtype_bytes
    if req.gpu_memory:
        result["gpu_memory_bytes"] = req.gpu_memory
        result["fits"] = {"table_on_disk": on_disk["total"] <= req.gpu_memory,
                          "table_on_device": on_device["total"] <= req.gpu_memory}
    return result


def resolve_dtype_bytes(base_dtype: str, bf16: bool) -> int:
    """Bytes per frozen value: 'auto' follows the compute precision."""
    if base_dtype == "auto":
        return 2 if bf16 else 4
    return 2 if base_dtype == "bfloat16" else 4


PUBLIC_REPORT = {
    "what": "a transformers issue report: Gemma 3n E4B inference with an 8.5k-token prefill; moving the PLE table "
            "to the CPU took GPU memory from 10.11 to 4.48 GB (saved 5.63 GB), with identical outputs",
    "differs": "inference, not training: no adapters, gradients or optimizer state, a KV cache instead of "
               "saved activations, and the whole prefill's activations at once; the unit (GB or GiB) and the "
               "measure (allocated or reserved) are not stated, and its saving exceeds the E4B table in bf16 "
               "(2.35e9 values = 4.70 GB = 4.38 GiB), so the report also freed something besides the table "
               "(e.g. the lookup's float32 intermediate or allocator slack)",
    "before_gb": 10.11, "after_gb": 4.48,
}


def gib(n: float) -> str:
    """n bytes in GiB, for the text table."""
    return f"{n / GiB:8.2f} GiB"
