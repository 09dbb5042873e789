"""The dead-zone study as `plelab report` runs it: any sweep folder, the seed's dP table and its plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE
from plelab.studies.deadzone.analysis import analyze_sweep
from plelab.studies.deadzone.report import write_report


def _analyse(folder: Path, say: Say, plan: str | Path | None = None, **_: Any) -> tuple[dict[str, Any], None]:
    return analyze_sweep(folder, plan=plan), None


STUDY = Study(name="dead-zone", detect=lambda folder: True, analyse=_analyse, write=write_report,
              inputs=lambda folder: (folder / DB_FILE, folder / RESOLVED_FILE))
"""Detects every folder: the registry lists it last."""
