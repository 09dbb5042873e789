"""A small safetensors reader built on os.pread: tensors in chunks of rows, and arbitrary rows of one tensor.

safe_open memory-maps a shard, and every page a read touches then counts in the process's RSS until the
mapping closes; streaming a 4.7 GB table through it would show a 4.7 GB high-water mark. pread copies only
the bytes asked for and leaves the file in the page cache. Format: an 8-byte little-endian header length,
a JSON header {name: {dtype, shape, data_offsets}} (offsets relative to the end of the header), the data.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from plelab.errors import PlelabError

# safetensors dtype -> (numpy dtype of the stored bits, bytes per value); BF16 is read as uint16 bits.
DTYPES = {"F32": (np.float32, 4), "F16": (np.float16, 2), "BF16": (np.uint16, 2), "F64": (np.float64, 8),
          "I64": (np.int64, 8), "I32": (np.int32, 4), "I16": (np.int16, 2), "I8": (np.int8, 1),
          "U8": (np.uint8, 1), "BOOL": (np.bool_, 1)}
MAX_HEADER = 100 << 20


class SafetensorsError(PlelabError):
    """A shard that is missing, unreadable or not a safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes are: its file, dtype, shape and absolute byte offset."""

    path: Path
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def row_bytes(self) -> int:
        """Bytes of one index along the first dimension."""
        return math.prod(self.shape[1:]) * DTYPES[self.dtype][1]


def read_header(path: Path) -> dict[str, TensorInfo]:
    """Name -> TensorInfo of every tensor in a shard (only the header is read)."""
    try:
        with open(path, "rb") as f:
            raw = f.read(8)
            size = struct.unpack("<Q", raw)[0] if len(raw) == 8 else -1
            if not 0 < size <= MAX_HEADER:
                raise SafetensorsError(f"{path}: not a safetensors file (header size {size})")
            header = json.loads(f.read(size))
            file_size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise SafetensorsError(f"{path}: cannot read ({exc.strerror})") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise SafetensorsError(f"{path}: corrupt safetensors header ({exc})") from None
    out = {}
    for name, d in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (a, b) = d["dtype"], tuple(int(s) for s in d["shape"]), d["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise SafetensorsError(f"{path}: corrupt entry for {name} ({exc})") from None
        if dtype not in DTYPES:
            raise SafetensorsError(f"{path}: tensor {name} has unsupported dtype {dtype}")
        if b - a != math.prod(shape) * DTYPES[dtype][1] or 8 + size + b > file_size:
            raise SafetensorsError(f"{path}: tensor {name} does not fit its byte range (truncated file?)")
        out[name] = TensorInfo(path, dtype, shape, 8 + size + a)
    return out


def _to_torch(raw: np.ndarray, dtype: str) -> torch.Tensor:
    if dtype == "BF16":
        return torch.from_numpy(raw.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(raw)


def _pread(fd: int, info: TensorInfo, nbytes: int, offset: int) -> np.ndarray:
    data = os.pread(fd, nbytes, offset)
    if len(data) != nbytes:
        raise SafetensorsError(f"{info.path}: truncated (wanted {nbytes} bytes at {offset})")
    return np.frombuffer(bytearray(data), dtype=DTYPES[info.dtype][0])


def _rows(fd: int, info: TensorInfo, start: int, stop: int) -> torch.Tensor:
    raw = _pread(fd, info, (stop - start) * info.row_bytes, info.offset + start * info.row_bytes)
    return _to_torch(raw.reshape(stop - start, *info.shape[1:]), info.dtype)


def _open(info: TensorInfo) -> int:
    try:
        return os.open(info.path, os.O_RDONLY)
    except OSError as exc:
        raise SafetensorsError(f"{info.path}: cannot open ({exc.strerror})") from None


def read_rows(info: TensorInfo, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop-1 (along the first dimension) as a tensor of the stored dtype."""
    fd = _open(info)
    try:
        return _rows(fd, info, start, stop)
    finally:
        os.close(fd)


READ_CHUNK = 64 << 20
"""Bytes per pread of `read_rows_into`."""


def read_rows_into(info: TensorInfo, start: int, out: torch.Tensor) -> torch.Tensor:
    """Rows start..start+len(out) read straight into `out` (contiguous, on the CPU, of the stored dtype): no copy
    of the bytes besides `out` itself (one rank's rows of a large table); returns `out`."""
    want = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64}.get(info.dtype)
    if out.dtype != want or not out.is_contiguous() or out.device.type != "cpu":
        return out.copy_(read_rows(info, start, start + out.shape[0]))
    if start < 0 or start + out.shape[0] > (info.shape[0] if info.shape else 0):
        raise SafetensorsError(f"{info.path}: rows [{start}, {start + out.shape[0]}) outside a tensor of shape "
                               f"{info.shape}")
    view = memoryview(out.detach().view(torch.uint8).numpy()).cast("B")
    offset, done = info.offset + start * info.row_bytes, 0
    fd = _open(info)
    try:
        while done < len(view):
            n = os.preadv(fd, [view[done : done + READ_CHUNK]], offset + done)
            if n <= 0:
                raise SafetensorsError(f"{info.path}: truncated (wanted {len(view)} bytes at {offset})")
            done += n
    finally:
        os.close(fd)
    return out


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """A whole tensor (scalars included) of the stored dtype."""
    if info.shape:
        return read_rows(info, 0, info.shape[0])
    fd = _open(info)
    try:
        return _to_torch(_pread(fd, info, DTYPES[info.dtype][1], info.offset).reshape(()), info.dtype)
    finally:
        os.close(fd)


def gather_rows(info: TensorInfo, ids: np.ndarray) -> torch.Tensor:
    """Rows `ids` (any order, repeats allowed) with one pread per run of consecutive ids."""
    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    uniq, inverse = np.unique(ids, return_inverse=True)
    out = torch.empty((len(uniq), *info.shape[1:]), dtype=torch.float32)
    fd = _open(info)
    try:
        breaks = np.flatnonzero(np.diff(uniq) != 1) + 1
        for run in np.split(np.arange(len(uniq)), breaks) if len(uniq) else []:
            a, b = int(uniq[run[0]]), int(uniq[run[-1]]) + 1
            out[run[0] : run[-1] + 1] = _rows(fd, info, a, b).float()
    finally:
        os.close(fd)
    return out[torch.from_numpy(inverse.reshape(-1))]
