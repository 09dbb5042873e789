"""`plelab report RECORDS.json`: a study's report recomputed from the per-seed records committed beside it.

Every study report writes OUT/records.json: the plain data its analysis rests on (per-seed final losses,
timelines, costs and table diagnostics for the variant studies, every run's record for the dead-zone law, and
the analysis plan's registration and inputs). A reviewer without the sweep folder regenerates the report, and
every verdict in it, from that file alone.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError


def load_records(path: str | Path) -> dict[str, Any]:
    """A records.json, checked to be one (a clear one-line error otherwise)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is not a readable records file ({exc})") from None
    if not isinstance(data, dict) or "kind" not in data:
        raise PlelabError(f"{path} is not a study's records.json (no 'kind'); give a sweep folder or a records file "
                          "a study report wrote")
    return data


def report_from_records(path: str | Path, out: str | Path | None, *,
                        overwrite: bool = False) -> tuple[dict[str, Any], list[Path]]:
    """Recompute the study's analysis from its records and write its report to `out` (default: the file's folder,
    whose report files it replaces only with `overwrite`); return (analysis, paths written)."""
    from plelab.experiments import ffn_study, law_report
    from plelab.experiments import vision_study as vision

    path = Path(path)
    rec = load_records(path)
    target = Path(out) if out else path.parent
    if rec["kind"] == ffn_study.RECORDS_KIND:
        from plelab.experiments.ffn_report import write_ffn_report

        analysis = ffn_study.analysis_from_records(rec)
        return analysis, write_ffn_report(analysis, target, overwrite=overwrite, inputs=(path,))
    if rec["kind"] == vision.RECORDS_KIND:
        analysis = vision.analysis_from_records(rec)
        return analysis, vision.write_vision_report(analysis, target, overwrite=overwrite, inputs=(path,))
    if rec["kind"] == law_report.LAW_KIND:
        analysis = law_report.law_from_records(rec)
        return analysis, law_report.write_law_report(analysis, target, overwrite=overwrite, inputs=(path,))
    raise PlelabError(f"{path}: unknown records kind {rec['kind']!r}")
