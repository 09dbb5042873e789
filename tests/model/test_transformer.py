"""Behaviour of the language model: baseline equivalence, KV cache, PLE wiring, bad ids.

Generation is tested with plelab/inference/generate.py (tests/inference/test_generate.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from plelab.model import KVCache, LanguageModel, TokenIdError, load_model_config
from plelab.model.transformer import check_token_ids


def tiny(*overrides: str) -> LanguageModel:
    torch.manual_seed(0)
    return LanguageModel(load_model_config("tiny", list(overrides)))


NGRAM = ["ple.index=ngram", "ple.ngram.orders=[1,2,3]", "ple.ngram.heads=2", "ple.dim=24"]


def test_dp_zero_is_exactly_the_baseline():
    model = tiny("ple.dim=0")
    assert model.per_layer_inputs is None
    assert all(layer.ple is None for layer in model.layers)
    names = {n for n, _ in model.named_parameters()}
    assert not any("per_layer" in n or ".ple." in n for n in names)


@pytest.mark.parametrize("table", ["token", "ngram"])
def test_silent_ple_leaves_logits_of_the_same_core_unchanged(table):
    # With the output norm at zero, PLE adds exactly nothing: same core weights -> same logits.
    with_ple = tiny("ple.output_norm_init=0", *(NGRAM if table == "ngram" else []))
    base = LanguageModel(load_model_config("tiny", ["ple.dim=0"]))
    base.load_state_dict({k: v for k, v in with_ple.state_dict().items() if k in base.state_dict()})
    ids = torch.randint(0, 256, (2, 16))
    assert torch.equal(with_ple(ids)[0], base(ids)[0])
    # ... and any non-zero output norm changes them (the path is really wired in).
    torch.nn.init.ones_(with_ple.layers[1].ple.post_per_layer_input_norm.weight)
    assert not torch.allclose(with_ple(ids)[0], base(ids)[0])


def test_kv_cache_decoding_matches_full_forward():
    model = tiny().eval()
    ids = torch.randint(0, 256, (2, 24))
    full = model(ids)[0]
    cache = KVCache.empty(model.config, 2, 24)
    model(ids[:, :9], cache=cache)
    chunk = model.hidden_states(ids[:, 9:15], cache=cache)  # multi-token chunk after a prefix
    steps = [model(ids[:, t : t + 1], cache=cache)[0] for t in range(15, 24)]
    ref_h = model.hidden_states(ids)
    assert torch.allclose(chunk, ref_h[:, 9:15], atol=1e-5)
    assert torch.allclose(torch.cat(steps, 1), full[:, 15:], atol=1e-5)


@pytest.mark.parametrize("extra", [[], ["ple.gate=engram", "ple.conv_kernel=3", "ple.context=false"]],
                         ids=["gemma-gate", "engram-gate-conv"])
def test_kv_cache_decoding_of_an_ngram_table_matches_full_forward(extra):
    # Each position's rows depend on the ids before it and the convolution on earlier outputs: a cached decode
    # must bring both across calls.
    model = tiny(*NGRAM, *extra).eval()
    for layer in model.layers:
        if layer.ple.conv is not None:  # taps start at zero; give them values so the test can see them
            torch.nn.init.normal_(layer.ple.conv.weight, std=0.5)
    ids = torch.randint(0, 256, (2, 24))
    full = model(ids)[0]
    cache = KVCache.empty(model.config, 2, 24)
    model(ids[:, :9], cache=cache)
    chunk = model.hidden_states(ids[:, 9:15], cache=cache)
    steps = [model(ids[:, t : t + 1], cache=cache)[0] for t in range(15, 24)]
    assert torch.allclose(chunk, model.hidden_states(ids)[:, 9:15], atol=1e-5)
    assert torch.allclose(torch.cat(steps, 1), full[:, 15:], atol=1e-5)


def test_an_ngram_position_reads_one_row_per_head_and_depends_only_on_its_suffix():
    model = tiny(*NGRAM)
    inputs = model.per_layer_inputs
    rows = inputs.index.rows(torch.tensor([[7, 8, 9, 10]]))
    assert rows.shape == (1, 4, 6)
    assert model.per_layer_inputs.embed_tokens_per_layer.weight.shape == (6 * 257, 2 * 24 // 6)
    # Order-3 heads see positions t-2..t; changing id 7 (position 0) moves rows of positions 0-2 only.
    moved = inputs.index.rows(torch.tensor([[99, 8, 9, 10]]))
    assert torch.equal(moved[0, 3], rows[0, 3]) and not torch.equal(moved[0, 2], rows[0, 2])
    # Layer l's vector is slice l of every head's row, heads side by side.
    table = inputs.embed_tokens_per_layer.weight
    got = inputs.identity(torch.tensor([[7, 8, 9, 10]]))[0, 1, 1] / inputs.embed_scale
    want = torch.cat([table[r, 4:8] for r in rows[0, 1]])
    assert torch.allclose(got, want)


def test_ple_on_a_subset_of_layers():
    model = tiny("ple.layers=[1]")
    assert model.layers[0].ple is None and model.layers[1].ple is not None
    assert model.per_layer_inputs.embed_tokens_per_layer.weight.shape == (256, 16)


def test_out_of_range_ids_raise_a_clear_error_where_ids_are_made():
    model = tiny()
    with pytest.raises(TokenIdError, match=r"\[0, 256\); got \[256\]"):
        model.check_ids(torch.tensor([[1, 2, 256]]))
    with pytest.raises(TokenIdError):
        check_token_ids(np.array([[-1, 2]]), 256)
    with pytest.raises(TokenIdError):
        check_token_ids([3, 999], 256)
    check_token_ids([], 256)
    check_token_ids(np.array([0, 255], dtype=np.uint16), 256)


SYNCS = {"item", "__bool__", "tolist", "__int__", "__float__", "__index__", "cpu", "numpy"}


class _HostSyncs(TorchFunctionMode):
    """Records the tensor methods that bring a value to the host (a device-to-host sync on an accelerator)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in SYNCS:
            self.seen.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_training_forward_never_brings_a_value_to_the_host():
    """No sync per micro-batch and no graph break under compile: the ids are checked where batches are made.
    (kernels=off: the path an accelerator takes; the CPU kernels are host code anyway.)"""
    model = tiny("kernels=off", "ple.vocab_size=100")
    ids = torch.randint(0, 256, (2, 8))
    with _HostSyncs() as watch:
        model(ids, ids, return_logits=False)
        model(ids)
    assert watch.seen == []


def test_ple_ids_outside_ple_vocab_use_row_zero():
    model = tiny("ple.vocab_size=100")
    ple = model.per_layer_inputs
    ids = torch.tensor([[150, 0, 99]])
    ident = ple.identity(ids)
    assert torch.equal(ident[0, 0], ident[0, 1])
    assert not torch.equal(ident[0, 2], ident[0, 1])


@pytest.mark.parametrize("extra", [["ffn.kind=mglu"], [*NGRAM, "ple.gate=engram", "ple.conv_kernel=4"]],
                         ids=["mglu", "ngram-engram-conv"])
def test_gradients_reach_every_parameter(extra):
    model = tiny(*extra)
    for layer in model.layers:  # zero taps pass gradient to themselves only, not through them
        if getattr(layer.ple, "conv", None) is not None:
            torch.nn.init.normal_(layer.ple.conv.weight, std=0.5)
    ids = torch.randint(0, 256, (2, 12))
    _, loss = model(ids, ids)
    loss.backward()
    dead = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert dead == []
