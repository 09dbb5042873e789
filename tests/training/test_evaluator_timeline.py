"""The evaluation timeline: log-spaced steps, each evaluated and logged exactly once across kills and resumes."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from training_helpers import make_dataset, write_config

from plelab.training.callbacks import Callback
from plelab.training.config import TrainConfig, load_train_config
from plelab.training.standard_callbacks import timeline_steps
from plelab.training.trainer import Trainer
from plelab.util.dataclass_config import ConfigError


def test_timeline_steps_are_log_spaced_distinct_and_include_both_ends():
    cfg = TrainConfig(max_steps=1500, warmup_steps=75, eval_timeline=8)
    steps = timeline_steps(cfg)
    assert steps == [75, 115, 177, 271, 415, 637, 978, 1500]
    ratios = [b / a for a, b in zip(steps, steps[1:], strict=False)]
    assert all(abs(math.log(r) - math.log(20) / 7) < 0.02 for r in ratios), ratios
    # Crowded at the start: rounding collisions move later, still ending exactly at max_steps.
    tight = timeline_steps(TrainConfig(max_steps=20, warmup_steps=0, eval_timeline=12))
    assert tight == [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 15, 20]
    assert timeline_steps(TrainConfig(max_steps=10, warmup_steps=3, eval_timeline=8)) == list(range(3, 11))
    assert timeline_steps(TrainConfig()) == []


@pytest.mark.parametrize("n", [1, 9, -1])
def test_a_timeline_that_cannot_have_distinct_points_is_refused(n):
    with pytest.raises(ConfigError, match="eval_timeline"):
        TrainConfig(max_steps=10, warmup_steps=3, eval_timeline=n)


class _CrashAt(Callback):
    """Raise at the end of `step` (before it is logged): a kill between a timeline point and its checkpoint."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        if trainer.step == self.step:
            raise RuntimeError("killed")


def _eval_lines(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [m for m in lines if "eval" in m]


def test_a_killed_and_resumed_run_records_each_timeline_point_exactly_once(tmp_path):
    make_dataset(tmp_path)
    cfg = load_train_config(write_config(tmp_path, max_steps=16, warmup_steps=3, ckpt_every=4, eval_timeline=8))
    steps = timeline_steps(cfg)
    assert steps == [3, 4, 5, 6, 8, 10, 13, 16]
    run_dir = tmp_path / "run"
    # Killed in step 11: the point at step 10 was logged, but the newest checkpoint is step 8.
    with pytest.raises(RuntimeError, match="killed"):
        Trainer(cfg, run_dir, callbacks=[_CrashAt(11)], quiet=True).run()
    assert [m["step"] for m in _eval_lines(run_dir)] == [3, 4, 5, 6, 8, 10]
    final = Trainer(cfg, run_dir, resume=True, quiet=True).run()
    # Finished, then resumed again (a kill before the sweep recorded the result): nothing is evaluated twice.
    again = Trainer(cfg, run_dir, resume=True, quiet=True).run()
    evals = _eval_lines(run_dir)
    assert [m["step"] for m in evals] == steps and all(m["timeline"] for m in evals)
    assert [m["tokens"] for m in evals] == [s * cfg.tokens_per_step for s in steps]
    assert final["final_eval"] == again["final_eval"] == evals[-1]["eval"]
    assert evals[-1]["eval"]["max_tokens_per_domain"] == cfg.eval_tokens


def test_without_a_timeline_evaluations_keep_their_schedule(tmp_path):
    make_dataset(tmp_path)
    cfg = load_train_config(write_config(tmp_path, max_steps=8, eval_every=4, ckpt_every=4))
    final = Trainer(cfg, tmp_path / "run", quiet=True).run()
    evals = _eval_lines(tmp_path / "run")
    assert [m["step"] for m in evals] == [4, 8] and not any("timeline" in m for m in evals)
    assert final["final_eval"] == evals[-1]["eval"]


def test_a_heldout_only_timeline_scores_the_split_alone_until_the_final_evaluation(tmp_path):
    make_dataset(tmp_path)
    cfg = load_train_config(write_config(tmp_path, max_steps=8, warmup_steps=2, eval_timeline=3,
                                         eval_timeline_domains="heldout"))
    final = Trainer(cfg, tmp_path / "run", quiet=True).run()
    evals = _eval_lines(tmp_path / "run")
    assert [m["step"] for m in evals] == timeline_steps(cfg) == [2, 4, 8]
    assert [sorted(m["eval"]["domains"]) for m in evals[:-1]] == [["val"], ["val"]]
    assert sorted(evals[-1]["eval"]["domains"]) == ["numbers", "prose", "val"]  # the last point scores everything
    assert final["final_eval"] == evals[-1]["eval"]
    with pytest.raises(ConfigError, match="eval_timeline_domains"):
        TrainConfig(eval_timeline_domains="some")
    with pytest.raises(ConfigError, match="eval_timeline is 0"):
        TrainConfig(eval_timeline_domains="heldout")
