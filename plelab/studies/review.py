"""Reviews of committed study reports whose sweep folders are gone: what every study's review shares.

A first-round report committed its tables (means ± s.e. over seeds), not its per-seed values or its database.
From such a table a review recomputes what the numbers allow under the current rules: t, p, 95 % intervals,
Holm over a study's comparisons, the equivalence bound (the smallest margin TOST would accept) and the power
of each comparison (sd = s.e. x sqrt(n)). Not recomputable: anything per seed, the trained criterion, the
evaluation noise. Each study's own review (plelab.studies.<name>.review) reads its tables with these helpers;
everything a review prints is post hoc: the rules are applied after the runs, to data made under the old ones.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.errors import PlelabError
from plelab.util.fs import atomic_write_bytes
from plelab.util.pages import Block, fmt, plain_data, write_pages

PM = re.compile(r"([+\-−]?\d+(?:\.\d+)?)\s*±\s*(\d+(?:\.\d+)?)")


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


POST_HOC = ("Post hoc: recomputed after the runs, from the committed report's means ± s.e. over 3 seeds (the "
            "per-seed values and the sweep database were not committed), under rules that were not registered "
            "before the runs. A reviewer reruns it with `python3 -m plelab report {dir} --review`.")


def interval(ci: Any, spec: str = "+.4f") -> str:
    """'[lo, hi]' of a 95 % interval ('-' without one)."""
    return "-" if not ci else f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def summary_row(name: str, t: dict[str, Any], spec: str = "+.4f") -> list[str]:
    """One comparison of a family as a table row under HEAD."""
    p = t.get("power") or {}
    return [name, f"{fmt(t['mean'], spec)} ± {fmt(t['se'], spec[1:])}", interval(t["ci95"], spec), fmt(t["p"], ".2g"),
            fmt(t.get("p_holm"), ".2g"), t.get("outcome_alone", "-"), t.get("outcome", "-"),
            fmt(t.get("equivalence_bound"), spec[1:]), fmt(p.get("mde"), spec[1:]),
            str(p.get("seeds_for_effect") or "-")]


HEAD = ["comparison", "Δ ± s.e.", "95 % CI", "p", "p (Holm)", "alone", "in the family", "equivalence bound",
        "detectable |Δ| at 3 seeds", "seeds for the effect of interest"]


def write_review(blocks: Sequence[Block], review: dict[str, Any], title: str, folder: Path,
                 out: str | Path | None, overwrite: bool) -> list[Path]:
    """Write the review beside the committed report (or into `out`): review.md, review.html, review.json."""
    target = Path(out) if out else folder
    paths = write_pages(blocks, title, target, {}, name="review", overwrite=overwrite, inputs=(folder / "report.md",))
    atomic_write_bytes(target / "review.json", json.dumps(plain_data(review), indent=1).encode())
    return [*paths, target / "review.json"]


def committed_report(folder: str | Path, title: str) -> str | None:
    """The text of FOLDER/report.md when it is a committed report whose first line is `# {title}...`, else None."""
    md = Path(folder) / "report.md"
    if not md.is_file():
        return None
    text = md.read_text(encoding="utf-8")
    return text if text.startswith(f"# {title}") else None
