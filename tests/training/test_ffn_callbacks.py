"""FFN-variant callbacks through the real Trainer: MoE router metrics and aux losses, the pruning schedule."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
from training_helpers import make_dataset, write_config

from plelab.model.pruning import pruned_layers
from plelab.training.callback_factory import callbacks_for
from plelab.training.callbacks import Callback
from plelab.training.config import load_train_config
from plelab.training.ffn_callbacks import PruningSchedule, RouterStats
from plelab.training.trainer import Trainer, auxiliary_losses

MOE = ["model.ffn.kind=moe", "model.ffn.num_experts=4", "model.ffn.top_k=2", "model.ffn.expert_size=16"]
PRUNED = ["model.ffn.kind=pruned", "model.ffn.prune_to=40", "model.ffn.prune_start=0.25",
          "model.ffn.prune_end=0.75"]


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


class AliveRecorder(Callback):
    """Keeps every step's live-unit flags; optionally asks the trainer to stop (as SIGINT would) after a step."""

    def __init__(self, stop_at: int | None = None):
        self.masks: dict[int, list[list[float]]] = {}
        self.stop_at = stop_at

    def on_step_logged(self, trainer: Any, metrics: dict[str, Any]) -> None:
        self.masks[trainer.step] = [f.alive.tolist() for f in pruned_layers(trainer.model)]
        if trainer.step == self.stop_at:
            trainer._stop_signal = signal.SIGINT


@pytest.fixture
def data(tmp_path):
    make_dataset(tmp_path, docs=20)
    return tmp_path


def test_callbacks_are_registered_by_ffn_kind(data):
    kinds = {
        name: {type(cb) for cb in callbacks_for(load_train_config(write_config(data), overrides))}
        for name, overrides in (("swiglu", []), ("moe", MOE), ("pruned", PRUNED))
    }
    assert RouterStats in kinds["moe"] and PruningSchedule not in kinds["moe"]
    assert PruningSchedule in kinds["pruned"] and RouterStats not in kinds["pruned"]
    assert not {RouterStats, PruningSchedule} & kinds["swiglu"]


def test_moe_trains_with_router_metrics_and_loss_stays_pure_cross_entropy(data):
    cfg = load_train_config(write_config(data, max_steps=4, eval_every=0, ckpt_every=4), MOE)
    trainer = Trainer(cfg, data / "run", quiet=True)
    torch.set_num_threads(1)
    seen: dict[str, float] = {}

    class Objective(Callback):
        def on_after_backward(self, trainer: Any, m: dict[str, Any]) -> None:
            x, y = trainer.data.next_batch()  # a training forward on an extra batch
            with torch.no_grad():
                logits, loss = trainer.model(x, y, return_logits=True)
            seen["loss"], seen["aux"] = float(loss), float(sum(auxiliary_losses(trainer.aux_modules).values()))
            seen["ce"] = float(torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), y.flatten()))

    trainer.callbacks.append(Objective())
    trainer.run()
    lines = [m for m in metrics(data / "run") if "moe_balance" in m]
    assert len(lines) == 4
    for m in lines:
        assert m["moe_balance"] == pytest.approx(0.01 * 2 * 1.0, rel=0.5)  # 2 layers, near-uniform router at init
        assert m["moe_z"] > 0
        assert 0 < m["moe_load_min"] <= 0.25 <= m["moe_load_max"] < 1
        assert m["moe_dropped"] == 0.0 and 0 < m["moe_router_entropy"] <= 1.3863
    assert seen["aux"] > 0 and seen["loss"] == pytest.approx(seen["ce"], rel=1e-5)  # no aux term in the LM loss


@pytest.mark.parametrize("importance", ["magnitude", "taylor"])
def test_pruning_reaches_prune_to_at_prune_end_and_resumes_to_the_same_masks(data, importance):
    overrides = [*PRUNED, f"model.ffn.prune_importance={importance}"]
    cfg = load_train_config(write_config(data, max_steps=8, ckpt_every=2, eval_every=0), overrides)
    whole = AliveRecorder()
    torch.set_num_threads(1)
    Trainer(cfg, data / "whole", callbacks=[whole], quiet=True).run()
    alive = [m["ffn_alive"] for m in metrics(data / "whole") if "ffn_alive" in m]
    assert len(alive) == 8 and alive[:2] == [1.0, 1.0] and alive[5:] == [40 / 64] * 3  # steps 1-2 full, 6-8 at prune_to
    assert 40 / 64 < alive[3] < 1.0  # step 4: mid-schedule
    assert all(sum(mask) == 40 for mask in whole.masks[6])

    cut = AliveRecorder(stop_at=3)  # stops mid-schedule, after the step-3 checkpoint is written
    with pytest.raises(KeyboardInterrupt):
        Trainer(cfg, data / "cut", callbacks=[cut], quiet=True).run()
    rest = AliveRecorder()
    Trainer(cfg, data / "cut", callbacks=[rest], resume=True, quiet=True).run()
    assert {**cut.masks, **rest.masks} == whole.masks
    assert min(rest.masks) == 4
