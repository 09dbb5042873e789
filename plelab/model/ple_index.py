"""Which PLE table rows a position reads: its token id's row, or one row per n-gram hash head.

`TableIndex.rows(ids)` returns (B, T, S) row numbers of the whole table (S = 1 for the token index); the table
lookup, the sharded table under torchrun and the lazy Adam all see only row numbers, so they serve both indexes
unchanged. The n-gram hash is the one of plelab/model/ngram.py, here in torch on int64 tensors that hold uint32
values (pinned to the same test vectors as the Python and NumPy forms).
"""

from __future__ import annotations

import torch
from torch import nn

from plelab.model.config import ModelConfig
from plelab.model.ngram import FMIX_1, FMIX_2, MASK32, PAD_ID, NgramLayout, read_id_map

Tensor = torch.Tensor


def mul32(a: Tensor, b: Tensor | int) -> Tensor:
    """(a * b) mod 2**32 for int64 tensors of uint32 values, in halves so no int64 product overflows."""
    lo, hi = b & 0xFFFF, b >> 16
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & MASK32


def fmix32(h: Tensor) -> Tensor:
    """MurmurHash3's 32-bit finaliser, elementwise (plelab.model.ngram.fmix32)."""
    h = h ^ (h >> 16)
    h = mul32(h, FMIX_1)
    h = h ^ (h >> 13)
    h = mul32(h, FMIX_2)
    return h ^ (h >> 16)


class NgramHash:
    """The n-gram hash of one layout on torch tensors: ids (B, T) -> table rows (B, T, S)."""

    def __init__(self, layout: NgramLayout):
        self.layout = layout
        self._constants: dict[torch.device, tuple[Tensor, Tensor, Tensor]] = {}

    def constants(self, device: torch.device) -> tuple[Tensor, Tensor, Tensor]:
        """(multipliers (S, N), rows (S,), offsets (S,)) on `device`, made once per device."""
        if device not in self._constants:
            lay = self.layout
            self._constants[device] = tuple(torch.tensor(v, dtype=torch.long, device=device)
                                            for v in (lay.multipliers(), lay.head_rows, lay.offsets))
        return self._constants[device]

    def __call__(self, ids: Tensor, skip: int = 0) -> Tensor:
        """Rows of positions skip..T-1 of ids (B, T) (the first `skip` positions are only history)."""
        m, rows, offsets = self.constants(ids.device)
        n = self.layout.max_order
        pad = torch.full((*ids.shape[:-1], n - 1), PAD_ID, dtype=torch.long, device=ids.device)
        padded = torch.cat([pad, ids.long()], dim=-1)
        T = ids.shape[-1]
        h = torch.zeros((*ids.shape[:-1], T - skip, m.shape[0]), dtype=torch.long, device=ids.device)
        for i in range(n):  # x[t - i] times each head's i-th multiplier (0 past the head's order)
            x = padded[..., n - 1 - i + skip : n - 1 - i + T]
            h = h ^ mul32(x.unsqueeze(-1), m[:, i])
        return fmix32(h) % rows + offsets


class TableIndex(nn.Module):
    """Maps token ids to PLE table rows; holds the n-gram hash and the id compression map where there are any."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.kind = cfg.ple.index
        self.table_rows = cfg.ple_table_rows
        self.heads = cfg.ple_heads
        layout = cfg.ple_layout
        self.hash = NgramHash(layout) if layout is not None else None
        self.history = layout.max_order - 1 if layout is not None else 0
        """Ids before a position that its rows depend on (a KV-cached decode keeps them)."""
        ngram = cfg.ple.ngram
        self.id_map_file, self.id_map_sha256 = (ngram.id_map, ngram.id_map_sha256) if ngram else (None, None)
        if self.id_map_file is not None:
            # Among the weights, so a checkpoint carries the map and needs the file no more.
            self.register_buffer("id_map", torch.zeros(cfg.vocab_size, dtype=torch.long))

    def reset_parameters(self) -> None:
        """Read the id compression map from its file (checked against the sha256 the config recorded)."""
        if self.id_map_file is not None:
            found = read_id_map(self.id_map_file, self.id_map.shape[0], self.id_map_sha256)
            with torch.no_grad():
                self.id_map.copy_(torch.tensor(found.ids, dtype=torch.long))

    def rows(self, ids: Tensor, skip: int = 0) -> Tensor:
        """(B, T - skip, S) table rows of positions skip.. of ids (B, T); ids past a token table read row 0."""
        if self.hash is None:
            ids = ids[..., skip:]
            in_table = (ids >= 0) & (ids < self.table_rows)
            return torch.where(in_table, ids, torch.zeros_like(ids)).unsqueeze(-1)
        if self.id_map_file is not None:
            ids = self.id_map[ids]
        return self.hash(ids, skip)
