"""`plelab data ...` end to end: prepare, tokenizer, info, eval-domains; bad input gives one line and exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from data_helpers import DOCS, write_docs

from plelab.cli.main import main
from plelab.data.loader import TokenDataset
from plelab.data.tokenizer import Tokenizer


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_help_has_examples(capsys):
    for argv in (["data", "--help"], ["data", "prepare", "--help"], ["data", "tokenizer", "--help"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 0
        assert "Example" in capsys.readouterr().out


def test_prepare_from_scratch_trains_the_tokenizer(tmp_path, capsys):
    write_docs(tmp_path / "in" / "a.txt", [f"{i} {d}" for i in range(30) for d in DOCS])
    tok = tmp_path / "tok.json"
    rc, out, err = run(capsys, "data", "prepare", str(tmp_path / "in"), "--tokenizer", str(tok), "--vocab-size", "300",
                       "--out", str(tmp_path / "ds"), "--val-fraction", "0.1", "--no-progress")
    assert rc == 0, err
    assert "tokens/s" in out and "trained a 300-token BPE" in err
    ds = TokenDataset(tmp_path / "ds", "train", tokenizer_sha256=Tokenizer.load(tok).sha256, vocab_size=300)
    assert len(ds) > 1000
    rc, out, _ = run(capsys, "data", "info", str(tmp_path / "ds"), "--sample", "20", "--verify")
    assert rc == 0 and "verified" in out and "first 20" in out
    rc, out, _ = run(capsys, "data", "info", str(tmp_path / "ds"), "--json")
    assert json.loads(out)["tokenizer"]["vocab_size"] == 300


def test_tokenizer_and_eval_domains_commands(tmp_path, capsys):
    write_docs(tmp_path / "train.txt", DOCS * 20)
    write_docs(tmp_path / "valid" / "en.txt", DOCS[:2])
    write_docs(tmp_path / "valid" / "zh.txt", DOCS[2:3])
    rc, out, err = run(capsys, "data", "tokenizer", str(tmp_path / "train.txt"), "--vocab-size", "280",
                       "--out", str(tmp_path / "t.json"), "--json")
    assert rc == 0, err
    assert json.loads(out)["vocab_size"] == 280
    rc, out, err = run(capsys, "data", "tokenizer", "--byte", "--out", str(tmp_path / "b.json"))
    assert rc == 0 and "vocab 258" in out
    rc, out, err = run(capsys, "data", "eval-domains", str(tmp_path / "valid"), "--tokenizer", str(tmp_path / "t.json"),
                       "--cache", str(tmp_path / "cache"), "--json")
    assert rc == 0, err
    doms = json.loads(out)["domains"]
    assert list(doms) == ["en", "zh"] and doms["zh"]["documents"] == 1


def bad_inputs(tmp_path):
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 40)
    (tmp_path / "gbk.txt").write_bytes("滚滚长江东逝水，浪花淘尽英雄。".encode("gbk") * 30)
    (tmp_path / "seps.txt").write_text("<|endoftext|>\n  \n<|endoftext|>\n")
    (tmp_path / "data.bin").write_text("hello")
    (tmp_path / "bad.jsonl").write_text('{"text": "a"}\n{broken\n')
    return {
        "missing.txt": "missing.txt: no such file or directory",
        "empty.txt": "empty.txt: empty file",
        "binary.txt": "binary.txt: binary file",
        "gbk.txt": "gbk.txt: not UTF-8 text",
        "seps.txt": "seps.txt: no documents",
        "data.bin": "data.bin: unknown input type",
        "bad.jsonl": "bad.jsonl:2: invalid JSON",
    }


def test_bad_inputs_exit_2_with_one_line_and_leave_nothing(tmp_path, capsys):
    for name, message in bad_inputs(tmp_path).items():
        out_dir = tmp_path / f"out-{name}"
        rc, out, err = run(capsys, "data", "prepare", str(tmp_path / name), "--tokenizer", "byte",
                           "--out", str(out_dir), "--no-progress")
        assert rc == 2, (name, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("plelab data: error: ") and message in lines[0], err
        assert not out_dir.exists() and not list(tmp_path.glob(f".out-{name}*"))
    # A missing tokenizer without --vocab-size, and a mismatched one at load time, are one line too.
    write_docs(tmp_path / "ok.txt", DOCS)
    rc, _, err = run(capsys, "data", "prepare", str(tmp_path / "ok.txt"), "--tokenizer", str(tmp_path / "no.json"),
                     "--out", str(tmp_path / "o"))
    assert rc == 2 and "tokenizer not found (pass --vocab-size N" in err


def test_a_few_bad_bytes_are_replaced_with_a_warning(tmp_path, capsys):
    (tmp_path / "latin.txt").write_bytes("Once upon a time, caf\xe9.\n".encode("latin-1") * 20)
    rc, out, err = run(capsys, "data", "prepare", str(tmp_path / "latin.txt"), "--tokenizer", "byte",
                       "--out", str(tmp_path / "o"), "--no-progress", "--json")
    assert rc == 0, err
    assert "20 invalid UTF-8 sequence(s) replaced" in err
    assert json.loads(out)["sources"][0]["replaced_utf8_sequences"] == 20


def test_console_prints_no_traceback(tmp_path):
    (tmp_path / "binary.txt").write_bytes(b"\x00\x01" * 100)
    proc = subprocess.run([sys.executable, "-m", "plelab", "data", "prepare", str(tmp_path / "binary.txt"),
                           "--tokenizer", "byte", "--out", str(tmp_path / "o")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr and "binary file" in proc.stderr


def test_an_existing_tokenizer_of_another_kind_than_asked_is_refused(tmp_path, capsys):
    src = write_docs(tmp_path / "a.txt", DOCS * 20)
    Tokenizer.byte_level().save(tmp_path / "tok.json")
    rc, _, err = run(capsys, "data", "prepare", str(src), "--tokenizer", str(tmp_path / "tok.json"),
                     "--tokenizer-kind", "gemma", "--vocab-size", "300", "--out", str(tmp_path / "ds"))
    assert rc == 2 and "is a byte-level tokenizer, not gemma" in err and err.count("\n") == 1, err
    assert not (tmp_path / "ds").exists()
    rc, _, err = run(capsys, "data", "prepare", str(src), "--tokenizer", str(tmp_path / "tok.json"),
                     "--out", str(tmp_path / "ds"))
    assert rc == 0 and Tokenizer.load(tmp_path / "ds").kind == "byte-level"
