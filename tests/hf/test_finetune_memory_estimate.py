"""`plelab train-memory --finetune`: exact parameter counts, activations measured on 'meta' equal to what a real
CPU forward keeps (tiny configs with Gemma 3n's KV sharing, sliding windows and activation sparsity), and the
published Gemma 3n E2B / E4B and Gemma 4 E2B shapes from their config.json alone (a tied output head counted once,
the table's saving exactly its bytes)."""

from __future__ import annotations

import json

import pytest
import torch

from plelab.cli.main import main
from plelab.hf.finetune.config import FinetuneSettings
from plelab.hf.finetune.memory import CheckpointShape, _model, saved_activation_bytes

pytest.importorskip("peft")

TINY = dict(vocab_size=320, vocab_size_per_layer_input=320, hidden_size=32, hidden_size_per_layer_input=8,
            num_hidden_layers=4, num_attention_heads=2, num_key_value_heads=1, head_dim=16, intermediate_size=64,
            max_position_embeddings=128, sliding_window=8)


def _tiny(family: str) -> dict:
    if family == "gemma3n":
        from transformers import Gemma3nTextConfig

        return Gemma3nTextConfig(**TINY, laurel_rank=4, altup_num_inputs=2, num_kv_shared_layers=2,
                                 activation_sparsity_pattern=[0.95, 0.0, 0.0, 0.0],
                                 layer_types=["sliding_attention", "full_attention"] * 2).to_dict()
    from transformers import Gemma4TextConfig

    return Gemma4TextConfig(**TINY, global_head_dim=16, num_kv_shared_layers=2,
                            layer_types=["sliding_attention", "full_attention"] * 2).to_dict()


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_meta_measurement_equals_a_real_forward(family, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**_tiny(family), "model_type": f"{family}_text"}))
    shape = CheckpointShape.of(tmp_path / "config.json")
    settings = FinetuneSettings(targets=["attention", "mlp", "ple"])
    meta = _model(shape, settings, torch.float32, "meta")
    real = _model(shape, settings, torch.float32, "cpu")
    torch.manual_seed(0)
    for p in real.parameters():
        torch.nn.init.normal_(p, std=0.02)
    got, want = saved_activation_bytes(meta, 2, 24), saved_activation_bytes(real, 2, 24, device="cpu")
    assert got == want and got[0] > 0
    # exact counts: every LoRA pair is r x (in + out); frozen + table + adapters = the model
    lora = sum(p.numel() for n, p in real.named_parameters() if "lora_" in n)
    linears = [m for n, m in real.named_modules() if hasattr(m, "lora_A")]
    assert lora == sum(8 * (m.in_features + m.out_features) for m in linears) > 0
    # kv-shared layers have no k/v projections: nothing adapted there that would never get a gradient
    assert not any(".layers.3.self_attn.k_proj" in n for n, _ in real.named_modules())


GEMMA4_E2B = dict(hidden_size=1536, num_hidden_layers=35, intermediate_size=6144, use_double_wide_mlp=True,
                  num_kv_shared_layers=20, num_attention_heads=8, num_key_value_heads=1, head_dim=256,
                  global_head_dim=512, layer_types=["full_attention" if i % 5 == 4 else "sliding_attention"
                                                    for i in range(35)])
"""Gemma 4 E2B's text shape (35 layers of width 1536, the last 20 sharing keys and values, double-wide MLPs,
one full-attention layer in five): 4,628,569,344 parameters with 2,348,810,240 in the PLE table, E2B's 4.63B and
2.35B."""


def _published(tmp_path) -> dict:
    """config.json files of Gemma 3n E2B / E4B (transformers' Gemma3nTextConfig defaults are E4B) and Gemma 4 E2B."""
    from transformers import Gemma3nTextConfig, Gemma4TextConfig

    e2b = dict(num_hidden_layers=30, intermediate_size=[8192] * 30, num_kv_shared_layers=10,
               activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20, layer_types=None)
    out = {}
    for name, family, config in (("E2B", "gemma3n", Gemma3nTextConfig(**e2b)), ("E4B", "gemma3n", Gemma3nTextConfig()),
                                 ("Gemma 4 E2B", "gemma4", Gemma4TextConfig(**GEMMA4_E2B))):
        f = tmp_path / f"{name}.json"
        f.write_text(json.dumps({"model_type": family, "text_config": config.to_dict()}))
        out[name] = f
    return out


def _transformers_count(config_json) -> int:
    """Every parameter of the text model as transformers builds it (on 'meta', its tied head once)."""
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig, Gemma4ForCausalLM, Gemma4TextConfig

    data = json.loads(config_json.read_text())
    lm_class, config_class = ((Gemma4ForCausalLM, Gemma4TextConfig) if data["model_type"] == "gemma4"
                              else (Gemma3nForCausalLM, Gemma3nTextConfig))
    with torch.device("meta"):
        lm = lm_class(config_class.from_dict(data["text_config"]))
    lm.tie_weights()
    return sum(p.numel() for p in lm.parameters())


@pytest.mark.parametrize(("name", "layers", "frozen"), [("E2B", 30, 2_421_916_768), ("E4B", 35, 4_486_425_328),
                                                        ("Gemma 4 E2B", 35, 2_279_759_104)])
def test_published_shapes_from_config_json(tmp_path, capsys, name, layers, frozen):
    config = _published(tmp_path)[name]
    argv = ["train-memory", "--finetune", str(config), "--gpu-memory", "24GB", "--set", "batch_size=1",
            "--set", "seq_len=512"]
    assert main([*argv, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    table = 262144 * layers * 256
    assert r["model"]["ple_table_params"] == table and r["model"]["table_shape"] == [262144, layers * 256]
    # The tied output head is the embedding: counted once, as transformers counts the model.
    assert r["model"]["frozen_params_without_table"] == frozen == _transformers_count(config) - table
    assert r["table_on_device_bytes"]["ple_table"] == 2 * table  # bf16: E2B 4.03 GB, E4B 4.70 GB
    assert r["table_saving_bytes"] == 2 * table and r["table_on_disk_bytes"]["ple_table"] == 0
    assert r["step"]["frozen_bytes_per_value"] == 2 and r["model"]["lora_params"] > 0
    assert "inference, not training" in r["public_report"]["differs"]
    if name == "E2B":  # the text form once (each plan runs a 'meta' forward of the whole model)
        assert main(argv) == 0
        assert "leaving the table on disk saves" in capsys.readouterr().out


@pytest.mark.parametrize("plant", [None, "alive"])  # the tiny checkpoints tie their head, except the 'alive' one
def test_a_tied_head_is_counted_once_and_an_untied_one_counted(make_gemma, capsys, plant):
    from transformers import AutoModelForCausalLM

    folder = make_gemma("gemma4", plant=plant)
    lm = AutoModelForCausalLM.from_pretrained(folder)
    assert (lm.lm_head.weight is lm.model.embed_tokens.weight) == (plant is None)
    assert main(["train-memory", "--finetune", str(folder), "--set", "seq_len=64", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"]["frozen_params_without_table"] == sum(p.numel() for p in lm.parameters()) - 320 * 16


def test_plan_of_a_checkpoint_folder_and_bad_input(make_gemma, capsys):
    folder = make_gemma("gemma4")
    assert main(["train-memory", "--finetune", str(folder), "--set", "seq_len=64", "--set", "finetune.table=sparse",
                 "--touched-rows", "100", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"]["table_bytes_on_disk"] == 320 * 16 * 4
    assert r["table_on_disk_bytes"]["table_delta"] == 12 * 100 * 16
    assert main(["train-memory", "--finetune", str(folder), "--set", "seq_len=64",
                 "--set", "finetune.targets=nope"]) == 2
    assert "no linear layer named 'nope'" in capsys.readouterr().err
    assert main(["train-memory", "--finetune", str(folder), "--json"]) == 0  # the default 512 cut to the context, 128
    assert json.loads(capsys.readouterr().out)["step"]["seq_len"] == 128
