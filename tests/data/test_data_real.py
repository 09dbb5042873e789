"""The real corpus in ../shared/data: a small BPE on a 1 MB sample, one prepared file, two eval domains."""

from __future__ import annotations

import time

import numpy as np

from plelab.data.loader import BatchLoader, TokenDataset
from plelab.data.prepare import load_eval_domains, prepare_dataset, train_tokenizer
from plelab.data.sources import iter_documents, resolve_sources, split_pieces


def test_real_data_small_pipeline(shared_data, tmp_path):
    t0 = time.perf_counter()
    tok = train_tokenizer([shared_data / "train"], vocab_size=2048, max_bytes=1_000_000)
    assert tok.vocab_size == 2048 and tok.eot_id == 0
    # Both languages made it into the sample: common Chinese characters and English words are single tokens.
    assert len(tok.encode("的")) == 1 and len(tok.encode(" the")) == 1

    m = prepare_dataset([shared_data / "valid" / "en_qa.txt"], tok, tmp_path / "qa", val_fraction=0.05,
                        progress=False)
    assert m["splits"]["train"]["documents"] + m["splits"]["val"]["documents"] == 817
    x, y = next(BatchLoader(TokenDataset(tmp_path / "qa", "train", vocab_size=2048), 4, 128, seed=0))
    assert x.shape == (4, 128) and int(x.max()) < 2048

    doms = load_eval_domains(shared_data / "valid", tok, tmp_path / "cache", domains=["en_qa", "zh_novel"])
    for name, d in doms.items():
        assert d.n_docs > 40 and d.n_bytes > 200_000, name
        assert d.tokens[0] == tok.eot_id and d.tokens[-1] == tok.eot_id
        assert 1.5 < d.n_bytes / d.n_targets < 6, name  # sane compression for a 2k vocabulary
    assert doms["en_qa"].n_bytes == sum(len(t.encode()) for t in
                                        iter_documents(resolve_sources([shared_data / "valid" / "en_qa.txt"])[0]))

    # Encoding a long real Chinese document in pieces gives the ids of encoding it whole.
    zh = next(iter_documents(resolve_sources([shared_data / "valid" / "zh_novel.txt"])[0]))
    pieces = list(split_pieces(zh, target=2000))
    assert len(pieces) > 3
    assert np.array_equal(np.concatenate([tok.encode(p) for p in pieces]), tok.encode(zh))
    assert time.perf_counter() - t0 < 60
