"""Read prepared token shards: a memmapped dataset, a deterministic rank-aware resumable batch loader, eval batches.

BatchLoader design: the split's shards form one token stream of N tokens. It holds W = (N - 1) // T windows;
window i covers tokens [i*T, i*T + T + 1) (consecutive windows share one boundary token, so every token but the
first is a target exactly once per epoch). Epoch e visits the windows in the order of a permutation seeded by
(seed, e). Global batch b of that epoch takes permutation entries [b*B*R, (b+1)*B*R); rank r takes its slice
[r*B, (r+1)*B) of those, so ranks never share a window. An epoch has W // (B*R) batches (the remainder is dropped,
so all ranks take the same number of steps). The whole state is (epoch, batch index): restoring it replays the
exact next batch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from plelab.data.sources import DataError

if TYPE_CHECKING:
    from plelab.data.tokenizer import Tokenizer

LOADER_STATE_VERSION = 1


class VocabMismatchError(DataError):
    """A dataset tokenized with a different tokenizer (or larger vocabulary) than the model expects."""


def read_manifest(path: str | Path) -> dict:
    """The manifest.json of a prepared dataset folder (DataError if absent or unreadable)."""
    folder = Path(path)
    mpath = folder / "manifest.json"
    if not folder.is_dir():
        raise DataError(f"{path}: no such dataset folder (create one with `plelab data prepare`)")
    if not mpath.is_file():
        raise DataError(f"{path}: not a prepared dataset (no manifest.json; an interrupted prepare leaves none)")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{mpath}: unreadable manifest ({exc})") from exc
    if not str(manifest.get("format", "")).startswith("plelab-tokens/"):
        raise DataError(f"{mpath}: not a plelab token dataset manifest")
    return manifest


def is_prepared_dataset(path: str | Path) -> bool:
    """Whether `path` is a folder `plelab data prepare` wrote (its manifest is readable)."""
    try:
        read_manifest(path)
    except DataError:
        return False
    return True


class TokenDataset:
    """One split (`train` or `val`) of a prepared dataset as a random-access token stream over memmapped shards."""

    def __init__(
        self,
        path: str | Path,
        split: str = "train",
        *,
        vocab_size: int | None = None,
        tokenizer_sha256: str | None = None,
        tokenizer: Tokenizer | None = None,
    ):
        self.path = Path(path)
        self.split = split
        self._tokenizer_checked: Path | None = None
        self.manifest = read_manifest(self.path)
        splits = self.manifest["splits"]
        if split not in splits:
            raise DataError(f"{path}: no split {split!r} (have: {', '.join(splits)})")
        info = splits[split]
        self.tokens_total = int(info["tokens"])
        if self.tokens_total == 0:
            raise DataError(f"{path}: split {split!r} is empty (0 tokens)")
        tok = self.manifest["tokenizer"]
        self.vocab_size_data = int(tok["vocab_size"])
        self.eot_id = int(tok["eot_id"])
        self.tokenizer_sha256 = tok["sha256"]
        self.max_token_id = int(info["max_token_id"])
        if self.max_token_id >= self.vocab_size_data:
            raise DataError(f"{path}: split {split!r} holds token id {self.max_token_id} but its tokenizer has only "
                            f"{self.vocab_size_data} ids (corrupt dataset)")
        self.check_compatible(vocab_size=vocab_size, tokenizer_sha256=tokenizer_sha256, tokenizer=tokenizer)
        self.vocab_limit = vocab_size if vocab_size is not None else self.vocab_size_data
        """Ids must lie below this (the model's vocabulary when given, else the tokenizer's): BatchLoader checks."""
        dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        self._shards: list[np.memmap] = []
        for sh in info["shards"]:
            f = self.path / sh["file"]
            want = int(sh["tokens"]) * dtype.itemsize
            if not f.is_file() or f.stat().st_size != want:
                have = f.stat().st_size if f.is_file() else "missing"
                raise DataError(f"{f}: shard is {have} bytes, manifest says {want} (dataset damaged; prepare again)")
            self._shards.append(np.memmap(f, dtype=dtype, mode="r"))
        self._starts = np.cumsum([0] + [len(s) for s in self._shards])
        if int(self._starts[-1]) != self.tokens_total:
            raise DataError(f"{path}: shards hold {int(self._starts[-1])} tokens, manifest says {self.tokens_total}")
        # Identity of this split's content (from the shard checksums): a resumed loader must see the same data.
        self.fingerprint = hashlib.sha256("".join(sh["sha256"] for sh in info["shards"]).encode()).hexdigest()

    def check_compatible(self, *, vocab_size: int | None = None, tokenizer_sha256: str | None = None,
                         tokenizer: Tokenizer | None = None) -> None:
        """Raise VocabMismatchError unless the data fits a model with this vocabulary / tokenizer hash / tokenizer
        (one that tokenizes as the data's did, though its file differs: re-saved by transformers, say)."""
        if tokenizer is not None and tokenizer.sha256 != self.tokenizer_sha256:
            from plelab.data.tokenizer import Tokenizer, tokenizer_difference

            diff = tokenizer_difference(Tokenizer.load(self.tokenizer_path), tokenizer)
            if diff:
                raise VocabMismatchError(f"tokenizer/model mismatch: {self.path} was tokenized with another tokenizer "
                                         f"than the model's ({diff}); prepare the data with the model's tokenizer")
        if tokenizer_sha256 is not None and tokenizer_sha256 != self.tokenizer_sha256:
            raise VocabMismatchError(
                f"tokenizer/model vocab mismatch: {self.path} was tokenized with tokenizer "
                f"{self.tokenizer_sha256[:12]} (vocab {self.vocab_size_data}) but the model uses tokenizer "
                f"{tokenizer_sha256[:12]}; "
                "prepare the data with the model's tokenizer")
        if vocab_size is not None and self.max_token_id >= vocab_size:
            raise VocabMismatchError(
                f"tokenizer/model vocab mismatch: {self.path} holds token ids up to {self.max_token_id} "
                f"(tokenizer vocab {self.vocab_size_data}) but the model's vocabulary is {vocab_size}")

    @property
    def tokenizer_path(self) -> Path:
        """The tokenizer.json the data was prepared with (pass it on to checkpoints), checked once against the
        hash the manifest records: a tokenizer.json replaced since would ship a tokenizer the ids do not mean."""
        path = self.path / self.manifest["tokenizer"].get("file", "tokenizer.json")
        if self._tokenizer_checked != path:
            from plelab.data.tokenizer import Tokenizer

            found = Tokenizer.load(path).sha256
            if found != self.tokenizer_sha256:
                raise VocabMismatchError(
                    f"{path} is not the tokenizer {self.path} was prepared with (sha256 {found[:12]}, the manifest "
                    f"records {self.tokenizer_sha256[:12]}): it was replaced; put it back, or prepare the data "
                    "again with the new tokenizer")
            self._tokenizer_checked = path
        return path

    def __len__(self) -> int:
        return self.tokens_total

    def array(self) -> np.ndarray:
        """The whole split as one array (the memmap itself for a single shard; a copy otherwise)."""
        if len(self._shards) == 1:
            return self._shards[0]
        return np.concatenate([np.asarray(s) for s in self._shards])

    def get(self, start: int, length: int) -> np.ndarray:
        """Tokens [start, start + length) of the split's stream (crossing shard boundaries as needed)."""
        if start < 0 or start + length > self.tokens_total:
            raise IndexError(f"tokens [{start}, {start + length}) outside 0..{self.tokens_total}")
        k = int(np.searchsorted(self._starts, start, side="right")) - 1
        off = start - int(self._starts[k])
        shard = self._shards[k]
        if off + length <= len(shard):
            return np.asarray(shard[off:off + length])
        parts, need = [], length
        while need > 0:
            take = min(need, len(self._shards[k]) - off)
            parts.append(np.asarray(self._shards[k][off:off + take]))
            need -= take
            k, off = k + 1, 0
        return np.concatenate(parts)

    def verify(self) -> None:
        """Full check: every shard's sha256 and the largest id match the manifest (reads all shards)."""
        info = self.manifest["splits"][self.split]
        seen_max = -1
        for sh, arr in zip(info["shards"], self._shards, strict=True):
            h = hashlib.sha256()
            with open(self.path / sh["file"], "rb") as f:
                for block in iter(lambda: f.read(1 << 22), b""):  # noqa: B023 - f is bound per iteration
                    h.update(block)
            if h.hexdigest() != sh["sha256"]:
                raise DataError(f"{self.path / sh['file']}: checksum mismatch (dataset damaged; prepare again)")
            seen_max = max(seen_max, int(arr.max()))
        if seen_max != self.max_token_id:
            raise DataError(f"{self.path}: largest token id is {seen_max}, manifest says {self.max_token_id}")


class BatchLoader:
    """Seeded shuffled windows of `seq_len + 1` tokens -> (x, y) int64 (B, T) batches; rank-aware and resumable."""

    def __init__(
        self,
        dataset: TokenDataset,
        batch_size: int,
        seq_len: int,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
    ):
        if batch_size < 1 or seq_len < 1:
            raise DataError(f"batch size and sequence length must be positive (got {batch_size}, {seq_len})")
        if not 0 <= rank < world_size:
            raise DataError(f"rank {rank} outside world size {world_size}")
        self.dataset = dataset
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.rank, self.world_size = rank, world_size
        self.n_windows = (len(dataset) - 1) // seq_len
        self.batches_per_epoch = self.n_windows // (batch_size * world_size)
        if self.batches_per_epoch == 0:
            raise DataError(
                f"{dataset.path} split {dataset.split!r} has {len(dataset):,} tokens: too few for one batch of "
                f"{batch_size} x {seq_len} tokens on {world_size} rank(s); lower batch size or sequence length")
        self.epoch = 0
        self.index = 0  # batch index within the epoch
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1

    def _permutation(self) -> np.ndarray:
        if self._perm_epoch != self.epoch:
            rng = np.random.default_rng([self.seed, self.epoch])
            self._perm = rng.permutation(self.n_windows)
            self._perm_epoch = self.epoch
        return self._perm

    def window_ids(self) -> np.ndarray:
        """Window indices of the next batch for this rank (without advancing)."""
        per_step = self.batch_size * self.world_size
        lo = self.index * per_step + self.rank * self.batch_size
        return self._permutation()[lo:lo + self.batch_size]

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The next (x, y) with y[:, t] = x[:, t + 1] in the stream; rolls into the next epoch when one ends."""
        if self.index >= self.batches_per_epoch:
            self.epoch += 1
            self.index = 0
        T = self.seq_len
        rows = np.stack([self.dataset.get(int(w) * T, T + 1) for w in self.window_ids()]).astype(np.int64)
        # The ids are checked here, on the host, once per batch (the model's forward does not check them).
        top = int(rows.max())
        if top >= self.dataset.vocab_limit:
            raise DataError(f"{self.dataset.path}: split {self.dataset.split!r} holds token id {top}, outside "
                            f"[0, {self.dataset.vocab_limit}) (its manifest says at most {self.dataset.max_token_id}"
                            "): the dataset is damaged; prepare it again")
        self.index += 1
        data = torch.from_numpy(rows)
        return data[:, :-1], data[:, 1:]

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict:
        """Everything needed to resume at the exact next batch (JSON-serialisable)."""
        return {
            "version": LOADER_STATE_VERSION,
            "epoch": self.epoch,
            "index": self.index,
            "seed": self.seed,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "world_size": self.world_size,
            "n_windows": self.n_windows,
            "tokenizer_sha256": self.dataset.tokenizer_sha256,
            "data_fingerprint": self.dataset.fingerprint,
        }

    def load_state_dict(self, state: dict) -> None:
        """Resume from `state_dict()` output (any rank's state works: only the position is taken).

        The position counts global batches (batch_size x world_size windows), so a run may resume on another
        number of ranks as long as the global batch is the same."""
        now = {"seed": self.seed, "global_batch_size": self.batch_size * self.world_size, "seq_len": self.seq_len,
               "n_windows": self.n_windows,
               "tokenizer_sha256": self.dataset.tokenizer_sha256, "data_fingerprint": self.dataset.fingerprint}
        saved = dict(state)
        if "batch_size" in saved:
            saved["global_batch_size"] = saved["batch_size"] * saved.get("world_size", 1)
        for key, have in now.items():
            if key in saved and saved[key] != have:
                raise DataError(f"cannot resume the data loader: saved {key}={saved[key]!r}, now {have!r} "
                                "(a resumed run must use the same data, global batch, sequence length and seed)")
        self.epoch = int(state["epoch"])
        self.index = int(state["index"])


def eval_batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, pad_id: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Sequential (x, y) batches over a whole token array, every target exactly once, no shuffling.

    Windows start every `seq_len` tokens; the last one is padded with `pad_id` in x and -100 in y (the usual
    `ignore_index`), so summing the loss over `y != -100` covers all `len(tokens) - 1` targets.
    """
    n_targets = len(tokens) - 1
    if n_targets < 1:
        return
    starts = list(range(0, n_targets, seq_len))
    for i in range(0, len(starts), batch_size):
        group = starts[i:i + batch_size]
        x = np.full((len(group), seq_len), pad_id, dtype=np.int64)
        y = np.full((len(group), seq_len), -100, dtype=np.int64)
        for row, s in enumerate(group):
            n = min(seq_len, n_targets - s)
            x[row, :n] = tokens[s:s + n]
            y[row, :n] = tokens[s + 1:s + 1 + n]
        yield torch.from_numpy(x), torch.from_numpy(y)
