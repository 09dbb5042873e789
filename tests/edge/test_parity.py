"""The NumPy runtime reproduces the PyTorch model: fp32 logits to 1e-4 over 256 tokens, every PLE variant."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from edge_helpers import lively_model

from plelab.edge.runtime import EdgeModel
from plelab.inference.generate import generate


def torch_logits(model, ids: torch.Tensor) -> np.ndarray:
    """Logits at every position of one sequence, full forward without a cache."""
    with torch.no_grad():
        return torch.nn.functional.linear(model.hidden_states(ids[None]), model.output_weight())[0].numpy()


def runtime_logits(path, ids: torch.Tensor, prefill: int) -> np.ndarray:
    """Prefill `prefill` tokens at once, then decode the rest one by one through the KV cache."""
    rt = EdgeModel(path)
    cache = rt.new_cache(len(ids))
    out = [rt.forward(ids[:prefill].tolist(), cache)]
    out += [rt.forward([t], cache) for t in ids[prefill:].tolist()]
    rt.close()
    return np.concatenate(out)


def test_fp32_export_matches_pytorch_over_256_tokens(export_tmp):
    model = lively_model()
    ids = torch.randint(0, model.config.vocab_size, (256,), generator=torch.Generator().manual_seed(1))
    ref = torch_logits(model, ids)
    got = runtime_logits(export_tmp(model, quant="fp32"), ids, prefill=100)
    assert np.abs(got - ref).max() <= 1e-4
    # The test has teeth: PLE changes the logits by far more than the tolerance.
    for layer in model.layers:
        torch.nn.init.zeros_(layer.ple.post_per_layer_input_norm.weight)
    assert np.abs(torch_logits(model, ids) - ref).max() > 1e-2


@pytest.mark.parametrize(
    "overrides, options",
    [
        (["num_kv_heads=4"], {}),  # plain multi-head
        (["ple.layers=[1]", "ple.context=false"], {}),  # PLE on a subset, no context component
        (["ple.gate=scalar", "ple.output_norm=false"], {}),  # simple form, scalar gate
        (["ple.gate=vector", "tie_embeddings=false", "embed_scale=true"], {}),  # vector gate, untied head
        (["ffn.kind=mglu", "ffn.mask_count=2"], {}),
        (["ffn.kind=lowrank", "ffn.rank=8"], {}),
        (["ple.vocab_size=100"], {}),  # ids >= 100 read PLE row 0
        (["ple.dim=0"], {}),  # no PLE at all
        ([], {"embed_in_record": True, "align": 16, "page": 512}),
        (["tie_embeddings=false"], {"embed_in_record": True}),
    ],
)
def test_variants_match_pytorch(export_tmp, overrides, options):
    model = lively_model(*overrides)
    ids = torch.randint(0, model.config.vocab_size, (48,), generator=torch.Generator().manual_seed(2))
    got = runtime_logits(export_tmp(model, quant="fp32", **options), ids, prefill=20)
    assert np.abs(got - torch_logits(model, ids)).max() <= 1e-4


def test_quantised_exports_degrade_in_order(export_tmp):
    model = lively_model()
    ids = torch.randint(0, 256, (64,), generator=torch.Generator().manual_seed(3))
    ref = torch_logits(model, ids)
    err = {q: np.abs(runtime_logits(export_tmp(model, quant=q), ids, 64) - ref).mean()
           for q in ("fp16", "int8", "int4")}
    assert err["fp16"] < err["int8"] < err["int4"]
    assert err["int8"] < 0.05 * np.abs(ref).mean()


def test_greedy_generation_matches_pytorch_generate(export_tmp):
    model = lively_model()
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    want = list(generate(model, prompt[0].tolist(), 20, temperature=0.0))
    rt = EdgeModel(export_tmp(model, quant="fp32"))
    assert list(rt.generate(prompt[0].tolist(), 20, temperature=0.0)) == want
