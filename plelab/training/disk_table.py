"""A PLE table trained on disk (`ple_table = "disk"`): its rows and both lazy-Adam moments in memory-mapped files.

The table, token- or n-gram-indexed, is the same nn.Embedding with sparse gradients as in memory, but its weight
and the optimizer's two moments are views of three files under RUN_DIR/.ple_table/, made sparse (a hole reads as
zeros), so only rows a step reads or writes ever occupy memory or disk. Each forward first drops the pages the
previous steps left mapped (MADV_DONTNEED: their data stays in the files), so the resident set holds one step's
rows, not every row trained so far: a table larger than RAM trains. What it takes: one process on the CPU, the
lazy Adam (sparse_ple = true), and a table that starts at zero (ple.table_init_std = 0: rows of a sparse file
are zeros until written). The generator still advances as a drawn table's would, so every other weight is the
one a table in memory gives, and training is bit for bit that of a table in memory started at zero.

The files are working storage: a run (new or resumed) makes them afresh, and a checkpoint holds the rows
training touched, with their moments (plelab/runs/table_rows.py), which resume writes back.
"""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import torch
from torch import nn

from plelab.errors import PlelabError
from plelab.model.row_init import skip_normal_
from plelab.runs.table_rows import FIELDS, TABLE_ROWS_FILE, scatter_table_rows, table_rows_shape, write_table_rows

TABLE_DIR = ".ple_table"
"""Under the run directory: the table's working files (weight.f32, exp_avg.f32, exp_avg_sq.f32); hidden, as they are
no record of the run (a checkpoint is)."""


class DiskTableError(PlelabError):
    """A table on disk that cannot be made or restored."""


def _mapped(path: Path, rows: int, width: int) -> tuple[mmap.mmap, torch.Tensor]:
    """A new sparse file of rows x width zeros, mapped shared, and the float32 tensor viewing it."""
    try:
        if path.exists():
            path.unlink()  # a mapping of the old file (an earlier table in this process) keeps its own inode
        with open(path, "w+b") as f:
            f.truncate(rows * width * 4)
            mapping = mmap.mmap(f.fileno(), rows * width * 4, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        # Rows are read wherever the batch sends them: read-ahead would map (and count) their neighbours too.
        mapping.madvise(mmap.MADV_RANDOM)
    except OSError as exc:
        raise DiskTableError(f"cannot make the PLE table file {path} ({exc.strerror or exc})") from None
    return mapping, torch.frombuffer(mapping, dtype=torch.float32).view(rows, width)


class DiskTable(nn.Embedding):
    """An (rows, width) embedding with sparse gradients whose weight and Adam moments live in files in `folder`."""

    def __init__(self, folder: Path, rows: int, width: int):
        folder.mkdir(parents=True, exist_ok=True)
        maps, views = {}, {}
        for field in FIELDS:
            maps[field], views[field] = _mapped(folder / f"{field}.f32", rows, width)
        super().__init__(rows, width, sparse=True, _weight=views["weight"])
        self.folder, self.maps = folder, maps
        self.moments = {f: views[f] for f in FIELDS[1:]}
        self.touched = torch.zeros(rows, dtype=torch.bool)
        """Rows a training forward read (so gradient, and an Adam update, reached them): what a checkpoint holds."""
        self._register_state_dict_hook(_without_weight)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, on disk in {self.folder}"

    def _apply(self, fn, recurse: bool = True):  # noqa: ANN001, ANN202, ARG002 - nn.Module's signature
        # to(), to_empty(), float(): the table stays the files' view on the CPU (materialize must not replace it).
        return self

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        """The weight is not in a state dict (the checkpoint's rows file restores it: `restore`)."""

    def reset_rows(self, std: float, generator: torch.Generator) -> None:
        """Rows at zero, as a new sparse file holds them; `generator` left where drawing the table would."""
        if std != 0:
            raise DiskTableError(f"a PLE table on disk starts at zero, but ple.table_init_std = {std} (set it to 0)")
        if self.touched.any():
            raise DiskTableError("a PLE table on disk is reset only when it is made")
        skip_normal_(generator, self.weight.numel())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.release()
        if self.training and torch.is_grad_enabled():
            self.touched[ids.reshape(-1).cpu()] = True
        return super().forward(ids)

    def release(self) -> None:
        """Drop every mapped page from this process (written ones stay in the page cache, then the files)."""
        for mapping in self.maps.values():
            mapping.madvise(mmap.MADV_DONTNEED)

    def adam_state(self) -> dict[str, torch.Tensor]:
        """The lazy Adam's moments of this table: views of their files (never a copy in memory)."""
        return dict(self.moments)

    def save_rows(self, folder: Path) -> list[str]:
        """Write the touched rows, with their moments, into checkpoint `folder`; returns the file's name."""
        rows = np.flatnonzero(self.touched.numpy())
        write_table_rows(folder / TABLE_ROWS_FILE, rows, {"weight": self.weight.detach(), **self.moments})
        self.release()
        return [TABLE_ROWS_FILE]

    def restore(self, ckpt: Path) -> None:
        """Rows, moments and the touched set as checkpoint `ckpt` holds them (the files start at zero)."""
        path = Path(ckpt) / TABLE_ROWS_FILE
        if not path.is_file():
            raise DiskTableError(f"{ckpt} has no {TABLE_ROWS_FILE}: a run with its PLE table in memory wrote it, "
                                 "and the table's storage is part of the run (ple_table cannot change on resume)")
        if table_rows_shape(path) != tuple(self.weight.shape):
            raise DiskTableError(f"{path} holds a table of shape {table_rows_shape(path)}, the model's is "
                                 f"{tuple(self.weight.shape)}")
        with torch.no_grad():
            rows = scatter_table_rows(path, {"weight": self.weight, **self.moments})
        self.touched[torch.from_numpy(rows)] = True
        self.release()


def _without_weight(module: nn.Module, state_dict: dict, prefix: str, local_metadata: dict) -> None:  # noqa: ARG001
    state_dict.pop(prefix + "weight", None)


def disk_table(model: nn.Module) -> DiskTable | None:
    """The model's PLE table when it is kept on disk, else None."""
    inputs = getattr(model, "per_layer_inputs", None)
    table = getattr(inputs, "embed_tokens_per_layer", None)
    return table if isinstance(table, DiskTable) else None


def place_on_disk(skeleton: nn.Module, folder: Path, device: torch.device) -> DiskTable:
    """Swap a meta-device model's PLE table for a DiskTable in `folder` (before `materialize` initialises it)."""
    if device.type != "cpu":
        raise DiskTableError(f"ple_table = \"disk\" trains on the CPU (the table stays in host files), but the run's "
                             f"device is {device}; set device = \"cpu\"")
    inputs = getattr(skeleton, "per_layer_inputs", None)
    if inputs is None:
        raise DiskTableError("ple_table = \"disk\" needs a PLE table (model.ple.dim > 0)")
    old = inputs.embed_tokens_per_layer
    if not old.sparse:
        raise DiskTableError("ple_table = \"disk\" needs the lazy Adam: set sparse_ple = true")
    inputs.embed_tokens_per_layer = table = DiskTable(folder, old.num_embeddings, old.embedding_dim)
    return table
