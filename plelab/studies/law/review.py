"""`plelab report DIR --review` for the dead-zone law's first round: its committed law.json upgraded with every
section the current analysis adds that its per-seed data allow, and the law report regenerated from it.

The first round's committed law.json holds every width's per-seed paired deltas, the ablation means and verdict
counts per dP, the early rule's confusion matrices and rank correlations. `upgrade_law` recomputes from it the
per-dP p values, the per-seed dose-response slopes, the collapse test against its simulated nulls, the early rule
beside the base-rate rule, the dP/H ranker beside the early signals, and the law on every measured width. Not
recomputable: the current trained criterion (the loss curves are not committed) and the evaluation noise.
Everything here is post hoc.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.diagnostics.early import TRIVIAL_RANKER
from plelab.studies.deadzone.analysis import PAIRED_RULE
from plelab.studies.law.analysis import PUBLISHED, TRAINED_RULE, collapse
from plelab.studies.law.report import write_law_report

LAW_JSON = "law.json"
"""The committed law report's full analysis, which the review reads."""


def _confusion_lists(confusion: dict[str, int]) -> tuple[list[str], list[str]]:
    """(predicted, actual) label lists from evaluate_rule's 'predicted X, final Y' counts."""
    pred, actual = [], []
    for key, n in confusion.items():
        m = re.fullmatch(r"predicted (.+), final (.+)", key)
        if m:
            pred += [m.group(1)] * n
            actual += [m.group(2)] * n
    return pred, actual


def _ranker_rows(widths: list[dict[str, Any]], form: str, hs: list[int]) -> list[tuple[float, float]]:
    """(dP/H, gain = -paired delta) of every run of the given widths, from the per-seed deltas."""
    return [(r["ple_dim"] / w["H"], -x) for w in widths if w["form"] == form and w["H"] in hs
            for r in w["paired"] for x in r.get("deltas") or [] if isinstance(x, (int, float))]


def upgrade_law(analysis: dict[str, Any], draws: int = 20_000) -> dict[str, Any]:
    """An old law.json analysis with every section the new code adds that its per-seed data allow (module doc)."""
    # the published points are reference data, not this study's: today's wording of them
    out = {**analysis, "widths": [], "paired_rule": PAIRED_RULE, "published": PUBLISHED,
           "trained_rule": TRAINED_RULE + " Not evaluable for these runs (loss curves not committed); the old rule "
                                          "passed every run."}
    for w in analysis["widths"]:
        w = dict(w)
        for key in ("paired", "paired_secondary"):
            rows = []
            for r in w[key]:
                c = stats.compare(r["delta_mean"], r["delta_se"], r["n"])
                rows.append({**r, "p": c["p"], "ci95": c["ci95"], "t": stats.t_critical(r["n"]),
                             "gain_significant": c["outcome"] == "better"})
            w[key] = rows
        deltas = {r["ple_dim"]: dict(zip(r["seeds"], r["deltas"], strict=True)) for r in w["paired"]}
        w["dose_response"] = stats.dose_response(deltas)
        w["trained"] = [{"name": t["name"], "trained": None, "doubling_drop": None,
                         "late_share_old": t.get("late_share"),
                         "reason": "loss curve not committed: the new criterion (fall over the last doubling of "
                                   "tokens) cannot be evaluated; the old one passed"} for t in w["trained"]]
        out["widths"].append(w)
    out["collapse"] = collapse(out["widths"], analysis["form"], draws=draws)
    early = dict(analysis.get("early") or {})
    rule = early.get("rule") or {}
    base = rule.get("one_class") or rule.get("majority")
    for part in ("fit", "test"):
        if early.get(part):
            pred, actual = _confusion_lists(early[part]["confusion"])
            early[part] = {**early[part], "base_rate": stats.accuracy_vs_base_rate(pred, actual, base)}
    tracking = dict(early.get("tracks_gain") or {})
    tests = sorted({p["H"] for p in analysis.get("predictions") or []})
    for part, hs in (("fit", analysis["fit_widths"]), ("test", tests)):
        rows = _ranker_rows(out["widths"], analysis["form"], hs)
        if tracking.get(part) and rows:
            rho = stats.spearman([a for a, _ in rows], [b for _, b in rows])
            fractions = next(iter(tracking[part].values())).keys()
            tracking[part] = {TRIVIAL_RANKER: {f: {"rho": rho, "n": len(rows)} for f in fractions}, **tracking[part]}
    early["tracks_gain"] = tracking
    out["early"] = early
    out["notes"] = list(analysis.get("notes") or []) + [
        "regenerated under the new analysis code from the committed law.json (per-seed paired deltas, ablation "
        "means and verdict counts, early-rule confusions): per-dP p values, dose-response slopes, the collapse "
        "test's nulls, the base-rate and trivial-ranker baselines and the law on every width are recomputed; the "
        "new trained criterion and the evaluation noise are not (the loss curves and checkpoints are not "
        "committed), and the runs were evaluated on the first 4,096 tokens of each file"]
    return out


def review_law(folder: str | Path, out: str | Path | None = None, overwrite: bool = False) -> list[Path]:
    """The law report regenerated from FOLDER/law.json under the current rules, into FOLDER/review/ (or `out`)."""
    folder = Path(folder)
    analysis = upgrade_law(json.loads((folder / LAW_JSON).read_text(encoding="utf-8")))
    return write_law_report(analysis, Path(out) if out else folder / "review", overwrite=overwrite,
                            inputs=(folder / LAW_JSON,))
