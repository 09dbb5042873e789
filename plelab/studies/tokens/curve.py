"""The gain of each PLE width against training tokens: one sweep whose groups differ only in training length.

A sweep that crosses dP with several training lengths (its [variants] set max_steps) holds, per length, each
seed's paired gain of every dP over the same seed's dP = 0 run. This module lines those gains up against the
tokens each length trained on, so one table and one plot show whether a gain shrinks, holds or grows with
training. Each point is a paired mean over seeds with its 95 % t interval; points of one dP at different lengths
come from different runs (independent), points at one length share their dP = 0 runs (not independent).
"""

from __future__ import annotations

import math
from typing import Any

from plelab.util.pages import Block, fmt


def training_lengths(groups: list[dict[str, Any]]) -> dict[int, dict[str, Any]] | None:
    """{training tokens: group} when every group's runs trained one length and the groups' lengths differ (at least
    two); None otherwise. groups: [{"runs": [{"tokens", ...}], ...}] (analysis.analyze_sweep's groups)."""
    lengths: dict[int, dict[str, Any]] = {}
    for g in groups:
        tokens = {r.get("tokens") for r in g.get("runs", [])}
        if len(tokens) != 1 or not isinstance(next(iter(tokens)), int):
            return None  # a group mixing lengths (or without recorded tokens) is not one point on the axis
        lengths.setdefault(next(iter(tokens)), g)
    if len(lengths) < 2 or len(lengths) != len(groups):
        return None
    return lengths


def gain_vs_tokens(groups: list[dict[str, Any]], key: str = "heldout") -> dict[str, Any] | None:
    """{"key", "rows": [{"group", "tokens", "ple_dim", "gain", "ci95", "n"}]} over groups of distinct training
    lengths (gain = dP = 0 loss minus dP loss, positive = PLE helps), or None with fewer than two lengths."""
    lengths = training_lengths(groups)
    if lengths is None:
        return None
    rows = []
    for tokens, g in sorted(lengths.items()):
        for r in (g.get("paired") or {}).get(key) or []:
            ci = r.get("ci95")
            rows.append({"group": g["key"], "tokens": tokens, "ple_dim": r["ple_dim"], "n": r["n"],
                         "gain": -r["delta_mean"] if _finite(r.get("delta_mean")) else None,
                         "gain_se": r.get("delta_se"),
                         "ci95": [-ci[1], -ci[0]] if ci else None})
    return {"key": key, "rows": rows} if rows else None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def tokens_blocks(curve: dict[str, Any] | None, png: bytes | None) -> list[Block]:
    """The gain-against-tokens table (one row per dP, one column per length) and its plot."""
    if not curve:
        return []
    lengths = sorted({(r["tokens"], r["group"]) for r in curve["rows"]})
    dims = sorted({r["ple_dim"] for r in curve["rows"]})
    cell = {(r["ple_dim"], r["tokens"]): r for r in curve["rows"]}
    rows = []
    for d in dims:
        row = [str(d)]
        for tokens, _ in lengths:
            r = cell.get((d, tokens))
            ci = (r or {}).get("ci95")
            row.append("-" if not r or r["gain"] is None else
                       f"{fmt(r['gain'], '+.4f')} [{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}] (n {r['n']})"
                       if ci else f"{fmt(r['gain'], '+.4f')} (n {r['n']})")
        rows.append(row)
    metric = "the held-out split" if curve["key"] == "heldout" else curve["key"]
    out: list[Block] = [
        ("h", 2, "Gain against tokens"),
        ("p", f"Gain of each dP over the same seed's dP = 0 run on {metric} (nats, positive = PLE helps), mean over "
              "seeds with its 95 % t interval, at each training length. Description, not a test: the registered "
              "analysis (if any) says which comparisons are tests."),
        ("table", ["dP", *[f"{t / 1e6:.2f}M tokens ({g})" for t, g in lengths]], rows)]
    if png:
        out.append(("img", "gain_vs_tokens", "Gain of each dP against training tokens (95 % t intervals)", png))
    return out


def gain_vs_tokens_png(curve: dict[str, Any] | None) -> bytes | None:
    """The plot: gain against tokens (log axis), one line per dP, 95 % intervals as error bars."""
    if not curve:
        return None
    from plelab.experiments.figures import dim_colors, plt, png

    dims = sorted({r["ple_dim"] for r in curve["rows"]})
    colors = dim_colors(dims)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, d in enumerate(dims):
        rows = sorted((r for r in curve["rows"] if r["ple_dim"] == d and r["gain"] is not None),
                      key=lambda r: r["tokens"])
        if not rows:
            continue
        x = [r["tokens"] * (1 + 0.03 * (i - len(dims) / 2)) for r in rows]  # spread the bars apart a little
        y = [r["gain"] for r in rows]
        err = [[r["gain"] - r["ci95"][0] if r["ci95"] else 0 for r in rows],
               [r["ci95"][1] - r["gain"] if r["ci95"] else 0 for r in rows]]
        ax.errorbar(x, y, yerr=err, fmt="o-", color=colors[d], capsize=3, label=f"dP {d}")
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("gain over dP = 0 (nats)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return png(fig)
