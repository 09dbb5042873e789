"""Input sources: find documents in text files, folders, JSON Lines, parquet and HF `save_to_disk` folders.

Documents are streamed as *pieces* of at most about `PIECE_CHARS` characters, so a huge document (or a text file
with no separators) never has to sit in memory whole. A piece ends only at the start of a line that begins with a
non-whitespace character; the pre-tokenizer never merges across such a point, so encoding the pieces one by one
gives exactly the same ids as encoding the whole document (tests check this).

Text files: UTF-8; documents are separated by a line holding only `<|endoftext|>`; a file without such lines is one
document. Bad input policy:
  * missing path, unknown type, empty named file, zero documents overall -> `DataError`;
  * binary file (a NUL byte, or mostly undecodable bytes at its start) -> `DataError` when named explicitly, skipped
    with a warning when found while walking a folder;
  * a few invalid UTF-8 sequences in otherwise-text input -> replaced with U+FFFD and counted (warning + manifest).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal, get_args

from plelab.errors import PlelabError

log = logging.getLogger("plelab.data")

SEPARATOR = "<|endoftext|>"
PIECE_CHARS = 1 << 16  # part of the determinism contract: the split key hashes a document's first piece
SNIFF_BYTES = 8192
NUL = b"\x00"
SourceFormat = Literal["auto", "text", "jsonl", "parquet", "hf"]
KINDS: tuple[str, ...] = get_args(SourceFormat)[1:]
TEXT_SUFFIXES = {".txt", ".text", ".md", ".rst"}
JSONL_SUFFIXES = {".jsonl", ".ndjson", ".json"}
PARQUET_SUFFIXES = {".parquet"}


class DataError(PlelabError):
    """Input data or a prepared dataset that cannot be used as asked."""


@dataclass(frozen=True)
class SourceOptions:
    """How to read inputs: forced format, JSONL/parquet/HF text field, HF DatasetDict split, text separator."""

    format: SourceFormat = "auto"
    text_field: str = "text"
    hf_split: str | None = None  # for a DatasetDict folder; default: "train" when present
    separator: str = SEPARATOR


@dataclass(frozen=True)
class Source:
    """One input: a file (text, jsonl, parquet; optionally .gz for text/jsonl) or an HF dataset folder."""

    path: Path
    kind: str
    size: int  # bytes on disk (for a folder: all its files)
    explicit: bool  # named on the command line (errors) rather than found in a folder (warnings)


@dataclass
class SourceStats:
    """Counters filled while a source is read."""

    documents: int = 0
    empty_documents: int = 0
    replaced: int = 0  # invalid UTF-8 sequences replaced by U+FFFD
    text_bytes: int = 0


@dataclass(frozen=True)
class Piece:
    """A slice of one document; `first`/`last` mark where the document starts and ends."""

    text: str
    first: bool
    last: bool


# --- finding sources -------------------------------------------------------------------------------------------------


def is_hf_dataset_dir(path: Path) -> bool:
    """True for a folder written by `datasets.Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    return (path / "dataset_dict.json").is_file() or (
        (path / "state.json").is_file() and (path / "dataset_info.json").is_file()
    )


def _kind_by_suffix(path: Path) -> str | None:
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    last = suffixes[-1] if suffixes else ""
    if last in TEXT_SUFFIXES:
        return "text"
    if last in JSONL_SUFFIXES:
        return "jsonl"
    if last in PARQUET_SUFFIXES and path.suffix.lower() != ".gz":
        return "parquet"
    return None


def _open_binary(path: Path) -> BinaryIO:
    if path.suffix.lower() == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def sniff_binary(path: Path) -> str | None:
    """Why a text-like file looks binary (a NUL byte, or mostly invalid UTF-8 at its start), or None if it is text."""
    try:
        with _open_binary(path) as f:
            head = f.read(SNIFF_BYTES)
    except (OSError, EOFError) as exc:  # includes gzip.BadGzipFile
        return f"unreadable ({exc})"
    if NUL in head:
        return f"binary file (NUL byte at offset {head.index(NUL)})"
    # Cut a possibly split multi-byte character at the end before judging.
    text = head.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - head.decode("utf-8", errors="ignore").count("\ufffd")
    if len(head) >= 64 and bad > 0.1 * len(head):  # real text in a legacy encoding is far below this
        return f"not UTF-8 text ({bad} invalid sequences in the first {len(head)} bytes)"
    return None


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def resolve_sources(inputs: list[str | Path], options: SourceOptions | None = None) -> list[Source]:
    """Expand inputs (files, folders) into a sorted, de-duplicated list of sources; raise DataError on bad ones."""
    opts = options or SourceOptions()
    if opts.format not in ("auto", *KINDS):
        raise DataError(f"unknown --format {opts.format!r} (expected auto, {', '.join(KINDS)})")
    if not inputs:
        raise DataError("no inputs given")
    out: list[Source] = []
    seen: set[Path] = set()

    def add(src: Source) -> None:
        key = src.path.resolve()
        if key not in seen:
            seen.add(key)
            out.append(src)

    for item in inputs:
        p = Path(item)
        if not p.exists():
            raise DataError(f"{item}: no such file or directory")
        if p.is_dir():
            if opts.format in ("auto", "hf") and is_hf_dataset_dir(p):
                add(Source(p, "hf", _dir_size(p), True))
                continue
            if opts.format == "hf":
                raise DataError(f"{item}: not a datasets folder (no dataset_info.json/state.json or dataset_dict.json)")
            found = _walk(p, opts)
            if not found:
                raise DataError(f"{item}: no usable input files in this folder "
                                "(looked for .txt/.md/.rst, .jsonl/.json, .parquet, datasets folders)")
            for s in found:
                add(s)
            continue
        kind = opts.format if opts.format != "auto" else _kind_by_suffix(p)
        if kind is None:
            raise DataError(f"{item}: unknown input type (expected .txt/.md/.rst, .jsonl/.json, .parquet, "
                            "optionally .gz, or a datasets folder; use --format text to force)")
        if kind == "hf":
            raise DataError(f"{item}: --format hf wants a folder written by datasets' save_to_disk")
        size = p.stat().st_size
        if size == 0:
            raise DataError(f"{item}: empty file (no documents)")
        if kind in ("text", "jsonl"):
            why = sniff_binary(p)
            if why:
                raise DataError(f"{item}: {why}; expected UTF-8 text")
        add(Source(p, kind, size, True))
    return out


def _walk(root: Path, opts: SourceOptions) -> list[Source]:
    found: list[Source] = []
    for dirpath, dirnames, filenames in os.walk(root):
        d = Path(dirpath)
        # Sorted walk, hidden entries skipped: the same folder always yields the same order (determinism).
        keep = []
        for name in sorted(dirnames):
            if name.startswith("."):
                continue
            if opts.format == "auto" and is_hf_dataset_dir(d / name):
                found.append(Source(d / name, "hf", _dir_size(d / name), False))
            else:
                keep.append(name)
        dirnames[:] = keep
        for name in sorted(filenames):
            if name.startswith("."):
                continue
            p = d / name
            kind = opts.format if opts.format not in ("auto", "hf") else _kind_by_suffix(p)
            if kind is None or (opts.format == "hf"):
                continue
            size = p.stat().st_size
            if size == 0:
                log.warning("%s: empty file, skipped", p)
                continue
            if kind in ("text", "jsonl"):
                why = sniff_binary(p)
                if why:
                    log.warning("%s: %s, skipped", p, why)
                    continue
            found.append(Source(p, kind, size, False))
    found.sort(key=lambda s: str(s.path))
    return found


# --- reading documents -----------------------------------------------------------------------------------------------


def split_pieces(text: str, target: int | None = None) -> Iterator[str]:
    """Cut `text` at the first line start at/after every `target` chars whose first char is not whitespace."""
    target = PIECE_CHARS if target is None else target
    start = 0
    n = len(text)
    while n - start > target:
        i = text.find("\n", start + target - 1)
        while i != -1 and i + 1 < n and text[i + 1].isspace():
            i = text.find("\n", i + 1)
        if i == -1 or i + 1 >= n:
            break
        yield text[start:i + 1]
        start = i + 1
    yield text[start:]


def _decode_line(raw: bytes, stats: SourceStats, path: Path, offset: int) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        if NUL in raw:
            raise DataError(f"{path}: binary data (NUL byte near offset {offset + raw.index(NUL)})") from None
        text = raw.decode("utf-8", errors="replace")
        # Count only replacements we made, not U+FFFD characters that were already in the text.
        stats.replaced += text.count("\ufffd") - raw.decode("utf-8", errors="ignore").count("\ufffd")
        return text


def _iter_text(src: Source, opts: SourceOptions, stats: SourceStats) -> Iterator[Piece]:
    sep = opts.separator.encode("utf-8")
    buf: list[str] = []
    buflen = 0
    first = True
    offset = 0

    def flush(last: bool) -> Iterator[Piece]:
        nonlocal buf, buflen, first
        text = "".join(buf)
        if last:
            # The newline before the separator line (or at end of file) belongs to the separator, not the document.
            if text.endswith("\r\n"):
                text = text[:-2]
            elif text.endswith("\n"):
                text = text[:-1]
            if first and not text.strip():
                stats.empty_documents += 1
            else:
                stats.documents += 1
                stats.text_bytes += len(text.encode("utf-8"))
                yield Piece(text, first, True)
            first = True
        else:
            stats.text_bytes += len(text.encode("utf-8"))
            yield Piece(text, first, False)
            first = False
        buf, buflen = [], 0

    with _open_binary(src.path) as f:
        for raw in f:
            if raw.rstrip(b"\r\n") == sep:
                offset += len(raw)
                yield from flush(True)
                continue
            if NUL in raw:
                raise DataError(f"{src.path}: binary data (NUL byte near offset {offset + raw.index(NUL)})")
            line = _decode_line(raw, stats, src.path, offset)
            if offset == 0 and line.startswith("\ufeff"):
                line = line[1:]  # a UTF-8 byte-order mark is not text
            offset += len(raw)
            if buflen >= PIECE_CHARS and line and not line[0].isspace():
                yield from flush(False)
            buf.append(line)
            buflen += len(line)
    if buf or not first:
        yield from flush(True)


def _doc_pieces(text: str, stats: SourceStats) -> Iterator[Piece]:
    if not text.strip():
        stats.empty_documents += 1
        return
    stats.documents += 1
    stats.text_bytes += len(text.encode("utf-8"))
    parts = list(split_pieces(text))
    for i, part in enumerate(parts):
        yield Piece(part, i == 0, i == len(parts) - 1)


def _check_value(value, src: Source, where: str, stats: SourceStats, field_name: str) -> str | None:
    if value is None:
        stats.empty_documents += 1
        return None
    if not isinstance(value, str):
        raise DataError(f"{src.path}{where}: field {field_name!r} is {type(value).__name__}, expected a string")
    return value


def _iter_jsonl(src: Source, opts: SourceOptions, stats: SourceStats) -> Iterator[Piece]:
    offset = 0
    with _open_binary(src.path) as f:
        for lineno, raw in enumerate(f, 1):
            line = _decode_line(raw, stats, src.path, offset)
            offset += len(raw)
            if lineno == 1 and line.startswith("\ufeff"):
                line = line[1:]
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                is_array = line.lstrip()[:1] == "["
                hint = " (a JSON array? convert it to JSON Lines: one object per line)" if is_array else ""
                raise DataError(f"{src.path}:{lineno}: invalid JSON ({exc.msg}){hint}") from None
            if not isinstance(obj, dict):
                raise DataError(f"{src.path}:{lineno}: expected a JSON object per line, got {type(obj).__name__}")
            if opts.text_field not in obj:
                keys = ", ".join(sorted(obj)[:10]) or "none"
                raise DataError(f"{src.path}:{lineno}: no field {opts.text_field!r} (fields: {keys}; "
                                "choose one with --text-field)")
            text = _check_value(obj[opts.text_field], src, f":{lineno}", stats, opts.text_field)
            if text is not None:
                yield from _doc_pieces(text, stats)


def _iter_parquet(src: Source, opts: SourceOptions, stats: SourceStats) -> Iterator[Piece]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{src.path}: reading parquet needs pyarrow (pip install pyarrow)") from None
    try:
        pf = pq.ParquetFile(src.path)
    except Exception as exc:  # pyarrow raises ArrowInvalid / OSError with a readable message
        raise DataError(f"{src.path}: not a readable parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if opts.text_field not in names:
        raise DataError(f"{src.path}: no column {opts.text_field!r} (columns: {', '.join(names)}; "
                        "choose one with --text-field)")
    for batch in pf.iter_batches(batch_size=256, columns=[opts.text_field]):
        for value in batch.column(0).to_pylist():
            text = _check_value(value, src, "", stats, opts.text_field)
            if text is not None:
                yield from _doc_pieces(text, stats)


def _iter_hf(src: Source, opts: SourceOptions, stats: SourceStats) -> Iterator[Piece]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{src.path}: reading a datasets folder needs `datasets` (pip install datasets)") from None
    try:
        ds = datasets.load_from_disk(str(src.path))
    except Exception as exc:  # datasets raises FileNotFoundError/ValueError variants
        raise DataError(f"{src.path}: cannot load datasets folder ({exc})") from None
    if isinstance(ds, datasets.DatasetDict):
        split = opts.hf_split or ("train" if "train" in ds else None)
        if split is None or split not in ds:
            raise DataError(f"{src.path}: choose a split with --hf-split (splits: {', '.join(ds)})")
        ds = ds[split]
    if opts.text_field not in ds.column_names:
        raise DataError(f"{src.path}: no column {opts.text_field!r} (columns: {', '.join(ds.column_names)}; "
                        "choose one with --text-field)")
    for batch in ds.select_columns([opts.text_field]).iter(batch_size=256):
        for value in batch[opts.text_field]:
            text = _check_value(value, src, "", stats, opts.text_field)
            if text is not None:
                yield from _doc_pieces(text, stats)


_READERS = {"text": _iter_text, "jsonl": _iter_jsonl, "parquet": _iter_parquet, "hf": _iter_hf}


def iter_pieces(src: Source, options: SourceOptions | None = None, stats: SourceStats | None = None) -> Iterator[Piece]:
    """Stream the document pieces of one source, updating `stats` (documents, empty ones, replaced bytes)."""
    opts = options or SourceOptions()
    st = stats if stats is not None else SourceStats()
    try:
        yield from _READERS[src.kind](src, opts, st)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{src.path}: read failed ({exc})") from None


def iter_documents(src: Source, options: SourceOptions | None = None) -> Iterator[str]:
    """Whole documents of one source (convenient for small inputs; `iter_pieces` keeps memory bounded)."""
    parts: list[str] = []
    for piece in iter_pieces(src, options):
        parts.append(piece.text)
        if piece.last:
            yield "".join(parts)
            parts = []


def fingerprint(src: Source) -> str:
    """sha256 of a source file (for a datasets folder: of its files' relative names and contents, sorted)."""
    h = hashlib.sha256()
    files = [src.path] if src.path.is_file() else sorted(p for p in src.path.rglob("*") if p.is_file())
    for p in files:
        if src.path.is_dir():
            h.update(str(p.relative_to(src.path)).encode() + b"\0")
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):  # noqa: B023 - f is bound per iteration
                h.update(block)
    return h.hexdigest()


# --- sampling (tokenizer training) ----------------------------------------------------------------------------------

SAMPLE_CHUNK = 1 << 16


def _budgets(sizes: list[int], total: int) -> list[int]:
    """Split `total` bytes over sources: equal shares, a source smaller than its share gives the rest to others."""
    budgets = [0] * len(sizes)
    left = total
    order = sorted(range(len(sizes)), key=lambda i: sizes[i])
    for k, i in enumerate(order):
        share = left // (len(sizes) - k)
        budgets[i] = min(sizes[i], share)
        left -= budgets[i]
    return budgets


def _sample_text_file(src: Source, budget: int, opts: SourceOptions) -> Iterator[str]:
    """Evenly spaced chunks of a text file, aligned to whole lines, separator lines removed."""
    n = max(1, budget // SAMPLE_CHUNK)
    chunk = min(SAMPLE_CHUNK, budget)
    stride = src.size / n
    sep = opts.separator
    stats = SourceStats()
    with open(src.path, "rb") as f:
        for k in range(n):
            start = int(k * stride)
            f.seek(start)
            if start:
                f.readline()  # drop the partial line we landed in
            data = f.read(chunk) + f.readline()
            if NUL in data:
                raise DataError(f"{src.path}: binary data (NUL byte near offset {start + data.index(NUL)})")
            text = _decode_line(data, stats, src.path, start)
            lines = [ln for ln in text.split("\n") if ln.rstrip("\r") != sep]
            if lines:
                yield "\n".join(lines)


def sample_texts(sources: list[Source], max_bytes: int | None, options: SourceOptions | None = None) -> Iterator[str]:
    """Texts for tokenizer training: everything if it fits in `max_bytes`, else an even sample of every source."""
    opts = options or SourceOptions()
    total = sum(s.size for s in sources)
    if max_bytes is None or total <= max_bytes:
        for s in sources:
            for piece in iter_pieces(s, opts):
                yield piece.text
        return
    for src, budget in zip(sources, _budgets([s.size for s in sources], max_bytes), strict=True):
        if budget <= 0:
            continue
        if src.kind == "text" and src.path.suffix.lower() != ".gz":
            yield from _sample_text_file(src, budget, opts)
            continue
        # Compressed or structured sources: take documents from the start until the budget is used.
        used = 0
        for piece in iter_pieces(src, opts):
            yield piece.text
            used += len(piece.text.encode("utf-8"))
            if used >= budget:
                break
