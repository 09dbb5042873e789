"""`plelab diagnose --hf`: planted dead and alive checkpoints, the streamed model equals transformers', and
the report has every part (per layer, per domain, table health on frequent tokens, layer selection)."""

from __future__ import annotations

import json

import pytest
import torch

from plelab.cli.main import main
from plelab.hf.checkpoint import HFCheckpoint
from plelab.hf.model import StreamedEmbedding, load_text_model

SMALL = ["--batches", "2", "--batch-size", "2", "--seq-len", "24"]


def diagnose(folder, valid_dir, capsys, *extra) -> dict:
    assert main(["diagnose", "--hf", str(folder), "--data", str(valid_dir), *SMALL, "--json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("family", ["gemma3n", "gemma4"])
def test_streamed_model_equals_transformers(make_gemma, family, gemma_vocab):
    from transformers import AutoModelForCausalLM

    V = gemma_vocab
    folder = make_gemma(family)
    ref = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    ours = load_text_model(HFCheckpoint.open(folder))
    x = torch.randint(0, V, (2, 12), generator=torch.Generator().manual_seed(0))
    y = torch.roll(x, -1, 1)
    with torch.no_grad():
        logits = ref(input_ids=x, use_cache=False).logits
        assert (ours.lm(input_ids=x, use_cache=False).logits - logits).abs().max() <= 1e-5
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, V), y.reshape(-1))
        loss, n = ours.lm_loss(x, y)
    assert n == x.numel() and abs(loss.item() - expected.item()) <= 1e-5
    assert isinstance(ours.table, StreamedEmbedding)
    assert not any(tuple(p.shape) == ours.ckpt.table.shape for p in ours.lm.parameters())  # nothing holds the table


def test_zero_gate_weights_diagnose_unused(make_gemma, valid_dir, capsys):
    r = diagnose(make_gemma("gemma3n", plant="dead"), valid_dir, capsys)
    assert r["used"]["verdict"] == "unused" and r["used"]["basis"] == "ablation"
    assert all(x["verdict"] == "unused" and x["injection_ratio"] == 0 for x in r["layers"])
    assert r["pays"]["verdict"] == "not measured" and "no dP = 0 twin" in r["pays"]["reason"]
    assert all(x["gate_near_zero_frac"] == 1.0 for x in r["layers"])
    assert all(abs(x["ablation_delta_loss_zero"]) < 1e-6 for x in r["layers"])


def test_ple_that_carries_the_tokens_diagnoses_used(make_gemma, valid_dir, capsys):
    r = diagnose(make_gemma("gemma4", plant="alive"), valid_dir, capsys)
    assert r["used"]["verdict"] == "used", r["used"]
    o = r["used"]
    assert min(o["ablation_delta_loss_zero"], o["ablation_delta_loss_shuffle"], o["ablation_delta_loss_table"]) > 0.1
    assert set(r["domains"]) == {"code", "prose"}
    assert all(d["verdict"] == "used" and d["batches"] == 2 for d in r["domains"].values())
    view = r["table_health"]["views"]["frequent"]
    assert view["available"] and "most frequent token ids" in view["rows"]
    assert not r["table_health"]["views"]["delta"]["available"]
    assert all(rec["table"]["frequent"]["rows"] > 1 for rec in r["layers"])


def test_random_checkpoint_text_report_and_layer_selection(make_gemma, valid_dir, capsys):
    folder = make_gemma("gemma3n")
    assert main(["diagnose", "--hf", str(folder), "--data", str(valid_dir), *SMALL, "--layers", "1"]) == 0
    out = capsys.readouterr().out
    assert "used:" in out and "pays: NOT MEASURED" in out and "domain code" in out and "domain prose" in out
    assert "AltUp" in out  # the Gemma 3n note on what the injection ratio divides by
    r = diagnose(folder, valid_dir, capsys, "--layers", "1")
    assert [x["layer"] for x in r["layers"]] == [1] and r["model"]["ple_layers"] == [1]


def test_multimodal_layout_gives_the_same_report(make_gemma, valid_dir, capsys):
    text = diagnose(make_gemma("gemma3n", plant="dead"), valid_dir, capsys)
    mm = diagnose(make_gemma("gemma3n", plant="dead", multimodal=True), valid_dir, capsys)
    assert mm["used"]["verdict"] == text["used"]["verdict"] == "unused"
    assert mm["used"]["loss_full"] == pytest.approx(text["used"]["loss_full"], abs=1e-6)


def test_without_data_only_proxies(make_gemma, capsys):
    assert main(["diagnose", "--hf", str(make_gemma("gemma4")), "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["used"]["basis"] == "proxies" and r["used"]["provisional"] and r["data"]["batches"] == 0
    assert "random rows" in r["table_health"]["views"]["frequent"]["rows"]


def test_npy_token_array_is_one_domain_and_ids_are_checked(make_gemma, tmp_path, capsys, gemma_vocab):
    import numpy as np

    folder = make_gemma("gemma4")
    tokens = np.random.default_rng(0).integers(0, gemma_vocab, 500)
    np.save(tmp_path / "mine.npy", tokens)
    r = diagnose(folder, tmp_path / "mine.npy", capsys)
    assert list(r["domains"]) == ["mine"] and r["data"]["batches"] == 2
    np.save(tmp_path / "bad.npy", np.array([0, gemma_vocab] * 50))
    capsys.readouterr()
    assert main(["diagnose", "--hf", str(folder), "--data", str(tmp_path / "bad.npy"), *SMALL]) == 2
    assert f"token id {gemma_vocab}" in capsys.readouterr().err


def _never_loaded(monkeypatch):
    """Make loading the model an error: a refusal must come before the model's gigabytes are read."""
    import plelab.hf.model

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(plelab.hf.model, "load_text_model", refuse)


def test_a_prepared_data_folder_is_read_and_progress_is_told(make_gemma, finetune_data, capsys):
    folder = make_gemma("gemma4")
    assert main(["diagnose", "--hf", str(folder), "--data", str(finetune_data[0]), *SMALL, "--json"]) == 0
    captured = capsys.readouterr()
    r = json.loads(captured.out)
    assert list(r["domains"]) == [finetune_data[0].name] and "split 'val' of a prepared dataset" in r["data"]["source"]
    err = captured.err
    passes = 1 + 1 + 3 * (2 + 1)  # statistics, the model as it is, 3 ablations of each of 2 layers and of both
    assert f"diagnosing 2 layer(s) of {folder}: {passes} passes over 2 batch(es) of 2 x 24 tokens" in err
    assert "the first pass took" in err and f"for all {passes}" in err
    assert f"layer 1 ablated: {passes - 3}/{passes} passes" in err and "left" in err


def test_data_of_another_tokenizer_is_refused_before_the_model_loads(make_gemma, tmp_path, capsys, monkeypatch):
    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import Tokenizer

    (tmp_path / "t.txt").write_text("some text in bytes\n" * 200)
    prepare_dataset([tmp_path / "t.txt"], Tokenizer.byte_level(), tmp_path / "bytes", progress=False)
    capsys.readouterr()
    _never_loaded(monkeypatch)
    assert main(["diagnose", "--hf", str(make_gemma("gemma4")), "--data", str(tmp_path / "bytes"), *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "was tokenized with another tokenizer" in err, err


def test_a_nan_row_of_the_table_is_refused_before_the_model_loads(make_gemma, valid_dir, tmp_path, capsys,
                                                                   monkeypatch):
    import shutil

    from safetensors.torch import load_file, save_file

    from plelab.data.tokenizer import Tokenizer

    folder = tmp_path / "nan"
    shutil.copytree(make_gemma("gemma4"), folder)
    weights = load_file(str(folder / "model.safetensors"))
    table = next(k for k in weights if k.endswith("embed_tokens_per_layer.weight"))
    token = Tokenizer.load(folder).encode((valid_dir / "prose.txt").read_text())[5]
    weights[table][token, 3] = float("nan")
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    _never_loaded(monkeypatch)
    assert main(["diagnose", "--hf", str(folder), "--data", str(valid_dir), *SMALL]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"the PLE table's row {token}" in err and "NaN" in err, err
