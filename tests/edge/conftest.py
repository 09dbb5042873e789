"""Fixtures for the edge tests: models exported to .ple (the models themselves: tests/edge_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from plelab.edge.export import ExportOptions, export_model
from plelab.model import LanguageModel


@pytest.fixture
def export_tmp(tmp_path: Path):
    """export_tmp(model, **options) -> path of the model exported into tmp_path."""
    counter = iter(range(1000))

    def _export(model: LanguageModel, **opts) -> Path:
        out = tmp_path / f"model{next(counter)}.ple"
        export_model(model, out, ExportOptions(**opts))
        return out

    return _export
