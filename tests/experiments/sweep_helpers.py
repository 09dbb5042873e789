"""Tiny sweeps for the experiments tests: the trainer tests' byte-level dataset and config, swept over a grid."""

from __future__ import annotations

import sys
from pathlib import Path

# The tiny dataset and training config live with the trainer tests; share them instead of copying.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import make_dataset, write_config  # noqa: E402

__all__ = ["make_dataset", "write_config", "write_sweep"]

TRAIN = dict(max_steps=12, ckpt_every=4, log_every=4, diagnostics_every=4)


def write_sweep(root: Path, grid: str, options: str = "", **train) -> Path:
    """A sweep file on root's tiny dataset: `base` refers to a training config written next to it."""
    write_config(root, **{**TRAIN, **train})
    path = root / "sweep.toml"
    path.write_text(f'base = "train.toml"\n[sweep]\nout = "{root / "out"}"\nthreads = 1\n{options}\n[grid]\n{grid}\n')
    return path
