"""Reviews of the studies whose run folders are gone: recompute what the committed files allow, under the new rules.

The first round's studies committed their reports, not their sweep databases. What each committed file holds
decides what can be recomputed:

- docs/deadzone-law/law.json: every width's per-seed paired deltas, the ablation means and verdict counts per
  dP, the early rule's confusion matrices and rank correlations. `upgrade_law` recomputes from it the per-dP
  p values, the per-seed dose-response slopes, the collapse test against its simulated nulls, the early rule
  beside the base-rate rule, the dP/H ranker beside the early signals, and the law on every measured width.
  Not recomputable: the new trained criterion (the loss curves are not committed) and the evaluation noise.
- docs/ffn-study/report.md, docs/visual-ple-study/report.md: means ± s.e. over 3 seeds, no per-seed value.
  `summary_review` recomputes t, p, 95 % intervals, Holm over the study's comparisons, the equivalence bound
  (the smallest margin TOST would accept) and the power of each comparison (sd = s.e. x sqrt(n)). Not
  recomputable: anything per seed (seed-level sign tests, dose slopes), the new trained criterion, the noise.

Everything here is post hoc: the rules are applied after the runs, to data made under the old ones.
"""

from __future__ import annotations

import math
import re
from typing import Any

from plelab import stats
from plelab.errors import PlelabError

PM = re.compile(r"([+\-−]?\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)")


# ------------------------------------------------------------------------------------------------ the law
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
    from plelab.diagnostics.early import TRIVIAL_RANKER
    from plelab.experiments.analysis import PAIRED_RULE
    from plelab.experiments.law import TRAINED_RULE, collapse

    out = {**analysis, "widths": [], "paired_rule": PAIRED_RULE,
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


# ------------------------------------------------------------------------------------------------ summary tables
def parse_pm(text: str) -> tuple[float, float] | None:
    """(mean, s.e.) from a report cell such as '+0.0124 ± 0.0069 ▲' (None when the cell holds none)."""
    m = PM.search(text or "")
    if not m:
        return None
    return float(m.group(1).replace("−", "-")), float(m.group(2))


def markdown_tables(text: str) -> list[dict[str, Any]]:
    """Every pipe table of a markdown text: {"heading": last heading above it, "headers", "rows"}."""
    tables, heading, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|") and i + 1 < len(lines) and set(lines[i + 1].replace("|", "").strip()) <= set("-: "):
            headers = _cells(line)
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(_cells(lines[i]))
                i += 1
            tables.append({"heading": heading, "headers": headers, "rows": rows})
            continue
        i += 1
    return tables


def _cells(line: str) -> list[str]:
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def table(tables: list[dict[str, Any]], heading: str) -> dict[str, Any]:
    """The first table under a heading starting with `heading`."""
    for t in tables:
        if t["heading"].startswith(heading):
            return t
    raise PlelabError(f"the committed report has no table under a heading '{heading}...'")


def summary_test(mean: float, se: float, n: int, effect: float | None = None) -> dict[str, Any]:
    """t test, 95 % interval, the equivalence bound and power, from a mean ± s.e. over n seeds."""
    c = stats.compare(mean, se, n)
    ci90 = stats.t_interval(mean, se, n, 0.90)
    sd = se * math.sqrt(n)
    return {"mean": mean, "se": se, "n": n, "t": c["t"], "p": c["p"], "ci95": c["ci95"],
            "equivalence_bound": None if ci90 is None else max(abs(ci90[0]), abs(ci90[1])),
            "power": stats.plan_power(sd, n, effect) if sd > 0 else None}


def family(tests: dict[str, dict[str, Any]], alpha: float = 0.05) -> None:
    """Holm over a family of summary tests, in place: p_holm and the outcome (worse / better / not resolved)."""
    names = list(tests)
    adjusted = stats.holm([tests[k]["p"] for k in names], alpha)["adjusted"]
    for k, p in zip(names, adjusted, strict=True):
        t = tests[k]
        t["p_holm"] = p
        t["outcome_alone"] = _outcome(t["mean"], t["p"], alpha)
        t["outcome"] = _outcome(t["mean"], p, alpha)


def _outcome(mean: float, p: float | None, alpha: float) -> str:
    if p is None:
        return "n/a"
    return "not resolved" if p >= alpha else ("worse" if mean > 0 else "better")


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
                                "verdicts": row[hh.index("verdicts")],
                                "ablation": None if pm is None else {"mean": pm[0], "se": pm[1]}}
    return {"n": n, "effect_of_interest": effect, "vs_none": vs_none, "fix": fixes, "tables": ablation}
