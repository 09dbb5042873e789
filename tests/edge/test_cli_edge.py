"""`plelab export / plan / run` through the console entry: outputs, and one-line errors (exit 2) on bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import lively_model

from plelab.cli.main import main
from plelab.data.tokenizer import Tokenizer
from plelab.edge.export import ExportOptions, export_model


def one_line_error(capsys, *argv: str) -> str:
    assert main(list(argv)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "Traceback" not in err, err
    return err


@pytest.fixture
def small(tmp_path) -> Path:
    out = tmp_path / "tiny.ple"
    assert main(["export", "tiny", "--quant", "int8", "--group", "32", "--out", str(out)]) == 0
    return out


def test_export_plan_run_roundtrip(small, capsys):
    capsys.readouterr()
    assert main(["plan", str(small), "--device", "desktop", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    for key in ("fits", "placement", "bytes_per_token", "reads_per_token", "est_ms_per_token"):
        assert key in plan
    assert plan["placement"]["table:ple"] == "nvme" and plan["reads_per_token"]["nvme"] == 1
    assert main(["run", str(small), "--ids", "1,2,3", "--max-new-tokens", "5", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert len(run["generated_ids"]) == 5 and run["tokens_per_s"] > 0
    assert run["reads_per_token"]["file"] == 1  # one PLE record per token, the tied embedding row is in RAM


def test_plan_text_says_what_goes_where(small, capsys):
    assert main(["plan", str(small), "--device", "esp32-s3"]) == 0
    out = capsys.readouterr().out
    assert "sram" in out and "flash" in out and "table:ple" in out and "ms/token" in out


def test_run_with_the_tokenizer_from_a_checkpoint(tmp_path, capsys):
    tok = Tokenizer.byte_level()
    model = lively_model(f"vocab_size={tok.vocab_size}")
    out = tmp_path / "m.ple"
    export_model(model, out, ExportOptions(quant="fp16"), tokenizer_json=tok.to_json())
    assert main(["run", str(out), "--prompt", "hello", "--max-new-tokens", "3", "--json"]) == 0
    run = json.loads(capsys.readouterr().out)
    assert run["prompt_tokens"] == 5 and isinstance(run["text"], str)


def test_bad_files_give_one_line_errors(small, tmp_path, capsys):
    raw = small.read_bytes()
    cut = tmp_path / "cut.ple"
    cut.write_bytes(raw[: len(raw) // 2])
    assert "truncated" in one_line_error(capsys, "run", str(cut), "--ids", "1")
    flipped = bytearray(raw)
    flipped[-300] ^= 0xFF
    bad = tmp_path / "flip.ple"
    bad.write_bytes(bytes(flipped))
    assert "checksum" in one_line_error(capsys, "run", str(bad), "--ids", "1")
    magic = tmp_path / "magic.ple"
    magic.write_bytes(b"NOTAPLE!" + raw[8:])
    assert "not a .ple file" in one_line_error(capsys, "run", str(magic), "--ids", "1")
    assert "no such file" in one_line_error(capsys, "run", str(tmp_path / "missing.ple"), "--ids", "1").lower()


def test_bad_ids_and_devices(small, capsys):
    assert "[0, 256)" in one_line_error(capsys, "run", str(small), "--ids", "1,2,999")
    assert "comma-separated" in one_line_error(capsys, "run", str(small), "--ids", "a,b")
    assert "unknown device" in one_line_error(capsys, "plan", str(small), "--device", "toaster")


def test_too_big_for_the_device(capsys):
    err = one_line_error(capsys, "plan", "esp32-28m", "--quant", "fp32", "--device", "esp32-s3")
    assert "does not fit esp32-s3" in err and "missing" in err and "flash" in err
    err = one_line_error(capsys, "plan", "esp32-28m", "--quant", "int8", "--set", "hidden_size=512",
                         "--device", "esp32-s3")
    assert "does not fit" in err


def test_user_device_file(small, tmp_path, capsys):
    dev = tmp_path / "devs.toml"
    dev.write_text(
        '[devices.tinymcu]\ndescription = "x"\nflops_per_s = 1e8\n'
        '[[devices.tinymcu.tiers]]\nname = "ram"\nkind = "ram"\ncapacity = 1000\nread_mb_s = 100\n'
        '[[devices.tinymcu.tiers]]\nname = "rom"\nkind = "storage"\ncapacity = 100000000\nread_mb_s = 10\n'
    )
    err = one_line_error(capsys, "plan", str(small), "--device", "tinymcu", "--devices", str(dev))
    assert "ram" in err and "missing" in err


def test_console_entry_has_no_traceback_on_corrupt_input(small, tmp_path):
    bad = tmp_path / "bad.ple"
    bad.write_bytes(small.read_bytes()[:-7])
    out = subprocess.run([sys.executable, "-m", "plelab", "run", str(bad), "--ids", "1"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().startswith("plelab run: error:") and "truncated" in out.stderr


def test_export_and_plan_a_checkpoint_with_its_tokenizer(tmp_path, capsys):
    from plelab.training.checkpoint import save_checkpoint

    tok = Tokenizer.byte_level()
    tok_file = tok.save(tmp_path / "tokenizer.json")
    model = lively_model(f"vocab_size={tok.vocab_size}")
    ckpt = save_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001", model, tokenizer=tok_file)
    out = tmp_path / "ckpt.ple"
    assert main(["export", str(tmp_path / "run"), "--quant", "int8", "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["sections"]["tokenizer"]["bytes"] > 0 and info["file_bytes"] == out.stat().st_size
    assert main(["plan", str(ckpt), "--quant", "int8", "--device", "esp32-p4", "--json"]) == 0
    from_ckpt = json.loads(capsys.readouterr().out)
    assert main(["plan", str(out), "--device", "esp32-p4", "--json"]) == 0
    from_file = json.loads(capsys.readouterr().out)
    # Planning the checkpoint analytically gives the file's numbers (the tokenizer is host-side).
    assert from_ckpt["bytes_per_token"] == from_file["bytes_per_token"]
    assert main(["run", str(out), "--prompt", "hi", "--max-new-tokens", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prompt_tokens"] == 2
