"""A tiny synthetic vision corpus (VisionCorpus-shaped arrays served from memory) and configs
for the vision model and trainer tests.

The planted corpus: pixels are uniform noise (they carry no information); patch ids follow a fixed chain
(id of patch p+1 = NEXT[id of patch p], so only the ids predict the next id); the caption is a function of
patch 0's id. A model can lower the caption loss only by reading the ids, i.e. through the visual table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from plelab.training.config import TrainConfig, load_train_config

K, P, PATCH, T, VOCAB = 16, 4, 2, 3, 32
NEXT = np.random.default_rng(7).permutation(K)


@dataclass
class FakeSplit:
    """One split, shaped like plelab.vision.corpus.VisionCorpus."""

    pixels: np.ndarray
    patch_ids: np.ndarray
    captions: np.ndarray
    caption_lengths: np.ndarray
    manifest: dict[str, Any] = field(default_factory=dict)


def planted_split(n: int, seed: int) -> FakeSplit:
    """`n` images of the planted corpus (see the module docstring); captions are [f(id0), g(id0), pad]."""
    rng = np.random.default_rng(seed)
    ids = np.empty((n, P), dtype=np.int64)
    ids[:, 0] = rng.integers(0, K, n)
    for p in range(1, P):
        ids[:, p] = NEXT[ids[:, p - 1]]
    captions = np.zeros((n, T), dtype=np.int64)
    captions[:, 0] = 1 + ids[:, 0] % 8
    captions[:, 1] = 9 + ids[:, 0] // 2
    lengths = np.full(n, 2, dtype=np.int64)
    pixels = rng.random((n, P, PATCH * PATCH), dtype=np.float32)
    manifest = {"patch_size": PATCH, "codebook": K, "caption_vocab_size": VOCAB, "caption_tokenizer": None,
                "bos_id": None}
    return FakeSplit(pixels, ids, captions, lengths, manifest)


def serve_planted_corpus(monkeypatch: Any, folder: Path) -> Path:
    """Make `plelab.vision.data.open_corpus(folder, split)` return the planted splits (train: 256 images, valid: 64)."""
    splits = {"train": planted_split(256, 0), "valid": planted_split(64, 1)}

    def fake_open(path: str | Path, split: str) -> FakeSplit:
        assert Path(path) == folder
        return splits[split]

    monkeypatch.setattr("plelab.vision.data.open_corpus", fake_open)
    return folder


def vision_config(corpus: Path, **fields: Any) -> TrainConfig:
    """A tiny fp32 CPU vision config on `corpus`; `fields` override top-level keys, `vision` / `model` merge."""
    data: dict[str, Any] = dict(
        batch_size=32, max_steps=20, warmup_steps=5, lr=1e-2, log_every=10, ckpt_every=1000,
        device="cpu", dtype="fp32",
        model={"vocab_size": VOCAB, "hidden_size": 32, "num_layers": 2, "num_heads": 2, "max_seq_len": 8,
               "ffn": {"intermediate_size": 64}},
        vision={"corpus": str(corpus)},
    )
    for key in ("vision", "model"):
        data[key].update(fields.pop(key, {}))
    data.update(fields)
    return load_train_config(data)
