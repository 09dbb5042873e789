"""TokenDataset + BatchLoader: shifted targets, determinism, disjoint ranks, exact resume, validation errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from data_helpers import DOCS, write_docs

from plelab.data.loader import BatchLoader, TokenDataset, VocabMismatchError, eval_batches
from plelab.data.prepare import prepare_dataset
from plelab.data.sources import DataError
from plelab.data.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    src = write_docs(root / "a.txt", [f"{i}: {DOCS[i % len(DOCS)]}" for i in range(300)])
    prepare_dataset([src], Tokenizer.byte_level(), root / "out", val_fraction=0.05, shard_tokens=997, progress=False)
    return root / "out"


def stream(ds: TokenDataset) -> np.ndarray:
    return np.concatenate([np.fromfile(ds.path / s["file"], dtype=np.uint16)
                           for s in ds.manifest["splits"][ds.split]["shards"]])


def test_dataset_random_access_across_shards(dataset_dir):
    ds = TokenDataset(dataset_dir, "train")
    full = stream(ds)
    assert len(ds) == len(full) and len(ds.manifest["splits"]["train"]["shards"]) > 10
    for start, length in [(0, 10), (990, 20), (1990, 3000), (len(full) - 5, 5)]:
        assert np.array_equal(ds.get(start, length), full[start:start + length])
    with pytest.raises(IndexError):
        ds.get(len(full) - 2, 5)
    ds.verify()
    assert ds.tokenizer_path.name == "tokenizer.json"
    assert np.array_equal(ds.array(), full) and np.array_equal(TokenDataset(dataset_dir, "val").array(),
                                                                stream(TokenDataset(dataset_dir, "val")))


def test_batches_shapes_shift_and_determinism(dataset_dir):
    ds = TokenDataset(dataset_dir, "train")
    full = stream(ds).astype(np.int64)
    a = BatchLoader(ds, batch_size=4, seq_len=32, seed=7)
    b = BatchLoader(ds, batch_size=4, seq_len=32, seed=7)
    c = BatchLoader(ds, batch_size=4, seq_len=32, seed=8)
    x, y = next(a)
    assert x.shape == y.shape == (4, 32) and x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row, w in zip(range(4), BatchLoader(ds, 4, 32, seed=7).window_ids(), strict=True):
        assert torch.equal(x[row], torch.from_numpy(full[w * 32:w * 32 + 32]))
        assert torch.equal(y[row], torch.from_numpy(full[w * 32 + 1:w * 32 + 33]))
    x2, _ = next(b)
    x3, _ = next(c)
    assert torch.equal(x, x2) and not torch.equal(x, x3)


def test_epoch_covers_windows_once_and_ranks_are_disjoint(dataset_dir):
    ds = TokenDataset(dataset_dir, "train")
    loaders = [BatchLoader(ds, batch_size=3, seq_len=64, seed=1, rank=r, world_size=2) for r in range(2)]
    per_rank = [[], []]
    for _ in range(loaders[0].batches_per_epoch):
        for r, ld in enumerate(loaders):
            per_rank[r].extend(ld.window_ids().tolist())
            next(ld)
    assert not set(per_rank[0]) & set(per_rank[1])
    seen = per_rank[0] + per_rank[1]
    assert len(seen) == len(set(seen)) == loaders[0].batches_per_epoch * 6
    assert set(seen) <= set(range(loaders[0].n_windows))
    next(loaders[0])
    assert loaders[0].epoch == 1 and loaders[0].index == 1


def test_resume_gives_the_exact_next_batches(dataset_dir):
    ds = TokenDataset(dataset_dir, "train")
    ref = BatchLoader(ds, batch_size=5, seq_len=48, seed=3, rank=1, world_size=2)
    n_epoch = ref.batches_per_epoch
    stop = n_epoch - 2  # resume shortly before an epoch boundary, then run past it
    expected = [next(ref) for _ in range(stop + 6)][stop:]
    first = BatchLoader(ds, batch_size=5, seq_len=48, seed=3, rank=1, world_size=2)
    for _ in range(stop):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # goes through a checkpoint as JSON
    resumed = BatchLoader(TokenDataset(dataset_dir, "train"), batch_size=5, seq_len=48, seed=3, rank=1, world_size=2)
    resumed.load_state_dict(state)
    for want in expected:
        got = next(resumed)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert resumed.epoch == 1
    other = BatchLoader(ds, batch_size=6, seq_len=48, seed=3, rank=1, world_size=2)
    with pytest.raises(DataError, match="batch_size"):
        other.load_state_dict(state)
    with pytest.raises(DataError, match="data_fingerprint"):
        resumed.load_state_dict({**state, "data_fingerprint": "elsewhere"})


def test_too_small_for_a_batch(dataset_dir):
    val = TokenDataset(dataset_dir, "val")
    with pytest.raises(DataError, match="too few for one batch"):
        BatchLoader(val, batch_size=64, seq_len=1024)


def test_vocab_mismatch_and_damage_are_clear_errors(dataset_dir, tmp_path):
    with pytest.raises(VocabMismatchError, match="tokenizer/model vocab mismatch"):
        TokenDataset(dataset_dir, "train", tokenizer_sha256="0" * 64)
    with pytest.raises(VocabMismatchError, match="tokenizer/model vocab mismatch.*vocabulary is 100"):
        TokenDataset(dataset_dir, "train", vocab_size=100)
    ds = TokenDataset(dataset_dir, "train", vocab_size=258, tokenizer_sha256=Tokenizer.byte_level().sha256)
    assert ds.max_token_id < 258
    with pytest.raises(DataError, match="no split 'test'"):
        TokenDataset(dataset_dir, "test")
    with pytest.raises(DataError, match="not a prepared dataset"):
        TokenDataset(tmp_path, "train")
    # A truncated shard and an out-of-range id in the manifest are refused.
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(dataset_dir, copy)
    shard = copy / "train_000.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(DataError, match="dataset damaged"):
        TokenDataset(copy, "train")
    m = json.loads((copy / "manifest.json").read_text())
    m["splits"]["val"]["max_token_id"] = 5000
    (copy / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(DataError, match="corrupt dataset"):
        TokenDataset(copy, "val")


def test_a_token_id_beyond_the_vocabulary_is_caught_where_the_batch_is_made(dataset_dir, tmp_path):
    """The model's forward does not check ids (no host sync per step): the loader does, on the host."""
    import shutil

    damaged = tmp_path / "damaged"
    shutil.copytree(dataset_dir, damaged)
    ds = TokenDataset(damaged, "train", vocab_size=258)
    shard = damaged / ds.manifest["splits"]["train"]["shards"][0]["file"]
    tokens = np.fromfile(shard, dtype=np.uint16)
    tokens[:] = 300  # same size, so only the content says it is damaged (the manifest still says max 255)
    tokens.tofile(shard)
    loader = BatchLoader(TokenDataset(damaged, "train", vocab_size=258), batch_size=64, seq_len=32, seed=0)
    with pytest.raises(DataError, match=r"token id 300, outside \[0, 258\).*damaged"):
        for _ in range(loader.batches_per_epoch):
            loader.next_batch()


def test_eval_batches_cover_every_target_once():
    tokens = np.arange(1, 104, dtype=np.uint16)  # 103 tokens -> 102 targets
    xs, ys = zip(*eval_batches(tokens, seq_len=10, batch_size=4), strict=True)
    y = torch.cat(ys)
    x = torch.cat(xs)
    assert x.shape == (11, 10)
    targets = y[y != -100]
    assert targets.tolist() == list(range(2, 104))
    assert torch.equal(x[y != -100] + 1, targets)
