"""Weight encodings of the .ple format: fp32, fp16, and symmetric group-wise int8 / int4 with fp16 scales.

A tensor is stored as a list of *vectors* (a dense matrix is one vector, a row table one vector per row).
Each vector is cut into groups of `group` consecutive values (the last group may be shorter); a group
has one fp16 scale s and codes q with value = q * s:

    int8: q in [-127, 127], one byte each (two's complement)
    int4: q in [-7, 7], two per byte, element 2i in the low nibble, 2i+1 in the high nibble
          (two's complement nibble; an odd-length vector ends with a zero high nibble)
    u1:   a 0/1 mask (MGLU), 8 per byte, first element in the most significant bit (np.packbits)

Scales are rounded to fp16 *before* the codes are computed, so dequantisation uses exactly the scale
the codes were made with. Optional scale search tries a few shrunken scales per group and keeps the
one with the least squared error (it clips outliers when that pays); -8 / -128 are never produced, so
the encoding stays symmetric. This module is NumPy only: the runtime imports it without torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from plelab.errors import PlelabError

DTYPES = ("fp32", "fp16", "int8", "int4", "u1")
ExportQuant = Literal["fp32", "fp16", "int8", "int4"]
EXPORT_QUANTS: tuple[str, ...] = get_args(ExportQuant)
"""The export encodings of matrices and tables (`plelab export --quant`, `plelab params --quant`); u1 is for
MGLU masks only."""
QMAX = {"int8": 127, "int4": 7}
# Scale candidates (fractions of absmax / qmax) tried by the search; 1.0 first so ties keep plain absmax.
SEARCH_RATIOS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7)


class QuantError(PlelabError):
    """An encoding that cannot be used (unknown dtype, bad group size, scale out of fp16 range)."""


@dataclass(frozen=True)
class Encoding:
    """How one vector of `length` values is stored: dtype, and group size for the integer dtypes."""

    dtype: str
    group: int = 0

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise QuantError(f"unknown weight encoding {self.dtype!r}; use one of {', '.join(DTYPES)}")
        if self.dtype in QMAX and self.group <= 0:
            raise QuantError(f"{self.dtype} needs a group size > 0, got {self.group}")

    @property
    def is_int(self) -> bool:
        """True for the scaled integer encodings."""
        return self.dtype in QMAX

    def code_bytes(self, length: int) -> int:
        """Bytes of codes for one vector of `length` values."""
        return {"fp32": 4 * length, "fp16": 2 * length, "int8": length, "int4": (length + 1) // 2,
                "u1": (length + 7) // 8}[self.dtype]

    def scale_count(self, length: int) -> int:
        """fp16 scales for one vector (0 for float encodings)."""
        return -(-length // self.group) if self.is_int else 0

    def scale_bytes(self, length: int) -> int:
        """Bytes of scales for one vector."""
        return 2 * self.scale_count(length)

    def to_json(self) -> dict:
        """The encoding as stored in the file's metadata."""
        return {"dtype": self.dtype, "group": self.group if self.is_int else 0}


def _grouped(x: np.ndarray, group: int) -> np.ndarray:
    """(n, length) -> (n, groups, group), zero-padded (zeros change neither absmax nor the codes kept)."""
    n, length = x.shape
    groups = -(-length // group)
    if groups * group != length:
        x = np.pad(x, ((0, 0), (0, groups * group - length)))
    return x.reshape(n, groups, group)


def quantize(x: np.ndarray, enc: Encoding, search: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Encode (n, length) float values; returns codes (n, code_bytes) uint8 and scales (n, groups) float16."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2:
        raise QuantError(f"quantize wants (vectors, length), got shape {x.shape}")
    n, length = x.shape
    if enc.dtype == "fp32":
        return x.view(np.uint8).reshape(n, -1), np.zeros((n, 0), np.float16)
    if enc.dtype == "u1":
        return np.packbits(x != 0, axis=1), np.zeros((n, 0), np.float16)
    if enc.dtype == "fp16":
        if np.abs(x).max(initial=0.0) > np.finfo(np.float16).max:
            raise QuantError("weights exceed the fp16 range; export with --quant fp32")
        return x.astype(np.float16).view(np.uint8).reshape(n, -1), np.zeros((n, 0), np.float16)
    qmax = QMAX[enc.dtype]
    g = _grouped(x, enc.group)
    absmax = np.abs(g).max(axis=2)
    if absmax.max(initial=0.0) / qmax > np.finfo(np.float16).max:
        raise QuantError("a group's scale exceeds the fp16 range; export with --quant fp32")
    best_scale = (absmax / qmax).astype(np.float16)
    if search:
        best_err = None
        for ratio in SEARCH_RATIOS:
            scale = (absmax * ratio / qmax).astype(np.float16)
            err = _group_error(g, scale, qmax)
            if best_err is None:
                best_err = err
            else:
                better = err < best_err
                best_scale = np.where(better, scale, best_scale)
                best_err = np.where(better, err, best_err)
    q = _codes(g, best_scale, qmax).reshape(n, -1)[:, :length]
    return pack_codes(q, enc.dtype), best_scale


def _codes(g: np.ndarray, scale: np.ndarray, qmax: int) -> np.ndarray:
    s = scale.astype(np.float32)[..., None]
    inv = np.divide(1.0, s, out=np.zeros_like(s), where=s > 0)
    return np.clip(np.rint(g * inv), -qmax, qmax).astype(np.int8)


def _group_error(g: np.ndarray, scale: np.ndarray, qmax: int) -> np.ndarray:
    q = _codes(g, scale, qmax).astype(np.float32)
    diff = g - q * scale.astype(np.float32)[..., None]
    return np.einsum("ngk,ngk->ng", diff, diff)


def pack_codes(q: np.ndarray, dtype: str) -> np.ndarray:
    """int8 codes (n, length) -> stored bytes (n, code_bytes)."""
    if dtype == "int8":
        return q.view(np.uint8)
    if q.shape[1] % 2:
        q = np.pad(q, ((0, 0), (0, 1)))
    nib = q.view(np.uint8) & 0x0F
    return nib[:, 0::2] | (nib[:, 1::2] << 4)


def unpack_codes(b: np.ndarray, dtype: str, length: int) -> np.ndarray:
    """Stored bytes (n, code_bytes) -> signed codes (n, length) as int8."""
    if dtype == "int8":
        return b.view(np.int8)
    lo = (b & 0x0F).astype(np.int8)
    hi = (b >> 4).astype(np.int8)
    q = np.empty((b.shape[0], 2 * b.shape[1]), np.int8)
    q[:, 0::2], q[:, 1::2] = lo, hi
    q = (q ^ 8) - 8  # sign-extend the 4-bit two's complement
    return q[:, :length]


def dequantize(codes: np.ndarray, scales: np.ndarray, enc: Encoding, length: int) -> np.ndarray:
    """Stored codes (n, code_bytes) uint8 and scales (n, groups) -> float32 values (n, length)."""
    codes = np.ascontiguousarray(codes)
    if enc.dtype == "fp32":
        return codes.view(np.float32).reshape(codes.shape[0], length).copy()
    if enc.dtype == "u1":
        return np.unpackbits(codes, axis=1)[:, :length].astype(np.float32)
    if enc.dtype == "fp16":
        return codes.view(np.float16).reshape(codes.shape[0], length).astype(np.float32)
    q = unpack_codes(codes, enc.dtype, length).astype(np.float32)
    n = q.shape[0]
    groups = scales.shape[1]
    if groups * enc.group != length:
        q = np.pad(q, ((0, 0), (0, groups * enc.group - length)))
    out = q.reshape(n, groups, enc.group) * scales.astype(np.float32).reshape(n, groups, 1)
    return np.ascontiguousarray(out.reshape(n, -1)[:, :length])  # contiguous: BLAS-able in matmuls
