"""The Gemma-style tokenizer (`plelab data tokenizer --kind gemma`): Gemma's tokenizer.json form, lossless, and
encoded the same whole or in pieces (what llama.cpp's gemma4 tokenizer relies on: it cuts at newline runs)."""

from __future__ import annotations

import json

import pytest
from data_helpers import DOCS, corpus_text, write_docs

from plelab.cli.main import main
from plelab.data.sources import split_pieces
from plelab.data.tokenizer import Tokenizer, TokenizerError, tokenizer_kind


@pytest.fixture(scope="module")
def gemma() -> Tokenizer:
    return Tokenizer.train_gemma([corpus_text()], 600, min_frequency=2)


def test_gemma_layout_is_gemmas_tokenizer_json(gemma):
    d = json.loads(gemma.to_json())
    assert d["model"]["type"] == "BPE" and d["model"]["byte_fallback"] and d["model"]["unk_token"] == "<unk>"
    assert d["normalizer"] == {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    assert d["pre_tokenizer"]["type"] == "Split" and d["pre_tokenizer"]["behavior"] == "MergedWithPrevious"
    assert [s["type"] for s in d["decoder"]["decoders"]] == ["Replace", "ByteFallback", "Fuse"]
    assert gemma.kind == tokenizer_kind(gemma.to_json()) == "gemma"
    assert (gemma.pad_id, gemma.eot_id, gemma.token_to_id("<unk>")) == (0, 1, 2)
    assert [gemma.token_to_id(f"<0x{b:02X}>") for b in (0, 255)] == [3, 258]
    assert gemma.vocab_size <= 600 and gemma.vocab_size > 300  # merges were learned
    assert Tokenizer.byte_level().kind == "byte-level"


def test_gemma_round_trip_and_byte_fallback(gemma):
    for text in DOCS + ["unseen ☃ ꙮ chars\r\n\t end  "]:
        ids = gemma.encode(text)
        assert gemma.decode(ids) == text
    snowman = gemma.encode("☃")  # not in the training text: three UTF-8 bytes
    assert snowman == [gemma.token_to_id(f"<0x{b:02X}>") for b in "☃".encode()]


def test_no_merge_crosses_a_newline_or_a_word_start(gemma):
    merges = json.loads(gemma.to_json())["model"]["merges"]
    for left, right in (m.split(" ", 1) if isinstance(m, str) else m for m in merges):
        assert "\n" not in left + right
        assert "▁" not in right  # "▁" only ever starts a token
    text = "\n".join(DOCS * 3) + "\n\n  x\n \n\ty"
    pieces = list(split_pieces(text, target=17))
    assert len(pieces) > 5 and [i for p in pieces for i in gemma.encode(p)] == gemma.encode(text)
    lines = text.split("\n")
    newline = gemma.encode("\n")
    joined = [i for k, line in enumerate(lines) for i in (newline if k else []) + gemma.encode(line)]
    assert joined == gemma.encode(text)  # llama.cpp tokenizes line by line


def test_gemma_transformers_gemma_tokenizer_agrees(tmp_path, gemma):
    transformers = pytest.importorskip("transformers")
    d = json.loads(gemma.to_json())
    vocab, merges = d["model"]["vocab"], [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1))
                                          for m in d["model"]["merges"]]
    theirs = transformers.GemmaTokenizer(vocab=vocab, merges=merges, bos_token="<eos>")  # Gemma's own pipeline
    for text in DOCS:
        assert theirs(text, add_special_tokens=False)["input_ids"] == gemma.encode(text)


def test_gemma_too_small():
    with pytest.raises(TokenizerError, match="too small for a Gemma-style BPE"):
        Tokenizer.train_gemma(["abc"], 200)


def test_padded_to_keeps_encoding(gemma):
    padded = gemma.padded_to(gemma.vocab_size + 5)
    assert padded.vocab_size == gemma.vocab_size + 5
    assert padded.id_to_token(gemma.vocab_size) == "<unused0>"
    assert all(padded.encode(t) == gemma.encode(t) for t in DOCS)
    assert gemma.padded_to(10) is gemma


def test_cli_kind_gemma(tmp_path, capsys):
    src = write_docs(tmp_path / "in" / "c.txt", DOCS * 20)
    out = tmp_path / "tok.json"
    assert main(["data", "tokenizer", str(src), "--kind", "gemma", "--vocab-size", "400", "--out", str(out),
                 "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "gemma" and Tokenizer.load(out).kind == "gemma"
    data = tmp_path / "ds"
    assert main(["data", "prepare", str(src), "--tokenizer", str(tmp_path / "t2.json"), "--vocab-size", "400",
                 "--tokenizer-kind", "gemma", "--out", str(data), "--no-progress"]) == 0
    assert Tokenizer.load(data).kind == "gemma"
