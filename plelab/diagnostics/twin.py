"""The dP = 0 twin of a run: the same training (data, seed, batch, schedule, steps) with the PLE table off.

Only a twin says what a table buys: both models saw the same tokens in the same order (the model's other weights
draw the same random numbers whether or not a table exists), so their paired loss difference is the table's
benefit, as the studies measure it. A twin is found beside the run (the demo's `base` beside `ple`, the same seed's
dP = 0 run of a sweep in the sweep's runs/ folder) or named with `plelab diagnose RUN --twin TWIN`; either way its
recorded training config must equal the run's in everything that shapes training but the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.runs.checkpoint import CheckpointError, read_checkpoint_json, resolve_checkpoint
from plelab.runs.run_dir import RESUMABLE_FIELDS, flatten

NOT_TRAINING = frozenset(RESUMABLE_FIELDS) - {"max_steps"} | {
    "eval_data", "eval_heldout_whole", "eval_timeline", "eval_timeline_domains", "early_warning_fraction"}
"""Recorded fields that do not change what a run learns (cadences, evaluation, logging, device placement);
max_steps does (it sets the cosine schedule), so it stays compared."""
TABLE_PREFIX = "model.ple."
"""Fields of the table itself: a twin has dim 0, so its other table fields mean nothing."""


class TwinError(PlelabError):
    """A run named as a twin that is not one."""


@dataclass
class Checkpointed:
    """What a twin comparison reads of a run: its newest checkpoint, the step, the training config, the tokenizer."""

    path: Path
    step: int
    train: dict[str, Any]
    tokenizer: str | None


def read_checkpointed(path: str | Path) -> Checkpointed:
    """The newest complete checkpoint of a run (or a checkpoint folder) and what it recorded."""
    ckpt = resolve_checkpoint(path)
    meta = read_checkpoint_json(ckpt / "config.json")
    try:
        step = int(ckpt.name.rsplit("_", 1)[-1])
    except ValueError:
        step = -1
    return Checkpointed(ckpt, step, meta.get("train") or {}, meta.get("tokenizer"))


def _table_dim(train: dict[str, Any]) -> int:
    return int(((train.get("model") or {}).get("ple") or {}).get("dim") or 0)


def twin_differences(run: Checkpointed, twin: Checkpointed) -> list[str]:
    """Why `twin` is not the dP = 0 twin of `run` (empty when it is)."""
    problems = []
    if _table_dim(twin.train) != 0:
        problems.append(f"it has a PLE table (dP = {_table_dim(twin.train)}), not dP = 0")
    if run.step != twin.step:
        problems.append(f"it was trained {twin.step} steps, the run {run.step}")
    if run.tokenizer and twin.tokenizer and run.tokenizer != twin.tokenizer:
        problems.append("its tokenizer differs")
    ours = {k: v for k, v in flatten(run.train).items() if k not in NOT_TRAINING and not k.startswith(TABLE_PREFIX)}
    theirs = {k: v for k, v in flatten(twin.train).items()
              if k not in NOT_TRAINING and not k.startswith(TABLE_PREFIX)}
    for key in sorted(set(ours) | set(theirs)):
        if ours.get(key) != theirs.get(key):
            problems.append(f"{key} = {theirs.get(key)!r}, the run's {ours.get(key)!r}")
    return problems


def check_twin(run_path: str | Path, twin_path: str | Path) -> Checkpointed:
    """The twin's checkpoint, or a TwinError saying in one line why it is not the run's dP = 0 twin."""
    run, twin = read_checkpointed(run_path), read_checkpointed(twin_path)
    problems = twin_differences(run, twin)
    if problems:
        raise TwinError(f"{twin_path} is not the dP = 0 twin of {run_path}: " + "; ".join(problems[:6])
                        + (f"; and {len(problems) - 6} more" if len(problems) > 6 else ""))
    return twin


def find_twin(run_dir: str | Path) -> tuple[Path | None, str]:
    """(the run's dP = 0 twin among its sibling run folders, or None; a note saying where it looked)."""
    run_dir = Path(run_dir)
    try:
        run = read_checkpointed(run_dir)
    except CheckpointError as exc:
        return None, f"cannot read the run's checkpoint ({exc})"
    siblings = sorted(p for p in run_dir.parent.iterdir()
                      if p.is_dir() and p.resolve() != run_dir.resolve() and (p / "checkpoints").is_dir())
    twins = []
    for sibling in siblings:
        try:
            other = read_checkpointed(sibling)
        except CheckpointError:
            continue
        if not twin_differences(run, other):
            twins.append(sibling)
    if len(twins) == 1:
        return twins[0], f"found beside the run: {twins[0]} (same training, dP = 0)"
    if twins:
        return None, (f"{len(twins)} runs beside it qualify ({', '.join(str(t) for t in twins[:3])}): name one "
                      "with --twin")
    return None, (f"none of the {len(siblings)} run folder(s) beside {run_dir} is its dP = 0 twin (the same "
                  "training with model.ple.dim = 0)")
