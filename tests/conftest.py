"""Shared fixtures: the real data in ../shared/data (skipped with a reason when absent), tiny sweeps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shared_data_helpers import REPO, SHARED_DATA

__all__ = ["REPO", "SHARED_DATA"]


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to ../shared/data; skips the test when the data is not on this machine."""
    if not (SHARED_DATA / "train").is_dir() or not (SHARED_DATA / "valid").is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (set PLELAB_SHARED_DATA)")
    return SHARED_DATA


@pytest.fixture(autouse=True)
def _deterministic_threads():
    # Two cores are shared by everything on this machine; keep tests from oversubscribing.
    torch.set_num_threads(min(2, torch.get_num_threads()))
    yield


@pytest.fixture
def tiny_data(tmp_path: Path) -> Path:
    """A folder with the trainer tests' tiny byte-level dataset (data/, valid/), for sweeps."""
    from sweep_helpers import make_dataset

    make_dataset(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def finished_sweep(tmp_path_factory) -> Path:
    """A finished 2 dP x 2 seeds sweep (in-process), shared by the read-only engine and study tests; its folder."""
    from sweep_helpers import make_dataset, write_sweep

    from plelab.experiments.sweep import load_sweep
    from plelab.experiments.sweep_runner import run_sweep

    root = tmp_path_factory.mktemp("sweep")
    make_dataset(root)
    sweep = load_sweep(write_sweep(root, 'seed = [1, 2]\n"model.ple.dim" = [0, 8]'))
    counts = run_sweep(sweep, quiet=True, say=lambda _: None)
    assert counts == {"done": 4}
    return sweep.folder
