"""`plelab export-gguf --hf` streams: a Gemma 4 folder whose PLE table is 512 MiB of float32 (rows as wide as
llama.cpp needs them: one per token, here 320 tokens of 2 x 209,696 values) is written as q8_0 in a fresh
subprocess whose peak RSS may grow by at most 300 MB over the process after its imports (measured: ~70 MB for a
1 GiB table)."""

from __future__ import annotations

import sys

import pytest
from test_hf_memory import BUDGET, GIB, _peak_growth, _write_safetensors

pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def wide_gemma4(tmp_path_factory, tokenizer_json):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    layers, vocab, hidden = 2, 320, 32
    dim = GIB // 2 // (vocab * layers * 4) // 32 * 32  # a multiple of q8_0's block
    common = dict(vocab_size=vocab, vocab_size_per_layer_input=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                  intermediate_size=64, layer_types=["sliding_attention", "full_attention"],
                  max_position_embeddings=128)
    small = Gemma4ForCausalLM(Gemma4TextConfig(**common, hidden_size_per_layer_input=32))
    cfg = Gemma4TextConfig(**common, hidden_size_per_layer_input=dim)
    folder = tmp_path_factory.mktemp("wide-gemma4")
    big = "model.embed_tokens_per_layer.weight"
    sd = {}
    g = torch.Generator().manual_seed(0)
    for k, v in small.state_dict().items():  # the PLE matrices at the wide dP (small next to the table)
        if k in ("lm_head.weight", big):
            continue
        if "per_layer_model_projection" in k:
            v = torch.randn(layers * dim, hidden, generator=g) * 0.02
        elif "per_layer_input_gate" in k:
            v = torch.randn(dim, hidden, generator=g) * 0.02
        elif "per_layer_projection.weight" in k:
            v = torch.randn(hidden, dim, generator=g) * 0.02
        elif "per_layer_projection_norm" in k:
            v = torch.ones(dim)
        sd[k] = v
    _write_safetensors(folder / "model.safetensors", sd, big, (vocab, layers * dim))
    cfg.to_json_file(str(folder / "config.json"))
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    return folder


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_export_gguf_of_a_512mib_table_stays_bounded(wide_gemma4, tmp_path):
    import gguf

    out = tmp_path / "wide.gguf"
    r = _peak_growth(["export-gguf", "--hf", str(wide_gemma4), str(out), "--type", "q8_0"])
    growth = r["hwm"] - r["before"]
    print(f"export-gguf: peak RSS grew {growth / 1e6:.1f} MB over {r['before'] / 1e6:.1f} MB after imports")
    assert growth < BUDGET, f"peak RSS grew by {growth:,} B, more than {BUDGET:,} B"
    import json

    dim = json.loads((wide_gemma4 / "config.json").read_text())["hidden_size_per_layer_input"]
    t = {x.name: x for x in gguf.GGUFReader(str(out)).tensors}["per_layer_token_embd.weight"]
    assert t.tensor_type.name == "Q8_0" and t.n_bytes == 320 * 2 * dim // 32 * 34  # the whole table was written
