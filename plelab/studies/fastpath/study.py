"""The fast-path check as `plelab report` runs it: a sweep whose variants are the fp32 and bf16-head paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.experiments.sweep import DB_FILE
from plelab.studies.fastpath.check import check, is_fastpath_sweep
from plelab.studies.fastpath.report import write_fastpath_report


def _analyse(folder: Path, say: Say, no_diagnose: bool = False, **_: Any) -> tuple[dict[str, Any], None]:
    if not no_diagnose:
        say("plelab report: running plelab diagnose on every run (--no-diagnose skips it)")
    return check(folder, diagnose=not no_diagnose), None


STUDY = Study(name="fast-path", detect=is_fastpath_sweep, analyse=_analyse, write=write_fastpath_report,
              inputs=lambda folder: (folder / DB_FILE,), options=("no_diagnose",))
