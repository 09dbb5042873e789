"""The visual PLE study's report: caption loss per config, the visual table beside random baselines, the fix, the
published figures, as OUT/report.md, OUT/report.html and OUT/plots/vision_delta.png, vision_table.png."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE
from plelab.studies.visual.analysis import DIAG_FILE
from plelab.util.pages import Block, fmt, pm, write_pages


def _delta(row: dict[str, Any]) -> str:
    if row.get("delta") is None:
        return "-"
    ci = row.get("delta_ci95")
    interval = f" [{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}]" if ci else ""
    p = f", p {fmt(row.get('delta_p'), '.2g')} (Holm {fmt(row.get('delta_p_holm'), '.2g')})" if row.get("delta_p") \
        is not None else ""
    return f"{fmt(row['delta'], '+.4f')} ± {fmt(row.get('delta_se'))}{interval}{p}: {row.get('outcome', 'n/a')}"


def _vs(test: dict[str, Any] | None) -> str:
    if not test or test.get("delta") is None:
        return "-"
    answer = {True: "yes", False: "no", None: "?"}[test["structured"]]
    return f"{fmt(test['delta'], '+.3f')} ± {fmt(test['se'], '.3f')} ({answer})"


def _rank(view: dict[str, Any], key: str = "effective_rank") -> str:
    return f"{fmt(view.get(key), '.1f')}/{fmt(view.get('max_rank'), '.0f')}"


def loss_blocks(a: dict[str, Any]) -> list[Block]:
    """Caption loss per config and Δ vs no visual PLE."""
    rows = [[r["variant"], r.get("tokenizer") or "-", str(r.get("ple_dim") or 0), fmt(r.get("aux_weight"), "g"),
             fmt(r.get("mi_bits"), ".3f"), str(r["n"]), pm(r["loss"], r["loss_se"]),
             "reference" if v == a["baseline"] else f"{r.get('reference', a['baseline'])}: {_delta(r)}"
             + (" (reference of another setting: Δ includes that difference)"
                if r.get("reference_same_setting") is False else "")]
            for v, r in a["rows"].items()]
    return [("h", 2, "Caption loss"),
            ("p", f"Δ is paired by seed against the config without visual PLE of the same setting (length, pixel "
                  f"path) when the sweep has one, else one of the same length, else {a['baseline']}."),
            ("table", ["config", "visual tokenizer", "dP", "aux λ", "MI(id; digit) bits", "seeds",
                       "caption loss (nats/token, ± s.e.)", "Δ vs no visual PLE (paired, ± s.e.)"], rows)]


def table_blocks(a: dict[str, Any]) -> list[Block]:
    """The visual table's statistics per config beside the random baselines, both views, and the verdicts."""
    out: list[Block] = [("h", 2, "The visual table (mean over seeds; random = Gaussian table of the same shape)")]
    for view, label in (("table", "the table itself"), ("delta", "change since initialisation, centred over the ids")):
        rows = []
        for v, r in a["rows"].items():
            t = r.get("table")
            if not t:
                continue
            s = t["views"][view]
            rows.append([v, f"{fmt(s.get('mean_abs_cosine'), '.3f')} ({fmt(s.get('random_mean_abs_cosine'), '.3f')})",
                         f"{fmt(s.get('mean_cosine'), '+.3f')}",
                         f"{_rank(s)} ({_rank(s, 'random_effective_rank')})",
                         f"{fmt(s.get('pc1_explained_variance'), '.3f')} "
                         f"({fmt(s.get('random_pc1_explained_variance'), '.3f')})"])
        if rows:
            out += [("p", f"View: {label}. Whole table (K x layers·dP); random baseline in brackets."),
                    ("table", ["config", "mean |cos| (random)", "mean cos", "effective rank (random)",
                               "PC1 variance (random)"], rows)]
    rows = [[v, t["structured"] or "-", f"{t['random_like_seeds']}/{t['diagnosed']}",
             f"{r['control']}: {_vs(r['vs_control'])}" if r.get("vs_control") else "-",
             ", ".join(f"{n} {k}" for k, n in sorted(t["verdicts"].items())),
             pm(t["ablation_delta"], t["ablation_se"]), fmt(t["injection_ratio"], ".3f")]
            for v, r in a["rows"].items() if (t := r.get("table"))]
    if rows:
        out += [("p", "Table vs Gaussian: the diagnostics' rule per seed. Vs the random-id control: paired change "
                      "in the effective-rank fraction of the centred change since initialisation (negative = more "
                      "structure than random ids), and whether it is significant (rules below)."),
                ("table", ["config", "table vs Gaussian", "random-like seeds",
                           "vs its random-id control (same setting; Δ rank fraction ± s.e.)", "verdicts",
                           "ablation Δ (± s.e. over seeds)", "injection ratio at patches"], rows)]
    return out


def fix_blocks(a: dict[str, Any]) -> list[Block]:
    """The loop-closing fix against its no-aux reference and against no visual PLE."""
    if not a["fix"]:
        return []
    rows = [[f["variant"], fmt(f["aux_weight"], "g"), f["reference"] or "-", f["reference_structured"] or "-",
             f["structured"] or "-", _vs(f.get("change_rank_vs_reference")),
             pm(f["delta_vs_reference"], f["delta_vs_reference_se"]), pm(f["delta"], f["delta_se"]),
             f.get("outcome") or "n/a"] for f in a["fix"]]
    best = a.get("best_tokenizer")
    pick = (f"Best tokenizer by MI: **{best['tokenizer']}** ({best['mi_bits']:.3f} bits)." if best
            else "Best tokenizer by MI: unknown (no tokenizer corpus but the random control has an MI in its "
                 "manifest).")
    return [("h", 2, "The fix: the ids become prediction targets"), ("p", pick),
            ("table", ["config", "λ", "reference (no aux)", "reference vs Gaussian", "fix vs Gaussian",
                       "Δ rank fraction vs reference (turned structured?)",
                       "Δ vs reference", f"Δ vs {a['baseline']}", "vs no visual PLE (Holm)"], rows)]


def published_blocks(a: dict[str, Any]) -> list[Block]:
    """SPEC §4's published figures beside ours (the tokenizer configs without the aux loss, and the fix)."""
    p = a["published"]
    rows = [["published (SPEC §4, 6,000 steps)", p["loss_delta"], f"{p['mean_cosine']:.3f}",
             f"{p['effective_rank']}/{p['max_rank']}",
             f"{p['pc1_explained_variance']} (random {p['random_pc1_explained_variance']})"]]
    for v, r in a["rows"].items():
        t = r.get("table")
        if t:
            s = t["views"]["table"]
            rows.append([v, _delta(r), fmt(s.get("mean_cosine"), "+.3f"), _rank(s),
                         f"{fmt(s.get('pc1_explained_variance'), '.3f')} "
                         f"(random {fmt(s.get('random_pc1_explained_variance'), '.3f')})"])
    return [("h", 2, "Published figures beside ours"),
            ("p", "The published table had 256 ids and a full-rank width (255.1/256); ours has K = 256 ids and "
                  "layers·dP columns, so read effective rank against its own maximum and its random baseline."),
            ("table", ["", "Δ loss vs no visual PLE", "mean cos", "effective rank", "PC1 variance"], rows)]


def vision_blocks(a: dict[str, Any], figures: dict[str, bytes]) -> list[Block]:
    """The whole report."""
    counts = ", ".join(f"{n} {k}" for k, n in sorted(a["counts"].items()))
    from plelab.experiments.plan_report import plan_blocks, power_blocks

    plan = a.get("plan") or {}
    blocks: list[Block] = [
        ("h", 1, f"Visual PLE study: {a['sweep']}"),
        ("p", f"Sweep folder `{a['folder']}`; runs: {counts} of {a['total_runs']}."),
        *plan_blocks(plan), *(power_blocks(plan["power"]) if plan.get("power") else []),
        ("h", 2, "Conclusions (post hoc unless registered above)"),
        ("list", a["conclusions"] or ["No finished runs yet."]),
    ]
    blocks += loss_blocks(a) + table_blocks(a) + fix_blocks(a) + published_blocks(a)
    blocks += [("h", 2, "Plots")] + [("img", stem, caption, figures[stem]) for stem, caption in FIGURE_CAPTIONS
                                     if stem in figures]
    blocks += [("h", 2, "Rules"), ("list", [f"{k}: {v}" for k, v in a["rules"].items()])]
    return blocks


FIGURE_CAPTIONS = (
    ("vision_delta", "Δ caption loss vs no visual PLE per config (mean ± s.e. over paired seeds; dots: seeds)"),
    ("vision_table", "Visual table statistics per config (bars) against a random Gaussian table of the same shape "
                     "(black ticks); mean over seeds"),
)


def vision_figures(a: dict[str, Any]) -> dict[str, bytes]:
    """{stem: PNG}: Δ loss with error bars, and table statistics vs random (empty where nothing to draw)."""
    from plelab.experiments.figures import plt, png

    out = {}
    rows = [r for v, r in a["rows"].items() if v != a["baseline"] and r.get("delta") is not None]
    if rows:
        fig, ax = plt.subplots(figsize=(8, 4.2))
        x = list(range(len(rows)))
        ax.errorbar(x, [r["delta"] for r in rows], yerr=[_nan0(r.get("delta_se")) for r in rows], fmt="o",
                    color="k", capsize=4, zorder=3)
        for i, r in enumerate(rows):
            base = a["rows"].get(r.get("reference", a["baseline"]), {}).get("per_seed", {})
            seeds = [r["per_seed"][s] - base[s] for s in r["per_seed"] if s in base]
            ax.scatter([i] * len(seeds), seeds, s=12, color="0.55", zorder=2)
        ax.axhline(0, color="k", lw=0.8)
        ax.axhspan(-0.002, 0.002, color="tab:red", alpha=0.12, label="published |Δ| ≤ 0.002")
        ax.set_xticks(x, [r["variant"] for r in rows], rotation=30, ha="right")
        ax.set_ylabel("caption loss − no visual PLE (nats/token)")
        ax.set_title("Δ caption loss vs no visual PLE (negative = visual PLE helps)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        out["vision_delta"] = png(fig)
    rows = [r for r in a["rows"].values() if r.get("table")]
    if rows:
        fig, axes = plt.subplots(1, 3, figsize=(12, 4))
        for ax, key, label in zip(axes, ("mean_abs_cosine", "effective_rank", "pc1_explained_variance"),
                                  ("mean |cos|", "effective rank / max", "PC1 variance fraction"), strict=True):
            views = [r["table"]["views"]["table"] for r in rows]
            scale = [(_nan0(s.get("max_rank")) or 1.0) if key == "effective_rank" else 1.0 for s in views]
            x = list(range(len(rows)))
            ax.bar(x, [_nan0(s.get(key)) / k for s, k in zip(views, scale, strict=True)], color="tab:blue")
            ax.scatter(x, [_nan0(s.get(f"random_{key}")) / k for s, k in zip(views, scale, strict=True)],
                       marker="_", s=300, color="k", zorder=3, label="random")
            ax.set_xticks(x, [r["variant"] for r in rows], rotation=45, ha="right", fontsize=8)
            ax.set_title(label)
            ax.grid(alpha=0.3, axis="y")
        axes[0].legend(fontsize=8)
        out["vision_table"] = png(fig)
    return out


def write_vision_report(analysis: dict[str, Any], out_dir: str | Path, *, overwrite: bool = True,
                        inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/report.md, OUT/report.html, the PNGs under OUT/plots/ and, given the study's records,
    OUT/records.json; return the paths."""
    figures = vision_figures(analysis)
    return write_pages(vision_blocks(analysis, figures), f"plelab visual PLE study: {analysis['sweep']}", out_dir,
                       figures, overwrite=overwrite, inputs=inputs, records=records)


def vision_report_inputs(folder: str | Path) -> tuple[Path, ...]:
    """Files the report reads from the sweep folder (its output must be none of them)."""
    folder = Path(folder)
    return folder / DB_FILE, folder / RESOLVED_FILE, folder / DIAG_FILE


def _nan0(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else 0.0
