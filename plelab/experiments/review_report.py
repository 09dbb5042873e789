"""`plelab report DIR --review`: a committed study report recomputed under the new rules (review.py), as pages.

DIR is a folder of a committed report: with law.json (the dead-zone law) the law report is regenerated into
DIR/review/ (law.md, law.html, law.json, deadzone_law.json, plots); with an FFN or visual-PLE report.md the
review is written as DIR/review.md, review.html and review.json. Everything in them is post hoc.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.experiments.review import ffn_review, upgrade_law, visual_review
from plelab.util.fs import atomic_write_bytes
from plelab.util.pages import Block, fmt, plain_data, write_pages

POST_HOC = ("Post hoc: recomputed after the runs, from the committed report's means ± s.e. over 3 seeds (the "
            "per-seed values and the sweep database were not committed), under rules that were not registered "
            "before the runs. A reviewer reruns it with `python3 -m plelab report {dir} --review`.")


def _ci(ci: Any, spec: str = "+.4f") -> str:
    return "-" if not ci else f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def _row(name: str, t: dict[str, Any], spec: str = "+.4f") -> list[str]:
    p = t.get("power") or {}
    return [name, f"{fmt(t['mean'], spec)} ± {fmt(t['se'], spec[1:])}", _ci(t["ci95"], spec), fmt(t["p"], ".2g"),
            fmt(t.get("p_holm"), ".2g"), t.get("outcome_alone", "-"), t.get("outcome", "-"),
            fmt(t.get("equivalence_bound"), spec[1:]), fmt(p.get("mde"), spec[1:]),
            str(p.get("seeds_for_effect") or "-")]


HEAD = ["comparison", "Δ ± s.e.", "95 % CI", "p", "p (Holm)", "alone", "in the family", "equivalence bound",
        "detectable |Δ| at 3 seeds", "seeds for the effect of interest"]


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
                   ("table", HEAD, [_row(v, t) for v, t in r[key].items()])]
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


def visual_blocks(r: dict[str, Any], folder: str) -> list[Block]:
    """The visual-PLE review as report blocks."""
    blocks: list[Block] = [("h", 1, "Visual PLE study: review under the new rules"), ("p", POST_HOC.format(dir=folder)),
                           ("h", 2, "Eight comparisons with no visual PLE, one family"),
                           ("p", "Caption-loss Δ vs `none`, paired over 3 seeds; Holm over the eight configs. Power "
                                 f"columns: the effect of interest is the published {r['effect_of_interest']:g} nats."),
                           ("table", HEAD, [_row(v, t) for v, t in r["vs_none"].items()])]
    rows = []
    for v, f in r["fix"].items():
        rank, loss = f["rank_vs_reference"] or {}, f["loss_vs_reference"] or {}
        rows.append([v, f"{fmt(rank.get('mean'), '+.3f')} ± {fmt(rank.get('se'), '.3f')}", fmt(rank.get("p"), ".2g"),
                     f"{fmt(loss.get('mean'), '+.4f')} ± {fmt(loss.get('se'))}", _ci(loss.get("ci95")),
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
                     "says how much. λ = 1: random-like in 3/3 seeds, ablation 0.22 nats."),
               ("table", ["config", "table vs Gaussian", "verdicts", "ablation Δ ± s.e."], rows)]
    return blocks


def run_review(folder: str | Path, out: str | Path | None = None, overwrite: bool = False) -> list[Path]:
    """Recompute the committed report in `folder` under the new rules; write the review; return the paths."""
    from plelab.experiments.law_report import write_law_report

    folder = Path(folder)
    if (folder / "law.json").is_file():
        analysis = upgrade_law(json.loads((folder / "law.json").read_text(encoding="utf-8")))
        target = Path(out) if out else folder / "review"
        return write_law_report(analysis, target, overwrite=overwrite, inputs=(folder / "law.json",))
    md = folder / "report.md"
    if not md.is_file():
        raise PlelabError(f"{folder} holds neither law.json nor report.md: give a committed study report's folder")
    text = md.read_text(encoding="utf-8")
    if text.startswith("# FFN study"):
        review = ffn_review(text)
        blocks = ffn_blocks(review, str(folder))
        title = "plelab FFN study: review"
    elif text.startswith("# Visual PLE study"):
        review = visual_review(text)
        blocks = visual_blocks(review, str(folder))
        title = "plelab visual PLE study: review"
    else:
        raise PlelabError(f"{md} is not an FFN or visual-PLE study report")
    target = Path(out) if out else folder
    paths = write_pages(blocks, title, target, {}, name="review", overwrite=overwrite, inputs=(md,))
    atomic_write_bytes(target / "review.json", json.dumps(plain_data(review), indent=1).encode())
    return [*paths, target / "review.json"]
