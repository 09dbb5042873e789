"""prepare_dataset: shard contents, manifest, deterministic split, atomic output, tokenizer training, eval domains."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from data_helpers import DOCS, write_docs

from plelab.data import prepare as prep
from plelab.data.prepare import (
    load_eval_domains,
    prepare_dataset,
    resolve_tokenizer,
    token_dtype,
)
from plelab.data.sources import DataError
from plelab.data.tokenizer import Tokenizer

MANY = [f"document number {i}: " + DOCS[i % len(DOCS)] for i in range(200)]


def read_split(out, manifest, split) -> np.ndarray:
    parts = [np.fromfile(out / s["file"], dtype=manifest["dtype"]) for s in manifest["splits"][split]["shards"]]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=manifest["dtype"])


def test_shards_hold_every_document_then_eot(tmp_path):
    src = write_docs(tmp_path / "in" / "a.txt", MANY)
    tok = Tokenizer.byte_level()
    m = prepare_dataset([src], tok, tmp_path / "out", val_fraction=0.1, shard_tokens=1000, progress=False)
    out = tmp_path / "out"
    assert m["dtype"] == "uint16" and m["tokenizer"]["sha256"] == tok.sha256 and m["tokenizer"]["eot_id"] == 0
    assert Tokenizer.load(out / "tokenizer.json").sha256 == tok.sha256
    assert json.loads((out / "manifest.json").read_text()) == m
    tr, va = m["splits"]["train"], m["splits"]["val"]
    assert tr["documents"] + va["documents"] == 200 and 5 <= va["documents"] <= 40
    assert len(tr["shards"]) > 3 and all(s["tokens"] <= 1000 for s in tr["shards"])
    # Decoding the split back gives its documents in input order, each followed by EOT.
    train_docs = [d for d in MANY if not prep.is_val_document(d, 0, 0.1)]
    ids = read_split(out, m, "train")
    assert tok.decode(ids) == "".join(d + "<|endoftext|>" for d in train_docs)
    assert tr["tokens"] == len(ids) == sum(len(d.encode()) + 1 for d in train_docs)
    assert tr["bytes"] == sum(len(d.encode()) for d in train_docs)
    assert tr["max_token_id"] == int(ids.max())
    assert m["sources"][0]["documents"] == 200 and len(m["sources"][0]["sha256"]) == 64
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging leftovers


def test_output_is_byte_identical_and_batching_independent(tmp_path):
    a = write_docs(tmp_path / "a.txt", MANY[:120])
    b = write_docs(tmp_path / "b.txt", MANY[120:])
    tok = Tokenizer.train_bpe(MANY, vocab_size=300)
    m1 = prepare_dataset([a, b], tok, tmp_path / "o1", progress=False, val_fraction=0.2)
    m2 = prepare_dataset([a, b], tok, tmp_path / "o2", progress=False, val_fraction=0.2, batch_chars=100)
    for split in ("train", "val"):
        for s1, s2 in zip(m1["splits"][split]["shards"], m2["splits"][split]["shards"], strict=True):
            assert (tmp_path / "o1" / s1["file"]).read_bytes() == (tmp_path / "o2" / s2["file"]).read_bytes()
    drop = ("created", "elapsed_s", "tokens_per_s")
    assert {k: v for k, v in m1.items() if k not in drop} == {k: v for k, v in m2.items() if k not in drop}
    # A different seed moves different documents into val.
    m3 = prepare_dataset([a, b], tok, tmp_path / "o3", progress=False, val_fraction=0.2, seed=1)
    assert m3["splits"]["val"]["shards"][0]["sha256"] != m1["splits"]["val"]["shards"][0]["sha256"]


def test_token_dtype():
    assert token_dtype(258) == np.uint16 and token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32


def test_failure_midway_leaves_nothing(tmp_path, monkeypatch):
    src = write_docs(tmp_path / "a.txt", MANY)
    tok = Tokenizer.byte_level()
    calls = {"n": 0}
    real = tok.encode_batch

    def flaky(texts):
        calls["n"] += 1
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real(texts)

    monkeypatch.setattr(tok, "encode_batch", flaky)
    with pytest.raises(DataError, match="No space left on device"):
        prepare_dataset([src], tok, tmp_path / "out", progress=False, batch_chars=500)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]


def test_sigkill_midway_leaves_no_dataset_and_next_run_cleans_up(tmp_path):
    src = write_docs(tmp_path / "a.txt", MANY)
    script = textwrap.dedent(f"""
        import os, signal
        from plelab.data.prepare import prepare_dataset
        from plelab.data.tokenizer import Tokenizer
        tok = Tokenizer.byte_level()
        real, n = tok.encode_batch, [0]
        def dying(texts):
            n[0] += 1
            if n[0] == 3:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(texts)
        tok.encode_batch = dying
        prepare_dataset([{str(src)!r}], tok, {str(tmp_path / "out")!r}, progress=False, batch_chars=300)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=120)
    assert proc.returncode == -9
    assert not (tmp_path / "out").exists()
    leftovers = [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
    assert len(leftovers) == 1 and not (leftovers[0] / "manifest.json").exists()
    prepare_dataset([src], Tokenizer.byte_level(), tmp_path / "out", progress=False)
    assert (tmp_path / "out" / "manifest.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]


def test_existing_output_needs_overwrite(tmp_path):
    src = write_docs(tmp_path / "a.txt", MANY[:10])
    tok = Tokenizer.byte_level()
    prepare_dataset([src], tok, tmp_path / "out", progress=False)
    with pytest.raises(DataError, match="already exists"):
        prepare_dataset([src], tok, tmp_path / "out", progress=False)
    write_docs(src, MANY[:20])
    m = prepare_dataset([src], tok, tmp_path / "out", progress=False, overwrite=True)
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 20
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "precious.txt").write_text("keep me")
    with pytest.raises(DataError, match="not a prepared dataset"):
        prepare_dataset([src], tok, tmp_path / "other", progress=False, overwrite=True)
    assert (tmp_path / "other" / "precious.txt").read_text() == "keep me"


def test_zero_documents_is_an_error(tmp_path):
    (tmp_path / "seps.txt").write_text("<|endoftext|>\n\n<|endoftext|>\n   \n")
    with pytest.raises(DataError, match="no documents"):
        prepare_dataset([tmp_path / "seps.txt"], Tokenizer.byte_level(), tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_resolve_tokenizer_trains_when_missing(tmp_path):
    src = write_docs(tmp_path / "a.txt", MANY)
    with pytest.raises(DataError, match="--vocab-size"):
        resolve_tokenizer(tmp_path / "tok.json", [src])
    tok = resolve_tokenizer(tmp_path / "tok.json", [src], vocab_size=320)
    assert (tmp_path / "tok.json").exists() and tok.vocab_size == 320
    assert resolve_tokenizer(tmp_path / "tok.json").sha256 == tok.sha256
    assert resolve_tokenizer("byte").vocab_size == 258


def test_eval_domains_layout_head_and_cache(tmp_path, monkeypatch):
    valid = tmp_path / "valid"
    write_docs(valid / "en.txt", DOCS[:4])
    write_docs(valid / "zh.txt", [DOCS[2]] * 3)
    tok = Tokenizer.byte_level()
    doms = load_eval_domains(valid, tok, cache_dir=tmp_path / "cache")
    assert list(doms) == ["en", "zh"]
    en = doms["en"]
    assert en.n_bytes == sum(len(d.encode()) for d in DOCS[:4]) and en.n_docs == 4
    assert tok.decode(en.tokens) == "<|endoftext|>" + "".join(d + "<|endoftext|>" for d in DOCS[:4])
    assert en.n_targets == en.n_bytes + 4  # every byte plus each document's EOT is predicted
    h = en.head(int(en.doc_token_ends[1]) + 3)
    assert h.n_docs == 2 and h.n_bytes == len(DOCS[0].encode()) + len(DOCS[1].encode())
    assert en.head(1).n_docs == 1 and en.head(10**9) is en
    # Second call is served from the cache; a changed file is re-tokenized.
    monkeypatch.setattr(prep, "tokenize_eval_file", lambda *a, **k: pytest.fail("cache not used"))
    again = load_eval_domains(valid, tok, cache_dir=tmp_path / "cache")
    assert np.array_equal(again["en"].tokens, en.tokens) and again["en"].n_bytes == en.n_bytes
    monkeypatch.undo()
    write_docs(valid / "en.txt", DOCS[:1])
    assert load_eval_domains(valid, tok, cache_dir=tmp_path / "cache", domains=["en"])["en"].n_docs == 1
    with pytest.raises(DataError, match="unknown eval domain"):
        load_eval_domains(valid, tok, domains=["fr"])
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".")]
    assert os.listdir(tmp_path / "cache")
