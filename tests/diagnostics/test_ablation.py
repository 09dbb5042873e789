"""Ablation mechanics: what each mode switches off, hook hygiene, padding targets, noise estimates."""

from __future__ import annotations

import math

import pytest
import torch

from plelab.diagnostics.ablation import ABLATION_MODES, ablation_study, batch_losses, ple_ablated


def _silence(model, layers):
    with torch.no_grad():
        for i in layers:
            model.layers[i].ple.post_per_layer_input_norm.weight.zero_()


def test_zero_ablation_equals_silencing_the_injection(make_model, chain):
    model, silent = make_model(), make_model()
    _silence(silent, [0, 1])
    batches = [chain(1, 4, 16), chain(2, 4, 16)]
    with ple_ablated(model, [0, 1], "zero"):
        ablated = batch_losses(model, batches)
    assert ablated == batch_losses(silent, batches)
    assert batch_losses(model, batches) != ablated  # the hooks are gone after the block
    assert not model.layers[0].ple._forward_hooks


def test_table_ablation_touches_only_the_named_layers(make_model, chain):
    model = make_model()
    _silence(model, [1])
    batches = [chain(3, 4, 16)]
    full = batch_losses(model, batches)
    with ple_ablated(model, [1], "table"):
        assert batch_losses(model, batches) == full  # layer 1 injects nothing, so permuting its slot is a no-op
    with ple_ablated(model, [0], "table"):
        assert batch_losses(model, batches) != full


def test_silent_ple_has_zero_delta_in_every_mode(make_model, chain):
    model = make_model()
    _silence(model, [0, 1])
    r = ablation_study(model, [chain(4, 4, 16), chain(5, 4, 16)])
    assert r["modes"] == list(ABLATION_MODES)
    for entry in [*r["layers"].values(), r["all"]]:
        for mode in ABLATION_MODES:
            assert entry[mode]["delta"] == 0.0
        assert entry["delta"] == 0.0 and entry["se"] == 0.0


def test_padding_targets_and_single_batch(make_model, chain):
    x, y = chain(6, 2, 16)
    y = y.clone()
    y[1, 8:] = -100  # the loader pads evaluation windows with -100
    r = ablation_study(make_model(), [(x, y)], modes=("zero",))
    assert r["n_tokens"] == 24 and r["n_batches"] == 1
    assert math.isnan(r["all"]["se"])  # one batch: no noise estimate, and it says so instead of claiming 0
    with pytest.raises(ValueError, match="targets"):
        ablation_study(make_model(), [x])
    with pytest.raises(ValueError, match="mode"):
        with ple_ablated(make_model(), [0], "nope"):
            pass
