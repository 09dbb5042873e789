"""The FFN study as `plelab report` runs it: a sweep with [variants] whose grid does not vary dP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.studies.ffn import analysis, report
from plelab.studies.ffn.review import is_committed_ffn_report, review_ffn


def _analyse(folder: Path, say: Say, measure_decode: bool = False, decode_tokens: int = 64,
             decode_runtime: str = "numpy", plan: str | Path | None = None,
             **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    records = report.ffn_report_records(folder, measure_decode=bool(measure_decode), say=say,
                                        decode_tokens=decode_tokens, decode_runtime=decode_runtime, plan=plan)
    return analysis.analysis_from_records(records), records


STUDY = Study(
    name="FFN", detect=analysis.is_variant_sweep, analyse=_analyse, write=report.write_ffn_report,
    inputs=report.ffn_report_inputs, summary=lambda a, folder, options: report.ffn_summary(a),
    options=("measure_decode",), records_kind=analysis.RECORDS_KIND, from_records=analysis.analysis_from_records,
    reviews=is_committed_ffn_report, review=review_ffn,
)
