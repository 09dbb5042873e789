"""The studies `plelab report` knows, each as one `Study`: detect / analyse / write / summary.

`plelab report DIR` takes the first study in `studies()` whose `detect(DIR)` says the folder is its kind (the
law is chosen by `--law` instead), analyses it into a JSON-ready dict, writes its report files, and prints the
summary lines and the paths (or the analysis with `--json`). A new study is one `Study` added to `studies()`,
above the general sweep report that takes any sweep; the command line does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError

Say = Callable[[str], None]
"""Receives progress lines (the CLI prints them on stderr)."""

OPTIONS = ("predict", "measure_decode")
"""The report options a study may take; the CLI passes them (None / False when not given). Every study also
takes `plan` (an analysis plan file given at report time: its verdicts are labelled post hoc)."""


@dataclass(frozen=True)
class Study:
    """One kind of sweep folder and how its report is made."""

    name: str
    detect: Callable[[Path], bool]
    """Is the folder this study's kind?"""
    analyse: Callable[..., tuple[dict[str, Any], dict[str, Any] | None]]
    """analyse(folder, say=..., **options) -> (the analysis (what `--json` prints after `to_json`), the per-seed
    records it rests on, committed beside the report as records.json; None for a study without records)."""
    write: Callable[..., list[Path]]
    """write(analysis, out_dir, overwrite=..., inputs=..., records=...) -> the files written."""
    inputs: Callable[[Path], Sequence[Path]]
    """Files of the folder the report reads (an output path may be none of them)."""
    summary: Callable[[dict[str, Any], Path, dict[str, Any]], list[str]] = lambda analysis, folder, options: []
    """summary(analysis, folder, options) -> lines printed before the written paths."""
    to_json: Callable[[dict[str, Any]], Any] = lambda analysis: analysis
    """The analysis as `--json` prints it."""
    options: tuple[str, ...] = ()
    """Which OPTIONS it takes; another one given is refused with `refusal`."""
    refusal: str = ""
    """'{option} ...{dir}...' message for an option it does not take; empty = such options are ignored."""
    flag: str = ""
    """Chosen by this option (e.g. "law") instead of by `detect`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments `analyse` receives besides the options (e.g. decode_tokens)."""
    records_kind: str = ""
    """records.json's `kind` for this study; empty = it writes no records."""
    from_records: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """The analysis recomputed from a records.json alone (`plelab report RECORDS.json`)."""


def _sweep_study() -> Study:
    from plelab.experiments.analysis import analyze_sweep
    from plelab.experiments.report import write_report
    from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE

    return Study(
        name="sweep", detect=lambda folder: True,
        analyse=lambda folder, say, plan=None, **options: (analyze_sweep(folder, plan=plan), None),
        write=write_report, inputs=lambda folder: (folder / DB_FILE, folder / RESOLVED_FILE),
        refusal="{option} works on a sweep with [variants] (the FFN study); {dir} has none",
    )


def _ffn_study() -> Study:
    from plelab.experiments import ffn_report, ffn_study

    def analyse(folder: Path, say: Say, measure_decode: bool = False, decode_tokens: int = 64,
                decode_runtime: str = "numpy", plan: str | Path | None = None,
                **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        records = ffn_report.ffn_report_records(folder, measure_decode=bool(measure_decode), say=say,
                                                decode_tokens=decode_tokens, decode_runtime=decode_runtime, plan=plan)
        return ffn_study.analysis_from_records(records), records

    return Study(
        name="ffn", detect=ffn_study.is_variant_sweep, analyse=analyse, write=ffn_report.write_ffn_report,
        inputs=ffn_report.ffn_report_inputs, summary=lambda analysis, folder, options: ffn_report.ffn_summary(analysis),
        options=("measure_decode",), records_kind=ffn_study.RECORDS_KIND, from_records=ffn_study.analysis_from_records,
    )


def _vision_study() -> Study:
    from plelab.experiments import vision_study
    from plelab.util.json_values import jsonable

    def analyse(folder: Path, say: Say, plan: str | Path | None = None,
                **_: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        records = vision_study.study_records(folder, lambda msg: say(f"plelab report: {msg}"), plan)
        return vision_study.analysis_from_records(records), records

    return Study(
        name="vision", detect=vision_study.is_vision_sweep, analyse=analyse,
        write=vision_study.write_vision_report, inputs=vision_study.vision_report_inputs, to_json=jsonable,
        refusal="{option} works on the FFN study's sweeps; {dir} is a visual PLE study",
        records_kind=vision_study.RECORDS_KIND, from_records=vision_study.analysis_from_records,
    )


def _law_study() -> Study:
    from plelab.experiments import law_report

    return Study(
        name="law", detect=lambda folder: False, flag="law",
        analyse=lambda folder, say, predict=None, **options: law_report.law_report_analysis(folder, predict),
        write=law_report.write_law_report, inputs=law_report.law_report_inputs,
        summary=lambda analysis, folder, options: law_report.law_summary_lines(analysis, folder,
                                                                               options.get("predict")),
        options=("predict",), records_kind=law_report.LAW_KIND, from_records=law_report.law_from_records,
    )


def studies() -> list[Study]:
    """Every study, in the order `plelab report` tries them: the first whose detect() is true is used. The
    visual PLE study comes before the FFN study (its sweeps have [variants] too); the general sweep report,
    which takes any sweep, comes last."""
    return [_law_study(), _vision_study(), _ffn_study(), _sweep_study()]


def choose_study(folder: str | Path, flags: Sequence[str] = ()) -> Study:
    """The study for `folder`: the one a flag names, else the first that detects it."""
    folder = Path(folder)
    for study in studies():
        if study.flag in flags if study.flag else study.detect(folder):
            return study
    raise PlelabError(f"no study reports on {folder}")  # unreachable: the sweep study takes any folder


def make_report(folder: str | Path, out: str | Path | None = None, *, flags: Sequence[str] = (),
                overwrite: bool = False, say: Say = lambda line: None,
                **options: Any) -> tuple[Study, dict[str, Any], list[Path]]:
    """Analyse `folder` with its study and write the report into `out` (default: the folder itself, whose
    previous report is then replaced); returns (study, analysis, paths written).

    options: the study's OPTIONS (predict, measure_decode) plus what its analysis takes (decode_tokens, ...).
    """
    folder = Path(folder)
    study = choose_study(folder, flags)
    for option in OPTIONS:
        if options.get(option) and option not in study.options and study.refusal:
            raise PlelabError(study.refusal.format(option="--" + option.replace("_", "-"), dir=folder))
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
    from plelab.experiments.records import load_records

    path = Path(path)
    rec = load_records(path)
    for study in studies():
        if study.records_kind and study.records_kind == rec["kind"] and study.from_records:
            analysis = study.from_records(rec)
            paths = study.write(analysis, Path(out) if out else path.parent, overwrite=overwrite, inputs=(path,))
            return study, analysis, paths
    raise PlelabError(f"{path}: unknown records kind {rec['kind']!r}")
