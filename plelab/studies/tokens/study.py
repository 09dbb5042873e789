"""The tokens study as `plelab report` runs it: a dP sweep whose groups differ only in training length, reported as
the dead-zone report with the gain of each dP against training tokens before the groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.study import Say, Study
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE
from plelab.experiments.sweep_store import SweepStore
from plelab.studies.deadzone.analysis import analyze_sweep, group_key
from plelab.studies.deadzone.report import write_report
from plelab.studies.tokens.curve import gain_vs_tokens, gain_vs_tokens_png, tokens_blocks, training_lengths


def is_tokens_sweep(folder: str | Path) -> bool:
    """Do the sweep's finished runs fall into groups that each trained one length, at least two lengths?"""
    path = Path(folder) / DB_FILE
    if not path.is_file():
        return False
    with SweepStore(path, readonly=True) as store:
        runs = [r for r in store.runs() if r["status"] == "done"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault(group_key(r["point"] or {}), []).append({"tokens": r.get("tokens")})
    return training_lengths([{"runs": g} for g in groups.values()]) is not None


def _analyse(folder: Path, say: Say, plan: str | Path | None = None, **_: Any) -> tuple[dict[str, Any], None]:
    analysis = analyze_sweep(folder, plan=plan)
    return {**analysis, "tokens_curve": gain_vs_tokens(analysis["groups"])}, None


def _write(analysis: dict[str, Any], out_dir: str | Path, **kwargs: Any) -> list[Path]:
    curve = analysis.get("tokens_curve")
    png = gain_vs_tokens_png(curve)
    return write_report(analysis, out_dir, sweep_blocks=tokens_blocks(curve, png),
                        sweep_pngs={"gain_vs_tokens": png} if png else {}, **kwargs)


STUDY = Study(name="tokens", detect=is_tokens_sweep, analyse=_analyse, write=_write,
              inputs=lambda folder: (folder / DB_FILE, folder / RESOLVED_FILE))
