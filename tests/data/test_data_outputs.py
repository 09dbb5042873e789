"""`plelab data` never writes over an existing file, an input or more than a bounded number of shards."""

from __future__ import annotations

import pytest
from data_helpers import DOCS, write_docs

from plelab.cli.main import main
from plelab.data.prepare import MAX_SHARDS, prepare_dataset
from plelab.data.sources import DataError
from plelab.data.tokenizer import Tokenizer


def run(capsys, *argv: str) -> tuple[int, str]:
    rc = main(list(argv))
    err = capsys.readouterr().err
    assert rc == 0 or err.count("\n") == 1, err  # an error is one line
    return rc, err


def test_tokenizer_out_refuses_an_existing_file_unless_overwrite(tmp_path, capsys):
    out = tmp_path / "notes.json"
    out.write_text("precious")
    rc, err = run(capsys, "data", "tokenizer", "--byte", "--out", str(out))
    assert rc == 2 and "already exists; pass --overwrite" in err
    assert out.read_text() == "precious"
    rc, _ = run(capsys, "data", "tokenizer", "--byte", "--out", str(out), "--overwrite")
    assert rc == 0 and Tokenizer.load(out).vocab_size == 258


def test_tokenizer_out_never_replaces_a_corpus_file_it_reads(tmp_path, capsys):
    corpus = write_docs(tmp_path / "corpus" / "a.txt", DOCS * 20)
    before = corpus.read_bytes()
    for target in (corpus, tmp_path / "corpus" / "a.txt"):
        rc, err = run(capsys, "data", "tokenizer", str(tmp_path / "corpus"), "--vocab-size", "280",
                      "--out", str(target), "--overwrite")
        assert rc == 2 and "is also an input" in err
    assert corpus.read_bytes() == before
    rc, err = run(capsys, "data", "tokenizer", str(tmp_path / "corpus"), "--vocab-size", "280",
                  "--out", str(tmp_path / "corpus"))
    assert rc == 2 and "inside the input folder" in err
    assert [p.name for p in (tmp_path / "corpus").iterdir()] == ["a.txt"]


def test_prepare_overwrite_never_deletes_an_input_inside_the_old_dataset(tmp_path):
    src = write_docs(tmp_path / "a.txt", DOCS)
    prepare_dataset([src], Tokenizer.byte_level(), tmp_path / "ds", progress=False)
    inside = write_docs(tmp_path / "ds" / "notes.txt", DOCS)
    with pytest.raises(DataError, match="inside the output folder"):
        prepare_dataset([inside], Tokenizer.byte_level(), tmp_path / "ds", progress=False, overwrite=True)
    assert inside.is_file()


def test_shard_count_is_bounded(tmp_path, capsys):
    src = write_docs(tmp_path / "a.txt", ["x" * (MAX_SHARDS + 100)])
    rc, err = run(capsys, "data", "prepare", str(src), "--tokenizer", "byte", "--out", str(tmp_path / "ds"),
                  "--shard-tokens", "1", "--no-progress")
    assert rc == 2 and f"more than {MAX_SHARDS} shard files" in err and "--shard-tokens" in err
    assert not (tmp_path / "ds").exists() and not list(tmp_path.glob(".ds.partial-*"))



def test_tokenizer_out_never_replaces_a_prepared_datasets_tokenizer(tmp_path, capsys, monkeypatch):
    src = write_docs(tmp_path / "a.txt", DOCS * 20)
    prepare_dataset([src], Tokenizer.byte_level(), tmp_path / "ds", progress=False)
    capsys.readouterr()  # its note about the validation split
    before = (tmp_path / "ds" / "tokenizer.json").read_bytes()
    (tmp_path / "ds-link").symlink_to(tmp_path / "ds")
    monkeypatch.chdir(tmp_path)
    for out in ("ds", "ds/", str(tmp_path / "ds"), "ds/tokenizer.json", "ds-link/"):
        rc, err = run(capsys, "data", "tokenizer", str(src), "--vocab-size", "280", "--out", out, "--overwrite")
        assert rc == 2 and "is in the prepared dataset" in err, err
    assert (tmp_path / "ds" / "tokenizer.json").read_bytes() == before
