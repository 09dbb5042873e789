"""What a study is to `plelab report`: one `Study` says which sweep folders are its kind and how its report is made.

The engine (sweeps, plans, records) knows no study; each study package under plelab.studies builds one `Study`,
and plelab.studies.registry lists them in the order `plelab report` tries them. A new study is a package with
its `Study` added to that list; the command line does not change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Say = Callable[[str], None]
"""Receives progress lines (the CLI prints them on stderr)."""

OPTIONS = ("predict", "measure_decode", "no_diagnose")
"""The report options a study may take; the CLI passes them (None / False when not given). Every study also
takes `plan` (an analysis plan file given at report time: its verdicts are labelled post hoc)."""


@dataclass(frozen=True)
class Study:
    """One kind of sweep folder and how its report is made."""

    name: str
    """How `plelab report` names it (in a refusal: "--measure-decode works only on the FFN study's sweeps")."""
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
    """Which OPTIONS it takes; another one given is refused."""
    flag: str = ""
    """Chosen by this option (e.g. "law") instead of by `detect`."""
    records_kind: str = ""
    """records.json's `kind` for this study; empty = it writes no records."""
    from_records: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    """The analysis recomputed from a records.json alone (`plelab report RECORDS.json`)."""
    reviews: Callable[[Path], bool] = lambda folder: False
    """Is the folder a committed report of this study that `review` can recompute (`plelab report DIR --review`)?"""
    review: Callable[..., list[Path]] | None = None
    """review(folder, out, overwrite=...) -> the files written: the committed report recomputed under the current
    rules, post hoc (for reports whose sweep folder is gone)."""
