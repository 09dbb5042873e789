"""The FFN study's report: variant summary, per-domain Δ tables, the published table beside ours, gap timeline plots.

Rendered as blocks (pages.write_pages) into OUT/report.md, OUT/report.html and
OUT/plots/ffn_gap.png, ffn_loss.png. The numbers come from analysis.study_analysis, which `--json` prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.errors import PlelabError
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE
from plelab.experiments.sweep_results import load_variant_sweep
from plelab.runs.checkpoint import CheckpointError, resolve_checkpoint
from plelab.studies.ffn.analysis import (
    DECODE_FILE,
    EXPORT_QUANT,
    PUBLISHED_DOMAINS,
    PUBLISHED_TIMELINE,
    study_records,
)
from plelab.util.fs import atomic_write_bytes
from plelab.util.pages import Block, fmt, write_pages

SIGN_MARK = {1: " ▲", -1: " ▼", 0: "", None: ""}
"""Appended to a Δ cell: significantly worse (▲) / better (▼) by the paired t-test of the rules."""


def _delta(mean: Any, se: Any, spec: str = "+.4f") -> str:
    return "-" if mean is None else f"{fmt(mean, spec)} ± {fmt(se, spec[1:])}"


def _int(x: Any) -> str:
    return "-" if x is None else f"{x:,}"


def _tokens(t: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if t >= scale:
            return f"{t / scale:.3g}{unit}"
    return f"{t:g}"


def _others(a: dict[str, Any]) -> list[str]:
    return [v for v in a["variants"] if v != a["baseline"]]


def _ci(ci: Any, spec: str = "+.3f") -> str:
    return "-" if not ci else f"[{fmt(ci[0], spec)}, {fmt(ci[1], spec)}]"


def _tested(r: dict[str, Any], key: str) -> str:
    """'+0.0124 ± 0.0069 [−0.017, +0.042], p 0.21 (Holm 0.9): not resolved' for the macro or the held-out split."""
    if r.get(f"{key}_delta") is None:
        return "-"
    return (f"{_delta(r[f'{key}_delta'], r[f'{key}_delta_se'])} {_ci(r.get(f'{key}_ci95'))}, "
            f"p {fmt(r.get(f'{key}_p'), '.2g')} (Holm {fmt(r.get(f'{key}_p_holm'), '.2g')}): "
            f"{r.get(f'{key}_outcome') or '-'}")


def summary_blocks(a: dict[str, Any]) -> list[Block]:
    """One row per variant: cost (params, active params, bytes), macro Δ and held-out Δ with their tests, domain
    counts, verdict, decode cost."""
    decode = any("tokens_per_s" in r for r in a["variants"].values())
    n_dom = max((r["domains_total"] for r in a["variants"].values()), default=0)
    headers = ["variant", "seeds paired", "params", "active params / token", f"inference bytes ({a['export_dtype']})",
               "macro Δ loss ± s.e. [95 % CI], p (Holm): outcome", "macro Δ bpb ± s.e.",
               f"Δ {a['heldout_domain']} (held-out) ± s.e. [95 % CI], p (Holm): outcome",
               f"domains Δ > 0 (descriptive) / worse ▲ / better ▼ (Holm; of {n_dom})", "verdict",
               "gap first open at", "illusory convergence"]
    headers += ["decode tokens/s", "bytes read / token"] if decode else []
    rows = []
    for name, r in a["variants"].items():
        base = name == a["baseline"]
        untested = base or r["verdict"] == "n/a"
        ill, first = r.get("illusory_convergence"), r.get("first_open")
        paired = str(r["n_pairs"]) + (f" (held-out {r['heldout_n']})" if r.get("heldout_n") not in (None, r["n_pairs"])
                                      else "")
        row = [f"{name} (baseline)" if base else name, paired, _int(r["params"]),
               _int(r["active_params_per_token"]), _int(r["inference_bytes"]),
               "0" if base else _tested(r, "macro"),
               "0" if base else _delta(r["macro_delta_bpb"], r["macro_delta_bpb_se"]),
               "0" if base else _tested(r, "heldout"),
               "-" if untested else f"{r['domains_positive']} / {r['domains_worse']} / {r['domains_better']}",
               r["verdict"],
               "-" if base or ill is None else ("never" if not first else
                                                f"{_tokens(first['tokens'])} ({fmt(first['gap'], '+.4f')})"),
               "-" if base or ill is None else "yes" if ill else "no"]
        if decode:
            row += [fmt(r.get("tokens_per_s"), ".1f"), _int(r.get("bytes_per_token"))]
        rows.append(row)
    margin = a.get("margin")
    return [("h", 2, "Variants"),
            ("p", f"Δ = variant − baseline `{a['baseline']}` of the same seed, mean ± s.e. over paired seeds "
                  "(positive = worse); p: two-sided paired t test over the seeds, Holm-corrected over the variants; "
                  "outcome: worse / better (significant), equivalent (TOST inside the margin "
                  + (f"±{margin:g} nats" if margin is not None else "- none was registered, so never") + "), "
                  "not resolved (neither). Inference bytes: weights read per decoded token at the export "
                  "precision (MGLU masks at 1 bit per element, MoE only the routed experts)."
             + (" Decode: measured on the variant's first seed (`plelab report DIR --measure-decode`, "
                f"{DECODE_FILE}); timings are only comparable from one idle machine." if decode else "")),
            ("table", headers, rows)]


def rule_blocks(a: dict[str, Any]) -> list[Block]:
    """The stated rules and what the data lacks."""
    blocks: list[Block] = [("h", 2, "Rules"), ("list", [f"**{k}**: {v}" for k, v in a["rules"].items()])]
    if a["notes"]:
        blocks += [("h", 2, "Notes on missing data"), ("list", a["notes"])]
    return blocks


def domain_blocks(a: dict[str, Any], key: str = "") -> list[Block]:
    """Per-domain paired Δ (key '' = loss in nats/token, '_bpb' = bits per byte), one column per variant."""
    others = _others(a)
    if not others or not a["domains"]:
        return []
    rows = []
    for dom, cells in a["domains"].items():
        label = f"{dom} (held-out split, not in the macro)" if dom == a["heldout_domain"] else dom
        rows.append([label] + [_delta(cells[v][f"delta{key}"], cells[v][f"se{key}"])
                               + (SIGN_MARK[cells[v]["significant"]] if not key else "") for v in others])
    rows.append(["macro (evaluation domains)"] + [_delta(a["variants"][v][f"macro_delta{key}"],
                                                         a["variants"][v][f"macro_delta{key}_se"]) for v in others])
    unit = "bits per byte" if key else ("nats/token; ▲ / ▼ significantly worse / better by each domain's own "
                                        "paired t test, unadjusted over the domains: description, where the Holm "
                                        "counts of the variants table are the test")
    return [("h", 2, f"Per-domain Δ vs `{a['baseline']}` ({'bits per byte' if key else 'loss'})"),
            ("p", f"Paired over seeds, mean ± s.e. ({unit})."),
            ("table", ["domain"] + others, rows)]


def published_blocks(a: dict[str, Any]) -> list[Block]:
    """SPEC §5's published MGLU result beside this study's MGLU n_m = 1 variant (placeholders until it has runs)."""
    v = a.get("published_variant")
    ours = {d: (cells.get(v) or {}) for d, cells in a["domains"].items()} if v else {}
    rows = []
    for dom, (b, m) in PUBLISHED_DOMAINS.items():
        c = ours.get(dom) or {}
        rows.append([dom, f"{b:.4f} → {m:.4f}", f"{m - b:+.4f}", _delta(c.get("delta"), c.get("se"))
                     + SIGN_MARK[c.get("significant")]])
    pub_mean = sum(m - b for b, m in PUBLISHED_DOMAINS.values()) / len(PUBLISHED_DOMAINS)
    r = a["variants"].get(v) or {}
    rows.append(["macro", "-", f"{pub_mean:+.4f}", _delta(r.get("macro_delta"), r.get("macro_delta_se"))])
    rows.append(["verdict", "-", "uniform degradation (16/16 worse)",
                 f"{r['verdict']} ({r['domains_positive']}/{r['domains_total']} Δ > 0, {r['domains_worse']} "
                 "significantly worse after Holm)" if r else "-"])
    timeline = [[_tokens(t), f"{b:.2f}", f"{m:.2f}", f"{m - b:+.2f}"] for t, b, m in PUBLISHED_TIMELINE]
    ours_line = [[_tokens(p["tokens"]), _delta(p["gap"], p["se"])] for p in a["timeline"].get(v) or []]
    blocks: list[Block] = [
        ("h", 2, "Published result (SPEC §5) beside this study"),
        ("p", "Published: MGLU (n_m = 1) vs SwiGLU, 3B parameters from scratch, 24.6B tokens. Ours: "
              + (f"variant `{v}` vs `{a['baseline']}`." if v else "no MGLU n_m = 1 variant in this sweep.")),
        ("table", ["domain", "published loss base → MGLU", "published Δ",
                   "our Δ ± s.e. (▲ / ▼: each domain's own test, unadjusted)"], rows),
        ("p", "Published gap over training (an early close at 8.2B tokens, reopened at 16.4B):"),
        ("table", ["tokens", "baseline loss", "MGLU loss", "gap"], timeline),
    ]
    if ours_line:
        blocks += [("p", f"Our gap over training (`{v}`; all variants in the gap timeline above):"),
                   ("table", ["tokens", "gap ± s.e."], ours_line)]
    return blocks


def _gap_cell(p: dict[str, Any]) -> str:
    if p.get("gap") is None:
        return "-"
    status = p.get("status") if p.get("status") in ("open", "closed", "open, within margin") else ""
    status = f" {status}" if status else ""
    return _delta(p["gap"], p.get("se")) + status


def _timeline_metric(a: dict[str, Any]) -> str:
    """What the gap timeline measures, in words: the held-out split's loss or the domains' macro loss."""
    metrics = {p.get("metric", "macro") for pts in a["timeline"].values() for p in pts}
    return "held-out split loss" if metrics == {HELDOUT_DOMAIN} else "macro loss"


def timeline_blocks(a: dict[str, Any], figures: dict[str, bytes]) -> list[Block]:
    """The gap timeline as a table (token counts × variants), the illusory-convergence findings and the plots."""
    others = [v for v in _others(a) if a["timeline"].get(v)]
    if not others:
        return [("h", 2, "Gap timeline"), ("p", "No timeline evaluations in this sweep yet.")]
    tokens = sorted({p["tokens"] for v in others for p in a["timeline"][v]})
    at = {v: {p["tokens"]: p for p in a["timeline"][v]} for v in others}
    what = _timeline_metric(a)
    rows = [[_tokens(t)] + [_gap_cell(at[v].get(t) or {}) for v in others] for t in tokens]
    found = []
    for v in others:
        ill = a["variants"][v].get("illusory_at")
        if ill:
            found.append(f"`{v}`: **illusory convergence**: gap {fmt(ill['open_gap'], '+.4f')} at "
                         f"{_tokens(ill['open_tokens'])} tokens, {_delta(ill['closed_gap'], ill['closed_se'])} at "
                         f"{_tokens(ill['closed_tokens'])} (closed), "
                         f"{_delta(ill['reopened_gap'], ill['reopened_se'])} at {_tokens(ill['reopened_tokens'])} "
                         f"(rise {_delta(ill['rise'], ill['rise_se'])})")
        else:
            found.append(f"`{v}`: no illusory convergence")
    blocks: list[Block] = [
        ("h", 2, "Gap timeline"),
        ("p", f"Paired gap in {what} vs `{a['baseline']}` at each evaluated token count (mean ± s.e. over seeds; "
              "nats), and its status: open = significant (unadjusted, per point) and not inside the margin, closed = "
              "inside the margin by TOST with no gap resolved (needs a registered margin), 'open, within margin' = "
              "significant and inside the margin, otherwise not resolved (rule: illusory_convergence above)."
              + (" The timeline scored the held-out split alone (eval_timeline_domains = \"heldout\"), so every "
                 "point, the final one included, is that split's." if what != "macro loss" else "")),
        ("table", ["tokens"] + others, rows), ("list", found)]
    captions = {"ffn_gap": f"Gap in {what} to the baseline vs tokens (mean ± s.e. band over seeds; x: log)",
                "ffn_loss": f"{what[0].upper() + what[1:]} vs tokens (mean ± s.e. band; x: log)"}
    blocks += [("img", stem, captions[stem], png) for stem, png in figures.items()]
    return blocks


def ffn_blocks(a: dict[str, Any], figures: dict[str, bytes]) -> list[Block]:
    """The whole report as blocks."""
    counts = ", ".join(f"{n} {k}" for k, n in sorted((a.get("counts") or {}).items())) or "-"
    blocks: list[Block] = [
        ("h", 1, f"FFN study: {a.get('sweep', '')}"),
        ("p", f"Sweep folder `{a.get('folder', '')}`; runs: {counts} of {a.get('total_runs', 0)}; baseline "
              f"`{a['baseline']}`. Loss = evaluation loss in nats/token on each domain; the macro is the mean over "
              f"the evaluation domains (not the held-out split `{a['heldout_domain']}`)."),
    ]
    from plelab.experiments.plan_report import plan_blocks, power_blocks

    plan = a.get("plan") or {}
    blocks += plan_blocks(plan) + (power_blocks(plan["power"]) if plan.get("power") else [])
    return (blocks + summary_blocks(a) + rule_blocks(a) + domain_blocks(a) + domain_blocks(a, "_bpb")
            + timeline_blocks(a, figures) + published_blocks(a))


def _band(ax, xs: Sequence[float], ys: Sequence[float], ses: Sequence[Any], label: str) -> None:
    line = ax.plot(xs, ys, "-o", ms=3, label=label)[0]
    lo = [y - (s or 0.0) for y, s in zip(ys, ses, strict=True)]
    hi = [y + (s or 0.0) for y, s in zip(ys, ses, strict=True)]
    ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, lw=0)


def ffn_figures(a: dict[str, Any]) -> dict[str, bytes]:
    """{stem: PNG}: the gap to the baseline and the absolute macro loss vs tokens (empty without a timeline)."""
    from plelab.experiments.figures import plt, png

    series = {v: [p for p in pts if p["gap"] is not None] for v, pts in a["timeline"].items()}
    if not any(series.get(v) for v in _others(a)):
        return {}
    out = {}
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v in _others(a):
        pts = series.get(v) or []
        if pts:
            _band(ax, [p["tokens"] for p in pts], [p["gap"] for p in pts], [p["se"] for p in pts], v)
            ill = a["variants"][v].get("illusory_at")
            if ill:
                ax.scatter([ill[f"{k}_tokens"] for k in ("open", "closed", "reopened")],
                           [ill[f"{k}_gap"] for k in ("open", "closed", "reopened")],
                           s=80, facecolors="none", edgecolors="k", zorder=5)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    what = _timeline_metric(a)
    ax.set_ylabel(f"{what} − {a['baseline']} (nats, paired)")
    ax.set_title("Gap to the baseline over training (circles: illusory convergence)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out["ffn_gap"] = png(fig)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for v, pts in a["timeline"].items():
        pts = [p for p in pts if p["loss"] is not None]
        if pts:
            _band(ax, [p["tokens"] for p in pts], [p["loss"] for p in pts], [p["loss_se"] for p in pts], v)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel(f"{what} (nats/token)")
    ax.set_title(f"{what[0].upper() + what[1:]} over training")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    out["ffn_loss"] = png(fig)
    return out


def write_ffn_report(analysis: dict[str, Any], out_dir: str | Path, *, overwrite: bool = True,
                     inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/report.md, OUT/report.html, the timeline PNGs under OUT/plots/ and, given the study's records,
    OUT/records.json (the per-seed data the report rests on); return the paths."""
    figures = ffn_figures(analysis)
    return write_pages(ffn_blocks(analysis, figures), f"plelab FFN study: {analysis.get('sweep', '')}", out_dir,
                       figures, overwrite=overwrite, inputs=inputs, records=records)


def _has_checkpoint(run_dir: str | Path) -> bool:
    try:
        resolve_checkpoint(run_dir)
        return True
    except CheckpointError:
        return False


def measure_all_decode(folder: str | Path, tokens: int = 64, runtime: str = "numpy",
                       say: Callable[[str], None] = lambda line: None) -> dict[str, dict[str, Any]]:
    """Measure decode cost on each variant's first seed and write FOLDER/decode.json; return {variant: result}.

    Exported at the study's EXPORT_QUANT, so bytes per token compare with the inference bytes column. A variant
    the runtime refuses (one line, PlelabError) is recorded with its error and the others are still measured.
    `say` receives a progress line per variant.
    """
    try:
        from plelab.edge.decode_cost import measure_decode
    except ImportError:
        raise PlelabError("--measure-decode needs plelab.edge.decode_cost, which this install lacks") from None
    data = load_variant_sweep(folder)
    out: dict[str, dict[str, Any]] = {}
    for v in data["variants"]:
        # A run restored from a snapshot (plelab sweep --restore) has its record but no checkpoint on this disk.
        seeds = sorted(s for (var, s), d in data["run_dirs"].items() if var == v and _has_checkpoint(d))
        if not seeds:
            say(f"decode: variant {v} has no finished run whose checkpoint is on this disk; skipped")
            continue
        run_dir = data["run_dirs"][(v, seeds[0])]
        say(f"decode: {v} (seed {seeds[0]}, {tokens} tokens, {runtime} runtime) ...")
        try:
            result = measure_decode(run_dir, tokens=tokens, runtime=runtime, quant=EXPORT_QUANT)
        except PlelabError as exc:
            say(f"decode: {v}: {exc}")
            result = {"error": str(exc)}
        out[v] = {**result, "seed": seeds[0], "run_dir": run_dir}
    atomic_write_bytes(Path(folder) / DECODE_FILE, json.dumps(out, indent=2).encode())
    return out


def ffn_report_records(folder: str | Path, *, measure_decode: bool = False, decode_tokens: int = 64,
                       decode_runtime: str = "numpy", say: Callable[[str], None] = lambda line: None,
                       plan: str | Path | None = None) -> dict[str, Any]:
    """`plelab report DIR` on a sweep with [variants]: (measure decode first,) then the study's per-seed records."""
    folder = Path(folder)
    if measure_decode:
        say("measuring decode speed: the timings mean something only on an otherwise idle machine")
        measure_all_decode(folder, decode_tokens, decode_runtime, say)
    return study_records(folder, plan=plan)


def ffn_report_inputs(folder: str | Path) -> tuple[Path, ...]:
    """Files the report reads from the sweep folder (its output must be none of them)."""
    folder = Path(folder)
    return folder / DB_FILE, folder / RESOLVED_FILE, folder / DECODE_FILE


def ffn_summary(analysis: dict[str, Any]) -> list[str]:
    """One line per variant against the baseline: macro Δ, domains worse, verdict."""
    return [f"{name}: macro Δ {_delta(r['macro_delta'], r['macro_delta_se'])}, {r['domains_worse']}/"
            f"{r['domains_total']} domains worse: {r['verdict']}"
            for name, r in analysis["variants"].items() if name != analysis["baseline"]]
