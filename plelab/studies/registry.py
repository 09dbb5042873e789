"""The studies `plelab report` knows, in the order it tries them, and what it does with the one it picks.

`plelab report DIR` takes the first study whose `detect(DIR)` says the folder is its kind (the law is chosen by
`--law` instead), analyses it into a JSON-ready dict, writes its report files, and prints the summary lines and
the paths (or the analysis with `--json`). `plelab report RECORDS.json` picks the study by the records' kind,
`plelab report DIR --review` the one whose committed report DIR holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.experiments.records import load_records
from plelab.experiments.study import OPTIONS, Say, Study
from plelab.studies.deadzone.study import STUDY as DEADZONE
from plelab.studies.fastpath.study import STUDY as FASTPATH
from plelab.studies.ffn.study import STUDY as FFN
from plelab.studies.law.study import STUDY as LAW
from plelab.studies.ngram.study import STUDY as NGRAM
from plelab.studies.onset.study import STUDY as ONSET
from plelab.studies.tokens.study import STUDY as TOKENS
from plelab.studies.visual.study import STUDY as VISUAL


def studies() -> list[Study]:
    """Every study, in the order `plelab report` tries them: the first whose detect() is true is used. The
    third round of the law takes a folder of its width sweeps; the visual PLE and n-gram studies come before the FFN
    study (their sweeps have [variants] too); the dead-zone
    report, which takes any sweep, comes last."""
    return [LAW, ONSET, VISUAL, NGRAM, FFN, FASTPATH, TOKENS, DEADZONE]


def choose_study(folder: str | Path, flags: Sequence[str] = ()) -> Study:
    """The study for `folder`: the one a flag names, else the first that detects it."""
    folder = Path(folder)
    for study in studies():
        if study.flag in flags if study.flag else study.detect(folder):
            return study
    raise PlelabError(f"no study reports on {folder}")  # unreachable: the dead-zone study takes any folder


def make_report(folder: str | Path, out: str | Path | None = None, *, flags: Sequence[str] = (),
                overwrite: bool = False, say: Say = lambda line: None,
                **options: Any) -> tuple[Study, dict[str, Any], list[Path]]:
    """Analyse `folder` with its study and write the report into `out` (default: the folder itself, whose
    previous report is then replaced); returns (study, analysis, paths written).

    options: the studies' OPTIONS (an option the chosen study does not take is refused) plus what its analysis
    takes (decode_tokens, plan, ...).
    """
    folder = Path(folder)
    study = choose_study(folder, flags)
    for option in OPTIONS:
        if options.get(option) and option not in study.options:
            owners = " or ".join(s.name for s in studies() if option in s.options)
            raise PlelabError(f"--{option.replace('_', '-')} works only on the {owners} study's sweeps; "
                              f"{folder} is reported as the {study.name} study")
    analysis, records = study.analyse(folder, say=say, **options)
    out_dir = Path(out or folder)
    own = out_dir.resolve() == folder.resolve()  # the sweep folder's report is regenerated in place
    paths = study.write(analysis, out_dir, overwrite=own or overwrite, inputs=tuple(study.inputs(folder)),
                        records=records)
    return study, analysis, paths


def report_from_records(path: str | Path, out: str | Path | None = None, *,
                        overwrite: bool = False) -> tuple[Study, dict[str, Any], list[Path]]:
    """Recompute a study's analysis from the records.json its report committed and write the report into `out`
    (default: the file's folder, whose report files are replaced only with `overwrite`); returns (study,
    analysis, paths written)."""
    path = Path(path)
    rec = load_records(path)
    for study in studies():
        if study.records_kind and study.records_kind == rec["kind"] and study.from_records:
            analysis = study.from_records(rec)
            paths = study.write(analysis, Path(out) if out else path.parent, overwrite=overwrite, inputs=(path,))
            return study, analysis, paths
    raise PlelabError(f"{path}: unknown records kind {rec['kind']!r}")


def review_report(folder: str | Path, out: str | Path | None = None, overwrite: bool = False) -> list[Path]:
    """`plelab report DIR --review`: the committed report in DIR recomputed under the current rules by the study
    it belongs to (post hoc); returns the paths written."""
    folder = Path(folder)
    for study in studies():
        if study.review is not None and study.reviews(folder):
            return study.review(folder, out, overwrite=overwrite)
    if (folder / "report.md").is_file():
        raise PlelabError(f"{folder / 'report.md'} is not a committed report any study can review "
                          f"({', '.join(s.name for s in studies() if s.review is not None)})")
    raise PlelabError(f"{folder} holds neither law.json nor report.md: give a committed study report's folder")
