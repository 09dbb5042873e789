"""Ablation: evaluation loss with PLE injections switched off, per layer and all at once.

delta = loss_ablated - loss_full, so positive means the trained model depends on PLE (it loses loss without it).
Dependence is not benefit: a model trained with a table adapts to it whether or not the table bought anything
against a model trained without one (plelab.diagnostics.benefit measures that). Three ways to switch a layer
off, all through forward hooks (no model code touched):
  zero     the injection y that `layers[i].ple` adds to the residual is replaced by zeros;
  shuffle  y is permuted across the batch's token positions: it keeps its distribution but loses what is
           specific to each token;
  table    the layer's table rows are permuted across positions (hook on the table lookup): the token
           identity is gone while the gate, the context path and the rest of the injection still run.
Each catches a failure the others miss: a trunk adapted to a noise injection (PLE fed ids unrelated to
the tokens) loses under 'zero'; an input-dependent gate times a learned mean row acts as an extra MLP on h
and loses under 'shuffle'; only 'table' asks whether the table itself - most of PLE's parameters -
carries anything. The primary delta is the smallest over the modes run: PLE counts as used only if
every way of removing it costs loss. The noise of each delta is the standard error of the paired
per-batch deltas (n batches).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from plelab.diagnostics.model_parts import as_batches, lm_loss, model_device, ple_layers, unwrap

ABLATION_MODES = ("zero", "shuffle", "table")
"""How a layer's PLE is switched off; the primary delta is the smallest over the modes run."""


def _permutation(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randperm(n, generator=generator).to(device)


def injection_hook(mode: str, generator: torch.Generator):
    """A forward hook replacing a PLE injection: zeros (`zero`) or a shuffle across positions (`shuffle`)."""
    def hook(module, args, output):
        if mode == "zero":
            return torch.zeros_like(output)
        flat = output.reshape(-1, output.shape[-1])
        return flat[_permutation(flat.shape[0], generator, flat.device)].view_as(output)

    return hook


def table_hook(slots: list[int], num_slots: int, generator: torch.Generator):
    """A forward hook shuffling the looked-up PLE rows of `slots` across positions."""
    def hook(module, args, output):
        rows = output.reshape(-1, num_slots, output.shape[-1] // num_slots).clone()
        perm = _permutation(rows.shape[0], generator, rows.device)
        rows[:, slots] = rows[perm][:, slots]
        return rows.view_as(output)

    return hook


@contextmanager
def ple_ablated(model: nn.Module, layers: Iterable[int], mode: str = "zero", seed: int = 0) -> Iterator[None]:
    """Within the block, the PLE of `layers` is switched off in one of ABLATION_MODES (see module docstring)."""
    if mode not in ABLATION_MODES:
        raise ValueError(f"ablation mode must be one of {ABLATION_MODES}, got {mode!r}")
    bare = unwrap(model)
    generator = torch.Generator().manual_seed(seed)
    if mode == "table":
        inputs = bare.per_layer_inputs
        hook = table_hook([bare.ple_slot[i] for i in layers], inputs.num_layers, generator)
        handles = [inputs.embed_tokens_per_layer.register_forward_hook(hook)]
    else:
        handles = [bare.layers[i].ple.register_forward_hook(injection_hook(mode, generator)) for i in layers]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@torch.no_grad()
def batch_losses(model: nn.Module, batches: list) -> list[tuple[float, int]]:
    """(mean loss, target token count) of each (x, y) batch, in eval mode."""
    bare = unwrap(model)
    was_training = bare.training
    bare.eval()
    try:
        out = []
        for x, y in batches:
            loss, n = lm_loss(bare, x, y)
            out.append((loss.item(), n))
        return out
    finally:
        bare.train(was_training)


def pooled_loss(losses: list[tuple[float, int]]) -> float:
    """Token-weighted mean of (mean loss, token count) pairs."""
    return sum(loss * n for loss, n in losses) / sum(n for _, n in losses)


def compare_losses(full: list[tuple[float, int]], ablated: list[tuple[float, int]]) -> dict[str, float]:
    """Paired loss change (ablated - full) over the batches: the pooled (token-weighted) delta, its standard error
    from the per-batch differences with the same weights, their count n, and the ablated loss."""
    diffs = [a - f for (a, _), (f, _) in zip(ablated, full, strict=True)]
    weights = [t for _, t in full]
    n, total = len(diffs), sum(weights)
    loss = pooled_loss(ablated)
    delta = loss - pooled_loss(full)  # = the token-weighted mean of the per-batch differences
    # the s.e. of that weighted mean (a ratio estimator); with equal batches it is sd / sqrt(n)
    se = (math.sqrt(n / (n - 1) * sum((w * (d - delta)) ** 2 for w, d in zip(weights, diffs, strict=True))) / total
          if n > 1 and total else float("nan"))
    return {"loss": loss, "delta": delta, "se": se, "n": n}


def _measure(model: nn.Module, batches: list, full: list, layers: list[int], modes: Iterable[str], seed: int) -> dict:
    out: dict = {}
    for mode in modes:
        with ple_ablated(model, layers, mode, seed):
            out[mode] = compare_losses(full, batch_losses(model, batches))
    primary = min(out, key=lambda m: out[m]["delta"])
    out["delta"] = out[primary]["delta"]
    out["se"] = out[primary]["se"]
    out["n"] = out[primary]["n"]
    out["primary_mode"] = primary
    return out


def ablation_study(
    model: nn.Module, batches: Iterable, layers: list[int] | None = None,
    modes: Iterable[str] = ABLATION_MODES, seed: int = 0,
) -> dict:
    """Loss with all PLE on, then with each layer's PLE (and all of it) switched off, on (x, y) batches.

    Returns {'loss_full', 'n_batches', 'n_tokens', 'modes', 'layers': {i: per-mode {'loss', 'delta', 'se', 'n'}
    plus the primary 'delta', 'se', 'n', 'primary_mode'}, 'all': the same for every layer off at once}; {} without
    PLE.
    """
    bare = unwrap(model)
    layers = ple_layers(bare) if layers is None else list(layers)
    if not layers:
        return {}
    data = as_batches(batches, model_device(bare))
    if any(y is None for _, y in data):
        raise ValueError("ablation needs (x, y) batches with targets")
    data = [(x, y) for x, y in data if bool((y >= 0).any())]  # all-padding batches carry no loss
    if not data:
        raise ValueError("ablation needs at least one batch with a target >= 0")
    modes = tuple(modes)
    full = batch_losses(bare, data)
    return {
        "loss_full": pooled_loss(full),
        "n_batches": len(data),
        "n_tokens": sum(n for _, n in full),
        "modes": list(modes),
        "layers": {i: _measure(bare, data, full, [i], modes, seed) for i in layers},
        "all": _measure(bare, data, full, layers, modes, seed),
    }
