"""Gradient norms of each layer's PLE gate, projection and table slice, relative to the trunk's.

Read from `.grad` after a backward pass. The table's gradient may be sparse (nn.Embedding(sparse=True)):
a COO tensor whose duplicate row entries must be summed (coalesce) before taking a norm.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from plelab.diagnostics.model_parts import ple_layers, ple_table, table_layer_view, trunk_parameters, unwrap


def grad_norm(grad: torch.Tensor | None) -> float:
    """L2 norm of a dense or sparse gradient (0 when absent)."""
    if grad is None:
        return 0.0
    if grad.is_sparse:
        grad = grad.coalesce().values()
    return grad.detach().float().norm().item()


def table_slot_grad_norms(model: nn.Module) -> list[float]:
    """L2 norm of the table gradient restricted to each PLE layer's dP-wide slice."""
    table = ple_table(model)
    if table is None or table.grad is None:
        return [0.0] * len(ple_layers(model))
    grad = table.grad
    if grad.is_sparse:
        # values() holds one (L_ple * dP) row per distinct id that appeared in the batch.
        grad = grad.coalesce().values()
    per_slot = table_layer_view(grad.detach().float(), model)
    return per_slot.pow(2).sum(dim=(0, 2)).sqrt().tolist()


def _params_norm(params) -> float:
    return math.sqrt(sum(grad_norm(p.grad) ** 2 for p in params))


def _ratio(part: float, trunk: float) -> float:
    return part / trunk if trunk > 0 else float("nan")


def grad_norm_ratios(model: nn.Module) -> dict:
    """{'trunk_grad_norm', 'table': ratio, 'context': ratio, 'layers': {i: {'gate', 'proj', 'table'}}}.

    Every ratio is ||grad of the part||_2 / ||grad of all trunk (non-PLE) parameters||_2.
    """
    bare = unwrap(model)
    layers = ple_layers(bare)
    trunk = _params_norm(p for _, p in trunk_parameters(bare))
    out: dict = {"trunk_grad_norm": trunk, "layers": {}}
    if not layers:
        return out
    inputs = bare.per_layer_inputs
    out["table"] = _ratio(grad_norm(inputs.embed_tokens_per_layer.weight.grad), trunk)
    context = [p for n, p in inputs.named_parameters() if not n.startswith("embed_tokens_per_layer")]
    out["context"] = _ratio(_params_norm(context), trunk) if context else None
    slots = table_slot_grad_norms(bare)
    for i in layers:
        inj = bare.layers[i].ple
        gate = [inj.per_layer_input_gate.weight] if inj.gate_kind == "input" else [inj.gate]
        out["layers"][i] = {
            "gate": _ratio(_params_norm(gate), trunk),
            "proj": _ratio(_params_norm([inj.per_layer_projection.weight]), trunk),
            "table": _ratio(slots[bare.ple_slot[i]], trunk),
        }
    return out
