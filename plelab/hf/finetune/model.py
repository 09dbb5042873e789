"""The model a fine-tune trains: a frozen transformers Gemma with LoRA adapters (peft), its PLE table on disk.

`FinetuneModel` registers only what trains (the adapters' A and B matrices, and the table delta when the table
trains), so `state_dict()`, `parameters()`, DDP and plelab's checkpoints see those alone, a few MB, while
`forward` runs the whole model. The frozen weights are held by the transformers model beside it (`.hf`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from plelab.hf.checkpoint import HFCheckpoint
from plelab.hf.finetune.config import FinetuneSettings
from plelab.hf.finetune.table_delta import TableWithDelta
from plelab.hf.finetune.targets import layer_linear_paths, resolve_targets, target_regex
from plelab.hf.model import HFTextModel, chunked_lm_loss, load_text_model, text_model_skeleton
from plelab.model.config import ModelConfig

INTERNAL_PREFIX = "model"
"""Where the decoder layers sit in the *ForCausalLM plelab builds (model.layers.N...)."""
ADAPTER_NAME = "default"


def lora_config(settings: FinetuneSettings, paths: list[str], layers_prefix: str, base: str | None = None):
    """The peft LoraConfig of a fine-tune, its target_modules anchored at `{layers_prefix}.layers.N`."""
    from peft import LoraConfig

    return LoraConfig(r=settings.rank, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                      target_modules=target_regex(layers_prefix, paths), task_type="CAUSAL_LM",
                      base_model_name_or_path=base)


def target_paths(ckpt: HFCheckpoint, settings: FinetuneSettings) -> list[str]:
    """The layer-relative paths of the linear layers to adapt (checked on a weightless 'meta' copy)."""
    skeleton = text_model_skeleton(ckpt, device="meta")
    return resolve_targets(settings.targets, layer_linear_paths(skeleton.model.layers))


def resolve_base_dtype(settings: FinetuneSettings, computes_bf16: bool) -> torch.dtype:
    """float32 / bfloat16 for the frozen weights ('auto' follows the run's precision)."""
    if settings.base_dtype == "auto":
        return torch.bfloat16 if computes_bf16 else torch.float32
    return getattr(torch, settings.base_dtype)


class FinetuneModel(nn.Module):
    """LoRA adapters (and optionally a PLE-table delta) over a frozen transformers Gemma text model.

    forward(x, y) -> (None, mean next-token loss over y >= 0), the contract of plelab's Trainer and
    evaluation; forward(x) -> (logits, None)."""

    def __init__(self, hf: HFTextModel, config: ModelConfig, settings: FinetuneSettings, paths: list[str],
                 table: TableWithDelta | None = None):
        super().__init__()
        self.hf = hf  # a dataclass, not a Module: the frozen model stays out of state_dict() and parameters()
        self.config = config
        self.settings = settings
        self.paths = paths
        self.adapters = nn.ModuleDict()
        for name, module in hf.lm.named_modules():
            if hasattr(module, "lora_A") and ADAPTER_NAME in getattr(module, "lora_A", {}):
                pair = nn.ModuleDict({"lora_A": module.lora_A[ADAPTER_NAME], "lora_B": module.lora_B[ADAPTER_NAME]})
                self.adapters[name.replace(".", ":")] = pair.float()
        self.table = table

    @property
    def layers(self) -> nn.ModuleList:
        """The decoder layers (activation checkpointing wraps each one)."""
        return self.hf.layers

    def train(self, mode: bool = True) -> FinetuneModel:
        """Train/eval mode for the adapters and the whole transformers model (dropout)."""
        super().train(mode)
        self.hf.lm.train(mode)
        return self

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None, return_logits: bool = True) -> tuple[Any, Any]:
        if y is None:
            return self.hf.lm(input_ids=x, use_cache=False).logits, None
        h = self.hf.text(input_ids=x, use_cache=False).last_hidden_state
        loss, _ = chunked_lm_loss(h, y, self.hf.lm.lm_head, getattr(self.hf.lm.config, "final_logit_softcapping", None))
        return None, loss

    def adapter_tensors(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """{module path in plelab's *ForCausalLM: (A, B)} on the CPU."""
        return {k.replace(":", "."): (v["lora_A"].weight.detach().cpu(), v["lora_B"].weight.detach().cpu())
                for k, v in self.adapters.items()}

    @property
    def scaling(self) -> float:
        """The factor on B A: alpha / rank."""
        return self.settings.alpha / self.settings.rank


def build_finetune_model(ckpt: HFCheckpoint, config: ModelConfig, settings: FinetuneSettings, device: torch.device,
                         dtype: torch.dtype, train_tokens=None) -> FinetuneModel:
    """Load the checkpoint's text model on `device` (table on disk), add LoRA, and the table delta when
    settings.table == 'sparse' (its rows: those `train_tokens` looks up). LoRA's A matrices are drawn from
    torch's global RNG (seed it first)."""
    from peft import inject_adapter_in_model

    paths = target_paths(ckpt, settings)
    hf = load_text_model(ckpt, dtype, device=device, attn_implementation=settings.attention)
    inject_adapter_in_model(lora_config(settings, paths, INTERNAL_PREFIX), hf.lm, adapter_name=ADAPTER_NAME)
    if settings.table_in_memory:
        from plelab.hf.finetune.table_delta import LoadedTable

        hf.text.embed_tokens_per_layer = LoadedTable(hf.table, device)
    table = None
    if settings.table == "sparse":
        from plelab.hf.finetune.table_delta import touched_rows

        rows = touched_rows(train_tokens, ckpt.ple_vocab_size) if train_tokens is not None else np.arange(0)
        table = TableWithDelta(hf.table, rows, device)
        hf.text.embed_tokens_per_layer = table
    return FinetuneModel(hf, config, settings, paths, table)
