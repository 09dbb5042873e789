"""Fixtures for the experiments tests: a tiny dataset and one finished tiny sweep shared by read-only tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_helpers import make_dataset, write_sweep


@pytest.fixture
def tiny_data(tmp_path: Path) -> Path:
    """A folder with the tiny byte-level dataset (data/, valid/)."""
    make_dataset(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory) -> Path:
    """A finished 2 dP x 2 seeds sweep (in-process), shared by the read-only tests; returns its folder."""
    from plelab.experiments.sweep import load_sweep
    from plelab.experiments.sweep_runner import run_sweep

    root = tmp_path_factory.mktemp("sweep")
    make_dataset(root)
    sweep = load_sweep(write_sweep(root, 'seed = [1, 2]\n"model.ple.dim" = [0, 8]'))
    counts = run_sweep(sweep, quiet=True, say=lambda _: None)
    assert counts == {"done": 4}
    return sweep.folder
