"""`plelab diagnose` / `plelab eval` refuse data and windows the model cannot use: one line, exit 2."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from diagnostic_helpers import tiny_config

from plelab.cli.main import main
from plelab.data.prepare import prepare_dataset, train_tokenizer
from plelab.data.tokenizer import Tokenizer
from plelab.model.transformer import LanguageModel
from plelab.runs.checkpoint import save_checkpoint

TEXT = "The cat sat on the mat. A dog ran in the park. " * 40


@pytest.fixture
def bpe_run(tmp_path):
    """A run whose checkpoint ships a small BPE tokenizer (the model's vocabulary has room for bytes too)."""
    (tmp_path / "corpus.txt").write_text(TEXT)
    tok = train_tokenizer([tmp_path / "corpus.txt"], 280, max_bytes=None)
    tok.save(tmp_path / "bpe.json")
    torch.manual_seed(0)
    model = LanguageModel(dataclasses.replace(tiny_config(), vocab_size=300))
    save_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001", model, tokenizer=tmp_path / "bpe.json")
    return tmp_path


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_diagnose_refuses_a_dataset_prepared_with_another_tokenizer(bpe_run, capsys):
    docs = bpe_run / "docs.txt"
    docs.write_text("\n<|endoftext|>\n".join(f"Document {i}. {TEXT}" for i in range(20)) + "\n")
    prepare_dataset([docs], Tokenizer.byte_level(), bpe_run / "bytes", val_fraction=0.5, progress=False)
    err = one_line_error(capsys, ["diagnose", str(bpe_run / "run"), "--data", str(bpe_run / "bytes"),
                                  "--seq-len", "16", "--batches", "1"])
    assert "tokenizer" in err and "prepare the data with the model's tokenizer" in err


def test_diagnose_data_shorter_than_one_window_is_one_clear_line(bpe_run, capsys):
    np.save(bpe_run / "short.npy", np.arange(10, dtype=np.uint16))
    err = one_line_error(capsys, ["diagnose", str(bpe_run / "run"), "--data", str(bpe_run / "short.npy"),
                                  "--seq-len", "16"])
    assert "10 tokens, fewer than one window of 17" in err


def test_diagnose_npy_that_is_not_an_array_is_one_line(bpe_run, capsys):
    (bpe_run / "junk.npy").write_text("not numpy")
    assert "not a readable .npy" in one_line_error(capsys, ["diagnose", str(bpe_run / "run"), "--data",
                                                            str(bpe_run / "junk.npy")])


@pytest.mark.parametrize("command", ["diagnose", "eval"])
def test_seq_len_beyond_the_models_context_is_refused(bpe_run, capsys, command):
    (bpe_run / "valid").mkdir()
    (bpe_run / "valid" / "prose.txt").write_text(TEXT)
    err = one_line_error(capsys, [command, str(bpe_run / "run"), "--data", str(bpe_run / "valid"),
                                  "--seq-len", "64", "--device", "cpu"])
    assert "--seq-len 64 is beyond the model's context of 32 tokens" in err


def test_a_damaged_monitor_file_does_not_stop_the_diagnosis(bpe_run, capsys):
    (bpe_run / "run" / "diagnostics").mkdir()
    (bpe_run / "run" / "diagnostics" / "final.json").write_bytes(b"\xff{ cut short")
    assert main(["diagnose", str(bpe_run / "run")]) == 0
    assert "monitor final used verdict (step None): unreadable" in capsys.readouterr().out
