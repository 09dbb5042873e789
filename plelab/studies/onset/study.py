"""The third round as `plelab report` runs it: a folder holding the round's width sweeps (runs/deadzone-onset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.experiments.sweep import DB_FILE
from plelab.studies.onset.analysis import (
    RECORDS_KIND,
    analysis_from_records,
    is_onset_round,
    round_records,
    width_folders,
)
from plelab.studies.onset.report import onset_summary, write_onset_report


def _analyse(folder: Path, say: Say, **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    records = round_records(folder)
    return analysis_from_records(records), records


STUDY = Study(name="onset", detect=is_onset_round, analyse=_analyse, write=write_onset_report,
              inputs=lambda folder: tuple(f / DB_FILE for f in width_folders(folder)),
              summary=lambda a, folder, options: onset_summary(a), records_kind=RECORDS_KIND,
              from_records=analysis_from_records)
