"""Tokenizer: byte and BPE kinds, round trips, hashes, save/load, transformers compatibility."""

from __future__ import annotations

import hashlib

import pytest
from data_helpers import DOCS, corpus_text

from plelab.data.sources import split_pieces
from plelab.data.tokenizer import EOT, PAD, TRAIN_RUN_CHARS, Tokenizer, TokenizerError, bounded_runs


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    return Tokenizer.train_bpe(corpus_text().splitlines(), vocab_size=400)


def test_byte_tokenizer_ids_and_round_trip():
    tok = Tokenizer.byte_level()
    assert tok.vocab_size == 258 and tok.eot_id == 0 and tok.pad_id == 1
    assert tok.encode("a") == [ord("a") + 2]
    assert tok.encode("é") == [0xC3 + 2, 0xA9 + 2]
    assert tok.encode(EOT) == [0] and tok.token_to_id(PAD) == 1
    for text in DOCS:
        ids = tok.encode(text)
        assert len(ids) == len(text.encode("utf-8"))
        assert tok.decode(ids) == text


def test_bpe_specials_first_and_round_trip(bpe):
    assert bpe.eot_id == 0 and bpe.pad_id == 1
    assert 258 < bpe.vocab_size <= 400
    for text in DOCS + ["unseen wörds ∑ 𝔘 \r\n\ttabs", ""]:
        assert bpe.decode(bpe.encode(text)) == text
    assert len(bpe.encode(DOCS[0])) < len(DOCS[0].encode())  # merges were learned
    assert bpe.encode_batch(DOCS[:2]) == [bpe.encode(DOCS[0]), bpe.encode(DOCS[1])]


def test_bpe_training_is_deterministic(bpe):
    again = Tokenizer.train_bpe(iter(corpus_text().splitlines()), vocab_size=400)
    assert again.sha256 == bpe.sha256


def test_vocab_too_small():
    with pytest.raises(TokenizerError, match="too small"):
        Tokenizer.train_bpe(["abc"], vocab_size=100)


def test_save_load_keeps_hash(tmp_path, bpe):
    p = bpe.save(tmp_path / "tok.json")
    loaded = Tokenizer.load(p)
    assert loaded.sha256 == bpe.sha256 == hashlib.sha256(p.read_bytes()).hexdigest()
    folder = tmp_path / "ckpt"
    folder.mkdir()
    assert bpe.save(folder) == folder / "tokenizer.json"
    assert Tokenizer.load(folder).sha256 == bpe.sha256  # a folder holding tokenizer.json loads too
    assert loaded.encode(DOCS[2]) == bpe.encode(DOCS[2])
    assert Tokenizer.byte_level().sha256 != bpe.sha256


def test_load_errors(tmp_path):
    with pytest.raises(TokenizerError, match="not found"):
        Tokenizer.load(tmp_path / "nope.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(TokenizerError, match="invalid JSON"):
        Tokenizer.load(tmp_path / "bad.json")
    (tmp_path / "odd.json").write_text('{"hello": 1}')
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        Tokenizer.load(tmp_path / "odd.json")


@pytest.mark.parametrize("kind", ["byte", "bpe"])
def test_transformers_loads_tokenizer_json(tmp_path, bpe, kind):
    transformers = pytest.importorskip("transformers")
    tok = Tokenizer.byte_level() if kind == "byte" else bpe
    path = tok.save(tmp_path / "tokenizer.json")
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(path), eos_token=EOT, pad_token=PAD)
    assert hf.eos_token_id == tok.eot_id == 0 and hf.pad_token_id == 1
    assert len(hf) == tok.vocab_size
    for text in DOCS:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == tok.encode(text)
        assert hf.decode(ids) == text
    assert tok.to_hf().encode(DOCS[3], add_special_tokens=False) == tok.encode(DOCS[3])


def test_piecewise_encoding_equals_whole(bpe):
    # Pieces end only before a non-whitespace line start, where no pretoken can straddle: same ids as the whole.
    text = "\n".join(DOCS * 3) + "\n\n  x\n \n\ty"
    pieces = list(split_pieces(text, target=17))
    assert len(pieces) > 5 and "".join(pieces) == text
    for tok in (bpe, Tokenizer.byte_level()):
        assert [i for p in pieces for i in tok.encode(p)] == tok.encode(text)


@pytest.mark.parametrize("kind", ["byte-level", "gemma"])
def test_training_on_one_unbroken_line_costs_what_spaced_text_costs(kind):
    """BPE training is quadratic in a word's length, so a 500 KB one-word text cost many times what the same
    characters with a space every 200 cost; both are timed under the same load, so the machine's speed cancels.
    The line still encodes and decodes whole, and no learned token is longer than the training runs."""
    import random
    import time

    rng = random.Random(0)
    line = "".join(rng.choice("abcdefghijklmnop") for _ in range(500_000))
    spaced = " ".join(line[i : i + 200] for i in range(0, len(line), 200))
    train = Tokenizer.train_gemma if kind == "gemma" else Tokenizer.train_bpe
    seconds = {}
    for name, text in (("spaced", spaced), ("line", line)):
        start = time.perf_counter()
        tok = train([text], 400)
        seconds[name] = time.perf_counter() - start
    assert seconds["line"] < 3 * seconds["spaced"] + 2.0, seconds
    assert max(len(t) for t in tok.backend.get_vocab()) <= TRAIN_RUN_CHARS
    assert tok.decode(tok.encode(line[:5000])) == line[:5000]


def test_training_cuts_only_runs_longer_than_the_bound():
    short, long_ = "x" * TRAIN_RUN_CHARS, "y" * (2 * TRAIN_RUN_CHARS + 5)
    assert list(bounded_runs([f"a {short} b"])) == [f"a {short} b"]
    (cut,) = bounded_runs([f"a {long_} b"])
    assert cut.split() == ["a", "y" * TRAIN_RUN_CHARS, "y" * TRAIN_RUN_CHARS, "y" * 5, "b"]


@pytest.mark.parametrize("kind", ["byte-level", "gemma"])
def test_a_tokenizer_re_saved_by_transformers_is_the_same_tokenizer(tmp_path, kind):
    pytest.importorskip("transformers")
    from plelab.data.tokenizer import tokenizer_difference

    train = Tokenizer.train_gemma if kind == "gemma" else Tokenizer.train_bpe
    tok = train([corpus_text() * 3], 300)
    tok.to_hf().save_pretrained(tmp_path)
    resaved = Tokenizer.load(tmp_path)
    assert resaved.sha256 != tok.sha256 and tokenizer_difference(resaved, tok) is None
    other = train([corpus_text()[::-1] * 3], 300)
    assert tokenizer_difference(other, tok).startswith("their model differs (")
    bigger = train([corpus_text() * 3], 320)
    assert "vocabulary entries" in tokenizer_difference(bigger, tok)
