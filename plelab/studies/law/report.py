"""The dead-zone-law report: per-width tables, the dP/H figure across widths, the law, the prediction, the early rule.

Rendered as blocks (pages.to_markdown / to_html) into OUT/law.md, OUT/law.html,
OUT/plots/law_vs_ratio.png, plus OUT/law.json (the full analysis) and OUT/deadzone_law.json (the compact
result the study commits as plelab/studies/law/deadzone_law.json).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.diagnostics.verdict import today_names, used_label
from plelab.errors import PlelabError
from plelab.studies.law.analysis import (
    CRITERIA,
    JSON_CRITERIA,
    PREDICTION_FILE,
    bracket_text,
    gather,
    law_analysis,
    law_summary,
    prediction_record,
    ratio_text,
)
from plelab.util.fs import atomic_write_bytes, check_output_path
from plelab.util.pages import RECORDS_FILE, Block, fmt, plain_data, to_html, to_markdown

PRIMARY = {"heldout": "the prepared data's held-out split", "loss": "macro over the evaluation domains"}


FIGURES = {"law_vs_ratio": "dP/H", "law_vs_dim": "dP"}
"""plots/NAME.png -> the x axis it draws the widths' curves against."""


def law_figure(analysis: dict[str, Any], axis: str = "dP/H") -> bytes | None:
    """Paired loss delta and ablation delta vs dP/H or dP (log x), every width and form on the same two panels."""
    from plelab.experiments.figures import plt, png

    widths = analysis["widths"]
    if not any(w["paired"] or w["ablation"] for w in widths):
        return None
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 7), sharex=True)
    for w in widths:
        label = f"H={w['H']} ({w['form']})"
        style = "-o" if w["form"] == "simple" else "--s"
        scale = w["H"] if axis == "dP/H" else 1
        for ax, rows, mean, se in ((top, w["paired"], "delta_mean", "delta_se"),
                                   (bottom, w["ablation"], "mean", "se")):
            xs = [r["ple_dim"] / scale for r in rows if r[mean] is not None]
            ys = [r[mean] for r in rows if r[mean] is not None]
            errs = [r[se] or 0.0 for r in rows if r[mean] is not None]
            if xs:
                ax.errorbar(xs, ys, yerr=errs, fmt=style, capsize=3, label=label)
    if axis == "dP/H":  # the published brackets are only comparable across widths as ratios
        for p, color in zip(analysis.get("published", []), ("tab:orange", "tab:gray"), strict=False):
            for ax in (top, bottom):
                ax.axvspan(p["bracket"][0] / p["H"], p["bracket"][1] / p["H"], color=color, alpha=0.12, zorder=0,
                           label=(f"published: H={p['H']} ({JSON_CRITERIA.get(p['criterion'], p['criterion'])})"
                                  if ax is top else None))
    top.axhline(0, color="k", lw=0.8)
    bottom.axhline(0.01, color="tab:green", lw=0.8, ls=":", label="used above (0.01 nats)")
    top.set_ylabel(f"paired Δ {analysis['primary_loss']} loss vs dP=0\n(mean ± s.e. over seeds)")
    bottom.set_ylabel("ablation Δ (PLE off − on)\n(mean ± s.e. over seeds)")
    bottom.set_xscale("log", base=2)
    bottom.set_xlabel("dP / H (shaded: published dP* brackets)" if axis == "dP/H" else "dP (per-layer PLE dimension)")
    top.legend(fontsize=8)
    bottom.legend(fontsize=8)
    return png(fig)


def tracking_blocks(tracking: dict[str, Any]) -> list[Block]:
    """Spearman rho of each early candidate with the runs' final paired gain, fit widths (and held-out width)."""
    fit, test = tracking.get("fit") or {}, tracking.get("test") or {}
    fractions = sorted({float(f) for cells in fit.values() for f in cells})
    if not fractions:
        return []

    def cell(cells: dict[str, Any], f: float) -> str:  # the analysis is JSON-shaped: fractions are text keys
        c = cells.get(str(f)) or {}
        return "-" if c.get("rho") is None else f"{c['rho']:+.2f} ({c['n']})"

    rows = [[name] + [cell(fit[name], f) for f in fractions] + ([cell(test.get(name) or {}, f) for f in fractions]
                                                               if test else [])
            for name in fit]
    head = ["signal"] + [f"fit {f:.0%}" for f in fractions] + ([f"held-out {f:.0%}" for f in fractions] if test else [])
    return [("h", 3, "Which early signal ranks the final gain?"),
            ("p", "Spearman's ρ between a candidate read at a fraction of training and the run's final gain over its "
                  "own dP = 0 run (primary loss; positive = a larger signal goes with a larger gain), over the PLE "
                  "runs (n in brackets). Part of it is only dP itself, which raises both: the row 'dP/H (trivial "
                  "ranker)' is what the design alone gets, known before training; a signal adds something only "
                  "where it clearly beats that row."),
            ("table", head, rows)]


def collapse_blocks(analysis: dict[str, Any]) -> list[Block]:
    """Which axis the widths' paired-gain curves share: dP/H (the law's premise) or dP, against a simulated null."""
    axes = analysis.get("collapse") or {}
    if not any(a.get("k") for a in axes.values()):
        return []
    rows = []
    for axis, a in axes.items():
        loo = [v for v in a.get("leave_one_out") or [] if v is not None]
        worst = max(range(len(loo)), key=lambda i: a["statistic"] - loo[i]) if loo else None
        x = a["points"][worst]["x"] if worst is not None else None
        drop = (f"{fmt(loo[worst], '.2f')} without H {a['points'][worst]['H']} at {axis} = "
                f"{ratio_text(x) if axis == 'dP/H' else format(x, 'g')}" if worst is not None else "-")
        rows.append([axis, str(a["k"]), fmt(a.get("mean_abs_diff"), ".4f"), fmt(a.get("statistic"), ".2f"),
                     f"{fmt(a.get('null_median'), '.2f')} / {fmt(a.get('null_median_independent'), '.2f')}",
                     f"{fmt(a.get('null_p95'), '.2f')} / {fmt(a.get('null_p95_independent'), '.2f')}",
                     f"{fmt(a.get('p'), '.3f')} / {fmt(a.get('p_independent'), '.3f')}", drop])
    return [("h", 2, "Does the gain follow dP/H or dP?"),
            ("p", "Every pair of widths compared where both tested the same value of the axis: z = difference of the "
                  "paired Δ / its s.e.; the statistic is the mean z². It is compared with its null simulated from "
                  "the seeds (each width redrawn with its own seeds' spread, no difference between widths), not "
                  "with 1: with 3 seeds a side z is t-like and the points share runs. Two nulls, given as "
                  "correlated / independent: the first keeps the seeds' correlation across dP (with 3 seeds it is "
                  "heavy-tailed: conservative), the second drops it (liberal). p = P(null ≥ observed): small = the "
                  "widths' curves differ on that axis. The last column leaves out the point that moves the "
                  "statistic most."),
            ("table", ["axis", "shared points", "mean |Δ difference| (nats)", "mean z²", "null median",
                       "null 95th percentile", "p", "mean z² without the most influential point"], rows)]


def dose_blocks(analysis: dict[str, Any]) -> list[Block]:
    """Per width: the per-seed slope of the paired Δ on log2 dP, tested across seeds (the seed-level test)."""
    rows = []
    for w in analysis["widths"]:
        d = w.get("dose_response") or {}
        if not d.get("n"):
            continue
        v = d["verdict"]
        seeds = ", ".join(f"{fmt(b, '+.3f')}" for b in d["per_seed"].values())
        rows.append([f"H = {w['H']} ({w['form']})", seeds, f"{d['negative']}/{d['n']}",
                     f"{fmt(d['mean'], '+.4f')} ± {fmt(d['se'])}",
                     "-" if not v.get("ci95") else f"[{fmt(v['ci95'][0], '+.3f')}, {fmt(v['ci95'][1], '+.3f')}]",
                     fmt(v.get("p"), ".3f"), v["outcome"]])
    if not rows:
        return []
    return [("h", 2, "Dose-response at the level of seeds"),
            ("p", "Each seed's paired Δ (dP vs the same seed's dP = 0 run) regressed on log2 dP: one slope per seed, "
                  "nats per doubling of dP. Every per-dP test of a width shares its seeds' dP = 0 runs, so those tests "
                  "are not independent and one unusual reference run sinks them all; the slopes use each run once "
                  "and the seeds are the units (t test across seeds, df = seeds − 1)."),
            ("table", ["width", "slope per seed", "negative", "mean ± s.e.", "95 % CI", "p", "outcome"], rows)]


def width_blocks(w: dict[str, Any], primary: str) -> list[Block]:
    """One width: paired deltas (primary, secondary), ablation and verdicts per dP, threshold brackets."""
    sec = {r["ple_dim"]: r for r in w["paired_secondary"]}
    abl = {r["ple_dim"]: r for r in w["ablation"]}
    rows = []
    for r in w["paired"]:
        s, a = sec.get(r["ple_dim"], {}), abl.get(r["ple_dim"], {})
        rows.append([str(r["ple_dim"]), ratio_text(r["ple_dim"] / w["H"]), str(r["n"]),
                     f"{fmt(r['delta_mean'], '+.4f')} ± {fmt(r['delta_se'])}",
                     {True: "yes", False: "no", None: "?"}[r["gain_significant"]],
                     f"{fmt(s.get('delta_mean'), '+.4f')} ± {fmt(s.get('delta_se'))}",
                     f"{fmt(a.get('mean'), '+.4f')} ± {fmt(a.get('se'))}",
                     _verdict_counts(a.get("verdicts") or {})])
    trained = [t for t in w["trained"] if t.get("trained") is not None]
    bent = sum(bool(t["trained"]) for t in trained)
    late = ", ".join(f"{t['name']} ({fmt(t.get('doubling_drop'), '.3f')} nats)" for t in trained if not t["trained"])
    unknown = {t.get("reason") for t in w["trained"] if t.get("trained") is None}
    t = w["thresholds"]
    return [
        ("h", 2, f"H = {w['H']}, {w['form']} form ({w['layers']} layers, vocab {w['vocab']}, {w['max_steps']} steps)"),
        ("table", ["dP", "dP/H", "seeds", f"paired Δ {primary} (± s.e.)", "gain?", "paired Δ 16 domains (± s.e.)",
                   "ablation Δ (± s.e.)", "final used verdicts"], rows),
        ("list", [f"{CRITERION_NAMES[name]}: dP* {bracket_text(t[name]['bracket'], w['H'])}"
                  + (f"; above it, not met at dP = {t[name]['exceptions']}" if t[name]["exceptions"] else "")
                  for name in CRITERIA]),
        ("p", f"Trained criterion met by {bent}/{len(trained)} runs"
              + (f"; still falling over the last doubling of tokens: {late}" if late else "")
              + (f"; not evaluable for {len(w['trained']) - len(trained)}: {'; '.join(sorted(unknown))}"
                 if unknown else "")
              + f". Time in training steps, all runs of this width together: {w['train_hours']:.2f} h."),
    ]


CRITERION_NAMES = {"alive": "used in every seed (dependence)", "gain": "pays (a resolved gain)"}
"""How the report names the law's two criteria (the records keep their first names, alive and gain)."""



def _verdict_counts(counts: dict[str, int]) -> str:
    """'3 used' from recorded verdict counts, old names (alive / weak / dead) read as today's."""
    merged: dict[str, int] = {}
    for v, n in counts.items():
        merged[used_label(v)] = merged.get(used_label(v), 0) + n
    return ", ".join(f"{n} {v}" for v, n in merged.items()) or "-"


def _beside_base(result: dict[str, Any]) -> str:
    """'; the base-rate rule (always alive) gets 20/21: the rule does not beat it' for evaluate_rule's result."""
    base = result.get("base_rate") or {}
    if base.get("base_class") is None:
        return ""
    verdict = ("beats it" if base["beats_base_rate"] else "does not beat it")
    always = used_label(base["base_class"])
    return (f" (the base-rate rule, always '{always}', gets {base['base_correct']}/{base['n']}: the "
            f"rule {verdict}; exact McNemar p = {base['mcnemar_p']:.2g})")


def law_blocks(analysis: dict[str, Any], figure: bool) -> list[Block]:
    """The whole law report as blocks."""
    primary = analysis["primary_loss"]
    blocks: list[Block] = [
        ("h", 1, "The dead-zone law"),
        ("p", "Registered before the held-out width's runs: the frozen prediction (prediction.json: the two "
              "criteria's brackets and the early rule). Every other verdict here (per-dP tests, dose-response, "
              "the collapse test, the baselines, the law refitted on every width) is post hoc."),
        ("p", f"Primary loss: `{primary}` ({PRIMARY[primary]}); secondary: the macro over the 16 evaluation "
              "domains. Paired Δ = loss(dP) − loss(dP = 0) of the same "
              "seed (same trunk init and data order), mean ± s.e. over seeds."),
        ("list", [f"{CRITERION_NAMES.get(k, k)}: {CRITERIA.get(k, v)}" for k, v in analysis["criteria"].items()]
                 + [analysis["trained_rule"], analysis["paired_rule"]] + analysis["notes"]),
    ]
    for w in analysis["widths"]:
        blocks += width_blocks(w, primary)
    blocks.append(("h", 2, f"The law dP*/H = c ({analysis['form']} form, fitted on H = {analysis['fit_widths']})"))
    blocks.append(("list", [f"{CRITERION_NAMES.get(c, c)}: {law['reason']}" + (f"; point estimate "
                                                                             f"{ratio_text(law['estimate'])}"
                                                         if law.get("estimate") else "")
                            for c, law in analysis["law"].items()]))
    every = law_summary(analysis)
    blocks.append(("p", f"Refitted on every measured width ({every['fit_widths']}, post hoc: the held-out width is "
                        f"evidence once measured; `--suggest-ple` uses this): used: {every['law']['reason']}; pays: "
                        f"{every['law_gain']['reason']}."))
    if analysis["predictions"]:
        blocks.append(("table", ["H", "criterion", "predicted dP*", "measured dP*", "outcome"],
                       [[str(p["H"]), CRITERION_NAMES[p["criterion"]], bracket_text(p["bracket"]),
                         bracket_text(p["measured"]),
                         p["outcome"]]
                        for p in analysis["predictions"]]))
    early = analysis["early"] or {}
    if early.get("rule"):
        test = early.get("test")
        blocks.append(("h", 2, "Early predictor"))
        blocks.append(("p", f"Chosen on the fit widths: {today_names(early['text'])}; right in "
                            f"{early['fit']['correct']}/{early['fit']['n']} of their runs{_beside_base(early['fit'])}. "
                       + (f"On the held-out width(s): {test['correct']}/{test['n']} right ({test['missing']} without "
                          "the signal); " + ", ".join(f"{today_names(k)}: {v}"
                                                      for k, v in sorted(test["confusion"].items()))
                          + f"{_beside_base(test)}." if test else "No held-out width has finished runs yet.")))
        if early.get("post_hoc"):
            ph = early["post_hoc"]
            blocks.append(("p", f"Post hoc (chosen on every width, held-out one included, so its accuracy is "
                                f"in-sample and tests nothing): {ph['text']}; right in {ph['fit']['correct']}/"
                                f"{ph['fit']['n']}."))
    else:
        blocks.append(("p", f"Early predictor: {early.get('reason', 'none')}."))
    blocks += tracking_blocks(early.get("tracks_gain") or {})
    blocks += dose_blocks(analysis)
    blocks += collapse_blocks(analysis)
    blocks.append(("h", 2, "Published points"))
    blocks.append(("table", ["source", "H", "form", "criterion", "dP* bracket", "note"],
                   [[p["source"], str(p["H"]), p["form"], JSON_CRITERIA.get(p["criterion"], p["criterion"]),
                     bracket_text(p["bracket"], p["H"]), today_names(p["note"])]
                    for p in analysis["published"]]))
    if figure:
        blocks += [("img", name, f"Paired loss Δ and ablation Δ vs {axis}, all widths", None)
                   for name, axis in FIGURES.items()]
    return blocks


def write_law_report(analysis: dict[str, Any], out_dir: str | Path, *, overwrite: bool = True,
                     inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/law.md, law.html, law.json, deadzone_law.json, plots/law_vs_{ratio,dim}.png and, given the
    study's records, OUT/records.json (every run's record: `plelab report OUT/records.json --law` recomputes
    the whole analysis from it); return the paths."""
    out_dir = Path(out_dir)
    check_output_path(out_dir, overwrite=True, is_dir=True, inputs=tuple(inputs))
    pngs = {name: law_figure(analysis, axis) for name, axis in FIGURES.items()}
    figure = all(p is not None for p in pngs.values())
    blocks = [b if b[0] != "img" else (*b[:3], pngs[b[1]]) for b in law_blocks(analysis, figure)]
    paths = {name: out_dir / "plots" / f"{name}.png" for name in FIGURES}
    links = {name: os.path.relpath(path, out_dir) for name, path in paths.items()}
    files = {out_dir / "law.md": to_markdown(blocks, links).encode(),
             out_dir / "law.html": to_html(blocks, "plelab: the dead-zone law").encode(),
             out_dir / "law.json": json.dumps(plain_data(analysis), indent=2, allow_nan=False).encode(),
             out_dir / "deadzone_law.json": json.dumps(plain_data(law_summary(analysis)), indent=2,
                                                       allow_nan=False).encode()}
    if records is not None:
        files[out_dir / RECORDS_FILE] = json.dumps(plain_data(records), indent=1, allow_nan=False).encode()
    if figure:
        files.update({paths[name]: pngs[name] for name in FIGURES})
    for path in files:
        check_output_path(path, overwrite=overwrite, inputs=tuple(inputs))
    (out_dir / "plots").mkdir(parents=True, exist_ok=True)
    for path, data in files.items():
        atomic_write_bytes(path, data)
    return list(files)


def law_report_analysis(folder: str | Path,
                        predict: Sequence[int] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """`plelab report DIR --law [--predict H]`: the law over DIR's sweeps and its records; with `predict`, the
    prediction for those widths is frozen in DIR/prediction.json first (once: it is never overwritten)."""
    folder = Path(folder)
    frozen_path = folder / PREDICTION_FILE
    frozen = load_prediction(frozen_path)
    if predict and frozen is not None:
        raise PlelabError(f"{frozen_path} already holds the prediction for H = "
                          f"{sorted({p['H'] for p in frozen['predictions']})}; it is never overwritten (the protocol: "
                          "predict once, before running the width). Drop --predict to score it")
    runs = gather(folder)
    analysis = law_analysis(runs, predict_widths=predict or (), prediction=frozen)
    if predict:
        measured = [p["H"] for p in analysis["predictions"] if p["measured"] is not None]
        if measured:
            raise PlelabError(f"H = {sorted(set(measured))} already has finished runs: a prediction must come first")
        atomic_write_bytes(frozen_path, json.dumps(prediction_record(analysis), indent=2).encode())
    return analysis, law_records(runs, frozen)


def law_report_inputs(folder: str | Path) -> tuple[Path, ...]:
    """Files the report reads from the folder besides the sweeps (its output must be none of them)."""
    return (Path(folder) / PREDICTION_FILE,)


def law_summary_lines(analysis: dict[str, Any], folder: str | Path, predict: Sequence[int] | None = None) -> list[str]:
    """The law per criterion, each prediction and its outcome, and where a new prediction was frozen."""
    lines = [f"law ({CRITERION_NAMES.get(criterion, criterion)}): {law['reason']}"
             for criterion, law in analysis["law"].items()]
    lines += [f"prediction H={p['H']} {JSON_CRITERIA.get(p['criterion'], p['criterion'])}: dP* "
              f"{bracket_text(p['bracket'])} -> measured "
              f"{bracket_text(p['measured'])}: {p['outcome']}" for p in analysis["predictions"]]
    if predict:
        lines.append(f"prediction frozen in {Path(folder) / PREDICTION_FILE}: commit it, and write it into "
                     f"docs/deadzone-law.md, before running H = {predict}")
    return lines


LAW_KIND = "deadzone-law"
"""records.json's `kind` for the law study."""


def law_records(runs: Sequence[dict[str, Any]], prediction: dict[str, Any] | None) -> dict[str, Any]:
    """The law's per-run records (losses, verdicts, ablation, trained criterion, early signals) and the frozen
    prediction: law_analysis recomputes everything from them (`law_from_records`)."""
    return {"kind": LAW_KIND, "prediction": prediction,
            "runs": [{k: v for k, v in r.items() if k != "dir"} for r in runs]}


def law_from_records(rec: dict[str, Any]) -> dict[str, Any]:
    """law_analysis on a records.json's runs (fraction keys of the early signals back to numbers)."""
    runs = [{**r, "signals": {float(f): v for f, v in (r.get("signals") or {}).items()}} for r in rec["runs"]]
    return law_analysis(runs, prediction=rec.get("prediction"))


def load_prediction(path: Path) -> dict[str, Any] | None:
    """The frozen prediction, or None when none has been made."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is damaged ({exc}); restore it from git (the committed prediction)") from None
