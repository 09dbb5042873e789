"""`plelab report DIR --review` for the FFN study's first round: its committed report.md recomputed under the current
rules (post hoc): the variants as one Holm family per metric, the domains per variant, the gap timeline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab import stats
from plelab.studies.review import (
    HEAD,
    POST_HOC,
    committed_report,
    family,
    markdown_tables,
    parse_pm,
    summary_row,
    summary_test,
    table,
    write_review,
)
from plelab.util.pages import Block, fmt

TITLE = "FFN study"
"""The committed report's first heading starts so."""


def ffn_review(report_md: str, n: int = 3, effect: float = 0.041) -> dict[str, Any]:
    """The FFN study's committed report.md under the new rules (module doc): variants, domains, timeline."""
    tables = markdown_tables(report_md)
    variants = table(tables, "Variants")
    h = variants["headers"]
    col = {name: h.index(name) for name in h}
    macro, val = {}, {}
    for row in variants["rows"]:
        name = row[0]
        if "baseline" in name:
            continue
        for out, key in ((macro, "macro Δ loss (nats) ± s.e."), (val, "Δ val (held-out)")):
            pm = parse_pm(row[col[key]])
            if pm:
                out[name] = summary_test(*pm, n, effect)
    family(macro)
    family(val)
    domains = table(tables, "Per-domain Δ vs `swiglu` (loss)")
    names = domains["headers"][1:]
    per_domain: dict[str, dict[str, Any]] = {v: {} for v in names}
    for row in domains["rows"]:
        dom = row[0]
        if dom.startswith(("val", "macro")):
            continue
        for v, cell in zip(names, row[1:], strict=True):
            pm = parse_pm(cell)
            if pm:
                per_domain[v][dom] = summary_test(*pm, n)
    domain_counts = {}
    for v, cells in per_domain.items():
        family(cells)
        domain_counts[v] = {"positive": sum(c["mean"] > 0 for c in cells.values()), "total": len(cells),
                            "worse_alone": sum(c["outcome_alone"] == "worse" for c in cells.values()),
                            "better_alone": sum(c["outcome_alone"] == "better" for c in cells.values()),
                            "worse_holm": sum(c["outcome"] == "worse" for c in cells.values()),
                            "better_holm": sum(c["outcome"] == "better" for c in cells.values()),
                            "old_sign_test_p": stats.sign_test_p(sum(c["mean"] > 0 for c in cells.values()),
                                                                 sum(c["mean"] < 0 for c in cells.values()))}
    timeline = table(tables, "Gap timeline")
    tnames = timeline["headers"][1:]
    gaps: dict[str, list[dict[str, Any]]] = {v: [] for v in tnames}
    for row in timeline["rows"]:
        for v, cell in zip(tnames, row[1:], strict=True):
            pm = parse_pm(cell)
            if pm and pm[1] > 0:
                t = summary_test(*pm, n)
                t["tokens"] = row[0]
                t["status"] = "open" if t["p"] is not None and t["p"] < 0.05 else "not resolved"
                gaps[v].append(t)
    return {"n": n, "effect_of_interest": effect, "macro": macro, "val": val, "domains": per_domain,
            "domain_counts": domain_counts, "timeline": gaps,
            "first_open": {v: next((g for g in pts if g["status"] == "open"), None) for v, pts in gaps.items()}}




def ffn_blocks(r: dict[str, Any], folder: str) -> list[Block]:
    """The FFN review as report blocks."""
    blocks: list[Block] = [("h", 1, "FFN study: review under the new rules"), ("p", POST_HOC.format(dir=folder)),
                           ("p", "Columns: the paired t test over 3 seeds (p), Holm over the six variants (one family "
                                 "per metric), the outcome alone and in the family (worse / better / not resolved: no "
                                 "margin was registered, so nothing can be called equivalent), the equivalence bound "
                                 "(the smallest margin TOST would accept: the 90 % interval's largest |end|), and "
                                 f"power: the |Δ| 3 seeds detect with 80 % power and the seeds needed for the "
                                 f"published effect {r['effect_of_interest']:g} nats (sd = s.e. × √3).")]
    for key, label in (("val", "held-out split `val`"), ("macro", "16-domain macro")):
        blocks += [("h", 2, f"Variants vs `swiglu`: {label}"),
                   ("table", HEAD, [summary_row(v, t) for v, t in r[key].items()])]
    rows = [[v, f"{c['positive']}/{c['total']}", fmt(c["old_sign_test_p"], ".2g"), str(c["worse_alone"]),
             str(c["better_alone"]), str(c["worse_holm"]), str(c["better_holm"])]
            for v, c in r["domain_counts"].items()]
    blocks += [("h", 2, "Domains"),
               ("p", "Domains with Δ > 0 describe consistency of direction; the old rule's sign-test p treated the 16 "
                     "domains, scored on the same 3 runs, as independent samples and is shown only to be retired. "
                     "Per-domain tests: alone, and Holm over the 16 domains of a variant."),
               ("table", ["variant", "domains Δ > 0", "old sign-test p (not a valid test)", "worse (alone)",
                          "better (alone)", "worse (Holm)", "better (Holm)"], rows)]
    rows = []
    for v, pts in r["timeline"].items():
        for g in pts:
            rows.append([v, g["tokens"], f"{fmt(g['mean'], '+.4f')} ± {fmt(g['se'])}", fmt(g["t"], "+.1f"),
                         fmt(g["p"], ".2g"), g["status"]])
    blocks += [("h", 2, "Gap timeline"),
               ("p", "Each timeline point's paired macro gap; open = significant at 5 % on its own (the study's rule, "
                     "no correction over the 8 points). Closed cannot be said of any point: no margin was "
                     "registered. First open per variant: " + "; ".join(
                         f"{v} {g['tokens']} ({fmt(g['mean'], '+.4f')}, p {fmt(g['p'], '.2g')})" if g else
                         f"{v} never" for v, g in r["first_open"].items()) + "."),
               ("table", ["variant", "tokens", "gap ± s.e.", "t", "p", "status"], rows)]
    return blocks


def is_committed_ffn_report(folder: str | Path) -> bool:
    """Does the folder hold the FFN study's committed report.md?"""
    return committed_report(folder, TITLE) is not None


def review_ffn(folder: str | Path, out: str | Path | None = None, overwrite: bool = False) -> list[Path]:
    """The committed report in `folder` under the current rules: review.md, review.html, review.json."""
    folder = Path(folder)
    review = ffn_review(committed_report(folder, TITLE) or "")
    return write_review(ffn_blocks(review, str(folder)), review, "plelab FFN study: review", folder, out, overwrite)
