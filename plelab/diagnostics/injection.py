"""Injection ratio per PLE layer, RMS(y) / RMS(h), measured with forward hooks on `layers[i].ple`.

Each PerLayerInjection gets the hidden state h (after that layer's attention and FFN) and returns the
contribution y that the layer adds to the residual, so one forward hook sees both. Gate statistics are
pooled in the same pass (they need the same h).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from plelab.diagnostics.gates import GATE_NEAR_ZERO, GateAccumulator
from plelab.diagnostics.model_parts import as_batches, model_device, ple_layers, unwrap


class _LayerProbe:
    """Sums of squares of h and y plus gate statistics for one layer."""

    def __init__(self, near_zero: float):
        self.hh = 0.0
        self.yy = 0.0
        self.gate = GateAccumulator(near_zero)

    def hook(self, module, args, kwargs, output) -> None:
        h = args[0] if args else kwargs["h"]
        ple_input = args[1] if len(args) > 1 else kwargs.get("ple_input")
        with torch.no_grad():
            self.hh += h.detach().float().pow(2).sum().item()
            self.yy += output.detach().float().pow(2).sum().item()
            self.gate.add(module, h.detach(), ple_input)

    def result(self) -> dict[str, float]:
        # h and y have the same shape, so the element counts cancel in the ratio of RMS values.
        ratio = (self.yy / self.hh) ** 0.5 if self.hh > 0 else float("nan")
        return {"injection_ratio": ratio, **self.gate.result()}


@torch.no_grad()
def probe_layers(
    model: torch.nn.Module, batches: Iterable, near_zero: float = GATE_NEAR_ZERO
) -> dict[int, dict[str, float]]:
    """Per PLE layer: injection ratio, mean |gate| and near-zero gate fraction, pooled over `batches`."""
    bare = unwrap(model)
    layers = ple_layers(bare)
    if not layers:
        return {}
    probes = {i: _LayerProbe(near_zero) for i in layers}
    handles = [bare.layers[i].ple.register_forward_hook(probes[i].hook, with_kwargs=True) for i in layers]
    was_training = bare.training
    bare.eval()
    try:
        for x, _ in as_batches(batches, model_device(bare)):
            bare(x)
    finally:
        for handle in handles:
            handle.remove()
        bare.train(was_training)
    return {i: probes[i].result() for i in layers}
