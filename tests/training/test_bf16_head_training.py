"""dtype = bf16-head in a real training run: recorded, switched on, close to fp32, sparse PLE updates exact."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest
import torch
from training_helpers import make_dataset, write_config

from plelab.experiments.sweep import config_hash
from plelab.model.transformer import LanguageModel
from plelab.training.config import load_train_config, train_config_dict
from plelab.training.optim import model_config_for
from plelab.training.trainer import Trainer
from plelab.util.dataclass_config import ConfigError


def metric_lines(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def train(root: Path, name: str, dtype: str, steps: int = 6) -> tuple[Trainer, list[dict]]:
    torch.set_num_threads(1)
    cfg = load_train_config(write_config(root, max_steps=steps, log_every=1, ckpt_every=steps, dtype=dtype))
    trainer = Trainer(cfg, root / name, quiet=True)
    trainer.run()
    return trainer, [m for m in metric_lines(root / name) if m.get("loss") is not None and "eval" not in m]


def test_a_bf16_head_run_records_its_path_and_stays_close_to_fp32(tmp_path):
    make_dataset(tmp_path)
    ref, ref_lines = train(tmp_path, "fp32", "fp32")
    fast, fast_lines = train(tmp_path, "fast", "bf16-head")
    recorded = json.loads((tmp_path / "fast" / "config.json").read_text())
    assert recorded["dtype"] == "bf16-head"
    assert {m["dtype"] for m in fast_lines} == {"bf16-head"} and {m["dtype"] for m in ref_lines} == {"fp32"}
    # Same seed, data and weights: step 1 differs only by the head's bf16 rounding, so the switch was on...
    assert fast_lines[0]["loss"] != ref_lines[0]["loss"]
    assert abs(fast_lines[0]["loss"] - ref_lines[0]["loss"]) < 2e-3 * ref_lines[0]["loss"]
    # ...and a few steps on, the runs are still near each other.
    for a, b in zip(fast_lines, ref_lines, strict=True):
        assert abs(a["loss"] - b["loss"]) < 2e-2 * b["loss"], (a, b)
    # Evaluation is fp32 on both paths: the final models are evaluated the same way.
    assert fast.last_eval["macro"]["loss"] == pytest.approx(ref.last_eval["macro"]["loss"], rel=2e-2)


def test_the_ple_table_keeps_exact_sparse_updates(tmp_path):
    make_dataset(tmp_path)
    trainer, _ = train(tmp_path, "fast", "bf16-head", steps=3)
    cfg = trainer.config
    torch.manual_seed(cfg.seed)
    init = LanguageModel(model_config_for(cfg)).per_layer_inputs.embed_tokens_per_layer.weight.detach()
    table = trainer.model.per_layer_inputs.embed_tokens_per_layer
    assert table.sparse and table.weight.dtype == torch.float32
    assert trainer.optimizer.sparse is not None and table.weight in trainer.optimizer.sparse.param_groups[0]["params"]
    assert all(g["fused"] for g in trainer.optimizer.dense.param_groups)  # AdamW's fused CPU kernel on this path
    moved = (table.weight.detach() != init).any(dim=1)
    # The byte corpus is ASCII: rows >= 128 are never seen, so a lazy sparse update leaves them bit-identical.
    assert moved[:128].any() and not moved[128:].any()


def test_bf16_head_is_a_config_value_of_its_own_hash(tmp_path):
    # (Old runs' hashes are pinned by tests/experiments/deadzone_h32_hashes.json: no field was added.)
    make_dataset(tmp_path)
    cfg = load_train_config(write_config(tmp_path))
    fast = dataclasses.replace(cfg, dtype="bf16-head")
    assert config_hash(train_config_dict(fast)) != config_hash(train_config_dict(cfg))
    assert config_hash(train_config_dict(dataclasses.replace(fast, dtype=cfg.dtype))) == \
        config_hash(train_config_dict(cfg))
    with pytest.raises(ConfigError, match="'bf16-head', 'fp32'"):
        load_train_config(write_config(tmp_path, dtype="fp16"))


def test_soft_capped_logits_are_refused_under_bf16_head(tmp_path):
    make_dataset(tmp_path)
    path = write_config(tmp_path, dtype="bf16-head")
    with pytest.raises(ConfigError, match=r"soft-capped logits \(model.gemma4.final_logit_softcap = 30\) do not use"):
        load_train_config(path, ["model.arch=gemma4", "model.gemma4.final_logit_softcap=30.0"])


def test_a_resumed_bf16_head_run_computes_the_same_steps(tmp_path):
    make_dataset(tmp_path)
    trainer, lines = train(tmp_path, "straight", "bf16-head", steps=6)
    assert trainer.config.ckpt_every == 6
    cfg = load_train_config(write_config(tmp_path, max_steps=6, log_every=1, ckpt_every=3, dtype="bf16-head"))
    first = Trainer(cfg, tmp_path / "resumed", quiet=True)
    first.run()
    ckpts = tmp_path / "resumed" / "checkpoints"
    shutil.rmtree(ckpts / "step_00000006")  # as if killed after the step-3 checkpoint
    (ckpts / "LATEST").write_text("step_00000003")
    Trainer(cfg, tmp_path / "resumed", resume=True, quiet=True).run()
    resumed = [m for m in metric_lines(tmp_path / "resumed") if m.get("loss") is not None and "eval" not in m]
    assert [m["loss"] for m in resumed] == [m["loss"] for m in lines]  # bit for bit, steps 4-6 recomputed
