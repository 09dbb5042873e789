"""Bad Hugging Face folders: one line on stderr, exit 2, from every --hf command, before any weight is read."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from plelab.cli.main import main
from plelab.util.safetensors import gather_rows, read_header, read_rows, read_tensor

COMMANDS = {
    "diagnose": lambda folder, tmp: ["diagnose", "--hf", str(folder)],
    "export": lambda folder, tmp: ["export", "--hf", str(folder), "--out", str(tmp / "x.ple")],
}


def one_line_error(argv, capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    return err


@pytest.fixture()
def copy(make_gemma, tmp_path):
    def make(family: str = "gemma3n"):
        dst = tmp_path / "ckpt"
        shutil.copytree(make_gemma(family), dst)
        return dst
    return make


def _edit_config(folder, **changes) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("command", COMMANDS)
def test_not_gemma(copy, tmp_path, capsys, command):
    folder = copy()
    _edit_config(folder, model_type="llama")
    err = one_line_error(COMMANDS[command](folder, tmp_path), capsys)
    assert "model_type 'llama' is not Gemma 3n or Gemma 4" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_shard(copy, tmp_path, capsys, command):
    folder = copy()
    (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    err = one_line_error(COMMANDS[command](folder, tmp_path), capsys)
    assert "1 of 2 weight shard(s)" in err and "model-00002-of-00002.safetensors" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_config_disagrees_with_table(copy, tmp_path, capsys, command):
    folder = copy()
    _edit_config(folder, hidden_size_per_layer_input=16)
    err = one_line_error(COMMANDS[command](folder, tmp_path), capsys)
    assert "config/weights mismatch" in err and "embed_tokens_per_layer.weight has shape" in err


def test_config_disagrees_with_a_core_weight(copy, tmp_path, capsys):
    folder = copy("gemma4")
    _edit_config(folder, intermediate_size=48)
    err = one_line_error(COMMANDS["diagnose"](folder, tmp_path), capsys)
    assert "config/weights mismatch" in err and "mlp" in err


def test_missing_weight(copy, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    folder = copy("gemma4")
    sd = load_file(str(folder / "model.safetensors"))
    del sd["model.layers.1.per_layer_projection.weight"]
    save_file(sd, str(folder / "model.safetensors"))
    err = one_line_error(COMMANDS["diagnose"](folder, tmp_path), capsys)
    assert "lacks 1 tensor(s)" in err and "model.layers.1.per_layer_projection.weight" in err


@pytest.mark.parametrize("command", COMMANDS)
def test_not_a_model_folder_and_truncated_shard(copy, tmp_path, capsys, command):
    (tmp_path / "notes").mkdir()  # a folder, but not a model's
    assert "no config.json" in one_line_error(COMMANDS[command](tmp_path / "notes", tmp_path), capsys)
    folder = copy()
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert "truncated" in one_line_error(COMMANDS[command](folder, tmp_path), capsys)


@pytest.mark.parametrize("broken", [b'{"version": "1.0", "model": {"type": "BPE"', b'{"not": "a tokenizer"}'])
def test_a_broken_tokenizer_json_is_refused_by_name_before_it_is_embedded(copy, tmp_path, capsys, broken):
    folder = copy("gemma4")
    (folder / "tokenizer.json").write_bytes(broken)
    out = tmp_path / "x.ple"
    err = one_line_error(["export", "--hf", str(folder), "--out", str(out)], capsys)
    assert str(folder / "tokenizer.json") in err and "--no-tokenizer" in err and not out.exists()
    assert main(["export", "--hf", str(folder), "--out", str(out), "--no-tokenizer"]) == 0


def test_either_source_or_hf(make_gemma, tmp_path, capsys):
    folder = make_gemma("gemma3n")
    assert "either" in one_line_error(["diagnose"], capsys)
    assert "either" in one_line_error(["export", "tiny", "--hf", str(folder), "--out", str(tmp_path / "x")], capsys)
    assert "layers 0..1" in one_line_error(["diagnose", "--hf", str(folder), "--layers", "5"], capsys)


def test_reader_matches_safetensors_for_every_dtype(tmp_path):
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(0)
    ts = {f"t_{d}": torch.randn(7, 3, generator=g).to(getattr(torch, d)) for d in ("float32", "float16", "bfloat16")}
    ts["scalar"] = torch.tensor(2.5)
    save_file({k: v for k, v in ts.items()}, str(tmp_path / "m.safetensors"))
    infos = read_header(tmp_path / "m.safetensors")
    for name, t in ts.items():
        assert torch.equal(read_tensor(infos[name]), t)
    info = infos["t_bfloat16"]
    assert torch.equal(read_rows(info, 2, 5), ts["t_bfloat16"][2:5])
    ids = np.array([6, 0, 1, 1, 4, 5])
    assert torch.equal(gather_rows(info, ids), ts["t_bfloat16"].float()[torch.from_numpy(ids)])


def test_diagnose_dtype_takes_the_training_spelling_and_the_old_one(capsys):
    """One spelling of precision across training and diagnose (fp32 / bf16); float32 / bfloat16 still parse."""
    import argparse

    from plelab.cli import diagnose

    parser = argparse.ArgumentParser()
    diagnose.add_parser(parser.add_subparsers())
    for given, want in (("fp32", "fp32"), ("bf16", "bf16"), ("float32", "fp32"), ("bfloat16", "bf16")):
        assert parser.parse_args(["diagnose", "--hf", "x", "--dtype", given]).dtype == want
    assert parser.parse_args(["diagnose", "--hf", "x"]).dtype == "fp32"
