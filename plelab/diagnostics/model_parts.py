"""Where a model's PLE parts live: unwrapping wrappers, PLE layer indices, the table, parameter groups."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The bare LanguageModel under torch.compile (`_orig_mod`) and DDP/FSDP (`module`) wrappers."""
    while True:
        inner = getattr(model, "_orig_mod", None)
        if not isinstance(inner, nn.Module):
            inner = getattr(model, "module", None)
        if not isinstance(inner, nn.Module):
            return model
        model = inner


def ple_layers(model: nn.Module) -> list[int]:
    """Indices of the decoder layers that carry a PLE injection (empty for dP = 0)."""
    model = unwrap(model)
    return [i for i, layer in enumerate(model.layers) if getattr(layer, "ple", None) is not None]


def ple_table(model: nn.Module) -> torch.Tensor | None:
    """The (V_ple, L_ple * dP) table parameter, or None without PLE."""
    inputs = getattr(unwrap(model), "per_layer_inputs", None)
    return None if inputs is None else inputs.embed_tokens_per_layer.weight


def table_layer_view(table: torch.Tensor, model: nn.Module) -> torch.Tensor:
    """The table as (rows, L_ple, width): slot s holds the s-th PLE layer's slice of every row (dP wide in a token
    table, dP / heads in an n-gram table)."""
    inputs = unwrap(model).per_layer_inputs
    return table.reshape(table.shape[0], inputs.num_layers, -1)


def is_ple_param(name: str) -> bool:
    """True for parameters that exist only because of PLE (table, context projection, injections)."""
    return name.startswith("per_layer_inputs.") or ".ple." in name


def trunk_parameters(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    """Named parameters of everything that is not PLE (the model that dP = 0 would give)."""
    for name, p in unwrap(model).named_parameters():
        if not is_ple_param(name):
            yield name, p


def as_batches(batches: Iterable, device: torch.device,
               vocab_size: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """Materialise (x, y) pairs (or bare x) as long tensors on `device` (diagnostics make several passes); with
    `vocab_size`, inputs outside the vocabulary are a TokenIdError (checked before they reach the device)."""
    from plelab.model.transformer import check_token_ids

    out = []
    for item in batches:
        x, y = item if isinstance(item, (tuple, list)) else (item, None)
        if vocab_size is not None:
            check_token_ids(torch.as_tensor(x), vocab_size)
        x = torch.as_tensor(x).long().to(device)
        out.append((x, None if y is None else torch.as_tensor(y).long().to(device)))
    return out


def lm_loss(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(mean next-token loss over targets >= 0, their count); negative targets are padding, whatever their value."""
    logits, _ = unwrap(model)(x)
    valid = y >= 0
    n = int(valid.sum())
    if n == 0:
        return logits.new_zeros((), dtype=torch.float32), 0
    return F.cross_entropy(logits[valid].float(), y[valid]), n


def model_device(model: nn.Module) -> torch.device:
    """Device of the model's first parameter."""
    return next(unwrap(model).parameters()).device
