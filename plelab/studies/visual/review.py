"""`plelab report DIR --review` for the visual PLE study's first round: its committed report.md recomputed under the
current rules (post hoc): the eight comparisons with no visual PLE as one family, the fix, the tables' verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.diagnostics.verdict import today_names
from plelab.studies.review import (
    HEAD,
    POST_HOC,
    committed_report,
    family,
    interval,
    markdown_tables,
    parse_pm,
    summary_row,
    summary_test,
    table,
    write_review,
)
from plelab.util.pages import Block, fmt

TITLE = "Visual PLE study"
"""The committed report's first heading starts so."""


def visual_review(report_md: str, n: int = 3, effect: float = 0.002) -> dict[str, Any]:
    """The visual PLE study's committed report.md under the new rules: the eight comparisons with no visual PLE
    as one Holm family, the fix against its own corpus, the tables' verdicts beside their ablation costs."""
    tables = markdown_tables(report_md)
    loss = table(tables, "Caption loss")
    col = loss["headers"].index(next(h for h in loss["headers"] if h.startswith("Δ vs")))
    vs_none = {}
    for row in loss["rows"]:
        pm = parse_pm(row[col])
        if pm:
            vs_none[row[0]] = summary_test(*pm, n, effect)
    family(vs_none)
    fix = table(tables, "The fix")
    h = fix["headers"]
    fixes = {}
    for row in fix["rows"]:
        rank = parse_pm(row[h.index("Δ rank fraction vs reference (turned structured?)")])
        ref = parse_pm(row[h.index("Δ vs reference")])
        fixes[row[0]] = {"rank_vs_reference": summary_test(*rank, n) if rank else None,
                         "loss_vs_reference": summary_test(*ref, n) if ref else None}
    verdicts = table(tables, "The visual table")  # the first table there: the table itself
    tables_rows = [t for t in tables if t["heading"].startswith("The visual table")]
    health = tables_rows[-1] if tables_rows else verdicts
    hh = health["headers"]
    ablation = {}
    if "ablation Δ (± s.e. over seeds)" in hh:
        for row in health["rows"]:
            pm = parse_pm(row[hh.index("ablation Δ (± s.e. over seeds)")])
            ablation[row[0]] = {"table_vs_gaussian": row[hh.index("table vs Gaussian")],
                                "verdicts": today_names(row[hh.index("verdicts")]),
                                "ablation": None if pm is None else {"mean": pm[0], "se": pm[1]}}
    return {"n": n, "effect_of_interest": effect, "vs_none": vs_none, "fix": fixes, "tables": ablation}


def visual_blocks(r: dict[str, Any], folder: str) -> list[Block]:
    """The visual-PLE review as report blocks."""
    blocks: list[Block] = [("h", 1, "Visual PLE study: review under the new rules"), ("p", POST_HOC.format(dir=folder)),
                           ("h", 2, "Eight comparisons with no visual PLE, one family"),
                           ("p", "Caption-loss Δ vs `none`, paired over 3 seeds; Holm over the eight configs. Power "
                                 f"columns: the effect of interest is the published {r['effect_of_interest']:g} nats."),
                           ("table", HEAD, [summary_row(v, t) for v, t in r["vs_none"].items()])]
    rows = []
    for v, f in r["fix"].items():
        rank, loss = f["rank_vs_reference"] or {}, f["loss_vs_reference"] or {}
        rows.append([v, f"{fmt(rank.get('mean'), '+.3f')} ± {fmt(rank.get('se'), '.3f')}", fmt(rank.get("p"), ".2g"),
                     f"{fmt(loss.get('mean'), '+.4f')} ± {fmt(loss.get('se'))}", interval(loss.get("ci95")),
                     fmt(loss.get("p"), ".2g")])
    blocks += [("h", 2, "The fix against the same corpus without the aux loss"),
               ("p", "Effective-rank fraction of the table's centred change: the rule set before the runs called a "
                     "table structured when this is significantly *lower*; it is significantly *higher* (the ids "
                     "spread apart), a direction chosen after the runs. Caption loss vs the same corpus without aux."),
               ("table", ["fix", "Δ rank fraction ± s.e.", "p", "caption Δ vs features-kmeans", "95 % CI", "p"],
                rows)]
    rows = [[v, t["table_vs_gaussian"], t["verdicts"],
             "-" if not t["ablation"] else f"{fmt(t['ablation']['mean'])} ± {fmt(t['ablation']['se'])}"]
            for v, t in r["tables"].items()]
    blocks += [("h", 2, "Table verdicts beside their ablation cost"),
               ("p", "A table the spectral tests call random-like can still be read by the model: its ablation cost "
                     "says how much. λ = 1: random-like in 3/3 seeds, ablation 0.22 nats. The verdicts are the "
                     "committed report's per-run words in today's names (alive: used; dead, weak: not used, since "
                     "without the equivalence test unused and not resolved cannot be told apart)."),
               ("table", ["config", "table vs Gaussian", "verdicts", "ablation Δ ± s.e."], rows)]
    return blocks


def is_committed_visual_report(folder: str | Path) -> bool:
    """Does the folder hold the visual PLE study's committed report.md?"""
    return committed_report(folder, TITLE) is not None


def review_visual(folder: str | Path, out: str | Path | None = None, overwrite: bool = False) -> list[Path]:
    """The committed report in `folder` under the current rules: review.md, review.html, review.json."""
    folder = Path(folder)
    review = visual_review(committed_report(folder, TITLE) or "")
    return write_review(visual_blocks(review, str(folder)), review, "plelab visual PLE study: review", folder, out,
                        overwrite)
