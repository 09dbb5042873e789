"""RUN_DIR/metrics.jsonl: one JSON object per line, training steps and evaluations, appended by the trainer."""

from __future__ import annotations

import json
from pathlib import Path


def read_metrics(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """(training step lines, evaluation lines) of RUN_DIR/metrics.jsonl; a later line for the same step wins."""
    train: dict[int, dict] = {}
    evals: dict[int, dict] = {}
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return [], []
    for line in path.read_text(errors="replace").splitlines():  # damaged bytes spoil one line, not the status
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        (evals if "eval" in m else train)[int(m.get("step", 0))] = m
    return [train[k] for k in sorted(train)], [evals[k] for k in sorted(evals)]
