"""The visual PLE study as `plelab report` runs it: a sweep whose runs train with [vision]."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.studies.visual import analysis, report
from plelab.studies.visual.review import is_committed_visual_report, review_visual
from plelab.util.json_values import jsonable


def _analyse(folder: Path, say: Say, plan: str | Path | None = None,
             **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    records = analysis.study_records(folder, lambda msg: say(f"plelab report: {msg}"), plan)
    return analysis.analysis_from_records(records), records


STUDY = Study(
    name="visual PLE", detect=analysis.is_vision_sweep, analyse=_analyse, write=report.write_vision_report,
    inputs=report.vision_report_inputs, to_json=jsonable, records_kind=analysis.RECORDS_KIND,
    from_records=analysis.analysis_from_records, reviews=is_committed_visual_report, review=review_visual,
)
"""Listed before the FFN study: its sweeps have [variants] too."""
