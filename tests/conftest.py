"""Shared fixtures: the real data in ../shared/data (skipped with a reason when absent)."""

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
