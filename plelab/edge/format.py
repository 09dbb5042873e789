"""The .ple file: layout, atomic streaming writer, and a checksum-verifying memory-mapped reader.

Byte-level specification: docs/ple-format.md. In short (little-endian throughout):

    [header, 64 B] [section table, 64 B per section] [meta JSON] [model] [tensors] [row tables ...] [tokenizer]

Version 2 adds `model`, a fixed binary description of the model (dims, flags, tensor directory, record
layouts) so a microcontroller runtime needs neither an inflater nor a JSON parser; it repeats what the meta
JSON says, and a reader checks that the two agree. Version 3 adds the n-gram index of a PLE table (its hash
parameters in `model`, the token-id compression in an `idmap` section); a file is written at the lowest version
that describes it, so a token model's file is the version 2 file it always was. Version 1 files (no `model`
section) are still read.
Dense tensors (read whole on every token) live in the `tensors` section as a codes block then a scales
block each. Row tables (the PLE table, the main embedding) are arrays of fixed-stride *records*: one
record holds everything a token needs from that table (codes and scales of every part), so a token
costs one contiguous read. Records may be padded to a stride multiple (`align`) and kept from straddling
flash pages (`page`). Every section has a sha256 in the section table; the header holds a crc32 of
itself, of the section table and of everything after it, so any flipped or missing byte is caught.

This module is NumPy only (the runtime imports it without torch).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plelab.edge.quant import Encoding, QuantError, dequantize
from plelab.errors import PlelabError
from plelab.model.ngram import NgramLayout
from plelab.util.fs import atomic_writer

MAX_ALIGN = 1 << 16
"""Largest record stride multiple: beyond a 64 KiB erase block no storage gains from it, and every record would be
padded to it (an align of 1e9 asks for 1 GB per token)."""
MAGIC = b"\x89PLE\r\n\x1a\n"  # PNG-style: non-ASCII first byte and CR/LF/^Z catch text-mode mangling
VERSION = 3  # the newest version; a file is written at the lowest one that describes it (Layout.version)
READ_VERSIONS = (1, 2, 3)  # versions this reader understands
# magic, version, header bytes, file bytes, section count, section-table crc32, body crc32, reserved, header crc32
HEADER = struct.Struct("<8sIIQIII24sI")
SECTION = struct.Struct("<16sQQ32s")  # name, offset, bytes, sha256
# The `model` section (version 2): a fixed head, the PLE layer indices (u32), the name suffixes (NUL-terminated
# strings), one entry per dense tensor, then per row table an entry followed by its parts; each of the first
# three blocks padded to 8 bytes (version 3: an n-gram index adds its block after the PLE layers). Field order:
# docs/ple-format.md section 4b. A tensor name is `layers.{layer}.` + its suffix (or the suffix alone, layer
# NO_LAYER): per-layer names share one string, which keeps the section small (the esp32-28m file stays within the
# reference deployment's size).
MODEL_MAGIC = b"PLEM"
MODEL_HEAD = struct.Struct("<4s21I2d")
TENSOR_DESC = struct.Struct("<HHBBHI4IQQ")  # layer, suffix offset, dtype, ndim, 0, group, shape[4], codes, scales
NO_LAYER = 0xFFFF
_LAYER_NAME = re.compile(r"layers\.(\d+)\.(.+)")
TABLE_DESC = struct.Struct("<16sQ6I")  # name, rows, record_bytes, stride, align, page, parts, 0
PART_DESC = struct.Struct("<16sBBHIIIII")  # name, dtype, 0, 0, group, length, codes, scales, 0
DTYPE_CODES = {"fp32": 0, "fp16": 1, "int8": 2, "int4": 3, "u1": 4}
FFN_CODES = {"swiglu": 0, "mglu": 1, "lowrank": 2, "moe": 3}
GATE_CODES = {"input": 0, "scalar": 1, "vector": 2}
INDEX_CODES = {"token": 0, "ngram": 1}  # which table rows a position reads (version 3; 0 in version 2)
# version 3, n-gram index: orders N, heads per order, hash seed, id-map entries (0 or vocab_size), then N orders
# and N rows per head (u32 each), the block padded to 8 bytes
NGRAM_HEAD = struct.Struct("<4I")
ID_MAP = "idmap"  # the section of an n-gram model's token-id compression: vocab_size u32, one per token id
FLAG_TIE, FLAG_EMBED_SCALE, FLAG_PLE_CONTEXT, FLAG_PLE_OUTPUT_NORM, FLAG_SHARED_EXPERT = 1, 2, 4, 8, 16
SECTION_ALIGN = 64  # every section starts on a 64-byte boundary (cache line; mmap-friendly)
TENSOR_ALIGN = 8  # every codes / scales block inside `tensors` starts on an 8-byte boundary
VERIFY_MODES = ("full", "core", "none")
_CHUNK = 1 << 20
_RELEASE_WINDOW = 1 << 21  # the largest page-cache folio the kernel maps on one fault (PMD size on x86-64)


class PleFormatError(PlelabError):
    """A .ple file that is not one, is truncated or corrupt, or is of an unsupported version."""


def _round_up(n: int, a: int) -> int:
    return -(-n // a) * a if a > 1 else n


@dataclass
class TensorEntry:
    """A dense tensor: `shape`, its encoding, and where its codes and scales sit inside the tensors section."""

    name: str
    shape: tuple[int, ...]
    enc: Encoding
    vector: int
    """Values per quantisation vector (groups never cross vectors); the numel for a dense matrix."""
    codes: int = 0
    scales: int = 0

    @property
    def numel(self) -> int:
        """Number of values."""
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def vectors(self) -> int:
        """Number of quantisation vectors."""
        return self.numel // self.vector

    @property
    def codes_bytes(self) -> int:
        """Bytes of the codes block."""
        return self.vectors * self.enc.code_bytes(self.vector)

    @property
    def scales_bytes(self) -> int:
        """Bytes of the scales block."""
        return self.vectors * self.enc.scale_bytes(self.vector)

    @property
    def nbytes(self) -> int:
        """Stored bytes (codes + scales, without alignment padding)."""
        return self.codes_bytes + self.scales_bytes

    def to_json(self) -> dict[str, Any]:
        """Directory entry as stored in the meta JSON."""
        return {"name": self.name, "shape": list(self.shape), **self.enc.to_json(), "vector": self.vector,
                "codes": self.codes, "scales": self.scales}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorEntry:
        """Inverse of `to_json`."""
        return cls(d["name"], tuple(d["shape"]), Encoding(d["dtype"], d["group"]), d["vector"], d["codes"], d["scales"])


@dataclass
class Part:
    """One component of a record (e.g. the PLE vector, or the main-embedding row): codes then scales."""

    name: str
    enc: Encoding
    length: int
    codes: int = 0
    scales: int = 0

    def to_json(self) -> dict[str, Any]:
        """As stored in the meta JSON."""
        return {"name": self.name, **self.enc.to_json(), "length": self.length, "codes": self.codes,
                "scales": self.scales}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Part:
        """Inverse of `to_json`."""
        return cls(d["name"], Encoding(d["dtype"], d["group"]), d["length"], d["codes"], d["scales"])


@dataclass
class Table:
    """A row table: `rows` records of `record_bytes`, laid out at `stride`, never straddling a `page`."""

    name: str
    rows: int
    parts: list[Part]
    align: int = 1
    page: int = 0
    record_bytes: int = field(init=False)
    stride: int = field(init=False)

    def __post_init__(self) -> None:
        pos = 0
        for p in self.parts:
            p.codes = pos
            pos += p.enc.code_bytes(p.length)
            p.scales = pos
            pos += p.enc.scale_bytes(p.length)
        self.record_bytes = pos
        if not 1 <= self.align <= MAX_ALIGN or self.page < 0:
            raise PleFormatError(f"table {self.name}: align must be in 1..{MAX_ALIGN} and page >= 0 (got align "
                                 f"{self.align}, page {self.page})")
        self.stride = _round_up(pos, self.align)
        if self.page and self.stride > self.page:
            raise PleFormatError(
                f"a {self.name} record is {self.stride} bytes, larger than the {self.page}-byte page it must fit in"
            )

    @property
    def per_page(self) -> int:
        """Records per page (0 = records are packed without page boundaries)."""
        return self.page // self.stride if self.page else 0

    def row_offset(self, row: int) -> int:
        """Offset of record `row` from the start of the table's section."""
        return int(self.row_offsets(row, row + 1)[0])

    def row_offsets(self, start: int, stop: int) -> np.ndarray:
        """Offsets (int64) of records start..stop-1 from the start of the table's section."""
        rows = np.arange(start, stop, dtype=np.int64)
        if self.page:
            return (rows // self.per_page) * self.page + (rows % self.per_page) * self.stride
        return rows * self.stride

    @property
    def nbytes(self) -> int:
        """Bytes of the whole table (the last record's stride padding included, the last page not padded)."""
        return self.row_offset(self.rows - 1) + self.stride if self.rows else 0

    def part(self, name: str) -> Part | None:
        """The part called `name`, or None."""
        return next((p for p in self.parts if p.name == name), None)

    def assemble(self, encoded: dict[str, tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
        """Records (n, stride) uint8 from each part's (codes (n, code_bytes), scales (n, groups) fp16)."""
        n = next(iter(encoded.values()))[0].shape[0]
        out = np.zeros((n, self.stride), np.uint8)
        for p in self.parts:
            codes, scales = encoded[p.name]
            out[:, p.codes : p.codes + codes.shape[1]] = codes
            out[:, p.scales : p.scales + 2 * scales.shape[1]] = np.ascontiguousarray(scales, "<f2").view(np.uint8)
        return out

    def chunks(self, records: Iterable[np.ndarray]) -> Iterator[bytes | memoryview]:
        """Lay assembled (n, stride) record batches out as section bytes (page padding included)."""
        row, pos = 0, 0
        for batch in records:
            n = batch.shape[0]
            if self.page:  # scatter the records into their page slots, zero-filling the page tails
                offs = self.row_offsets(row, row + n) - pos
                buf = np.zeros(int(offs[-1]) + self.stride, np.uint8)
                buf[offs[:, None] + np.arange(self.stride)] = batch
                batch = buf
            yield memoryview(np.ascontiguousarray(batch)).cast("B")
            row += n
            pos = self.row_offset(row - 1) + self.stride
        if row != self.rows:
            raise PleFormatError(f"table {self.name}: got {row} records, expected {self.rows}")

    def decode(self, rec: np.ndarray) -> dict[str, np.ndarray]:
        """float32 values of each part of one record (a uint8 view of `record_bytes`)."""
        out = {}
        for p in self.parts:
            cb, sb = p.enc.code_bytes(p.length), p.enc.scale_bytes(p.length)
            scales = rec[p.scales : p.scales + sb].view("<f2").reshape(1, -1)
            out[p.name] = dequantize(rec[p.codes : p.codes + cb].reshape(1, -1), scales, p.enc, p.length)[0]
        return out

    def to_json(self) -> dict[str, Any]:
        """As stored in the meta JSON."""
        return {"name": self.name, "rows": self.rows, "record_bytes": self.record_bytes, "stride": self.stride,
                "align": self.align, "page": self.page, "parts": [p.to_json() for p in self.parts]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Table:
        """Inverse of `to_json` (offsets recomputed, then checked against the stored ones)."""
        t = cls(d["name"], d["rows"], [Part.from_json(p) for p in d["parts"]], d["align"], d["page"])
        stored = [(p["codes"], p["scales"]) for p in d["parts"]]
        if stored != [(p.codes, p.scales) for p in t.parts] or (t.record_bytes, t.stride) != (
            d["record_bytes"], d["stride"]
        ):
            raise PleFormatError(f"table {t.name}: record layout in the metadata is inconsistent")
        return t


@dataclass
class Section:
    """A byte range of the file with its sha256."""

    name: str
    offset: int
    nbytes: int
    sha256: bytes = b"\0" * 32


@dataclass
class Layout:
    """Everything about a .ple file except the weight bytes: model config, directory, tables, sections."""

    model: dict[str, Any]
    derived: dict[str, Any]
    quant: dict[str, Any]
    tensors: list[TensorEntry]
    tables: list[Table]
    tokenizer: dict[str, Any] | None = None
    """{"encoding": "zlib", "bytes": compressed size, "sha256": of the tokenizer.json text} or None."""
    source: dict[str, Any] = field(default_factory=dict)
    sections: list[Section] = field(default_factory=list)
    file_bytes: int = 0
    version: int | None = None
    """Format version of the file this layout describes; None (a new layout): the lowest that describes it, 3 for
    an n-gram index, else 2."""

    def __post_init__(self) -> None:
        if self.version is None:
            self.version = 3 if self.ngram is not None else 2
        if self.ngram is not None and self.version < 3:
            raise ValueError(f"an n-gram index needs format version 3, the file is version {self.version}")
        pos = 0
        for t in self.tensors:
            t.codes = _round_up(pos, TENSOR_ALIGN)
            t.scales = _round_up(t.codes + t.codes_bytes, TENSOR_ALIGN)
            pos = t.scales + t.scales_bytes
        self._tensors_bytes = pos
        if not self.sections:
            self._place_sections()

    @property
    def ngram(self) -> NgramLayout | None:
        """The PLE table's n-gram index (orders, heads, rows, hash seed), or None for a token table."""
        g = self.derived.get("ple_ngram")
        return NgramLayout(tuple(g["orders"]), g["heads"], tuple(g["rows"]), g["seed"]) if g else None

    @property
    def ple_reads(self) -> int:
        """PLE records one position reads: one per hash head of an n-gram index, else one."""
        return self.ngram.num_heads if self.ngram is not None else 1

    @property
    def id_map(self) -> bool:
        """Whether the file holds a token-id compression (the `idmap` section: an n-gram index hashes its ids)."""
        return bool(self.derived.get("ple_ngram", {}).get("id_map"))

    def meta(self) -> dict[str, Any]:
        """The meta JSON object (offsets inside it are relative to their section, so its size is stable)."""
        return {"format": "plelab-ple", "version": self.version, "model": self.model, "derived": self.derived,
                "quant": self.quant, "tensors": [t.to_json() for t in self.tensors],
                "tables": [t.to_json() for t in self.tables], "tokenizer": self.tokenizer, "source": self.source}

    def meta_bytes(self) -> bytes:
        """The meta section as stored: zlib-compressed compact UTF-8 JSON (a quarter of the plain size)."""
        return zlib.compress(json.dumps(self.meta(), separators=(",", ":"), sort_keys=True).encode(), 9)

    def model_desc(self) -> bytes:
        """The binary `model` section (versions 2 and 3): what a runtime without JSON needs, fixed-size fields."""
        m, d, g = self.model, self.derived, self.ngram
        ffn, ple = m["ffn"], m["ple"]
        flags = (FLAG_TIE * bool(m["tie_embeddings"]) | FLAG_EMBED_SCALE * bool(m["embed_scale"])
                 | FLAG_PLE_CONTEXT * bool(ple["context"]) | FLAG_PLE_OUTPUT_NORM * bool(ple["output_norm"]))
        width, kind_a, kind_b = ffn["intermediate_size"], ffn.get("mask_count", 1), ffn.get("rank", 0)
        if ffn["kind"] == "moe":  # the two kind fields hold E and k; the width is each expert's
            width, kind_a, kind_b = ffn.get("expert_size") or width, ffn["num_experts"], ffn["top_k"]
            flags |= FLAG_SHARED_EXPERT * bool(ffn.get("shared_expert"))
        layers = list(d["ple_layers"])
        names, offsets = [], {}
        for t in self.tensors:
            hit = _LAYER_NAME.fullmatch(t.name)
            layer, suffix = (int(hit[1]), hit[2]) if hit and int(hit[1]) < NO_LAYER else (NO_LAYER, t.name)
            names.append((layer, suffix))
            offsets.setdefault(suffix, sum(len(k.encode()) + 1 for k in offsets))
        strings = b"".join(k.encode() + b"\0" for k in offsets)
        try:
            head = MODEL_HEAD.pack(MODEL_MAGIC, MODEL_HEAD.size, m["hidden_size"], m["num_layers"], m["num_heads"],
                                   d["kv_heads"], d["head_dim"], m["vocab_size"], m["max_seq_len"],
                                   FFN_CODES[ffn["kind"]], width, kind_a, kind_b, ple["dim"], d["ple_vocab_size"],
                                   len(layers), GATE_CODES[ple["gate"]], flags, len(self.tensors), len(self.tables),
                                   len(strings), INDEX_CODES["ngram" if g else "token"], m["norm_eps"],
                                   m["rope_theta"])
            entries = []
            for t, (layer, suffix) in zip(self.tensors, names, strict=True):
                if len(t.shape) > 4 or len(t.name.encode()) >= 64 or t.vector != t.numel:
                    raise PleFormatError(f"tensor {t.name}: the binary description holds one quantisation vector, "
                                         "<= 4 dims and names < 64 bytes")
                entries.append(TENSOR_DESC.pack(layer, offsets[suffix], DTYPE_CODES[t.enc.dtype], len(t.shape), 0,
                                                t.enc.group, *t.shape, *[0] * (4 - len(t.shape)), t.codes, t.scales))
            tables = []
            for tab in self.tables:
                tables.append(TABLE_DESC.pack(tab.name.encode(), tab.rows, tab.record_bytes, tab.stride, tab.align,
                                              tab.page, len(tab.parts), 0))
                tables += [PART_DESC.pack(p.name.encode(), DTYPE_CODES[p.enc.dtype], 0, 0, p.enc.group, p.length,
                                          p.codes, p.scales, 0) for p in tab.parts]
        except (struct.error, KeyError) as exc:
            raise PleFormatError(f"the model cannot be described in format version {self.version} ({exc})") from exc
        blocks = [struct.pack(f"<{len(layers)}I", *layers)]
        if g is not None:
            entries_map = m["vocab_size"] if self.id_map else 0
            blocks.append(NGRAM_HEAD.pack(len(g.orders), g.heads, g.seed, entries_map)
                          + struct.pack(f"<{2 * len(g.orders)}I", *g.orders, *g.rows))
        blocks += [strings, b"".join(entries)]
        return head + b"".join(b + bytes(-len(b) % 8) for b in blocks) + b"".join(tables)

    def _section_sizes(self) -> list[tuple[str, int, int]]:
        """(name, bytes, alignment) in file order."""
        out = [("meta", len(self.meta_bytes()), 1)]
        if self.version >= 2:
            out.append(("model", len(self.model_desc()), TENSOR_ALIGN))
        out.append(("tensors", self._tensors_bytes, SECTION_ALIGN))
        if self.id_map:
            out.append((ID_MAP, 4 * self.model["vocab_size"], SECTION_ALIGN))
        for t in self.tables:
            out.append((t.name, t.nbytes, max(SECTION_ALIGN, t.align, t.page)))
        if self.tokenizer:
            out.append(("tokenizer", self.tokenizer["bytes"], SECTION_ALIGN))
        return out

    def _place_sections(self) -> None:
        sizes = self._section_sizes()
        pos = HEADER.size + SECTION.size * len(sizes)
        self.sections = []
        for name, nbytes, align in sizes:
            pos = _round_up(pos, align)
            self.sections.append(Section(name, pos, nbytes))
            pos += nbytes
        self.file_bytes = pos

    def section(self, name: str) -> Section:
        """The section called `name`."""
        for s in self.sections:
            if s.name == name:
                return s
        raise PleFormatError(f"the file has no {name!r} section")

    def tensor(self, name: str) -> TensorEntry:
        """The directory entry of tensor `name`."""
        for t in self.tensors:
            if t.name == name:
                return t
        raise PleFormatError(f"the file has no tensor {name!r}")

    def table(self, name: str) -> Table | None:
        """The row table called `name`, or None."""
        return next((t for t in self.tables if t.name == name), None)

    def tensor_chunks(self, encode: Callable[[TensorEntry], tuple[np.ndarray, np.ndarray]]) -> Iterator[bytes]:
        """The tensors section's bytes, given a function that encodes one entry to (codes, scales)."""
        pos = 0
        for t in self.tensors:
            codes, scales = encode(t)
            for off, blob in ((t.codes, codes.tobytes()), (t.scales, np.ascontiguousarray(scales, "<f2").tobytes())):
                if off > pos:
                    yield bytes(off - pos)
                yield blob
                pos = off + len(blob)
            if pos != t.scales + t.scales_bytes:
                raise PleFormatError(f"tensor {t.name}: encoded to the wrong number of bytes")


def write_ple(path: str | Path, layout: Layout, sections: dict[str, Iterable[bytes | memoryview]]) -> Layout:
    """Write a .ple atomically (`plelab.util.fs.atomic_writer`), streaming each data section from `sections`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as f:
        body_start = HEADER.size + SECTION.size * len(layout.sections)
        f.write(bytes(body_start))
        body_crc = 0
        pos = body_start
        for sec in layout.sections:
            pad = bytes(sec.offset - pos)
            f.write(pad)
            body_crc = zlib.crc32(pad, body_crc)
            h = hashlib.sha256()
            n = 0
            fixed = {"meta": layout.meta_bytes, "model": layout.model_desc}.get(sec.name)
            for chunk in [fixed()] if fixed else sections[sec.name]:
                f.write(chunk)
                h.update(chunk)
                body_crc = zlib.crc32(chunk, body_crc)
                n += len(chunk) if isinstance(chunk, bytes) else chunk.nbytes
            if n != sec.nbytes:
                raise PleFormatError(f"section {sec.name}: wrote {n} bytes, layout says {sec.nbytes}")
            sec.sha256 = h.digest()
            pos = sec.offset + n
        table = b"".join(SECTION.pack(s.name.encode(), s.offset, s.nbytes, s.sha256) for s in layout.sections)
        f.seek(0)
        f.write(_pack_header(layout.file_bytes, len(layout.sections), zlib.crc32(table), body_crc, layout.version))
        f.write(table)
    return layout


def _pack_header(file_bytes: int, n_sections: int, table_crc: int, body_crc: int, version: int = VERSION) -> bytes:
    head = HEADER.pack(MAGIC, version, HEADER.size, file_bytes, n_sections, table_crc, body_crc, bytes(24), 0)
    return head[:-4] + struct.pack("<I", zlib.crc32(head[:-4]))


class PleFile:
    """An open .ple file: verified on open, memory-mapped, with row reads that touch only the rows asked for."""

    def __init__(self, path: str | Path, verify: str = "full"):
        if verify not in VERIFY_MODES:
            raise PleFormatError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY)
        except OSError as exc:
            raise PleFormatError(f"{path}: cannot open ({exc.strerror})") from exc
        try:
            self.layout = self._read_layout()
            if verify != "none":
                self._verify(full=verify == "full")
            self._mm = mmap.mmap(self._fd, 0, access=mmap.ACCESS_READ)
            self._release = hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_DONTNEED")
            if hasattr(mmap, "MADV_RANDOM"):
                # Rows are random accesses: do not let readahead pull in neighbouring records.
                self._mm.madvise(mmap.MADV_RANDOM)
        except BaseException:
            os.close(self._fd)
            raise

    def _fail(self, what: str) -> PleFormatError:
        return PleFormatError(f"{self.path}: {what}")

    def _pread(self, n: int, off: int) -> bytes:
        data = os.pread(self._fd, n, off)
        if len(data) != n:
            raise self._fail(f"truncated (wanted {n} bytes at offset {off}, got {len(data)})")
        return data

    def _read_layout(self) -> Layout:
        size = os.fstat(self._fd).st_size
        if size < HEADER.size:
            raise self._fail(f"not a .ple file (only {size} bytes)")
        head = self._pread(HEADER.size, 0)
        magic, version, hbytes, file_bytes, n_sec, table_crc, body_crc, _, crc = HEADER.unpack(head)
        if magic != MAGIC:
            raise self._fail(f"not a .ple file (magic {magic!r}, expected {MAGIC!r})")
        if version not in READ_VERSIONS:
            raise self._fail(f"format version {version} is not supported (this plelab reads versions "
                             f"{', '.join(map(str, READ_VERSIONS))}); re-export the model with this plelab")
        if zlib.crc32(head[:-4]) != crc or hbytes != HEADER.size:
            raise self._fail("header is corrupt (crc32 mismatch)")
        if size < file_bytes:
            raise self._fail(f"truncated: {size:,} bytes on disk, the header says {file_bytes:,}")
        if size > file_bytes:
            raise self._fail(f"has {size - file_bytes:,} unexpected trailing bytes (corrupt copy?)")
        table = self._pread(SECTION.size * n_sec, HEADER.size)
        if zlib.crc32(table) != table_crc:
            raise self._fail("section table is corrupt (crc32 mismatch)")
        sections = []
        for i in range(n_sec):
            name, off, nbytes, sha = SECTION.unpack_from(table, i * SECTION.size)
            if off + nbytes > file_bytes:
                raise self._fail(f"section {name!r} runs past the end of the file")
            sections.append(Section(name.rstrip(b"\0").decode("ascii", "replace"), off, nbytes, sha))
        self._body_crc = body_crc
        self._body_start = HEADER.size + SECTION.size * n_sec
        meta_sec = next((s for s in sections if s.name == "meta"), None)
        if meta_sec is None:
            raise self._fail("has no meta section")
        raw = self._section_bytes(meta_sec)
        try:
            m = json.loads(zlib.decompress(raw))
            layout = Layout(m["model"], m["derived"], m["quant"], [TensorEntry.from_json(t) for t in m["tensors"]],
                            [Table.from_json(t) for t in m["tables"]], m["tokenizer"], m.get("source", {}),
                            sections=sections, file_bytes=file_bytes, version=version)
            if version >= 2:
                model_sec = next((s for s in sections if s.name == "model"), None)
                if model_sec is None:
                    raise self._fail("has no model section (required from format version 2)")
                if self._section_bytes(model_sec) != layout.model_desc():
                    raise self._fail("the binary model description disagrees with the meta JSON (corrupt writer?)")
        except (ValueError, KeyError, TypeError, QuantError, zlib.error) as exc:
            raise self._fail(f"metadata is invalid ({exc})") from exc
        for name, nbytes, _ in layout._section_sizes():
            if layout.section(name).nbytes != nbytes:
                have = layout.section(name).nbytes
                raise self._fail(f"section {name!r} has {have} bytes, its contents need {nbytes}")
        return layout

    def _section_bytes(self, sec: Section) -> bytes:
        """A small section's bytes, checked against its sha256 (meta and model are always verified)."""
        raw = self._pread(sec.nbytes, sec.offset)
        if hashlib.sha256(raw).digest() != sec.sha256:
            raise self._fail(f"section {sec.name!r} fails its sha256 checksum (file corrupt)")
        return raw

    def _verify(self, full: bool) -> None:
        """Check section sha256s (all of them, or all but the row tables and tokenizer) and the body crc32."""
        skip = set() if full else {t.name for t in self.layout.tables} | {ID_MAP, "tokenizer"}
        crc = 0
        pos = self._body_start
        for sec in sorted(self.layout.sections, key=lambda s: s.offset):
            if sec.name in skip:
                continue
            if full and sec.offset > pos:
                crc = zlib.crc32(self._pread(sec.offset - pos, pos), crc)
            h = hashlib.sha256()
            for off in range(sec.offset, sec.offset + sec.nbytes, _CHUNK):
                block = self._pread(min(_CHUNK, sec.offset + sec.nbytes - off), off)
                h.update(block)
                if full:
                    crc = zlib.crc32(block, crc)
            if h.digest() != sec.sha256:
                raise self._fail(f"section {sec.name!r} fails its sha256 checksum (file corrupt)")
            pos = sec.offset + sec.nbytes
        if full:
            if pos < self.layout.file_bytes:
                crc = zlib.crc32(self._pread(self.layout.file_bytes - pos, pos), crc)
            if crc != self._body_crc:
                raise self._fail("whole-file crc32 mismatch (file corrupt)")

    def read_tensor(self, name: str) -> np.ndarray:
        """Tensor `name` dequantised to float32 in its shape (read with pread, so no pages stay mapped)."""
        t = self.layout.tensor(name)
        base = self.layout.section("tensors").offset
        codes = np.frombuffer(self._pread(t.codes_bytes, base + t.codes), np.uint8).reshape(t.vectors, -1)
        scales = np.frombuffer(self._pread(t.scales_bytes, base + t.scales), "<f2").reshape(t.vectors, -1)
        return dequantize(codes, scales, t.enc, t.vector).reshape(t.shape)

    def read_codes(self, name: str) -> np.ndarray:
        """Tensor `name`'s stored codes block as flat uint8 (a u1 mask stays packed, 8 values per byte)."""
        t = self.layout.tensor(name)
        return np.frombuffer(self._pread(t.codes_bytes, self.layout.section("tensors").offset + t.codes), np.uint8)

    def read_record(self, table: Table, row: int) -> dict[str, np.ndarray]:
        """Decoded parts of record `row`: one contiguous mmap read of `table.record_bytes`."""
        off = self.layout.section(table.name).offset + table.row_offset(row)
        rec = np.frombuffer(self._mm, np.uint8, count=table.record_bytes, offset=off)
        out = table.decode(rec)  # decode copies, so the mapping can be dropped below
        del rec
        if self._release:
            # Linux maps a whole large page-cache folio (up to 2 MiB) on one fault, so each record read
            # would leave ~1 MB resident; unmapping the aligned neighbourhood keeps RSS to what we use.
            # The pages stay in the page cache: re-reading a record costs no I/O.
            lo = off // _RELEASE_WINDOW * _RELEASE_WINDOW
            hi = min(self.layout.file_bytes, -(-(off + table.record_bytes) // _RELEASE_WINDOW) * _RELEASE_WINDOW)
            self._mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
        return out

    def read_id(self, token: int) -> int:
        """Token `token`'s compressed id from the `idmap` section (one 4-byte read)."""
        return struct.unpack("<I", self._pread(4, self.layout.section(ID_MAP).offset + 4 * token))[0]

    def read_table(self, table: Table, part: str, chunk_rows: int = 4096) -> np.ndarray:
        """One part of every record, float32 (rows, length): a whole-table read, for the output head."""
        p = table.part(part)
        out = np.empty((table.rows, p.length), np.float32)
        base = self.layout.section(table.name).offset
        for start in range(0, table.rows, chunk_rows):
            stop = min(table.rows, start + chunk_rows)
            offs = table.row_offsets(start, stop)
            lo, hi = int(offs[0]), int(offs[-1]) + table.record_bytes
            raw = np.frombuffer(self._pread(hi - lo, base + lo), np.uint8)
            recs = raw[(offs - lo)[:, None] + np.arange(table.record_bytes)[None, :]]
            cb, sb = p.enc.code_bytes(p.length), p.enc.scale_bytes(p.length)
            scales = np.ascontiguousarray(recs[:, p.scales : p.scales + sb]).view("<f2")
            out[start:stop] = dequantize(recs[:, p.codes : p.codes + cb], scales, p.enc, p.length)
        return out

    def tokenizer_json(self) -> str | None:
        """The embedded tokenizer.json text, or None."""
        if not self.layout.tokenizer:
            return None
        sec = self.layout.section("tokenizer")
        return zlib.decompress(self._pread(sec.nbytes, sec.offset)).decode("utf-8")

    def close(self) -> None:
        """Unmap and close."""
        if getattr(self, "_mm", None) is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> PleFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
