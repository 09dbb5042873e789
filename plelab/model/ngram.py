"""The n-gram index of a PLE table: hashed suffix n-grams of token ids choose the rows (docs/ngram-ple.md).

Everything here is plain integers and NumPy (no torch), so the edge runtimes can import it; the training path's
torch version of the same hash is `plelab.model.ple.NgramRows`, pinned to the same test vectors.

The hash, for head (n, k) (n-gram order n, head k of that order) at position t of a sequence of ids x:

    h   = XOR over i in 0..n-1 of  x[t - i] * m(n, k, i)      uint32, products wrap modulo 2**32
    h   = fmix32(h)                                            MurmurHash3's 32-bit finaliser
    row = offset(n, k) + h mod rows(n)

x[t - i] is PAD (0xFFFFFFFF, no token's id) before the start of the sequence. The multipliers are
m(n, k, i) = fmix32(seed + GOLDEN * (1 + (n << 16 | k << 8 | i))) | 1, odd and distinct per (n, k, i). Heads are
laid out order by order (ascending), head by head: head (n, k) owns the contiguous rows
[offset(n, k), offset(n, k) + rows(n)) of one table. Only 32-bit multiplies, shifts, XORs and one 32-bit modulo
per head: what a microcontroller without 64-bit division or doubles computes in a few cycles.

Row counts: every head of order n has rows(n) rows, which must be prime and not a multiple of the vocabulary size
(`rows_problem`). The finaliser spreads h evenly over 32 bits; a prime modulus keeps the reduction free of any
arithmetic structure left in h besides (a power of two would keep only low bits, a multiple of the vocabulary
size is where hashed tables' collisions spike), and costs nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plelab.errors import PlelabError

MASK32 = 0xFFFFFFFF
PAD_ID = 0xFFFFFFFF
"""What x[t - i] is before the sequence starts: no token id is this large."""
GOLDEN = 0x9E3779B9
"""2**32 / golden ratio, odd: seed + GOLDEN * key is a bijection of the key modulo 2**32."""
FMIX_1, FMIX_2 = 0x85EBCA6B, 0xC2B2AE35
MAX_ORDER = 8
"""Longest n-gram (and most heads per order, 255): the (n, k, i) key packs each into 8 bits."""
MAX_HEADS = 255
ID_MAP_FORMAT = "plelab-id-map/1"


class NgramError(PlelabError):
    """An n-gram layout or id-map file that cannot be used."""


def fmix32(h: int) -> int:
    """MurmurHash3's 32-bit finaliser (a bijection of uint32 that spreads every input bit over the output)."""
    h &= MASK32
    h ^= h >> 16
    h = (h * FMIX_1) & MASK32
    h ^= h >> 13
    h = (h * FMIX_2) & MASK32
    return h ^ (h >> 16)


def multiplier(seed: int, order: int, head: int, position: int) -> int:
    """m(n, k, i): the odd multiplier of id x[t - i] in head k of order n."""
    key = (order << 16) | (head << 8) | position
    return fmix32((seed + GOLDEN * (1 + key)) & MASK32) | 1


def is_prime(n: int) -> bool:
    """Whether n is prime (trial division: n < 2**32 needs divisors up to 65,536 only)."""
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    return all(n % d for d in range(3, math.isqrt(n) + 1, 2))


def next_prime(n: int) -> int:
    """The smallest prime >= n."""
    while not is_prime(n):
        n += 1
    return n


def prev_prime(n: int) -> int | None:
    """The largest prime <= n, or None below 2."""
    while n >= 2 and not is_prime(n):
        n -= 1
    return n if n >= 2 else None


def rows_problem(rows: int, vocab_size: int) -> str | None:
    """Why `rows` rows per head would hash badly (see the module docstring), or None when they are fine."""
    if not 2 <= rows <= MASK32:
        return f"must lie in 2..{MASK32} (a uint32 modulus)"
    if rows % vocab_size == 0:
        return f"is a multiple of the vocabulary size {vocab_size} (where hashed tables' collisions spike)"
    if not is_prime(rows):
        below = prev_prime(rows)
        return (f"is not prime (a composite modulus keeps structure the hash leaves); nearest primes "
                f"{below} and {next_prime(rows)}")
    return None


def default_rows(vocab_size: int) -> int:
    """Rows per head when none are given: the smallest prime above the vocabulary size, so an n-gram table has
    about the bytes of a token table of the same dP (rows x L x dP either way)."""
    return next_prime(vocab_size + 1)


@dataclass(frozen=True)
class NgramLayout:
    """Orders, heads and rows of an n-gram table, and the hash parameters: what a runtime needs besides the ids."""

    orders: tuple[int, ...]
    """N-gram lengths, ascending."""
    heads: int
    """Hash heads per order."""
    rows: tuple[int, ...]
    """Rows of each head, one entry per order."""
    seed: int = 0
    """Seed of the multipliers."""

    @property
    def num_heads(self) -> int:
        """S: heads of all orders together (the rows one token reads)."""
        return len(self.orders) * self.heads

    @property
    def max_order(self) -> int:
        """The longest n-gram: how many ids (this one and max_order - 1 before it) a position hashes."""
        return max(self.orders)

    @property
    def head_keys(self) -> list[tuple[int, int]]:
        """(order, head) of each of the S heads, in table order."""
        return [(n, k) for n in self.orders for k in range(self.heads)]

    @property
    def head_rows(self) -> list[int]:
        """Rows of each head, in table order."""
        return [r for r in self.rows for _ in range(self.heads)]

    @property
    def offsets(self) -> list[int]:
        """First table row of each head, in table order."""
        sizes = self.head_rows
        return [sum(sizes[:j]) for j in range(len(sizes))]

    @property
    def total_rows(self) -> int:
        """Rows of the whole table."""
        return sum(self.head_rows)

    def multipliers(self) -> list[list[int]]:
        """m(n, k, i) of every head, padded with 0 to max_order entries (a zero multiplier adds nothing to h)."""
        return [[multiplier(self.seed, n, k, i) if i < n else 0 for i in range(self.max_order)]
                for n, k in self.head_keys]


def hash_rows_python(ids: Sequence[int], layout: NgramLayout) -> list[list[int]]:
    """Table rows of every position of one sequence, [T][S]: the reference, one integer at a time."""
    out = []
    for t in range(len(ids)):
        rows = []
        for (n, _), m, rows_n, offset in zip(layout.head_keys, layout.multipliers(), layout.head_rows,
                                              layout.offsets, strict=True):
            h = 0
            for i in range(n):
                x = ids[t - i] if t - i >= 0 else PAD_ID
                h ^= (x * m[i]) & MASK32
            rows.append(offset + fmix32(h) % rows_n)
        out.append(rows)
    return out


def _fmix32_np(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(FMIX_1)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(FMIX_2)
    return h ^ (h >> np.uint32(16))


def hash_rows_numpy(ids: np.ndarray, layout: NgramLayout) -> np.ndarray:
    """Table rows (..., T, S) int64 of id arrays (..., T): every position at once, in uint32 arithmetic."""
    x = np.asarray(ids).astype(np.uint32)
    T = x.shape[-1]
    pad = np.full(x.shape[:-1] + (layout.max_order - 1,), PAD_ID, dtype=np.uint32)
    padded = np.concatenate([pad, x], axis=-1)
    # shifted[..., t, i] = x[t - i] (PAD before the start)
    shifted = np.stack([padded[..., layout.max_order - 1 - i: layout.max_order - 1 - i + T]
                        for i in range(layout.max_order)], axis=-1)
    m = np.array(layout.multipliers(), dtype=np.uint32)  # (S, N)
    with np.errstate(over="ignore"):
        h = np.bitwise_xor.reduce(shifted[..., None, :] * m, axis=-1)  # (..., T, S)
        h = _fmix32_np(h)
    rows = np.array(layout.head_rows, dtype=np.uint32)
    return (h % rows).astype(np.int64) + np.array(layout.offsets, dtype=np.int64)


# ----------------------------------------------------------------------------------------------- id maps


def canonical_form(text: str) -> str:
    """The text two token ids must share to share a compressed id: NFKC, accents stripped, lower case,
    whitespace runs folded to one space and trimmed (a token of whitespace only stays one space)."""
    s = unicodedata.normalize("NFKC", text)
    s = "".join(c for c in unicodedata.normalize("NFD", s) if not unicodedata.combining(c)).lower()
    s = " ".join(s.split()) if s.strip() else (" " if s else "")
    return s


def build_id_map(vocab_size: int, decode: Callable[[int], str]) -> list[int]:
    """A surjective map token id -> compressed id: ids whose decoded text has one `canonical_form` share an id.

    A token that decodes to an incomplete character (U+FFFD: part of a multi-byte UTF-8 sequence) keeps an id of
    its own, as does one whose canonical form is empty. Compressed ids are numbered in order of first appearance."""
    keys: dict[str, int] = {}
    out = []
    for tid in range(vocab_size):
        text = decode(tid)
        norm = canonical_form(text)
        key = f"\x00id {tid}" if "\ufffd" in text or not norm else norm
        out.append(keys.setdefault(key, len(keys)))
    return out


@dataclass(frozen=True)
class IdMap:
    """A token-id compression read from its file."""

    ids: list[int]
    """Compressed id of each token id."""
    sha256: str
    """sha256 of the file's bytes."""

    @property
    def num_ids(self) -> int:
        """Distinct compressed ids."""
        return max(self.ids) + 1 if self.ids else 0


def id_map_document(ids: list[int], tokenizer_sha256: str | None = None) -> dict:
    """The JSON object of an id-map file."""
    return {"format": ID_MAP_FORMAT, "vocab_size": len(ids), "num_ids": max(ids) + 1 if ids else 0,
            "rule": "NFKC, accents stripped, lower case, whitespace folded (plelab.model.ngram.canonical_form)",
            "tokenizer_sha256": tokenizer_sha256, "map": ids}


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes (the id map's hash recorded in the model config)."""
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as exc:
        raise NgramError(f"ple.ngram.id_map: cannot read {path} ({exc.strerror})") from None


def read_id_map(path: str | Path, vocab_size: int, sha256: str | None = None) -> IdMap:
    """The id map in `path`, checked against the model's vocabulary and (when given) the recorded sha256."""
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise NgramError(f"ple.ngram.id_map: cannot read {path} ({exc.strerror})") from None
    digest = hashlib.sha256(raw).hexdigest()
    if sha256 is not None and digest != sha256:
        raise NgramError(f"ple.ngram.id_map: {path} has sha256 {digest[:12]}, but the model was configured with "
                         f"{sha256[:12]} (the file changed since)")
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NgramError(f"ple.ngram.id_map: {path} is not JSON ({exc})") from None
    ids = doc.get("map") if isinstance(doc, dict) else None
    if not isinstance(doc, dict) or doc.get("format") != ID_MAP_FORMAT or not isinstance(ids, list):
        raise NgramError(f"ple.ngram.id_map: {path} is not a {ID_MAP_FORMAT} file (make one with `plelab data id-map`)")
    if len(ids) != vocab_size:
        raise NgramError(f"ple.ngram.id_map: {path} maps {len(ids)} token ids, the model's vocabulary has {vocab_size}")
    if not all(isinstance(i, int) and 0 <= i < len(ids) for i in ids):
        raise NgramError(f"ple.ngram.id_map: {path} holds entries that are not ids in 0..{len(ids) - 1}")
    if set(ids) != set(range(max(ids) + 1)):
        raise NgramError(f"ple.ngram.id_map: {path} skips compressed ids (they must be 0..N-1, each used)")
    return IdMap(ids, digest)
