"""`plelab finetune --merge OUT`: the checkpoint with its adapters (and table delta) folded in, as a Hugging
Face folder of the original architecture.

Every shard is rewritten with the same tensor names, dtypes, shapes and order (so the index and config.json
are copied unchanged): an adapted weight becomes W + (alpha / r) B A, computed in float32 and stored in W's
dtype; the PLE table is streamed in chunks of rows, each chunk with its rows' delta added; every other tensor
(vision and audio towers included) is copied byte for byte in chunks. No tensor is ever whole in memory
beyond one adapted matrix, so merging an E2B needs about one matrix of RAM, not the model. The other
top-level files of the folder (config, tokenizer, generation config, index) are copied as they are.
The folder is built beside OUT under a temporary name and renamed into place when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.errors import PlelabError
from plelab.hf.checkpoint import INDEX, TABLE_SUFFIX, HFCheckpoint, _shard_files
from plelab.hf.finetune.adapter import RECORD, check_base_unchanged, read_adapter, read_record
from plelab.util.fs import check_output_path, fsync_dir, replace_folder, staging_dir
from plelab.util.safetensors import DTYPES, TensorInfo, read_header, read_rows

CHUNK_BYTES = 16 << 20
"""Bytes of a tensor read, changed and written at a time."""


def _to_bytes(t: torch.Tensor, dtype: str) -> bytes:
    """A tensor in the safetensors dtype `dtype`, as little-endian bytes."""
    if dtype == "BF16":
        return t.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes()
    return t.numpy().astype(DTYPES[dtype][0], copy=False).tobytes()


def _chunks(info: TensorInfo) -> Iterator[tuple[int, int]]:
    if not info.shape:
        yield 0, 1
        return
    step = max(1, CHUNK_BYTES // max(1, info.row_bytes))
    for a in range(0, info.shape[0], step):
        yield a, min(info.shape[0], a + step)


def _raw_bytes(info: TensorInfo, nbytes: int) -> Iterator[bytes]:
    with open(info.path, "rb") as f:
        f.seek(info.offset)
        left = nbytes
        while left:
            block = f.read(min(CHUNK_BYTES, left))
            if not block:
                raise PlelabError(f"{info.path}: truncated while copying")
            left -= len(block)
            yield block


def _merged_weight(info: TensorInfo, a: torch.Tensor, b: torch.Tensor, scaling: float) -> Iterator[bytes]:
    w = read_rows(info, 0, info.shape[0]).float()
    if w.shape != (b.shape[0], a.shape[1]):
        raise PlelabError(f"adapter shapes A {tuple(a.shape)}, B {tuple(b.shape)} do not fit the weight "
                          f"{tuple(w.shape)}")
    w += scaling * (b.float() @ a.float())
    yield _to_bytes(w, info.dtype)


def _table_with_delta(info: TensorInfo, rows: np.ndarray, delta: torch.Tensor) -> Iterator[bytes]:
    for a, b in _chunks(info):
        chunk = read_rows(info, a, b)
        lo, hi = np.searchsorted(rows, [a, b])
        if hi > lo:
            chunk = chunk.float()
            chunk[torch.from_numpy(rows[lo:hi] - a)] += delta[lo:hi]
        yield _to_bytes(chunk, info.dtype)


def _write_shard(src: Path, dst: Path, changes: dict[str, Any]) -> None:
    """Rewrite shard `src` into `dst`: same header and layout, tensors in `changes` produced by their generator."""
    with open(src, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header_bytes = f.read(size)
    infos = read_header(src)
    order = sorted(infos, key=lambda n: infos[n].offset)
    with open(dst, "wb") as out:
        out.write(size.to_bytes(8, "little") + header_bytes)  # offsets and sizes are unchanged
        for name in order:
            info = infos[name]
            nbytes = int(np.prod(info.shape, dtype=np.int64)) * DTYPES[info.dtype][1]
            written = 0
            for block in (changes[name]() if name in changes else _raw_bytes(info, nbytes)):
                out.write(block)
                written += len(block)
            if written != nbytes:
                raise PlelabError(f"{name}: wrote {written} bytes, expected {nbytes}")
        out.flush()
        os.fsync(out.fileno())


def merge_adapter(base: str | Path, adapter: str | Path, out: str | Path, record: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Write `out`: the Hugging Face folder `base` with the adapter folder's LoRA (and table delta) merged in;
    returns what was merged. An existing `out` is refused."""
    ckpt = HFCheckpoint.open(base)
    out = check_output_path(out, is_dir=True, inputs=(ckpt.path, adapter))
    check_base_unchanged(read_record(Path(adapter)), ckpt)
    adapted, scaling, delta = read_adapter(Path(adapter), ckpt)
    changes: dict[str, Any] = {}
    for name, (a, b) in adapted.items():
        info = ckpt.tensors[name.removeprefix(ckpt.prefix)]
        changes[name] = lambda info=info, a=a, b=b: _merged_weight(info, a, b, scaling)
    if delta is not None:
        rows, values = delta
        order = torch.argsort(rows)
        rows_np, values = rows[order].numpy(), values[order].float()
        changes[ckpt.prefix + TABLE_SUFFIX] = lambda: _table_with_delta(ckpt.table, rows_np, values)
    tmp = staging_dir(out)
    try:
        shards = _shard_files(ckpt.path)
        for shard in shards:
            _write_shard(shard, tmp / shard.name, changes)
        copied = []
        for item in sorted(ckpt.path.iterdir()):
            if item.is_file() and item.suffix != ".safetensors" and item.name != RECORD:
                shutil.copyfile(item, tmp / item.name)
                copied.append(item.name)
        summary = {"base": str(ckpt.path), "adapter": str(adapter), "merged_weights": len(adapted),
                   "scaling": scaling, "table_rows_changed": 0 if delta is None else len(delta[0]),
                   "shards": [s.name for s in shards], "copied": copied, **(record or {})}
        (tmp / RECORD).write_text(json.dumps(summary, indent=2))
        fsync_dir(tmp)
        replace_folder(tmp, out)  # out is absent or an empty folder: check_output_path refused a non-empty one
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if (ckpt.path / INDEX).is_file() and not (out / INDEX).is_file():
        raise PlelabError(f"{out}: the index was not copied")
    return summary
