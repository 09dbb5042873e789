"""The sweep report: one list of blocks (headings, text, tables, figures) rendered as markdown and as HTML.

report.html is self-contained: figures are embedded as base64 data: URIs and the style sheet is inline.
report.md links the same figures as PNG files under plots/ next to it.
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.experiments.analysis import NOISE_SIGMAS
from plelab.experiments.tables import html_table, markdown_table
from plelab.util.fs import atomic_write_bytes, check_output_path

# ("h", level, text) | ("p", text) | ("list", items) | ("table", headers, rows) | ("img", stem, caption, png)
Block = tuple

CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}img{max-width:100%}
figure{margin:1.5em 0}figcaption{color:#555;font-size:13px}code{background:#f3f3f3;padding:0 3px}"""


def fmt(x: Any, spec: str = ".4f") -> str:
    """A number for a table cell ('-' for missing)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    return format(x, spec)


def pm(mean: Any, std: Any, spec: str = ".4f") -> str:
    """mean +- std."""
    return f"{fmt(mean, spec)} ± {fmt(std, spec)}" if std is not None else fmt(mean, spec)


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "-"


def config_blocks(cfg: dict[str, Any], grid: dict[str, list[Any]]) -> list[Block]:
    """What was trained, in one table (the first run's config; the grid says what varies)."""
    if not cfg:
        return []
    m, ple = cfg.get("model", {}), cfg.get("model", {}).get("ple", {})
    tokens = cfg.get("batch_size", 0) * cfg.get("grad_accum", 1) * (cfg.get("seq_len") or m.get("max_seq_len", 0))
    form = ("Gemma form (input gate" + (", context path" if ple.get("context") else "") + ")"
            if ple.get("gate") == "input" else f"simple form ({ple.get('gate')} gate, init {ple.get('gate_init')})")
    rows = [
        ["model", f"H={m.get('hidden_size')}, {m.get('num_layers')} layers, {m.get('num_heads')} heads, "
                  f"FFN {m.get('ffn', {}).get('intermediate_size')}, vocab {m.get('vocab_size')}"],
        ["PLE", f"{form}, output RMSNorm {'on' if ple.get('output_norm') else 'off'}"],
        ["training", f"{cfg.get('max_steps')} steps x {tokens:,} tokens = {cfg.get('max_steps', 0) * tokens:,} tokens, "
                     f"lr {cfg.get('lr')}, warmup {cfg.get('warmup_steps')}"],
        ["data", f"{cfg.get('data')}; eval {cfg.get('eval_data') or 'held-out split'} "
                 f"(<= {cfg.get('eval_tokens'):,} tokens per domain)"],
        ["diagnostics", f"every {cfg.get('diagnostics_every')} steps; early warning at "
                        f"{cfg.get('early_warning_fraction', 0):.0%} of training"],
    ]
    rows.insert(0, ["grid", "; ".join(f"{k} = {v}" for k, v in grid.items()) or "-"])
    return [("h", 2, "Setup"), ("table", ["", "setting"], rows)]


def seed_table_blocks(g: dict[str, Any]) -> list[Block]:
    """The seed's table with noise, the step classification, the rule and the conclusion."""
    ref = g["reference_dim"]
    rows = [[str(r["ple_dim"]), f"{r['params_added']:,}", fmt(r["pct_of_base"], ".1f") + " %", str(r["n"]),
             pm(r["loss_mean"], r["loss_std"]),
             "-" if r["ple_dim"] == ref else f"{fmt(r['delta'], '+.4f')} ± {fmt(r['delta_se'])}",
             "-" if r["ple_dim"] == ref else {True: "yes", False: "no", None: "?"}[r["significant"]]]
            for r in g["table"]]
    steps = [[f"{s['from']} → {s['to']}", fmt(s["delta"], "+.4f"), fmt(s["noise"]), fmt(s["z"], "+.1f"),
              fmt(s["gain_per_doubling"], "+.4f"), s["class"]] for s in g["steps"]]
    return [
        ("h", 2, "Loss vs dP (the seed's table)"),
        ("table", ["dP", "added params", "% of base", "seeds", "loss (mean ± seed std)",
                   f"Δ vs dP={ref} (± s.e.)", f"|Δ| > {NOISE_SIGMAS:g} s.e.?"], rows),
        ("h", 2, "Steps between consecutive dP values"),
        ("table", ["step", "Δ loss", "noise (s.e.)", "z", "gain per doubling", "class"], steps),
        ("p", "Rule:"), ("list", g.get("rules") or []),
        ("p", f"**Conclusion:** {g['conclusion']['text']}."),
    ]


def paired_blocks(g: dict[str, Any]) -> list[Block]:
    """Paired deltas: each seed's dP run against the same seed's dP = 0 run (same trunk init and data order)."""
    paired = g.get("paired") or {}
    out: list[Block] = []
    for key, label in (("heldout", "held-out split"), ("loss", "macro over the evaluation domains")):
        rows = [[str(r["ple_dim"]), str(r["n"]), f"{fmt(r['delta_mean'], '+.4f')} ± {fmt(r['delta_se'])}",
                 {True: "yes", False: "no", None: "?"}[r["gain_significant"]]] for r in paired.get(key) or []]
        if rows:
            out += [("h", 2, f"Paired Δ vs dP=0, same seed ({label})"),
                    ("table", ["dP", "seed pairs", "Δ (mean ± s.e. of the per-seed deltas)",
                               "significant gain (paired t, 5 %)?"], rows)]
    return out


def domain_blocks(g: dict[str, Any]) -> list[Block]:
    """Per-domain loss at the reference dP and the change at every other dP."""
    dom = g.get("domains") or {}
    if not dom.get("rows"):
        return []
    dims = dom["dims"]
    rows = [[r["domain"], fmt(r["mean"][0])] + [fmt(d, "+.4f") for d in r["delta"][1:]] for r in dom["rows"]]
    rows.append(["domains improved", ""] + [f"{n}/{len(dom['rows'])}" for n in dom["improved_domains"][1:]])
    return [("h", 2, "Per-domain final loss"),
            ("p", f"Loss at dP={dims[0]} and the change at each dP (mean over seeds; negative = better)."),
            ("table", ["domain", f"dP={dims[0]}"] + [f"Δ dP={d}" for d in dims[1:]], rows)]


def verdict_blocks(g: dict[str, Any]) -> list[Block]:
    """Early-warning vs final diagnostics verdicts per dP."""
    v = g.get("verdicts") or {}
    if not v.get("rows"):
        return []
    rows = [[str(r["ple_dim"]), _counts(r["final"]), f"{_counts(r['early'])} (step {r['early_step']})",
             _counts(r["early_proxy"]), f"{r['early_agrees']}/{r['compared']}",
             f"{r['early_proxy_agrees']}/{r['compared']}",
             pm(r["ablation_early"]["mean"], r["ablation_early"]["std"]),
             pm(r["ablation_final"]["mean"], r["ablation_final"]["std"]),
             pm(r["injection_ratio"]["mean"], r["injection_ratio"]["std"], ".3f"),
             {True: "yes", False: "no", None: "?"}[r["loss_gain_significant"]]] for r in v["rows"]]
    n = v["compared"]
    return [
        ("h", 2, "PLE verdicts: early warning vs end of training"),
        ("p", "Verdicts from the PLEMonitor diagnostics (RUN_DIR/diagnostics/early.json and final.json): alive / "
              "weak / dead by the ablation rule of `plelab diagnose` (loss with PLE switched off minus loss with "
              "it on, on held-out batches). 'Early proxies' is what the proxies alone (injection ratio, table "
              "health) said at the early step. Ablation Δ and injection ratio: mean ± seed std."),
        ("table", ["dP", "final verdicts", "early verdicts", "early proxies", "early = final",
                   "early proxies = final", "ablation Δ early",
                   "ablation Δ final", "injection ratio (final)", "loss gain significant"], rows),
        ("p", f"The early-warning verdict matched the final verdict in {v['early_agrees']}/{n} runs; the early "
              f"proxies alone matched it in {v['early_proxy_agrees']}/{n}."),
    ]


def group_blocks(g: dict[str, Any], figures: Sequence[tuple[str, str, bytes | None]]) -> list[Block]:
    """Everything about one group of runs (one per combination of grid values other than dP and seed)."""
    blocks: list[Block] = [("h", 1, f"Group {g['key']}")] if g["key"] else []
    blocks += seed_table_blocks(g) + paired_blocks(g) + verdict_blocks(g) + domain_blocks(g)
    blocks.append(("h", 2, "Plots"))
    blocks += [("img", stem, caption, png) for stem, caption, png in figures if png]
    return blocks


def build_blocks(analysis: dict[str, Any], figures: dict[str, list[tuple[str, str, bytes | None]]]) -> list[Block]:
    """The report as blocks; figures: {group key: [(stem, caption, png)]}."""
    blocks: list[Block] = [
        ("h", 1, f"Sweep report: {analysis['sweep']}"),
        ("p", f"Sweep folder `{analysis['folder']}`; runs: {_counts(analysis['counts'])} of "
              f"{analysis['total_runs']}. Loss = final evaluation loss in nats/token, macro-averaged over the "
              "evaluation domains; spread = seed-to-seed sample standard deviation."),
    ]
    from plelab.experiments.plan_report import plan_blocks, power_blocks

    plan = analysis.get("plan") or {}
    blocks += plan_blocks(plan) + (power_blocks(plan["power"]) if plan.get("power") else [])
    blocks += [("list", analysis["notes"])] if analysis.get("notes") else []
    blocks += config_blocks(analysis.get("config") or {}, analysis.get("grid") or {})
    for g in analysis["groups"]:
        g = {**g, "rules": analysis["rules"]}
        blocks += group_blocks(g, figures.get(g["key"], []))
    if not analysis["groups"]:
        blocks.append(("p", "No finished runs yet."))
    return blocks


def to_markdown(blocks: Sequence[Block], image_paths: dict[str, str]) -> str:
    """Markdown; image_paths maps a figure stem to its path relative to the markdown file."""
    out = []
    for b in blocks:
        if b[0] == "h":
            out.append("#" * b[1] + " " + b[2])
        elif b[0] == "p":
            out.append(b[1])
        elif b[0] == "list":
            out.append("\n".join(f"- {item}" for item in b[1]))
        elif b[0] == "table":
            out.append(markdown_table(b[1], b[2]))
        elif b[0] == "img" and b[1] in image_paths:
            out.append(f"![{b[2]}]({image_paths[b[1]]})\n\n*{b[2]}*")
    return "\n\n".join(out) + "\n"


def _inline(text: str) -> str:
    """Escape, then render **bold** and `code` (the only markdown the blocks use)."""
    import re

    text = html.escape(text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", text)
    return re.sub(r"`(.+?)`", r"<code>\1</code>", text)


def to_html(blocks: Sequence[Block], title: str) -> str:
    """A self-contained HTML page: inline CSS, figures as data: URIs, no external references."""
    body = []
    for b in blocks:
        if b[0] == "h":
            body.append(f"<h{b[1]}>{_inline(b[2])}</h{b[1]}>")
        elif b[0] == "p":
            body.append(f"<p>{_inline(b[1])}</p>")
        elif b[0] == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in b[1]) + "</ul>")
        elif b[0] == "table":
            body.append(html_table(b[1], b[2]))
        elif b[0] == "img":
            data = base64.b64encode(b[3]).decode("ascii")
            body.append(f'<figure><img alt="{html.escape(b[2])}" src="data:image/png;base64,{data}">'
                        f"<figcaption>{_inline(b[2])}</figcaption></figure>")
    return (f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def plain_data(obj: Any) -> Any:
    """Plain JSON data: keys as text, numpy scalars as numbers, tuples as lists, NaN and inf as None."""
    if isinstance(obj, dict):
        return {str(k): plain_data(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_data(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def render_figures(analysis: dict[str, Any]) -> dict[str, list[tuple[str, str, bytes | None]]]:
    """Every figure of every group: {group key: [(file stem, caption, png or None)]}."""
    from plelab.experiments.plots import FIGURES

    out = {}
    for i, g in enumerate(analysis["groups"]):
        suffix = f"_g{i}" if len(analysis["groups"]) > 1 else ""
        out[g["key"]] = [(stem + suffix, caption, fn(g)) for stem, caption, fn in FIGURES]
    return out


def write_report(analysis: dict[str, Any], out_dir: str | Path, plots_dir: str | Path | None = None, *,
                 overwrite: bool = True, inputs: Sequence[str | Path] = ()) -> list[Path]:
    """Write OUT/report.html, OUT/report.md and the PNGs (default OUT/plots/); return the paths written."""
    figures = render_figures(analysis)
    pngs = {stem: png for figs in figures.values() for stem, _, png in figs if png}
    return write_pages(build_blocks(analysis, figures), f"plelab sweep report: {analysis['sweep']}", out_dir, pngs,
                       plots_dir=plots_dir, overwrite=overwrite, inputs=inputs)


RECORDS_FILE = "records.json"
"""Beside a study's report: the per-seed data it rests on (`plelab report OUT/records.json` recomputes it)."""


def write_pages(blocks: Sequence[Block], title: str, out_dir: str | Path, pngs: dict[str, bytes], *,
                plots_dir: str | Path | None = None, name: str = "report", overwrite: bool = True,
                inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/{name}.html, OUT/{name}.md, PLOTS/{stem}.png (default OUT/plots/) and, given `records`,
    OUT/records.json; return the paths written.

    Every target is checked before anything is written: none may be one of `inputs`, and without `overwrite`
    none may exist.
    """
    out_dir = Path(out_dir)
    plots = Path(plots_dir) if plots_dir else out_dir / "plots"
    check_output_path(out_dir, overwrite=True, is_dir=True, inputs=tuple(inputs))
    check_output_path(plots, overwrite=True, is_dir=True, inputs=tuple(inputs))
    files = {plots / f"{stem}.png": png for stem, png in pngs.items()}
    rel = {path.stem: os.path.relpath(path, out_dir) for path in files}
    pages = {out_dir / f"{name}.html": to_html(blocks, title).encode(),
             out_dir / f"{name}.md": to_markdown(blocks, rel).encode()}
    if records is not None:
        pages[out_dir / RECORDS_FILE] = json.dumps(plain_data(records), indent=1, allow_nan=False).encode()
    for path in [*pages, *files]:
        check_output_path(path, overwrite=overwrite, inputs=tuple(inputs))
    plots.mkdir(parents=True, exist_ok=True)
    for path, data in {**files, **pages}.items():
        atomic_write_bytes(path, data)
    return [*pages, *files]
