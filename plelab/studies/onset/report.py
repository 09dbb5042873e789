"""The third round's report: each width's registered outcomes, then the gain of every dP against tokens per
non-embedding parameter (table and plot), markdown + self-contained HTML."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.experiments.plan_report import compute_block, interim_note, plan_blocks, reading_block
from plelab.util.pages import Block, fmt, write_pages


def gain_table(w: dict[str, Any]) -> Block:
    """One row per (dP, timeline step): tokens per parameter both ways, and the paired gain with its interval."""
    rows = [[str(r["ple_dim"]), f"1/{round(1 / r['ratio'])}", str(r["step"]), f"{r['tokens'] / 1e6:.2f}M",
             f"{r['tokens_per_param']:.1f}", f"{r['tokens_per_non_embedding']:.1f}", str(r["n"]),
             f"{fmt(r['gain'], '+.4f')}" + (f" [{fmt(r['ci95'][0], '+.4f')}, {fmt(r['ci95'][1], '+.4f')}]"
                                            if r["ci95"] else ""), r.get("outcome") or "-"]
            for r in w["gains"]]
    return ("table", ["dP", "dP/H", "step", "tokens", "tokens / parameter", "tokens / non-embedding parameter",
                      "seeds", "gain over dP = 0 (95 % CI)", "point outcome (unadjusted)"], rows)


def _where(first: dict[str, Any] | None) -> str:
    if first is None:
        return "not at any point"
    return (f"{first['tokens_per_non_embedding']:.0f} (step {first['step']:,}"
            f"{', and every later point' if first['stays'] else ', not every later point'})")


def crossing_block(w: dict[str, Any]) -> list[Block]:
    """Where each dP's gain curve enters the margin: description beside the registered end-of-run tests."""
    if not w.get("crossings"):
        return []
    m = w["crossings"][0]["margin"]
    rows = [[str(c["ple_dim"]), f"1/{round(1 / c['ratio'])}", _where(c["below_margin"]), _where(c["equivalent"]),
             f"{fmt(c['last']['gain'], '+.4f')} at {c['last']['tokens_per_non_embedding']:.0f}: "
             f"{c['last']['outcome'] or '-'}"] for c in w["crossings"]]
    return [("p", f"Where the curve enters the margin (description, unadjusted, defined after the round's first seed "
                  f"had finished: post hoc): the first evaluation at which the mean gain lies below +{m:g} nats, and "
                  f"the first at which its 90 % interval lies inside +-{m:g} with nothing resolved (the point's "
                  "outcome is equivalent), in tokens per non-embedding parameter. The registered tests above grade "
                  "the predictions; this only says where along one schedule the curve went."),
            ("table", ["dP", "dP/H", "gain first below the margin", "first point equivalent", "last point"], rows)]


def reading_blocks(w: dict[str, Any]) -> list[Block]:
    """A width's registered dead-zone reading, combined from its tests' outcomes (absent when the plan lacks them)."""
    r = w.get("reading")
    if not r:
        return []
    return [reading_block(f"Dead-zone reading at H = {w['hidden_size']}", r["reading"], r["rule"], w["runs_done"],
                          w.get("total_runs"))]


def onset_blocks(a: dict[str, Any], figures: dict[str, bytes]) -> list[Block]:
    """The whole report."""
    blocks: list[Block] = [("h", 1, "Where the dead zone begins"),
                           ("p", "Each width is its own registered sweep; its registered outcomes come first. The gain "
                                 "table and plot that follow are description: each point is one evaluation of the "
                                 "held-out split inside a run's cosine schedule (not a run of that length), the gain "
                                 "the paired loss(dP = 0) - loss(dP) over seeds with its 95 % t interval. Tokens per "
                                 "parameter are given on the dP = 0 model's parameters, and on them without the tied "
                                 "embedding.")]
    for w in a["widths"]:
        blocks += [("h", 2, f"H = {w['hidden_size']} ({w['sweep']}: {w['runs_done']} runs done; "
                            f"{w['params']:,} parameters, {w['non_embedding']:,} without the embedding)")]
        blocks += plan_blocks(w["plan"]) + reading_blocks(w)
        if w["gains"]:
            blocks += [("h", 3, "Gain against tokens (description)"), gain_table(w), *crossing_block(w)]
        blocks.append(compute_block(w.get("compute"), w["runs_done"]))
    if "gain_vs_tokens" in figures:
        blocks.append(("img", "gain_vs_tokens", "Paired gain over dP = 0 against tokens per non-embedding parameter "
                                                "(one line per width and dP; 95 % t intervals)",
                       figures["gain_vs_tokens"]))
    return blocks


def onset_figures(a: dict[str, Any]) -> dict[str, bytes]:
    """{stem: PNG}: gain against tokens per non-embedding parameter, one line per (width, dP)."""
    from plelab.experiments.figures import plt, png

    series = [(w["hidden_size"], dim, [r for r in w["gains"] if r["ple_dim"] == dim])
              for w in a["widths"] for dim in sorted({r["ple_dim"] for r in w["gains"]})]
    if not series:
        return {}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for k, (h, dim, rows) in enumerate(series):
        x = [r["tokens_per_non_embedding"] for r in rows]
        y = [r["gain"] for r in rows]
        err = [[r["gain"] - r["ci95"][0] if r["ci95"] else 0 for r in rows],
               [r["ci95"][1] - r["gain"] if r["ci95"] else 0 for r in rows]]
        ax.errorbar(x, y, yerr=err, fmt="o-" if h == max(s[0] for s in series) else "s--", capsize=2, ms=3,
                    color=f"C{k % 10}", label=f"H = {h}, dP = {dim} (1/{round(h / dim)})")
    ax.axhline(0, color="k", lw=0.8)
    margins = {((w.get("plan") or {}).get("evaluation") or {}).get("margin") for w in a["widths"]} - {None}
    if len(margins) == 1:  # the plans' own margin (both widths register the same one)
        m = margins.pop()
        ax.axhspan(-m, m, color="0.85", zorder=0, label=f"the registered margin, +-{m:g}")
    ax.set_xscale("log")
    ax.set_xlabel("training tokens per non-embedding parameter")
    ax.set_ylabel("gain over dP = 0 (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return {"gain_vs_tokens": png(fig)}


def write_onset_report(analysis: dict[str, Any], out_dir: str | Path, *, overwrite: bool = True,
                       inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/report.md, OUT/report.html, OUT/plots/gain_vs_tokens.png and, given the records, OUT/records.json."""
    figures = onset_figures(analysis)
    return write_pages(onset_blocks(analysis, figures), "plelab: where the dead zone begins", out_dir, figures,
                       overwrite=overwrite, inputs=inputs, records=records)


def onset_summary(a: dict[str, Any]) -> list[str]:
    """One line per registered test of every width."""
    out = []
    for w in a["widths"]:
        for r in ((w["plan"] or {}).get("evaluation") or {}).get("results", []):
            out.append(f"H={w['hidden_size']} {r['name']}: {r['outcome']} (predicted {r['predicted'] or '-'}: "
                       f"{r['prediction'] or '-'})")
        if w.get("reading"):
            out.append(f"H={w['hidden_size']} dead-zone reading: {w['reading']['reading']}"
                       f"{interim_note(w['runs_done'], w.get('total_runs'))}")
    return out
