"""A checkpoint's PLE table when the run kept it on disk: only the rows training touched, with their Adam moments.

A table trained on disk (plelab.training.disk_table) can be larger than memory, and most of its rows may never be
read; writing it whole at every checkpoint would write what the run never changed, three times over. The
checkpoint holds `TABLE_ROWS_FILE` instead, a safetensors file:
    table_shape  I64 (2,)      rows and width of the whole table
    rows         I64 (n,)      the rows held, ascending
    weight, exp_avg, exp_avg_sq  F32 (n, width)  their values and lazy-Adam moments
Every other row is zero, values and moments alike (a table on disk starts at zero). It is written and read in
chunks of rows, so neither side ever holds more than a chunk besides the table itself.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import torch

from plelab.util.safetensors import read_header, read_rows, read_tensor

TABLE_WEIGHT = "per_layer_inputs.embed_tokens_per_layer.weight"
"""The PLE table's parameter name."""
TABLE_ROWS_FILE = "ple_table_rows.safetensors"
"""In a checkpoint directory: the touched rows of a PLE table kept on disk (absent otherwise)."""
FIELDS = ("weight", "exp_avg", "exp_avg_sq")
CHUNK_ROWS = 1 << 14
"""Rows gathered or scattered at a time."""


def write_table_rows(path: Path, rows: np.ndarray, tables: dict[str, torch.Tensor]) -> None:
    """Write rows `rows` (ascending) of each (R, width) tensor in `tables` (keys: FIELDS) to `path`."""
    rows = np.asarray(rows, dtype=np.int64)
    R, width = next(iter(tables.values())).shape
    header, offset = {}, 0
    for name, dtype, shape in [("table_shape", "I64", [2]), ("rows", "I64", [len(rows)]),
                               *[(f, "F32", [len(rows), width]) for f in FIELDS]]:
        size = int(np.prod(shape)) * 8 if dtype == "I64" else len(rows) * width * 4
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.write(np.array([R, width], dtype="<i8").tobytes() + rows.astype("<i8").tobytes())
        for field in FIELDS:
            for a in range(0, len(rows), CHUNK_ROWS):
                f.write(tables[field][torch.from_numpy(rows[a : a + CHUNK_ROWS])].numpy().astype("<f4").tobytes())


def table_rows_shape(path: Path) -> tuple[int, int]:
    """(rows, width) of the whole table a rows file belongs to."""
    R, width = read_tensor(read_header(path)["table_shape"]).tolist()
    return int(R), int(width)


def held_rows(path: Path) -> np.ndarray:
    """The rows a rows file holds."""
    return read_tensor(read_header(path)["rows"]).numpy()


def scatter_table_rows(path: Path, tables: dict[str, torch.Tensor]) -> np.ndarray:
    """Write the rows of `path` into the (R, width) tensors of `tables` (any of FIELDS); returns the rows."""
    infos = read_header(path)
    rows = held_rows(path)
    for field, dest in tables.items():
        for a in range(0, len(rows), CHUNK_ROWS):
            b = min(a + CHUNK_ROWS, len(rows))
            dest[torch.from_numpy(rows[a:b])] = read_rows(infos[field], a, b)
    return rows


def dense_table(path: Path) -> torch.Tensor:
    """The whole table's values (zeros where the file holds no row), for a model loaded into memory."""
    table = torch.zeros(table_rows_shape(path), dtype=torch.float32)
    scatter_table_rows(path, {"weight": table})
    return table
