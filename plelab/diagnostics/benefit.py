"""Does the table pay? The paired loss difference between a model and its dP = 0 twin on the same batches.

The model and its twin (plelab.diagnostics.twin) are scored on the same evaluation batches; the per-batch
differences give the mean, its standard error and the four-way verdict (plelab.diagnostics.verdict.pays_verdict).
One pair of runs: the interval is the evaluation sample's noise, not the spread between seeds.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from plelab.diagnostics.ablation import batch_losses, compare_losses
from plelab.diagnostics.model_parts import as_batches, model_device, unwrap
from plelab.diagnostics.verdict import PAYS_MARGIN, pays_verdict


def paired_gain(model: nn.Module, twin: nn.Module, batches: list, margin: float = PAYS_MARGIN) -> dict[str, Any]:
    """The pays verdict of `model` against `twin` on (x, y) batches: delta = loss(model) - loss(twin)."""
    bare, other = unwrap(model), unwrap(twin)
    if bare.config.vocab_size != other.config.vocab_size:
        raise ValueError(f"the twin's vocabulary ({other.config.vocab_size}) is not the model's "
                         f"({bare.config.vocab_size})")
    data = [(x, y) for x, y in as_batches(batches, model_device(bare)) if y is not None and bool((y >= 0).any())]
    if not data:
        raise ValueError("the pays verdict needs (x, y) batches with targets")
    mine = batch_losses(bare, data)
    theirs = batch_losses(other, [(x.to(model_device(other)), y.to(model_device(other))) for x, y in data])
    paired = compare_losses(theirs, mine)
    judged = pays_verdict(paired["delta"], paired["se"], paired["n"], margin)
    return {**judged, "loss": paired["loss"], "twin_loss": paired["loss"] - paired["delta"], "delta": paired["delta"],
            "se": paired["se"], "n_batches": paired["n"]}
