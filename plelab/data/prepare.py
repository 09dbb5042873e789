"""Turn text sources into token shards on disk (+ manifest), train a tokenizer on them, tokenize eval domains.

Prepared dataset layout (`OUT/`):
    manifest.json            splits (tokens, documents, bytes, max token id, shards with sha256), sources with
                             sha256, tokenizer sha256/vocab size/EOT id, dtype, options, creation time
    tokenizer.json           the tokenizer used (so the folder is self-contained)
    train_000.bin, ...       flat little-endian token ids (uint16 when vocab <= 65536, else uint32), `np.memmap`-able
    val_000.bin, ...
Every document is followed by the EOT id. A document goes to `val` when a keyed hash of its first piece of text
(see `sources.PIECE_CHARS`) falls below `val_fraction`: deterministic, independent of input order, and exact
duplicates land in the same split. The same inputs and options give byte-identical shards. The folder is built
under a hidden temporary name and renamed into place only when complete, so a killed run never leaves a dataset
that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from plelab import __version__
from plelab.data.sources import (
    DataError,
    Source,
    SourceOptions,
    SourceStats,
    fingerprint,
    iter_pieces,
    resolve_sources,
    sample_texts,
)
from plelab.data.tokenizer import KINDS, Tokenizer
from plelab.util.fs import check_output_path, fsync_dir, pid_alive

log = logging.getLogger("plelab.data")

FORMAT = "plelab-tokens/1"
DEFAULT_SHARD_TOKENS = 1 << 28  # 512 MiB per uint16 shard: few files, each far below filesystem limits
MAX_SHARDS = 4096
"""Shard files per split at most: a tiny --shard-tokens would otherwise write one file per token."""
DEFAULT_TOKENIZER_SAMPLE = 20_000_000
BATCH_CHARS = 1 << 22  # text per encode_batch call: enough pieces to keep every core busy, small in memory
SPLITS = ("train", "val")
HELDOUT_DOMAIN = "val"
"""The held-out split's name when it is evaluated as a domain beside evaluation folders."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def is_val_document(first_piece: str, seed: int, val_fraction: float) -> bool:
    """Deterministic split: a seeded hash of the document's first piece, mapped to [0, 1), below val_fraction."""
    if val_fraction <= 0:
        return False
    h = hashlib.blake2b(first_piece.encode("utf-8"), digest_size=8, key=str(seed).encode())
    return int.from_bytes(h.digest(), "little") / 2**64 < val_fraction


# --- on-disk writing -------------------------------------------------------------------------------------------------


class _ShardWriter:
    """Appends token arrays to `PREFIX_000.bin`, `PREFIX_001.bin`, ... of at most `shard_tokens` tokens each."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, shard_tokens: int):
        self.folder, self.prefix, self.dtype, self.shard_tokens = folder, prefix, dtype, shard_tokens
        self.shards: list[dict] = []
        self._f = None
        self._hash = None
        self._n = 0
        self.tokens = 0
        self.max_id = -1

    def _open_next(self) -> None:
        if len(self.shards) >= MAX_SHARDS:
            raise DataError(f"{self.prefix} split needs more than {MAX_SHARDS} shard files of {self.shard_tokens:,} "
                            "tokens; raise --shard-tokens")
        self._close_current()
        name = f"{self.prefix}_{len(self.shards):03d}.bin"
        self._f = open(self.folder / name, "wb")
        self._hash = hashlib.sha256()
        self._n = 0
        self.shards.append({"file": name, "tokens": 0, "sha256": None})

    def _close_current(self) -> None:
        if self._f is not None:
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            self.shards[-1].update(tokens=self._n, sha256=self._hash.hexdigest())
            self._f = None

    def write(self, ids: np.ndarray) -> None:
        if ids.size == 0:
            return
        self.max_id = max(self.max_id, int(ids.max()))
        arr = ids.astype(self.dtype.newbyteorder("<"), copy=False)
        pos = 0
        while pos < arr.size:
            if self._f is None or self._n >= self.shard_tokens:
                self._open_next()
            take = min(arr.size - pos, self.shard_tokens - self._n)
            data = arr[pos:pos + take].tobytes()
            self._f.write(data)
            self._hash.update(data)
            self._n += take
            pos += take
        self.tokens += arr.size

    def close(self) -> list[dict]:
        self._close_current()
        return self.shards


@contextmanager
def staging_dir(out: Path, overwrite: bool = False, marker: str = "manifest.json") -> Iterator[Path]:
    """Build a folder under a hidden temporary name and rename it to `out` only if the block finishes."""
    out = Path(out)
    # Dangling links, files, unwritable parents; whether an existing folder may go is decided below.
    check_output_path(out, overwrite=True, is_dir=True)
    if out.is_dir():
        if (out / marker).exists():
            if not overwrite:
                raise DataError(f"{out}: a prepared dataset already exists (pass --overwrite to replace it)")
        elif any(out.iterdir()):
            raise DataError(f"{out}: folder exists, is not empty and is not a prepared dataset; refusing to touch it")
    out.parent.mkdir(parents=True, exist_ok=True)
    # Leftovers of runs that were killed (SIGKILL, power loss): hidden, never mistaken for a dataset; tidy them.
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        fsync_dir(tmp)
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


# --- tokenizer -------------------------------------------------------------------------------------------------------


def train_tokenizer(
    inputs: list[str | Path] | list[Source],
    vocab_size: int,
    *,
    max_bytes: int | None = DEFAULT_TOKENIZER_SAMPLE,
    options: SourceOptions | None = None,
    show_progress: bool = False,
    kind: str = "byte-level",
) -> Tokenizer:
    """Train a BPE of `kind` (byte-level or gemma, see plelab.data.tokenizer) on the inputs, streaming an even
    sample of at most `max_bytes` across all sources."""
    if kind not in KINDS:
        raise DataError(f"tokenizer kind {kind!r} is not one of {', '.join(KINDS)}")
    sources = inputs if inputs and isinstance(inputs[0], Source) else resolve_sources(list(inputs), options)
    train = Tokenizer.train_gemma if kind == "gemma" else Tokenizer.train_bpe
    return train(sample_texts(sources, max_bytes, options), vocab_size, show_progress=show_progress)


def resolve_tokenizer(
    spec: str | Path,
    inputs: list[str | Path] | None = None,
    *,
    vocab_size: int | None = None,
    max_bytes: int | None = DEFAULT_TOKENIZER_SAMPLE,
    options: SourceOptions | None = None,
    show_progress: bool = False,
    kind: str | None = None,
) -> Tokenizer:
    """Load `spec` (a tokenizer.json or folder holding one); `byte` = the byte tokenizer; a missing file is trained
    (a BPE of `kind`, default byte-level) on `inputs` and saved there when `vocab_size` is given. An existing
    tokenizer of another `kind` than the one asked for is refused (it would be used instead, without a word)."""
    p = Path(spec)
    if str(spec) == "byte" and not p.exists():
        return Tokenizer.byte_level()
    if p.exists():
        tok = Tokenizer.load(p)
        if kind is not None and tok.kind != kind:
            raise DataError(f"{spec} exists and is a {tok.kind} tokenizer, not {kind}: --tokenizer-kind chooses what "
                            "is trained when the file is missing; give a new --tokenizer path, or drop "
                            "--tokenizer-kind to use this one")
        if vocab_size is not None and vocab_size != tok.vocab_size:
            log.warning("%s exists (vocab %d); --vocab-size %d ignored", p, tok.vocab_size, vocab_size)
        return tok
    if vocab_size is None:
        raise DataError(f"{spec}: tokenizer not found (pass --vocab-size N to train one on the inputs, "
                        "or --tokenizer byte for the byte tokenizer)")
    if not inputs:
        raise DataError(f"{spec}: tokenizer not found and no inputs to train one on")
    t0 = time.perf_counter()
    tok = train_tokenizer(inputs, vocab_size, max_bytes=max_bytes, options=options, show_progress=show_progress,
                          kind=kind or "byte-level")
    tok.save(p)
    log.info("trained a %d-token BPE in %.1f s -> %s", tok.vocab_size, time.perf_counter() - t0, p)
    return tok


# --- prepare ---------------------------------------------------------------------------------------------------------


@dataclass
class _SplitStats:
    documents: int = 0
    bytes: int = 0


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="prepare", disable=not enabled,
                dynamic_ncols=True)


def prepare_dataset(
    inputs: list[str | Path],
    tokenizer: Tokenizer,
    out: str | Path,
    *,
    val_fraction: float = 0.005,
    seed: int = 0,
    options: SourceOptions | None = None,
    shard_tokens: int = DEFAULT_SHARD_TOKENS,
    overwrite: bool = False,
    progress: bool = True,
    batch_chars: int = BATCH_CHARS,
) -> dict:
    """Tokenize inputs into `out` (train/val shards + manifest.json + tokenizer.json); return the manifest."""
    if not 0.0 <= val_fraction < 1.0:
        raise DataError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    if shard_tokens < 1:
        raise DataError(f"shard size must be positive, got {shard_tokens}")
    opts = options or SourceOptions()
    sources = resolve_sources(list(inputs), opts)
    dtype = token_dtype(tokenizer.vocab_size)
    eot = np.array([tokenizer.eot_id], dtype=np.int64)
    out = Path(out)
    for src in sources:  # --overwrite replaces the whole folder: it must not hold the text being read
        if out.is_dir() and out.resolve() in src.path.resolve().parents:
            raise DataError(f"input {src.path} is inside the output folder {out}; choose another --out")
    t0 = time.perf_counter()
    with staging_dir(out, overwrite) as tmp:
        tokenizer.save(tmp / "tokenizer.json")
        writers = {s: _ShardWriter(tmp, s, dtype, shard_tokens) for s in SPLITS}
        split_stats = {s: _SplitStats() for s in SPLITS}
        pending: list[tuple[str, str, bool]] = []  # (split, text, ends a document)
        pending_chars = pending_bytes = 0
        bar = _progress(sum(s.size for s in sources), progress)

        def flush() -> None:
            nonlocal pending, pending_chars, pending_bytes
            if not pending:
                return
            encoded = tokenizer.encode_batch([text for _, text, _ in pending])
            parts: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
            for (split, _, last), ids in zip(pending, encoded, strict=True):
                parts[split].append(np.asarray(ids, dtype=np.int64))
                if last:
                    parts[split].append(eot)
            for split, arrays in parts.items():
                if arrays:
                    writers[split].write(np.concatenate(arrays))
            bar.update(pending_bytes)  # progress counts encoded text, not text merely read ahead
            pending, pending_chars, pending_bytes = [], 0, 0
            done = sum(w.tokens for w in writers.values())
            bar.set_postfix_str(f"{done / max(time.perf_counter() - t0, 1e-9):,.0f} tok/s, {done:,} tokens")

        source_records = []
        try:
            for src in sources:
                st = SourceStats()
                split = "train"
                for piece in iter_pieces(src, opts, st):
                    if piece.first:
                        split = "val" if is_val_document(piece.text, seed, val_fraction) else "train"
                    nbytes = len(piece.text.encode("utf-8"))
                    split_stats[split].bytes += nbytes
                    if piece.last:
                        split_stats[split].documents += 1
                    pending.append((split, piece.text, piece.last))
                    pending_chars += len(piece.text)
                    pending_bytes += nbytes
                    if pending_chars >= batch_chars:
                        flush()
                _check_source(src, st)
                source_records.append(_source_record(src, st))
            flush()
        except OSError as exc:  # disk full, permissions: a DataError, the staging folder is removed
            raise DataError(f"writing {out} failed: {exc.strerror or exc}") from exc
        finally:
            bar.close()
        total_docs = sum(s.documents for s in split_stats.values())
        if total_docs == 0:
            raise DataError("no documents in the inputs (every file is empty or whitespace)")
        if val_fraction > 0 and split_stats["val"].documents == 0:
            log.warning("no document fell into the validation split (%d documents, --val-fraction %g); "
                        "raise --val-fraction or use a separate validation set", total_docs, val_fraction)
        elapsed = time.perf_counter() - t0
        splits = {}
        for name in SPLITS:
            shards = writers[name].close()
            splits[name] = {
                "tokens": writers[name].tokens,
                "documents": split_stats[name].documents,
                "bytes": split_stats[name].bytes,
                "max_token_id": writers[name].max_id,
                "shards": shards,
            }
        manifest = {
            "format": FORMAT,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "plelab_version": __version__,
            "tokenizer": {
                "file": "tokenizer.json",
                "sha256": tokenizer.sha256,
                "vocab_size": tokenizer.vocab_size,
                "eot_id": tokenizer.eot_id,
                "pad_id": tokenizer.pad_id,
            },
            "dtype": dtype.name,
            "byteorder": "little",
            "eot_after_each_document": True,
            "val_fraction": val_fraction,
            "seed": seed,
            "shard_tokens": shard_tokens,
            "options": asdict(opts),
            "splits": splits,
            "sources": source_records,
            "elapsed_s": round(elapsed, 3),
            "tokens_per_s": round(sum(s["tokens"] for s in splits.values()) / max(elapsed, 1e-9)),
        }
        _write_json(tmp / "manifest.json", manifest)  # last: its presence marks a complete dataset
    return manifest


def _check_source(src: Source, st: SourceStats) -> None:
    if st.replaced:
        log.warning("%s: %d invalid UTF-8 sequence(s) replaced with U+FFFD", src.path, st.replaced)
    if st.documents == 0:
        if src.explicit:
            raise DataError(f"{src.path}: no documents (the file holds only separators or whitespace)")
        log.warning("%s: no documents", src.path)


def _source_record(src: Source, st: SourceStats) -> dict:
    return {
        "path": str(src.path.resolve()),
        "kind": src.kind,
        "size": src.size,
        "sha256": fingerprint(src),
        "documents": st.documents,
        "empty_documents": st.empty_documents,
        "text_bytes": st.text_bytes,
        "replaced_utf8_sequences": st.replaced,
    }


# --- evaluation domains ----------------------------------------------------------------------------------------------

EVAL_CACHE_VERSION = 1


@dataclass(frozen=True)
class EvalDomain:
    """One evaluation domain: `tokens` = EOT, doc 1, EOT, doc 2, EOT, ...; `n_bytes` = UTF-8 bytes of the docs.

    Score every position but the first as a target (`tokens[1:]`): the summed NLL in nats over those targets
    divided by `n_bytes * ln 2` is bits per byte (EOT predictions included, separators not counted as bytes).
    `doc_token_ends[i]` / `doc_byte_ends[i]` are the cumulative token (into `tokens`) and byte counts after
    document i, so `head(max_tokens)` can cap an evaluation at a document boundary with exact byte counts.
    """

    name: str
    tokens: np.ndarray
    n_bytes: int
    doc_token_ends: np.ndarray
    doc_byte_ends: np.ndarray

    @property
    def n_docs(self) -> int:
        """Number of documents."""
        return len(self.doc_token_ends)

    @property
    def n_targets(self) -> int:
        """Number of predicted positions (`len(tokens) - 1`)."""
        return max(len(self.tokens) - 1, 0)

    def head(self, max_tokens: int) -> EvalDomain:
        """The first whole documents that fit in `max_tokens` tokens (at least one document)."""
        if len(self.tokens) <= max_tokens:
            return self
        k = max(int(np.searchsorted(self.doc_token_ends, max_tokens, side="right")), 1)
        end = int(self.doc_token_ends[k - 1])
        return EvalDomain(self.name, self.tokens[:end], int(self.doc_byte_ends[k - 1]),
                          self.doc_token_ends[:k], self.doc_byte_ends[:k])


def tokenize_eval_file(path: str | Path, tokenizer: Tokenizer, name: str | None = None) -> EvalDomain:
    """Tokenize one domain file (documents separated by `<|endoftext|>` lines) into an EvalDomain."""
    p = Path(path)
    sources = resolve_sources([p], SourceOptions(format="text"))
    st = SourceStats()
    ids: list[np.ndarray] = [np.array([tokenizer.eot_id], dtype=np.int64)]
    tok_ends: list[int] = []
    byte_ends: list[int] = []
    n_tok, n_bytes = 1, 0
    batch: list[tuple[str, bool]] = []

    def flush() -> None:
        nonlocal n_tok, n_bytes
        for (text, last), enc in zip(batch, tokenizer.encode_batch([t for t, _ in batch]), strict=True):
            ids.append(np.asarray(enc, dtype=np.int64))
            n_tok += len(enc)
            n_bytes += len(text.encode("utf-8"))
            if last:
                ids.append(np.array([tokenizer.eot_id], dtype=np.int64))
                n_tok += 1
                tok_ends.append(n_tok)
                byte_ends.append(n_bytes)
        batch.clear()

    chars = 0
    for piece in iter_pieces(sources[0], SourceOptions(format="text"), st):
        batch.append((piece.text, piece.last))
        chars += len(piece.text)
        if chars >= BATCH_CHARS:
            flush()
            chars = 0
    flush()
    _check_source(sources[0], st)
    tokens = np.concatenate(ids).astype(token_dtype(tokenizer.vocab_size))
    return EvalDomain(name or p.stem, tokens, n_bytes, np.array(tok_ends, dtype=np.int64),
                      np.array(byte_ends, dtype=np.int64))


def load_eval_domains(
    valid_dir: str | Path,
    tokenizer: Tokenizer,
    cache_dir: str | Path | None = None,
    *,
    domains: list[str] | None = None,
    on_domain: Callable[[str], None] | None = None,
) -> dict[str, EvalDomain]:
    """Tokenize every `*.txt` in `valid_dir` (or one file) into {name: EvalDomain}, name = file stem, sorted.

    With `cache_dir`, results are kept as `NAME.<file sha>.<tokenizer sha>.npz` and reused while both hashes match.
    `domains` restricts to those names (unknown names raise DataError).
    """
    root = Path(valid_dir)
    if not root.exists():
        raise DataError(f"{valid_dir}: no such file or directory")
    files = [root] if root.is_file() else sorted(root.glob("*.txt"))
    if not files:
        raise DataError(f"{valid_dir}: no .txt domain files")
    by_name = {f.stem: f for f in files}
    if domains is not None:
        unknown = [d for d in domains if d not in by_name]
        if unknown:
            raise DataError(f"unknown eval domain(s) {', '.join(unknown)} (have: {', '.join(by_name)})")
        by_name = {d: by_name[d] for d in domains}
    cache = Path(cache_dir) if cache_dir is not None else None
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
    result: dict[str, EvalDomain] = {}
    for name, f in by_name.items():
        if on_domain:
            on_domain(name)
        if cache is None:
            result[name] = tokenize_eval_file(f, tokenizer, name)
            continue
        key = f"{name}.{fingerprint(Source(f, 'text', f.stat().st_size, True))[:16]}.{tokenizer.sha256[:16]}"
        path = cache / f"{key}.v{EVAL_CACHE_VERSION}.npz"
        dom = _read_eval_cache(path, name)
        if dom is None:
            dom = tokenize_eval_file(f, tokenizer, name)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
            np.savez(tmp, tokens=dom.tokens, n_bytes=np.int64(dom.n_bytes), doc_token_ends=dom.doc_token_ends,
                     doc_byte_ends=dom.doc_byte_ends)
            os.replace(tmp, path)
        result[name] = dom
    return result


def _read_eval_cache(path: Path, name: str) -> EvalDomain | None:
    if not path.is_file():
        return None
    try:
        with np.load(path) as z:
            return EvalDomain(name, z["tokens"], int(z["n_bytes"]), z["doc_token_ends"], z["doc_byte_ends"])
    except Exception:  # a damaged cache file is rebuilt, never trusted
        log.warning("%s: unreadable cache entry, rebuilding", path)
        return None
