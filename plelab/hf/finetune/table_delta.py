"""Training the PLE table without holding it: a float32 delta on the rows the training data touches.

The table stays in the checkpoint's shards (StreamedEmbedding reads each batch's rows). The trained part is
a (rows touched, L x dP) delta, an nn.Embedding with sparse gradients, so plelab's lazy sparse Adam updates
only the rows a step sees; its moments are the same size. Which rows: every id of the training split (ids
past the table read row 0, as Gemma 3n masks them), found once before training, so the delta never grows
and its slots are the same on resume. Memory: 12 bytes x touched rows x L x dP (value + two moments), e.g.
20,000 rows of Gemma 3n E2B (L x dP = 7,680) = 1.8 GB, against 24 GB for Adam over the whole fp32 table.

The delta file (`table_delta.safetensors`, beside the adapter): `rows` (int64, sorted) and `delta`
(float32, one row per entry) in the table's stored units: the model computes (table + delta) x sqrt(dP).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from plelab.errors import PlelabError
from plelab.hf.model import StreamedEmbedding

DELTA_FILE = "table_delta.safetensors"
DELTA_FORMAT = "plelab-table-delta/1"
SCAN_CHUNK = 1 << 24
"""Tokens read at a time while finding the touched rows."""


def touched_rows(tokens, ple_rows: int) -> np.ndarray:
    """Sorted table rows that a token stream (TokenDataset or array) looks up; ids >= ple_rows read row 0."""
    seen = np.zeros(ple_rows, dtype=bool)
    total = len(tokens)
    for a in range(0, total, SCAN_CHUNK):
        n = min(SCAN_CHUNK, total - a)
        ids = np.asarray(tokens.get(a, n) if hasattr(tokens, "get") else tokens[a : a + n]).astype(np.int64)
        seen[np.where(ids < ple_rows, ids, 0)] = True
    return np.flatnonzero(seen)


class LoadedTable(nn.Module):
    """The whole table in memory (frozen), with StreamedEmbedding's interface: forward(ids) = table[ids] x scale."""

    def __init__(self, streamed: StreamedEmbedding, device: torch.device | str = "cpu"):
        super().__init__()
        from plelab.hf.model import _copy_in

        self.scale, self.dtype = streamed.scale, streamed.dtype
        self.num_embeddings, self.embedding_dim = streamed.num_embeddings, streamed.embedding_dim
        weight = torch.empty(streamed.info.shape, dtype=streamed.dtype, device=device)
        with torch.no_grad():
            _copy_in(weight, streamed.info)
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight) * torch.tensor(self.scale, dtype=self.dtype)

    def read_rows(self, ids: np.ndarray) -> torch.Tensor:
        """Unscaled float32 rows `ids`."""
        return self.weight.detach()[torch.as_tensor(np.asarray(ids), dtype=torch.long)].float().cpu()


class TableWithDelta(nn.Module):
    """A frozen table (streamed or loaded) plus a trainable delta on fixed `rows`:
    forward(ids) = (table[ids] + delta) x scale."""

    def __init__(self, streamed: StreamedEmbedding | LoadedTable, rows: np.ndarray,
                 device: torch.device | str = "cpu"):
        super().__init__()
        if len(rows) == 0:
            raise PlelabError("the training data touches no row of the PLE table")
        # Not a registered submodule: a table loaded in memory must not enter state_dict() (the checkpoints).
        object.__setattr__(self, "streamed", streamed)
        self.num_embeddings, self.embedding_dim = streamed.num_embeddings, streamed.embedding_dim
        self.register_buffer("rows", torch.as_tensor(np.asarray(rows), dtype=torch.long, device=device))
        self.delta = nn.Embedding(len(rows), self.embedding_dim, sparse=True, device=device, dtype=torch.float32)
        nn.init.zeros_(self.delta.weight)

    def slots(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot of each id in the delta, whether the id has one); ids without a slot read slot 0, masked."""
        # Batches are slices (x[:, :-1]), not contiguous; searchsorted warns on every run if given one.
        slot = torch.searchsorted(self.rows, ids.contiguous()).clamp_(max=len(self.rows) - 1)
        return slot, self.rows[slot] == ids

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        base = self.streamed(ids)
        slot, hit = self.slots(ids)
        delta = self.delta(slot) * hit.unsqueeze(-1)
        return (base.float() + delta * self.streamed.scale).to(base.dtype)

    def read_rows(self, ids: np.ndarray) -> torch.Tensor:
        """Unscaled float32 rows `ids` with the delta applied (table health reads stored values)."""
        ids_t = torch.as_tensor(np.asarray(ids), dtype=torch.long, device=self.rows.device)
        slot, hit = self.slots(ids_t)
        with torch.no_grad():
            delta = (self.delta(slot) * hit.unsqueeze(-1)).cpu()
        return self.streamed.read_rows(ids) + delta

    def changed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(rows, delta) of the rows whose delta is not zero, on the CPU."""
        with torch.no_grad():
            w = self.delta.weight.detach().float().cpu()
            keep = w.abs().amax(dim=1) > 0
            return self.rows.cpu()[keep], w[keep]


def save_delta(path: Path, rows: torch.Tensor, delta: torch.Tensor, table_name: str,
               table_shape: tuple[int, int]) -> None:
    """Write a delta file (rows, delta, and the table it belongs to in the metadata)."""
    meta = {"format": DELTA_FORMAT, "table": table_name, "table_shape": json.dumps(list(table_shape)),
            "units": "stored table values; the model multiplies (table + delta) by sqrt(dP)"}
    save_file({"rows": rows.to(torch.int64).contiguous(), "delta": delta.float().contiguous()}, str(path),
              metadata=meta)


def load_delta(path: Path, table_shape: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """(rows, delta, metadata) of a delta file, checked against `table_shape` when given."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            rows, delta = f.get_tensor("rows"), f.get_tensor("delta")
    except Exception as exc:  # safetensors raises its own error types for corrupt files
        raise PlelabError(f"{path}: not a readable table delta ({str(exc).splitlines()[0][:120]})") from None
    if meta.get("format") != DELTA_FORMAT or rows.ndim != 1 or delta.ndim != 2 or len(rows) != len(delta):
        raise PlelabError(f"{path}: not a {DELTA_FORMAT} file")
    if table_shape is not None:
        n, width = table_shape
        if delta.shape[1] != width or (len(rows) and (int(rows.min()) < 0 or int(rows.max()) >= n)):
            raise PlelabError(f"{path}: delta of width {delta.shape[1]} on rows up to {int(rows.max())} does not fit "
                              f"the checkpoint's table {tuple(table_shape)}")
    if len(torch.unique(rows)) != len(rows):
        raise PlelabError(f"{path}: a row appears more than once (a delta holds each row once); the file is damaged")
    check_trained_values(path, "delta", delta.float())
    return rows, delta, meta


TRAINED_LIMIT = 1e4
"""Largest magnitude a trained value may have: Adam moves a value by about lr per step, so a fine-tune's adapters
and table delta stay many orders below this; a file beyond it (1e30, say) is damaged or not a plelab fine-tune."""


def check_trained_values(path: Path, name: str, values: torch.Tensor) -> None:
    """Refuse (one line) a trained tensor holding NaN, infinity or a value past TRAINED_LIMIT."""
    if values.numel() and not bool(torch.isfinite(values).all()):
        raise PlelabError(f"{path}: {name} holds NaN or infinite values; the file is damaged (merging it would "
                          "break the model)")
    if values.numel() and float(values.abs().max()) > TRAINED_LIMIT:
        raise PlelabError(f"{path}: {name} holds a value of magnitude {float(values.abs().max()):.3g}, past what "
                          f"training produces ({TRAINED_LIMIT:g}); the file is damaged")


def ple_table_parameter(model: nn.Module) -> nn.Parameter:
    """The PLE table weight of a transformers Gemma 3n / Gemma 4 model (text or multimodal)."""
    found = [m.weight for name, m in model.named_modules() if name.endswith("embed_tokens_per_layer")]
    if len(found) != 1:
        raise PlelabError(f"the model has {len(found)} modules named *embed_tokens_per_layer (expected one)")
    return found[0]


@torch.no_grad()
def apply_table_delta(model: nn.Module, delta_file: str | Path) -> int:
    """Add a delta file to a loaded transformers model's PLE table in place (what `--merge` does on disk);
    returns the number of rows changed. Use it after PeftModel.from_pretrained when the table was trained."""
    weight = ple_table_parameter(model)
    rows, delta, _ = load_delta(Path(delta_file), tuple(weight.shape))
    idx = rows.to(weight.device)
    weight[idx] = (weight[idx].float() + delta.to(weight.device)).to(weight.dtype)
    return len(rows)
