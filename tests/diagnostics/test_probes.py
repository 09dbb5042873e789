"""Injection ratio, gate statistics and gradient-norm ratios (dense and sparse table gradients)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from plelab.diagnostics.grads import grad_norm, grad_norm_ratios, table_slot_grad_norms
from plelab.diagnostics.injection import probe_layers
from plelab.diagnostics.model_parts import ple_layers, unwrap


def test_injection_ratio_scales_with_the_output_norm_weight(make_model, chain):
    model = make_model()
    batches = [chain(1, 4, 16)]
    base = probe_layers(model, batches)
    with torch.no_grad():
        model.layers[1].ple.post_per_layer_input_norm.weight.mul_(3.0)
        model.layers[0].ple.post_per_layer_input_norm.weight.zero_()
    scaled = probe_layers(model, batches)
    assert scaled[0]["injection_ratio"] == 0.0
    # Zeroing layer 0 changed layer 1's h, so check layer 1's scaling on a model whose layer 0 is untouched.
    ref = make_model()
    with torch.no_grad():
        ref.layers[1].ple.post_per_layer_input_norm.weight.mul_(3.0)
    assert math.isclose(probe_layers(ref, batches)[1]["injection_ratio"], 3 * base[1]["injection_ratio"], rel_tol=1e-5)
    assert not model.layers[0].ple._forward_hooks  # probes leave no hooks behind


@pytest.mark.parametrize(("value", "closed"), [(0.5, 0.0), (0.005, 1.0), (0.0, 1.0)])
def test_scalar_gate_statistics(make_model, chain, value, closed):
    model = make_model(gate="scalar", output_norm=False)
    with torch.no_grad():
        for layer in model.layers:
            layer.ple.gate.fill_(value)
    stats = probe_layers(model, [chain(1, 2, 8)])
    for s in stats.values():
        assert math.isclose(s["gate_mean_abs"], value, rel_tol=1e-6)
        assert s["gate_near_zero_frac"] == closed
        assert (s["injection_ratio"] == 0.0) == (value == 0.0)


def test_input_gate_statistics_are_fractions(make_model, chain):
    stats = probe_layers(make_model(), [chain(2, 2, 8)])
    assert ple_layers(make_model()) == [0, 1] == sorted(stats)
    for s in stats.values():
        assert 0.0 <= s["gate_near_zero_frac"] <= 1.0 and s["gate_mean_abs"] > 0


def _backward(model, batch):
    model.zero_grad(set_to_none=True)
    _, loss = model(*batch)
    loss.backward()


def test_sparse_table_gradients_give_the_same_ratios(make_model, chain):
    dense = make_model()
    sparse = copy.deepcopy(dense)
    sparse.per_layer_inputs.embed_tokens_per_layer.sparse = True
    batch = chain(3, 4, 16)  # many repeated ids: the sparse gradient holds duplicate rows until coalesced
    _backward(dense, batch)
    _backward(sparse, batch)
    assert sparse.per_layer_inputs.embed_tokens_per_layer.weight.grad.is_sparse
    a, b = grad_norm_ratios(dense), grad_norm_ratios(sparse)
    assert math.isclose(a["table"], b["table"], rel_tol=1e-5)
    for i in (0, 1):
        for part in ("gate", "proj", "table"):
            assert math.isclose(a["layers"][i][part], b["layers"][i][part], rel_tol=1e-5)
    total = grad_norm(dense.per_layer_inputs.embed_tokens_per_layer.weight.grad)
    assert math.isclose(math.hypot(*table_slot_grad_norms(sparse)), total, rel_tol=1e-5)


class _Wrapper(torch.nn.Module):
    """Stands in for DDP: the real model under `.module`."""

    def __init__(self, module):
        super().__init__()
        self.module = module


def test_trunk_excludes_every_ple_parameter_and_wrappers_are_seen_through(make_model, chain):
    model = make_model(context=True)
    _backward(model, chain(4, 2, 8))
    wrapped = _Wrapper(model)
    assert unwrap(wrapped) is model
    ratios = grad_norm_ratios(wrapped)
    assert ratios["context"] > 0 and ratios["trunk_grad_norm"] > 0
    ple_names = {n for n, _ in model.named_parameters() if n.startswith("per_layer_inputs.") or ".ple." in n}
    trunk_sq = sum(p.grad.pow(2).sum().item() for n, p in model.named_parameters() if n not in ple_names)
    assert math.isclose(ratios["trunk_grad_norm"], math.sqrt(trunk_sq), rel_tol=1e-6)
    model.zero_grad(set_to_none=True)
    assert math.isnan(grad_norm_ratios(model)["table"])  # no gradient at all: the ratio is undefined, not a crash
