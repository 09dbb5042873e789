"""`plelab finetune` on tiny transformers-built Gemma 3n / Gemma 4 checkpoints: LoRA lowers the held-out loss
of the domain it trains on; the peft adapter folder and the merged folder load in transformers (+ peft) with
plelab's logits; the table's trained rows live in a sparse delta; multimodal layouts keep their own names."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from finetune_helpers import (
    evals,
    finetune_argv,
    hf_logits,
    peft_logits,
    plelab_logits,
    train_losses,
    training_tokens,
)

from plelab.cli.main import main
from plelab.hf.checkpoint import HFCheckpoint
from plelab.util.safetensors import read_header, read_rows

pytest.importorskip("peft")

TOL = 1e-5
MERGED_TOL = 5e-5
"""The merged folder rounds W + (alpha / r) B A once per weight in fp32 where the adapter path computes
x W + (x A) B: 8.5e-6 measured on logits of magnitude ~20 (Gemma's soft cap is 30)."""
RUNS = {  # name -> (family, extra flags)
    "gemma4": ("gemma4", []),
    "gemma3n-sparse": ("gemma3n", ["--set", "finetune.table=sparse", "--set", "finetune.targets=attention,mlp,ple"]),
}


@pytest.fixture(scope="module")
def runs(make_gemma, finetune_data, tmp_path_factory):
    """{name: (checkpoint folder, run dir, merged folder)}, each fine-tuned once with --merge."""
    data, valid = finetune_data
    out = {}
    for name, (family, extra) in RUNS.items():
        folder, root = make_gemma(family), tmp_path_factory.mktemp(f"ft-{name}")
        argv = finetune_argv(folder, data, valid, root / "run", *extra, "--merge", str(root / "merged"))
        assert main(argv) == 0
        out[name] = (folder, root / "run", root / "merged")
    return out


@pytest.mark.parametrize("name", RUNS)
def test_lora_lowers_the_heldout_loss_of_its_domain(runs, name):
    _, run, _ = runs[name]
    ev = evals(run)
    assert sorted(ev) == [0, 24]  # the untouched model first, then the end of training
    before, after = ev[0]["domains"]["prose"]["loss"], ev[24]["domains"]["prose"]["loss"]
    print(f"{name}: held-out prose loss {before:.4f} -> {after:.4f}")
    assert after < before - 0.2
    losses = train_losses(run)
    assert len(losses) == 24 and all(np.isfinite(list(losses.values())))


@pytest.mark.parametrize("name", RUNS)
def test_adapter_and_merged_folder_load_in_transformers_with_plelabs_logits(runs, finetune_data, name):
    folder, run, merged = runs[name]
    sparse = "sparse" in name
    x = training_tokens(finetune_data[0])
    ours = plelab_logits(run, x)
    with_peft = peft_logits(folder, run / "adapter", x, delta=sparse)
    from_merged = hf_logits(merged, x)
    base = hf_logits(folder, x)
    print(f"{name}: max |logit diff| peft {(with_peft - ours).abs().max():.2e}, merged "
          f"{(from_merged - ours).abs().max():.2e}, untouched base {(base - ours).abs().max():.2e}")
    assert (with_peft - ours).abs().max() <= TOL
    assert (from_merged - ours).abs().max() <= MERGED_TOL
    assert (base - ours).abs().max() > 100 * TOL  # the fine-tune changed the model
    if sparse:  # peft alone misses the table's change
        assert (peft_logits(folder, run / "adapter", x) - ours).abs().max() > 100 * TOL


def test_table_delta_holds_only_touched_rows_and_the_merge_changes_only_those(runs, finetune_data):
    from plelab.data.loader import TokenDataset
    from plelab.hf.finetune.table_delta import DELTA_FILE, load_delta

    folder, run, merged = runs["gemma3n-sparse"]
    base, after = HFCheckpoint.open(folder), HFCheckpoint.open(merged)
    rows, delta, meta = load_delta(run / "adapter" / DELTA_FILE, base.table.shape)
    train_ids = np.unique(TokenDataset(finetune_data[0], "train").array())
    assert 0 < len(rows) <= len(train_ids) and set(rows.tolist()) <= set(train_ids.tolist())
    assert delta.shape == (len(rows), base.table.shape[1]) and delta.abs().amax(dim=1).min() > 0
    t0 = read_rows(base.table, 0, base.table.shape[0])
    t1 = read_rows(after.table, 0, after.table.shape[0])
    changed = torch.nonzero((t1 != t0).any(dim=1)).flatten()
    assert set(changed.tolist()) <= set(rows.tolist())
    assert torch.allclose(t1[rows], t0[rows] + delta, atol=1e-6)
    # checkpoints hold what trains only: adapters and the delta, not the model
    ckpt = sorted((run / "checkpoints").glob("step_*"))[-1]
    names = read_header(ckpt / "model.safetensors")
    assert set(names) == {n for n in names if "lora_" in n or n.startswith("table.")}
    assert {"table.rows", "table.delta.weight"} <= set(names)
    record = json.loads((merged / "plelab_finetune.json").read_text())
    assert record["table_rows_changed"] == len(rows) and record["step"] == 24


def test_merged_folder_keeps_every_tensor_name_dtype_and_shape(runs):
    folder, _, merged = runs["gemma4"]
    a, b = read_header(folder / "model.safetensors"), read_header(merged / "model.safetensors")
    assert list(a) == list(b)
    assert all((a[k].dtype, a[k].shape, a[k].offset) == (b[k].dtype, b[k].shape, b[k].offset) for k in a)
    assert (folder / "config.json").read_bytes() == (merged / "config.json").read_bytes()


@pytest.fixture(scope="module")
def gemma4_multimodal(tmp_path_factory, tokenizer_json, gemma_vocab):
    """A tiny Gemma4ForConditionalGeneration (vision and audio towers included), saved by transformers."""
    from parity_helpers import randomise_
    from transformers import Gemma4Config, Gemma4ForConditionalGeneration, Gemma4TextConfig
    from transformers.models.gemma4.configuration_gemma4 import Gemma4AudioConfig, Gemma4VisionConfig

    text = Gemma4TextConfig(vocab_size=gemma_vocab, vocab_size_per_layer_input=gemma_vocab, hidden_size=32,
                            hidden_size_per_layer_input=8, num_hidden_layers=2, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, global_head_dim=16, intermediate_size=64,
                            layer_types=["full_attention"] * 2, max_position_embeddings=128)
    vision = Gemma4VisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                num_key_value_heads=2, head_dim=8)
    audio = Gemma4AudioConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              subsampling_conv_channels=[4, 4], output_proj_dims=16)
    torch.manual_seed(0)
    model = Gemma4ForConditionalGeneration(Gemma4Config(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                                         audio_config=audio.to_dict())).eval()
    randomise_(model.model.language_model, seed=1, layer_scalars=False)
    folder = tmp_path_factory.mktemp("gemma4-multimodal")
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    return folder


def test_multimodal_gemma4_adapter_and_merge_keep_the_towers(gemma4_multimodal, finetune_data, tmp_path):
    data, valid = finetune_data
    folder = gemma4_multimodal
    assert main(finetune_argv(folder, data, valid, tmp_path / "run", "--set", "max_steps=6",
                              "--merge", str(tmp_path / "merged"))) == 0
    names = read_header(tmp_path / "run" / "adapter" / "adapter_model.safetensors")
    assert all(n.startswith("base_model.model.model.language_model.layers.") for n in names)
    x = training_tokens(data)
    ours = plelab_logits(tmp_path / "run", x)
    assert (peft_logits(folder, tmp_path / "run" / "adapter", x) - ours).abs().max() <= TOL
    assert (hf_logits(tmp_path / "merged", x) - ours).abs().max() <= MERGED_TOL
    a, b = read_header(folder / "model.safetensors"), read_header(tmp_path / "merged" / "model.safetensors")
    towers = [k for k in a if "vision_tower" in k or "audio_tower" in k]
    assert towers and all(torch.equal(read_rows(a[k], 0, a[k].shape[0]) if a[k].shape else torch.zeros(()),
                                      read_rows(b[k], 0, b[k].shape[0]) if b[k].shape else torch.zeros(()))
                          for k in towers)


def test_multimodal_gemma3n_layout(make_gemma, finetune_data, tmp_path):
    """Gemma 3n's multimodal class needs timm (its vision tower), which cannot be installed here without
    changing torch; the text part is checked through the merged folder, read by plelab's own loader."""
    from plelab.hf.model import load_text_model

    data, valid = finetune_data
    folder = make_gemma("gemma3n", multimodal=True)
    assert main(finetune_argv(folder, data, valid, tmp_path / "run", "--set", "max_steps=6",
                              "--merge", str(tmp_path / "merged"))) == 0
    names = read_header(tmp_path / "run" / "adapter" / "adapter_model.safetensors")
    assert all(n.startswith("base_model.model.model.language_model.layers.") for n in names)
    config = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert config["target_modules"].startswith("model\\.language_model\\.layers")
    x = training_tokens(data)
    merged = load_text_model(HFCheckpoint.open(tmp_path / "merged"), attn_implementation="sdpa")
    with torch.no_grad():
        got = merged.lm(input_ids=x, use_cache=False).logits
    ours = plelab_logits(tmp_path / "run", x)
    assert (got - ours).abs().max() <= MERGED_TOL
    try:
        import timm  # noqa: F401
    except ImportError:
        return
    assert (peft_logits(folder, tmp_path / "run" / "adapter", x) - ours).abs().max() <= TOL


def test_table_in_memory_reads_what_the_streamed_table_reads(make_gemma):
    from plelab.hf.finetune.table_delta import LoadedTable, TableWithDelta
    from plelab.hf.model import load_text_model

    model = load_text_model(HFCheckpoint.open(make_gemma("gemma3n")))
    ids = torch.tensor([[0, 5, 5, 319], [17, 3, 250, 1]])
    loaded = LoadedTable(model.table)
    assert torch.equal(loaded(ids), model.table(ids))
    wrapped = TableWithDelta(loaded, np.array([3, 5]))
    assert not any(t.shape == loaded.weight.shape for t in wrapped.state_dict().values())  # never checkpointed
    with torch.no_grad():
        wrapped.delta.weight[1] = 1.0  # row 5
    diff = (wrapped(ids) - loaded(ids)).abs().amax(dim=-1)
    assert diff[0, 1] > 0 and diff[0, 2] > 0 and diff[0, 0] == 0 and diff[1].max() == 0


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_activation_checkpointing_gives_the_same_gradients(make_gemma, family):
    from plelab.hf.finetune.config import FinetuneSettings, model_config_of
    from plelab.hf.finetune.model import build_finetune_model
    from plelab.parallel.engine import checkpoint_activations

    ckpt = HFCheckpoint.open(make_gemma(family))
    torch.manual_seed(0)
    model = build_finetune_model(ckpt, model_config_of(ckpt), FinetuneSettings(targets=["attention", "mlp", "ple"]),
                                 torch.device("cpu"), torch.float32)
    for p in model.parameters():  # B = 0 at init would leave A without gradient
        torch.nn.init.normal_(p, std=0.05)
    x = torch.randint(0, 300, (2, 16), generator=torch.Generator().manual_seed(1))

    def grads():
        model.train()
        _, loss = model(x, torch.roll(x, -1, 1))
        loss.backward()
        out = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad()
        return loss.item(), out

    loss, plain = grads()
    checkpoint_activations(model)
    loss2, ckpted = grads()
    assert loss == pytest.approx(loss2, abs=1e-6)
    assert all(torch.allclose(plain[n], ckpted[n], atol=1e-6) for n in plain) and len(plain) > 10


def test_published_layout_with_kv_shared_projections_loads(tmp_path, tokenizer_json, finetune_data):
    """Released Gemma 3n shards keep k/v projections and norms for the KV-shared layers, which transformers
    builds no modules for (and lists as ignorable); the loader and the merge accept them as transformers does."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM, Gemma3nForCausalLM, Gemma3nTextConfig

    from plelab.hf.model import load_text_model

    cfg = Gemma3nTextConfig(vocab_size=320, vocab_size_per_layer_input=320, hidden_size=32,
                            hidden_size_per_layer_input=8, num_hidden_layers=4, num_attention_heads=2,
                            num_key_value_heads=1, head_dim=16, intermediate_size=64, laurel_rank=4,
                            altup_num_inputs=2, num_kv_shared_layers=2, activation_sparsity_pattern=[0.0] * 4,
                            layer_types=["full_attention"] * 4, max_position_embeddings=128)
    torch.manual_seed(0)
    Gemma3nForCausalLM(cfg).save_pretrained(tmp_path / "ckpt")
    sd = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    for i in (2, 3):  # as released: the shared layers' unused key/value weights are in the file
        sd[f"model.layers.{i}.self_attn.k_proj.weight"] = torch.randn(16, 32)
        sd[f"model.layers.{i}.self_attn.v_proj.weight"] = torch.randn(16, 32)
    save_file(sd, str(tmp_path / "ckpt" / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "ckpt" / "tokenizer.json").write_text(tokenizer_json)
    ours = load_text_model(HFCheckpoint.open(tmp_path / "ckpt"), attn_implementation="sdpa")
    x = training_tokens(finetune_data[0])
    with torch.no_grad():
        got = ours.lm(input_ids=x, use_cache=False).logits
    want = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt", dtype=torch.float32).eval()(input_ids=x).logits
    assert (got - want).abs().max() <= TOL
