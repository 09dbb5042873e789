"""`plelab generate` and `plelab run`: the same sampler and decode loop, and one stderr line when the context cuts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from plelab.cli.main import main
from plelab.data.tokenizer import Tokenizer
from plelab.edge.export import ExportOptions, export_model
from plelab.model import LanguageModel, load_model_config
from plelab.runs.checkpoint import save_checkpoint


@pytest.fixture(scope="module")
def run_and_ple(tmp_path_factory) -> tuple[Path, Path]:
    """A run folder with a byte-tokenizer checkpoint (context 32), and the same weights as an fp32 .ple."""
    tmp = tmp_path_factory.mktemp("gen")
    tok = Tokenizer.byte_level()
    torch.manual_seed(0)
    model = LanguageModel(load_model_config("tiny", [f"vocab_size={tok.vocab_size}", "max_seq_len=32",
                                                     "init_std=0.2"])).eval()
    save_checkpoint(tmp / "run" / "checkpoints" / "step_00000001", model, tokenizer=tok.save(tmp / "tok.json"))
    export_model(model, tmp / "m.ple", ExportOptions(quant="fp32"), tokenizer_json=tok.to_json())
    return tmp / "run", tmp / "m.ple"


def test_generate_and_run_sample_the_same_tokens(run_and_ple, capsys):
    run, ple = run_and_ple
    for sampling in ([], ["--temperature", "0"], ["--temperature", "1.5", "--top-k", "20", "--top-p", "0.9",
                                                  "--seed", "5"]):
        assert main(["generate", str(run), "--prompt", "ab", "--max-new-tokens", "6", "--device", "cpu",
                     *sampling]) == 0
        text = capsys.readouterr().out
        assert main(["run", str(ple), "--prompt", "ab", "--max-new-tokens", "6", "--json", *sampling]) == 0
        edge = json.loads(capsys.readouterr().out)
        assert text == "ab" + edge["text"] + "\n"


def test_generate_says_once_when_the_context_cuts_the_output(run_and_ple, capsys):
    run, _ = run_and_ple
    assert main(["generate", str(run), "--prompt", "x" * 30, "--max-new-tokens", "50", "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "generating 3 tokens, not 50" in captured.err
    assert "context is 32" in captured.err


def test_generate_and_run_keep_the_end_of_a_too_long_prompt(run_and_ple, capsys):
    run, ple = run_and_ple
    assert main(["generate", str(run), "--prompt", "y" * 40, "--max-new-tokens", "4", "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "kept the last 29 of the prompt's 40 tokens" in err
    assert main(["run", str(ple), "--prompt", "y" * 40, "--max-new-tokens", "4", "--json"]) == 0
    captured = capsys.readouterr()
    assert "kept the last 29" in captured.err and json.loads(captured.out)["prompt_tokens"] == 29


def test_a_request_that_fits_says_nothing(run_and_ple, capsys):
    run, _ = run_and_ple
    assert main(["generate", str(run), "--prompt", "hi", "--max-new-tokens", "3", "--device", "cpu"]) == 0
    assert capsys.readouterr().err == ""


def test_a_prompt_of_invalid_utf8_is_one_line_in_generate_and_both_run_engines(run_and_ple, capsys):
    """`--prompt $'caf\xe9'`: Python hands such argv bytes over as lone surrogates ("caf\udce9"); the real process
    is checked too, for `run` (which starts without torch)."""
    import subprocess
    import sys

    run, ple = run_and_ple
    for argv in (["generate", str(run), "--device", "cpu"], ["run", str(ple)], ["run", str(ple), "--engine", "c"]):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--prompt", "caf\udce9", "--max-new-tokens", "2"])
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "--prompt" in err and "UTF-8" in err and "0xe9" in err, err
    proc = subprocess.run([sys.executable, "-m", "plelab", "run", str(ple), "--prompt", b"caf\xe9"],
                          capture_output=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count(b"\n") == 1 and b"UTF-8" in proc.stderr, proc.stderr
