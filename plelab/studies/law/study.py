"""The dead-zone law as `plelab report DIR --law` runs it: every width's sweep under DIR, the law, the prediction."""

from __future__ import annotations

from pathlib import Path

from plelab.experiments.study import Study
from plelab.studies.law import report
from plelab.studies.law.review import LAW_JSON, review_law

STUDY = Study(
    name="dead-zone law", detect=lambda folder: False, flag="law",
    analyse=lambda folder, say, predict=None, **options: report.law_report_analysis(folder, predict),
    write=report.write_law_report, inputs=report.law_report_inputs,
    summary=lambda analysis, folder, options: report.law_summary_lines(analysis, folder, options.get("predict")),
    options=("predict",), records_kind=report.LAW_KIND, from_records=report.law_from_records,
    reviews=lambda folder: (Path(folder) / LAW_JSON).is_file(), review=review_law,
)
"""Chosen by --law (its folder holds several sweeps, so nothing in it to detect)."""
