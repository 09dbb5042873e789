"""The n-gram study's report: the registered verdicts, what each table buys over no table, and per domain what an
n-gram table does that the token table of the same size does not, with plots (markdown + self-contained HTML)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.experiments.plan_report import compute_block, interim_note, plan_blocks, power_blocks, reading_block
from plelab.util.pages import Block, fmt, write_pages

METRIC_NAMES = {HELDOUT_DOMAIN: "held-out split", "macro": "macro over the 16 domains"}


def _ci(r: dict[str, Any]) -> str:
    ci = r.get("ci95")
    return "-" if not ci else f"[{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}]"


def _delta(r: dict[str, Any]) -> str:
    return "-" if not r["n"] else f"{fmt(r['mean'], '+.4f')} ± {fmt(r['se'], '.4f')}"


def gain_blocks(a: dict[str, Any]) -> list[Block]:
    """Each variant against the dP = 0 baseline of the same seed (the pays question, seed-paired)."""
    rows = []
    for v in a["variants"]:
        if v == a["baseline"]:
            continue
        s = a["shapes"][v]
        for metric, r in a["gains"][v].items():
            rows.append([v, s["index"], str(s["dim"]), f"{s['table_params']:,}", str(s["rows_read_per_token"]),
                         str(s["table_params_per_token"]), METRIC_NAMES[metric], str(r["n"]), _delta(r), _ci(r),
                         r["outcome"]])
    return [("h", 2, "What each table buys over no table (description)"),
            ("p", f"Loss of each variant minus the same seed's `{a['baseline']}` run (nats; negative = the table "
                  "pays), mean ± s.e. over seeds with the 95 % t interval and the four-way outcome (margin: the "
                  "plan's). Description beside the registered tests above, uncorrected for multiplicity."),
            ("table", ["variant", "index", "dP", "table params", "rows read / token", "table values read / token",
                       "metric", "seeds", "Δ ± s.e.", "95 % CI", "outcome"], rows)]


def domain_blocks(a: dict[str, Any]) -> list[Block]:
    """Per table size and domain: n-gram minus token loss, paired by seed (description)."""
    out: list[Block] = []
    for pair in a["ngram_vs_token"]:
        rows = [[name, str(r["n"]), _delta(r), _ci(r), "yes" if r["ci95"] and r["ci95"][1] < 0 else
                 "worse" if r["ci95"] and r["ci95"][0] > 0 else "-"]
                for name, r in [*pair["overall"].items(), *pair["domains"].items()]]
        out += [("h", 2, f"dP = {pair['dim']}: {pair['ngram']} minus {pair['token']}, per domain (description)"),
                ("p", "Negative = the n-gram table does better than the token table of the same size on that "
                      "text. Per domain the 95 % interval is unadjusted for the 16 domains: a domain whose interval "
                      "excludes 0 is a lead, not a finding."),
                ("table", ["domain", "seeds", "Δ ± s.e.", "95 % CI", "n-gram better (CI < 0)?"], rows)]
    return out


def longcat_blocks(a: dict[str, Any]) -> list[Block]:
    """The registered LongCat reading, combined from its two tests' outcomes (absent when the plan lacks them)."""
    lc = a.get("longcat")
    if not lc:
        return []
    parts = ", ".join(f"{name}: {outcome}" for name, outcome in lc["outcomes"].items())
    return [reading_block("LongCat reading (n-gram >= token)", lc["reading"], lc["rule"], a["counts"].get("done", 0),
                          a["total_runs"], parts)]


def ngram_blocks(a: dict[str, Any], figures: dict[str, bytes]) -> list[Block]:
    """The whole report."""
    counts = ", ".join(f"{n} {k}" for k, n in sorted(a["counts"].items()))
    blocks: list[Block] = [("h", 1, f"N-gram study: {a['sweep']}"),
                           ("p", f"Runs: {counts} of {a['total_runs']}. Baseline: `{a['baseline']}` (dP = 0).")]
    blocks += plan_blocks(a["plan"])
    blocks += longcat_blocks(a)
    if (a["plan"] or {}).get("power"):
        blocks += power_blocks(a["plan"]["power"])
    blocks += gain_blocks(a) + domain_blocks(a)
    blocks.append(compute_block(a.get("compute"), a["counts"].get("done", 0)))
    for stem, caption in (("gains", "Gain over no table, per variant (95 % t intervals)"),
                          ("domains", "N-gram minus token loss per domain, per table size (95 % t intervals)")):
        if stem in figures:
            blocks.append(("img", stem, caption, figures[stem]))
    return blocks


def ngram_figures(a: dict[str, Any]) -> dict[str, bytes]:
    """{stem: PNG}: the gains over no table, and the per-domain n-gram minus token deltas."""
    from plelab.experiments.figures import plt, png

    out = {}
    arms = [v for v in a["variants"] if v != a["baseline"] and a["gains"][v][HELDOUT_DOMAIN]["n"] >= 2]
    if arms:
        fig, ax = plt.subplots(figsize=(7, 3.8))
        for i, v in enumerate(arms):
            for j, metric in enumerate((HELDOUT_DOMAIN, "macro")):
                r = a["gains"][v][metric]
                lo, hi = r["ci95"] or (r["mean"], r["mean"])
                ax.errorbar(i + 0.18 * (j - 0.5), -r["mean"], yerr=[[hi - r["mean"]], [r["mean"] - lo]],
                            fmt="o" if j == 0 else "s", color=f"C{j}", capsize=3,
                            label=METRIC_NAMES[metric] if i == 0 else None)
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(arms)), arms)
        ax.set_ylabel(f"gain over {a['baseline']} (nats)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out["gains"] = png(fig)
    pairs = [p for p in a["ngram_vs_token"] if any(r["n"] >= 2 for r in p["domains"].values())]
    if pairs:
        fig, ax = plt.subplots(figsize=(9, 4))
        names = a["domains"]
        for k, pair in enumerate(pairs):
            xs, ys, err = [], [], [[], []]
            for i, name in enumerate(names):
                r = pair["domains"][name]
                if r["n"] < 2:
                    continue
                lo, hi = r["ci95"]
                xs.append(i + 0.2 * (k - (len(pairs) - 1) / 2))
                ys.append(r["mean"])
                err[0].append(r["mean"] - lo)
                err[1].append(hi - r["mean"])
            ax.errorbar(xs, ys, yerr=err, fmt="o", capsize=2, label=f"dP = {pair['dim']}")
        ax.axhline(0, color="k", lw=0.8)
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("n-gram - token loss (nats)")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        out["domains"] = png(fig)
    return out


def write_ngram_report(analysis: dict[str, Any], out_dir: str | Path, *, overwrite: bool = True,
                       inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/report.md, OUT/report.html, OUT/plots/*.png and, given the records, OUT/records.json."""
    figures = ngram_figures(analysis)
    return write_pages(ngram_blocks(analysis, figures), f"plelab n-gram study: {analysis['sweep']}", out_dir,
                       figures, overwrite=overwrite, inputs=inputs, records=records)


def ngram_summary(a: dict[str, Any]) -> list[str]:
    """Lines `plelab report` prints: the registered outcomes, one per test."""
    ev = (a.get("plan") or {}).get("evaluation") or {}
    lines = [f"{r['name']}: {r['outcome']} (predicted {r['predicted'] or '-'}: {r['prediction'] or '-'})"
             for r in ev.get("results", [])]
    if a.get("longcat"):
        lines.append(f"LongCat reading (n-gram >= token): {a['longcat']['reading']}"
                     f"{interim_note(a['counts'].get('done', 0), a['total_runs'])}")
    return lines
