"""The n-gram study as `plelab report` runs it: a variant sweep with an n-gram-indexed variant."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE
from plelab.studies.ngram.analysis import RECORDS_KIND, analysis_from_records, is_ngram_sweep, study_records
from plelab.studies.ngram.report import ngram_summary, write_ngram_report


def _analyse(folder: Path, say: Say, plan: str | Path | None = None, **_: Any) -> tuple[dict[str, Any], dict]:
    records = study_records(folder, plan)
    return analysis_from_records(records), records


STUDY = Study(name="n-gram", detect=is_ngram_sweep, analyse=_analyse, write=write_ngram_report,
              inputs=lambda folder: (folder / DB_FILE, folder / RESOLVED_FILE),
              summary=lambda a, folder, options: ngram_summary(a), records_kind=RECORDS_KIND,
              from_records=analysis_from_records)
