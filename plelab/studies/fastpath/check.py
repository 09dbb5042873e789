"""Same science on the fast path: a sweep's fp32 and bf16-head runs compared seed by seed.

The sweep (studies/fastpath/fastpath-check.toml) trains every (dP, seed) point twice, once per [variants] table:
`fp32` (the reference) and `bf16-head` (plelab/model/bf16_gemm.py). `check(folder)` reads the sweep folder
and answers four questions, each with its numbers and a pass mark fixed here before any full run:

1. Final held-out loss (the prepared data's held-out split `val`; the macro over the evaluation domains is
   shown beside it). Per dP: each path's mean and seed-to-seed sd; the paired Δ = bf16-head - fp32 per seed,
   mean, s.e. and 95 % t interval. Passes when |mean Δ| < the fp32 seed sd. `equivalent` says more: the
   whole 95 % interval lies inside ± the seed sd (a two one-sided test at 2.5 % each; with 3 seeds the
   interval is wide, so it may well not hold where the pass does).
2. The PLE effect, the studies' paired Δ: loss(dP) - loss(dP = 0) of the same seed, on each path, and the
   difference of the two paths' effects per seed. Passes when |mean difference| < the sd over seeds of
   the fp32 effect.
3. Loss curves: per (dP, seed), d(t) = train loss bf16-head - fp32 at each logged step t; per dP, s(t) =
   the sd over seeds of the fp32 loss at t. Reported: mean d / mean s and mean |d| / mean s over the steps
   both logged. Passes when |mean d| / mean s < CURVE_FRACTION.
4. `plelab diagnose` verdicts (run on each run's final checkpoint with the run's evaluation data): per
   (dP, seed), the overall and per-layer verdicts of the two paths. Passes when every pair agrees.

    plelab report runs/fastpath-check [--json] [--no-diagnose]

writes the answers as report.md and report.html into the folder (plelab.studies.fastpath.report).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.errors import PlelabError
from plelab.experiments.sweep import DB_FILE, DIM_KEY, SEED_KEY, VARIANT_KEY
from plelab.experiments.sweep_store import SweepStore
from plelab.runs.metrics import read_metrics
from plelab.stats.paired import mean_std, t_critical
from plelab.util.json_values import jsonable as _jsonable

REFERENCE, FAST = "fp32", "bf16-head"
CURVE_FRACTION = 0.25
"""Loss curves pass when the mean per-step difference is below this fraction of the mean per-step seed sd."""


def is_fastpath_sweep(folder: str | Path) -> bool:
    """Does the sweep folder hold a sweep whose variants are exactly the two numeric paths?"""
    path = Path(folder) / DB_FILE
    if not path.is_file():
        return False
    with SweepStore(path, readonly=True) as store:
        variants = {(r["point"] or {}).get(VARIANT_KEY) for r in store.runs()}
    return variants == {REFERENCE, FAST}


def load_runs(folder: str | Path) -> list[dict[str, Any]]:
    """The sweep's finished runs as {variant, dim, seed, dir, config, final: {domain: loss}, curve: {step: loss}}."""
    folder = Path(folder)
    if not (folder / DB_FILE).is_file():
        raise PlelabError(f"{folder} has no {DB_FILE}; run `plelab sweep studies/fastpath/fastpath-check.toml` first")
    with SweepStore(folder / DB_FILE) as store:
        runs, evals = store.runs(), store.evals()
    out = []
    for r in runs:
        point = r["point"] or {}
        if r["status"] != "done" or point.get(VARIANT_KEY) not in (REFERENCE, FAST):
            continue
        run_dir = folder / "runs" / r["name"]
        train, _ = read_metrics(run_dir)
        out.append({"name": r["name"], "variant": point[VARIANT_KEY], "dim": int(point.get(DIM_KEY, 0)),
                    "seed": int(point.get(SEED_KEY, r.get("seed") or 0)), "dir": str(run_dir), "config": r["config"],
                    "final": {d: v["loss"] for d, v in evals.get(r["name"], {}).items()},
                    "curve": {int(m["step"]): float(m["loss"]) for m in train if _finite(m.get("loss"))}})
    return out


def final_losses(run: dict[str, Any]) -> dict[str, float]:
    """{"heldout": the held-out split's loss, "macro": mean over the other evaluation domains} (NaN when absent)."""
    others = [v for d, v in run["final"].items() if d != HELDOUT_DOMAIN and _finite(v)]
    return {"heldout": run["final"].get(HELDOUT_DOMAIN, math.nan),
            "macro": sum(others) / len(others) if others else math.nan}


def paired(ref: dict[int, float], fast: dict[int, float]) -> dict[str, Any]:
    """fast[s] - ref[s] over the seeds both have: mean, s.e., 95 % t interval, and the per-seed values."""
    seeds = sorted(s for s in ref if s in fast and _finite(ref[s]) and _finite(fast[s]))
    deltas = [fast[s] - ref[s] for s in seeds]
    mean, sd = mean_std(deltas)
    se = sd / math.sqrt(len(deltas)) if len(deltas) > 1 else math.nan
    half = t_critical(len(deltas)) * se
    return {"mean": mean, "se": se, "ci95": [mean - half, mean + half], "n": len(deltas),
            "per_seed": dict(zip(seeds, deltas, strict=True))}


def within(delta: dict[str, Any], spread: float) -> dict[str, Any]:
    """Does a paired Δ sit inside the seed spread (|mean| < sd), and is it equivalent (95 % interval inside ± sd)?"""
    lo, hi = delta["ci95"]
    ok = _finite(delta["mean"]) and _finite(spread) and abs(delta["mean"]) < spread
    equivalent = all(_finite(x) for x in (lo, hi, spread)) and -spread < lo and hi < spread
    return {"seed_sd": spread, "passes": bool(ok), "equivalent": bool(equivalent)}


def final_section(runs: Sequence[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    """Question 1 for one loss (heldout or macro): per dP, both paths' mean and seed sd, the paired Δ, the mark."""
    rows = []
    for dim in sorted({r["dim"] for r in runs}):
        by = {v: {r["seed"]: final_losses(r)[key] for r in runs if r["dim"] == dim and r["variant"] == v}
              for v in (REFERENCE, FAST)}
        stats = {v: dict(zip(("mean", "seed_sd"), mean_std([x for x in by[v].values() if _finite(x)]), strict=True))
                 for v in by}
        delta = paired(by[REFERENCE], by[FAST])
        rows.append({"dim": dim, **{v: stats[v] for v in by}, "delta": delta,
                     **within(delta, stats[REFERENCE]["seed_sd"])})
    return rows


def effect_section(runs: Sequence[dict[str, Any]], key: str = "heldout") -> list[dict[str, Any]]:
    """Question 2: per dP > 0, the PLE effect loss(dP) - loss(0) by seed on each path, and fast - fp32 of it."""
    value = {(r["variant"], r["dim"], r["seed"]): final_losses(r)[key] for r in runs}
    rows = []
    for dim in sorted({r["dim"] for r in runs if r["dim"] > 0}):
        effect = {}
        for v in (REFERENCE, FAST):
            effect[v] = {s: value[(v, dim, s)] - value[(v, 0, s)] for (vv, d, s) in value
                         if vv == v and d == dim and (v, 0, s) in value}
        ref_mean, ref_sd = mean_std([x for x in effect[REFERENCE].values() if _finite(x)])
        fast_mean, fast_sd = mean_std([x for x in effect[FAST].values() if _finite(x)])
        delta = paired(effect[REFERENCE], effect[FAST])
        rows.append({"dim": dim, "effect": {REFERENCE: {"mean": ref_mean, "seed_sd": ref_sd,
                                                        "per_seed": effect[REFERENCE]},
                                            FAST: {"mean": fast_mean, "seed_sd": fast_sd, "per_seed": effect[FAST]}},
                     "delta": delta, **within(delta, ref_sd)})
    return rows


def curve_section(runs: Sequence[dict[str, Any]], fraction: float = CURVE_FRACTION) -> list[dict[str, Any]]:
    """Question 3: per dP, the mean per-step loss difference (fast - fp32) as a fraction of the per-step seed sd."""
    rows = []
    for dim in sorted({r["dim"] for r in runs}):
        curves = {(r["variant"], r["seed"]): r["curve"] for r in runs if r["dim"] == dim}
        seeds = sorted({s for v, s in curves if (REFERENCE, s) in curves and (FAST, s) in curves})
        steps = sorted(set.intersection(*[set(curves[(v, s)]) for s in seeds for v in (REFERENCE, FAST)])) \
            if seeds else []
        diffs = [curves[(FAST, s)][t] - curves[(REFERENCE, s)][t] for t in steps for s in seeds]
        spreads = [mean_std([curves[(REFERENCE, s)][t] for s in seeds])[1] for t in steps]
        mean_d = sum(diffs) / len(diffs) if diffs else math.nan
        mean_abs = sum(abs(d) for d in diffs) / len(diffs) if diffs else math.nan
        spreads = [x for x in spreads if _finite(x)]
        spread = sum(spreads) / len(spreads) if spreads else math.nan
        ratio = mean_d / spread if _finite(spread) and spread > 0 else math.nan
        rows.append({"dim": dim, "seeds": seeds, "steps": len(steps), "mean_diff": mean_d, "mean_abs_diff": mean_abs,
                     "mean_seed_sd": spread, "mean_diff_over_seed_sd": ratio,
                     "mean_abs_diff_over_seed_sd": mean_abs / spread if _finite(spread) and spread > 0 else math.nan,
                     "threshold": fraction, "passes": bool(_finite(ratio) and abs(ratio) < fraction)})
    return rows


def diagnose_run(run: dict[str, Any]) -> dict[str, Any]:
    """`plelab diagnose RUN_DIR --data EVAL_DATA --json` (a subprocess: the command itself, as a user runs it):
    the overall and per-layer used verdicts."""
    data = run["config"].get("eval_data") or run["config"].get("data")
    cmd = [sys.executable, "-m", "plelab", "diagnose", run["dir"], "--json"] + (["--data", data] if data else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise PlelabError(f"plelab diagnose {run['dir']} exited {proc.returncode}: {last}")
    report = json.loads(proc.stdout)
    return {"verdict": (report.get("used") or {}).get("verdict"),
            "layers": [rec.get("verdict") for rec in report.get("layers", [])]}


def verdict_section(runs: Sequence[dict[str, Any]], verdicts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Question 4: per (dP, seed), both paths' diagnose verdicts and whether they agree."""
    by = {(r["variant"], r["dim"], r["seed"]): verdicts[r["name"]] for r in runs if r["name"] in verdicts}
    rows = [{"dim": d, "seed": s, REFERENCE: by[(REFERENCE, d, s)], FAST: by[(FAST, d, s)],
             "agree": by[(REFERENCE, d, s)] == by[(FAST, d, s)]}
            for (v, d, s) in sorted(by) if v == REFERENCE and (FAST, d, s) in by]
    return {"rows": rows, "agree": sum(r["agree"] for r in rows), "compared": len(rows),
            "passes": bool(rows) and all(r["agree"] for r in rows)}


def check(folder: str | Path, diagnose: bool = True) -> dict[str, Any]:
    """The four answers for a sweep folder, JSON-ready, with an overall pass."""
    runs = load_runs(folder)
    if not any(r["variant"] == FAST for r in runs) or not any(r["variant"] == REFERENCE for r in runs):
        raise PlelabError(f"{folder}: no finished runs of both paths ({REFERENCE} and {FAST}) yet")
    out: dict[str, Any] = {
        "folder": str(folder), "runs": len(runs),
        "steps": sorted({int(r["config"].get("max_steps", 0)) for r in runs}),
        "final_heldout": final_section(runs, "heldout"), "final_macro": final_section(runs, "macro"),
        "ple_effect": effect_section(runs), "curves": curve_section(runs),
        "verdicts": verdict_section(runs, {r["name"]: diagnose_run(r) for r in runs}) if diagnose else None,
    }
    marks = [r["passes"] for r in out["final_heldout"] + out["ple_effect"] + out["curves"]]
    if diagnose:
        marks.append(out["verdicts"]["passes"])
    out["passes"] = bool(marks) and all(marks)
    return _jsonable(out)


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
