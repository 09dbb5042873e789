"""The dead-zone study's report (and that of any sweep no other study claims): seed tables, paired deltas, verdicts,
per-domain losses and plots, as report.md and a self-contained report.html (plelab.util.pages)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.studies.deadzone.analysis import NOISE_SIGMAS
from plelab.util.pages import Block, fmt, pm, write_pages


def _counts(c: dict[str, int]) -> str:
    return ", ".join(f"{v} {k}" for k, v in sorted(c.items())) or "-"


def config_blocks(cfg: dict[str, Any], grid: dict[str, list[Any]],
                  schedules: Sequence[Sequence[Any]] = ()) -> list[Block]:
    """What was trained, in one table (the first run's config; the grid says what varies, and `schedules`, the
    runs' (max_steps, warmup_steps), the training lengths when there are several)."""
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
        ["training", (f"{cfg.get('max_steps')} steps x {tokens:,} tokens = {cfg.get('max_steps', 0) * tokens:,} "
                      f"tokens, lr {cfg.get('lr')}, warmup {cfg.get('warmup_steps')}") if len(schedules) < 2 else
                     ("; ".join(f"{n:,} steps ({n * tokens / 1e6:.2f}M tokens, warmup {w})" for n, w in schedules)
                      + f" x {tokens:,} tokens a step, lr {cfg.get('lr')}")],
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
    def step_class(s: dict[str, Any]) -> str:
        # the margin and the metric beside the word, so "dead zone" is never read without them
        return f"dead zone (inside ±{s['margin']:g}, TOST)" if s["class"] == "dead zone" else s["class"]
    steps = [[f"{s['from']} → {s['to']}", fmt(s["delta"], "+.4f"), fmt(s["noise"]), fmt(s["z"], "+.1f"),
              fmt(s["gain_per_doubling"], "+.4f"), step_class(s)] for s in g["steps"]]
    return [
        ("h", 2, "Loss vs dP (the seed's table)"),
        ("table", ["dP", "added params", "% of base", "seeds", "loss (mean ± seed std)",
                   f"Δ vs dP={ref} (± s.e.)", f"|Δ| > {NOISE_SIGMAS:g} s.e.?"], rows),
        ("h", 2, "Steps between consecutive dP values"),
        ("p", "Post hoc, on the macro loss above, unpaired (seed means and seed spreads): a description of the "
              "curve's shape. The registered tests and the paired tables below are the seed-level tests."),
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
            out += [("h", 2, f"Pays: paired Δ vs dP=0, same seed ({label})"),
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
             {True: "yes", False: "no", None: "?"}[r["loss_delta_beyond_2se_unpaired"]]] for r in v["rows"]]
    n = v["compared"]
    return [
        ("h", 2, "Used (dependence): early warning vs end of training"),
        ("p", "The used verdicts of the PLEMonitor diagnostics (RUN_DIR/diagnostics/early.json and final.json), by "
              "the ablation rule of `plelab diagnose` (loss with PLE switched off minus loss with it on, on "
              "held-out batches): does the trained model depend on its table? That is not whether the table pays: "
              "the paired Δ against the same seed's dP = 0 run (above) is the benefit. Runs recorded before the "
              "used / pays verdicts said alive (today's used, the same rule) or weak / dead (shown as 'not used': "
              "without an equivalence test, unused and not resolved cannot be told apart). 'Early proxies' is what "
              "the proxies alone (injection ratio, table health) said at the early step. Ablation Δ and injection "
              "ratio: mean ± seed std."),
        ("table", ["dP", "used (final)", "used (early)", "early proxies", "early = final",
                   "early proxies = final", "ablation Δ early",
                   "ablation Δ final", "injection ratio (final)",
                   f"macro Δ vs dP=0 beyond {NOISE_SIGMAS:g} s.e. (unpaired; the paired test is above)"], rows),
        ("p", f"The early used verdict matched the final one in {v['early_agrees']}/{n} runs; the early "
              f"proxies alone matched it in {v['early_proxy_agrees']}/{n}."),
    ]


def group_blocks(g: dict[str, Any], figures: Sequence[tuple[str, str, bytes | None]]) -> list[Block]:
    """Everything about one group of runs (one per combination of grid values other than dP and seed)."""
    blocks: list[Block] = [("h", 1, f"Group {g['key']}")] if g["key"] else []
    blocks += seed_table_blocks(g) + paired_blocks(g) + verdict_blocks(g) + domain_blocks(g)
    blocks.append(("h", 2, "Plots"))
    blocks += [("img", stem, caption, png) for stem, caption, png in figures if png]
    return blocks


def build_blocks(analysis: dict[str, Any], figures: dict[str, list[tuple[str, str, bytes | None]]],
                 sweep_blocks: Sequence[Block] = ()) -> list[Block]:
    """The report as blocks; figures: {group key: [(stem, caption, png)]}; sweep_blocks: a section about the whole
    sweep that a study building on this report adds before the groups."""
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
    blocks += config_blocks(analysis.get("config") or {}, analysis.get("grid") or {}, analysis.get("schedules") or ())
    blocks += list(sweep_blocks)
    for g in analysis["groups"]:
        g = {**g, "rules": analysis["rules"]}
        blocks += group_blocks(g, figures.get(g["key"], []))
    if not analysis["groups"]:
        blocks.append(("p", "No finished runs yet."))
    return blocks


def render_figures(analysis: dict[str, Any]) -> dict[str, list[tuple[str, str, bytes | None]]]:
    """Every figure of every group: {group key: [(file stem, caption, png or None)]}."""
    from plelab.studies.deadzone.plots import FIGURES

    out = {}
    for i, g in enumerate(analysis["groups"]):
        suffix = f"_g{i}" if len(analysis["groups"]) > 1 else ""
        out[g["key"]] = [(stem + suffix, caption, fn(g)) for stem, caption, fn in FIGURES]
    return out


def write_report(analysis: dict[str, Any], out_dir: str | Path, plots_dir: str | Path | None = None, *,
                 overwrite: bool = True, inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None,
                 sweep_blocks: Sequence[Block] = (), sweep_pngs: dict[str, bytes] | None = None) -> list[Path]:
    """Write OUT/report.html, OUT/report.md, the PNGs (default OUT/plots/) and, given records, OUT/records.json;
    return the paths written. sweep_blocks / sweep_pngs: a whole-sweep section and its figures (build_blocks)."""
    figures = render_figures(analysis)
    pngs = {stem: png for figs in figures.values() for stem, _, png in figs if png}
    pngs.update(sweep_pngs or {})
    return write_pages(build_blocks(analysis, figures, sweep_blocks), f"plelab sweep report: {analysis['sweep']}",
                       out_dir, pngs, plots_dir=plots_dir, overwrite=overwrite, inputs=inputs, records=records)
