"""Sources: documents from text, folders, JSONL, parquet and datasets folders; bad-input policy; sampling."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from data_helpers import DOCS, write_docs

from plelab.data import sources
from plelab.data.sources import (
    DataError,
    SourceOptions,
    SourceStats,
    iter_documents,
    iter_pieces,
    resolve_sources,
    sample_texts,
    split_pieces,
)


def docs_of(paths, **opts) -> list[str]:
    return [d for s in resolve_sources(paths, SourceOptions(**opts)) for d in iter_documents(s, SourceOptions(**opts))]


def test_text_documents_match_the_documented_split(tmp_path):
    p = write_docs(tmp_path / "a.txt", DOCS)
    raw = p.read_text(encoding="utf-8")
    assert docs_of([p]) == raw[:-1].split("\n<|endoftext|>\n") == DOCS


def test_text_file_without_separator_is_one_document_and_edge_cases(tmp_path):
    (tmp_path / "one.txt").write_text("line 1\nline 2\n")
    assert docs_of([tmp_path / "one.txt"]) == ["line 1\nline 2"]
    # BOM dropped, CRLF separators recognised, empty and whitespace-only documents skipped and counted.
    raw = b"\xef\xbb\xbfa\r\n<|endoftext|>\r\n\r\n<|endoftext|>\r\n  \n<|endoftext|>\r\nb\r\n"
    (tmp_path / "crlf.txt").write_bytes(raw)
    src = resolve_sources([tmp_path / "crlf.txt"])[0]
    st = SourceStats()
    assert [p.text for p in iter_pieces(src, stats=st)] == ["a", "b"]
    assert st.documents == 2 and st.empty_documents == 2


def test_long_documents_stream_in_pieces_that_join_back(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "PIECE_CHARS", 50)
    docs = ["\n".join(DOCS * 3), "short", "x" * 500]  # the last has no line break: one piece despite its size
    p = write_docs(tmp_path / "long.txt", docs)
    pieces = list(iter_pieces(resolve_sources([p])[0]))
    assert sum(pc.first for pc in pieces) == 3 and sum(pc.last for pc in pieces) == 3
    assert len(pieces) > 6
    assert docs_of([p]) == docs
    # The text reader cuts exactly where split_pieces cuts the same document (the split key depends on it).
    first_doc = [pc.text for pc in pieces[: next(i for i, pc in enumerate(pieces) if pc.last) + 1]]
    assert first_doc == list(split_pieces(docs[0]))


@pytest.fixture
def data_log():
    """Messages logged on `plelab.data` (attached directly: the CLI may have stopped propagation to root)."""
    records: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: records.append(record.getMessage())
    logger = logging.getLogger("plelab.data")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


def test_folder_walk_sorted_skips_hidden_unknown_empty_binary(tmp_path, data_log):
    write_docs(tmp_path / "b" / "z.txt", ["zz"])
    write_docs(tmp_path / "a.txt", ["aa"])
    write_docs(tmp_path / ".hidden.txt", ["hidden"])
    (tmp_path / "image.png").write_bytes(b"\x89PNG\x00\x00")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "binary.txt").write_bytes(b"abc\x00\x01\x02" * 100)
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "cc"}) + "\n")
    found = resolve_sources([tmp_path])
    assert [s.path.relative_to(tmp_path).as_posix() for s in found] == ["a.txt", "b/z.txt", "c.jsonl"]
    text = "\n".join(data_log)
    assert "empty file, skipped" in text and "binary file" in text
    assert docs_of([tmp_path]) == ["aa", "zz", "cc"]


def test_explicit_bad_inputs_raise(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        resolve_sources([tmp_path / "missing.txt"])
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(DataError, match="empty file"):
        resolve_sources([tmp_path / "empty.txt"])
    (tmp_path / "bin.txt").write_bytes(bytes(range(256)) * 10)
    with pytest.raises(DataError, match="binary file"):
        resolve_sources([tmp_path / "bin.txt"])
    (tmp_path / "gbk.txt").write_bytes("滚滚长江东逝水，浪花淘尽英雄。".encode("gbk") * 20)
    with pytest.raises(DataError, match="not UTF-8 text"):
        resolve_sources([tmp_path / "gbk.txt"])
    (tmp_path / "data.xyz").write_text("hello")
    with pytest.raises(DataError, match="unknown input type"):
        resolve_sources([tmp_path / "data.xyz"])
    assert docs_of([tmp_path / "data.xyz"], format="text") == ["hello"]
    (tmp_path / "sub").mkdir()
    with pytest.raises(DataError, match="no usable input files"):
        resolve_sources([tmp_path / "sub"])
    (tmp_path / "late.txt").write_bytes(b"fine text\n" * 2000 + b"then \x00 binary\n")
    with pytest.raises(DataError, match="NUL byte"):
        docs_of([tmp_path / "late.txt"])


def test_a_few_invalid_utf8_bytes_are_replaced_and_counted(tmp_path):
    (tmp_path / "latin.txt").write_bytes("caf\xe9 cr\xe8me, na\xefve\n".encode("latin-1") + "ok \ufffd kept\n".encode())
    src = resolve_sources([tmp_path / "latin.txt"])[0]
    st = SourceStats()
    text = "".join(p.text for p in iter_pieces(src, stats=st))
    assert text == "caf\ufffd cr\ufffdme, na\ufffdve\nok \ufffd kept"
    assert st.replaced == 3  # the U+FFFD already in the file is not counted


def test_jsonl_fields_gzip_and_errors(tmp_path):
    rows = [{"text": "first", "id": 1}, {"text": None}, {"text": "second\nline"}, {"content": "x", "text": "third"}]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert docs_of([tmp_path / "d.jsonl"]) == ["first", "second\nline", "third"]
    with gzip.open(tmp_path / "d.jsonl.gz", "wt") as f:
        f.write(json.dumps({"body": "zipped"}) + "\n")
    assert docs_of([tmp_path / "d.jsonl.gz"], text_field="body") == ["zipped"]
    with pytest.raises(DataError, match=r"d\.jsonl:1: no field 'body' \(fields: id, text"):
        docs_of([tmp_path / "d.jsonl"], text_field="body")
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:2: invalid JSON"):
        docs_of([tmp_path / "bad.jsonl"])
    (tmp_path / "arr.json").write_text('[{"text": "a"},\n {"text": "b"}]')
    with pytest.raises(DataError, match="JSON Lines"):
        docs_of([tmp_path / "arr.json"])
    (tmp_path / "num.jsonl").write_text('{"text": 5}\n')
    with pytest.raises(DataError, match="expected a string"):
        docs_of([tmp_path / "num.jsonl"])


def test_parquet(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    table = pa.table({"text": DOCS + [None], "n": list(range(len(DOCS) + 1))})
    pq.write_table(table, tmp_path / "d.parquet", row_group_size=2)
    assert docs_of([tmp_path / "d.parquet"]) == DOCS
    assert docs_of([tmp_path]) == DOCS  # found by suffix in a folder
    with pytest.raises(DataError, match="no column 'body'"):
        docs_of([tmp_path / "d.parquet"], text_field="body")
    (tmp_path / "fake.parquet").write_text("not parquet at all")
    with pytest.raises(DataError, match="not a readable parquet file"):
        docs_of([tmp_path / "fake.parquet"])


def test_hf_datasets_folders(tmp_path):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": DOCS[:3], "label": [0, 1, 2]})
    ds.save_to_disk(str(tmp_path / "single"))
    assert docs_of([tmp_path / "single"]) == DOCS[:3]
    dd = datasets.DatasetDict({"train": ds, "test": datasets.Dataset.from_dict({"text": ["held out"]})})
    dd.save_to_disk(str(tmp_path / "dict"))
    assert docs_of([tmp_path / "dict"]) == DOCS[:3]
    assert docs_of([tmp_path / "dict"], hf_split="test") == ["held out"]
    with pytest.raises(DataError, match="choose a split"):
        docs_of([tmp_path / "dict"], hf_split="validation")
    found = resolve_sources([tmp_path])  # folders inside a walked folder are recognised
    assert sorted(s.kind for s in found) == ["hf", "hf"]


def test_sample_texts_spreads_budget_over_sources(tmp_path):
    big = write_docs(tmp_path / "big.txt", [f"english line {i} " * 20 for i in range(3000)])
    small = write_docs(tmp_path / "small.txt", ["中文句子。" * 30 for _ in range(100)])
    srcs = resolve_sources([big, small])
    everything = list(sample_texts(srcs, None))
    assert sum(len(t) for t in everything) > 1_000_000
    sample = list(sample_texts(srcs, 200_000))
    total = sum(len(t.encode()) for t in sample)
    assert 150_000 < total < 200_000 + 2 * sources.SAMPLE_CHUNK
    assert any("中文" in t for t in sample) and any("english" in t for t in sample)
    assert not any("<|endoftext|>" in t for t in sample)
    assert list(sample_texts(srcs, 200_000)) == sample  # deterministic
