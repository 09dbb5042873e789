"""Checkpoints: round trip, corruption detected on load, weights-only MGLU masks packed at 1 bit."""

from __future__ import annotations

import pytest
import torch

from plelab.inference.load import load_model
from plelab.model import LanguageModel, load_model_config
from plelab.runs.checkpoint import CheckpointError, save_checkpoint


def test_round_trip_and_corruption(tmp_path):
    model = LanguageModel(load_model_config("tiny"))
    ckpt = save_checkpoint(tmp_path / "c", model, state={"step": 3})
    loaded, meta = load_model(ckpt)
    ids = torch.randint(0, 256, (1, 12))
    assert torch.equal(loaded(ids)[0], model(ids)[0])
    assert meta["model"]["ple"]["dim"] == 16
    raw = bytearray((ckpt / "model.safetensors").read_bytes())
    raw[-5] ^= 0xFF
    (ckpt / "model.safetensors").write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="checksum"):
        load_model(ckpt)
    (ckpt / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        load_model(ckpt)


def test_weights_only_mglu_checkpoint_stores_masks_at_one_bit(tmp_path):
    model = LanguageModel(load_model_config("tiny", ["ffn.kind=mglu", "ffn.mask_count=2"]))
    ckpt = save_checkpoint(tmp_path / "w", model)  # no training state: an inference checkpoint
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        bits = f.get_tensor("layers.0.mlp.mask_bits")
    assert not any(k.endswith("mask_logits") for k in keys)
    assert bits.dtype == torch.uint8 and bits.numel() == 2 * 64 * 32 // 8
    loaded, _ = load_model(ckpt)
    ids = torch.randint(0, 256, (1, 12))
    assert torch.allclose(loaded(ids)[0], model(ids)[0], atol=1e-6)


def test_a_checkpoint_being_read_is_not_pruned_until_the_reader_is_done(tmp_path):
    from plelab.runs.checkpoint import prune_checkpoints, reading_checkpoint

    model = LanguageModel(load_model_config("tiny"))
    ckpts = tmp_path / "run" / "checkpoints"
    first = save_checkpoint(ckpts / "step_00000001", model)
    with reading_checkpoint(tmp_path / "run") as held:
        assert held == first
        save_checkpoint(ckpts / "step_00000002", model)
        prune_checkpoints(ckpts, keep=1)  # what the trainer does after each checkpoint
        assert first.is_dir() and load_model(held)[0] is not None  # still whole while it is read
    prune_checkpoints(ckpts, keep=1)
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000002"]
    with reading_checkpoint(tmp_path / "run") as held:  # the newest, now
        assert held.name == "step_00000002"
