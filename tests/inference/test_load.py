"""Device choice and the inference loader: unknown devices and unreadable model files are one-line errors."""

from __future__ import annotations

import pytest
import torch

from plelab.cli.main import main
from plelab.data.tokenizer import Tokenizer
from plelab.errors import PlelabError
from plelab.inference.load import load_for_inference, load_model
from plelab.model import LanguageModel, load_model_config
from plelab.runs.checkpoint import CheckpointError, save_checkpoint
from plelab.util.device import pick_device


@pytest.fixture
def ckpt(tmp_path):
    tok = tmp_path / "tokenizer.json"
    Tokenizer.byte_level().save(tok)
    model = LanguageModel(load_model_config("tiny", ["vocab_size=258"]))
    return save_checkpoint(tmp_path / "ckpt", model, state={"step": 1}, tokenizer=tok)


def test_auto_and_cpu_devices() -> None:
    assert pick_device("cpu") == torch.device("cpu")
    assert pick_device("auto").type in ("cpu", "cuda", "mps")


@pytest.mark.parametrize("name", ["foo", "cuda", "cuda:99", "mps"])
def test_unknown_or_unavailable_devices_are_refused(name) -> None:
    kind = name.split(":")[0]
    if kind == "cuda" and torch.cuda.is_available() and torch.cuda.device_count() > 99:
        pytest.skip("this machine has that device")
    if kind == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has mps")
    if name == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has cuda")
    with pytest.raises(PlelabError, match=repr(name)):
        pick_device(name)


@pytest.mark.parametrize("argv", [["generate", "{ckpt}", "--prompt", "hi"], ["eval", "{ckpt}", "--data", "{ckpt}"],
                                  ["diagnose", "{ckpt}"]])
def test_cli_device_errors_are_one_line(ckpt, capsys, argv) -> None:
    rc = main([a.format(ckpt=ckpt) for a in argv] + ["--device", "foo"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "unknown device 'foo'" in err, err


def test_load_for_inference_round_trip(ckpt) -> None:
    model, tok = load_for_inference(ckpt, torch.device("cpu"))
    assert model.config.vocab_size == 258 and tok.vocab_size <= 258
    assert not model.training


@pytest.mark.parametrize("name", ["manifest.json", "config.json"])
def test_non_utf8_model_files_are_a_checkpoint_error(ckpt, name) -> None:
    (ckpt / name).write_bytes(b'{"model": "caf\xe9\xff"}')
    with pytest.raises(CheckpointError, match=f"{name} is corrupt"):
        load_model(ckpt, verify=name == "manifest.json")


def test_non_utf8_model_file_in_the_cli_is_one_line(ckpt, capsys) -> None:
    (ckpt / "manifest.json").write_bytes(b"\xff\xfe{}")
    assert main(["generate", str(ckpt), "--prompt", "hi", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "corrupt" in err, err
