"""`plelab diagnose --hf MERGED` compares PLE use with the folder the fine-tune started from. Known answers on a
planted dead checkpoint (PLE gate weights zero): adapters on the gate bring the PLE into use ("more"); adapters
on attention and MLP alone leave the gate at zero, so the PLE stays exactly unused ("unchanged")."""

from __future__ import annotations

import json
import shutil

import pytest
from finetune_helpers import finetune_argv

from plelab.cli.main import main

pytest.importorskip("peft")

DIAG = ["--batches", "16", "--batch-size", "4", "--seq-len", "32", "--json"]


@pytest.mark.parametrize(("targets", "expected"), [("ple", "more"), ("attention,mlp", "unchanged")])
def test_dead_ple_revived_only_by_gate_adapters(make_gemma, finetune_data, tmp_path, capsys, targets, expected):
    data, valid = finetune_data
    folder = make_gemma("gemma4", plant="dead")
    assert main(finetune_argv(folder, data, valid, tmp_path / "run", "--set", f"finetune.targets={targets}",
                              "--merge", str(tmp_path / "merged"))) == 0
    capsys.readouterr()
    prose = tmp_path / "prose"  # the domain it trained on
    prose.mkdir()
    (prose / "prose.txt").write_text((valid / "prose.txt").read_text())
    assert main(["diagnose", "--hf", str(tmp_path / "merged"), "--data", str(prose), *DIAG]) == 0
    report = json.loads(capsys.readouterr().out)
    c = report["finetune"]
    assert c["base"] == str(folder) and c["verdict"] == expected, c
    assert set(c["domains"]) == {"prose"} and len(c["layers"]) == 2
    primary = c["modes"][c["primary_mode"]]
    assert abs(primary["base_delta"]) < 1e-6  # the planted base: PLE contributes nothing
    if expected == "more":
        assert report["used"]["verdict"] != "unused" and primary["tuned_delta"] > 0.01
        assert all(x["injection_ratio_base"] == 0 < x["injection_ratio_tuned"] for x in c["layers"].values())
    else:
        assert report["used"]["verdict"] == "unused" and abs(primary["tuned_delta"]) < 1e-6


def test_text_report_and_explicit_base(make_gemma, finetune_data, tmp_path, capsys):
    data, valid = finetune_data
    base = make_gemma("gemma4")
    argv = ["diagnose", "--hf", str(base), "--data", str(valid), "--base", str(base), *DIAG[:-1]]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fine-tuning vs base" in out and "UNCHANGED" in out  # a folder against itself
    assert main(["diagnose", "--hf", str(base), "--data", str(valid), *DIAG]) == 0
    assert "finetune" not in json.loads(capsys.readouterr().out)  # no record, no --base: no comparison


def _one_line_refusal(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_base_that_is_not_the_same_model_is_refused(make_gemma, finetune_data, tokenizer_json, tmp_path, capsys):
    from transformers import AutoConfig, Gemma4ForCausalLM

    from plelab.data.tokenizer import Tokenizer

    _, valid = finetune_data
    tuned = make_gemma("gemma4")
    wide = tmp_path / "wide"
    config = AutoConfig.from_pretrained(tuned)
    config.hidden_size = 64
    Gemma4ForCausalLM(config).save_pretrained(wide)
    shutil.copy(tuned / "tokenizer.json", wide)
    retokenized = tmp_path / "retokenized"
    shutil.copytree(tuned, retokenized)
    Tokenizer.train_bpe(["other words entirely " * 50], 300, min_frequency=1).save(retokenized)
    cases = {make_gemma("gemma4", ple_vocab=160): "embed_tokens_per_layer.weight is (160, 16)",
             make_gemma("gemma3n"): "it is a gemma3n checkpoint",
             wide: "embed_tokens.weight is (320, 64) against (320, 32)",
             retokenized: "the tokenizers differ: their model differs"}
    for base, why in cases.items():
        err = _one_line_refusal(["diagnose", "--hf", str(tuned), "--data", str(valid), "--base", str(base), *DIAG],
                                capsys)
        assert f"--base {base} is not the model" in err and why in err, err


def test_base_missing_or_without_data_is_refused(make_gemma, finetune_data, tmp_path, capsys):
    tuned, valid = make_gemma("gemma4"), finetune_data[1]
    err = _one_line_refusal(["diagnose", "--hf", str(tuned), "--data", str(valid), "--base", str(tmp_path / "no"),
                             *DIAG], capsys)
    assert "no such folder" in err
    err = _one_line_refusal(["diagnose", "--hf", str(tuned), "--base", str(tuned), *DIAG], capsys)
    assert "give --data too" in err
