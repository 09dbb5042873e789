"""The dead-zone study's analysis of a dP sweep: the seed's dP table with seed-to-seed noise, each step classified,
paired deltas against dP = 0, the dose-response, per-domain and verdict tables.

It is also the report of any sweep no other study claims. Everything here is pure arithmetic on the sweep
database (SWEEP_DIR/sweep.sqlite), so the classification rule can be tested on synthetic numbers and
`plelab report --json` prints exactly what the report shows.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.diagnostics.verdict import used_label
from plelab.errors import PlelabError
from plelab.experiments.sweep import DB_FILE, DIM_KEY, SEED_KEY
from plelab.experiments.sweep_results import sample_note
from plelab.experiments.sweep_store import SweepStore
from plelab.runs.run_dir import METRICS_FILE
from plelab.util.json_values import jsonable as _jsonable

NOISE_SIGMAS = 2.0
"""A change counts as real only beyond this many standard errors of the difference."""

PAIRED_RULE = ("paired gain: delta = loss(dP) - loss(dP = 0) of the same seed; significant when its mean over the n "
               "seeds is below -t x s.e., t = t(0.975, n - 1) (two-sided 5 % paired t-test: 4.30 s.e. for 3 seeds, "
               "12.7 for 2)")

CLASSES = ("dead zone", "not resolved", "transition", "diminishing returns", "improvement", "worse", "n/a")

STEP_RULES = [
    "loss = final evaluation loss (nats/token), macro-averaged over the evaluation domains; each dP's value is "
    "the mean over seeds, and s its seed-to-seed sample standard deviation",
    "noise of a step a -> b = the standard error of the difference of the two means, sqrt(s_a^2/n_a + s_b^2/n_b)",
    f"dead zone: |delta| <= {NOISE_SIGMAS:g} x noise AND an equivalence test (TOST at 5 % per side, df = the smaller "
    "side's seeds - 1) puts the step inside +-margin, the registered plan's (without a plan margin no step can be "
    "called a dead zone)",
    f"not resolved: |delta| <= {NOISE_SIGMAS:g} x noise without that equivalence: within noise is not evidence of no "
    "change (the paired tables and the dose-response below are the seed-level tests)",
    f"worse: delta > {NOISE_SIGMAS:g} x noise (the loss rises beyond noise)",
    "gain per doubling = -delta / log2(b / a); the step from dP = 0 counts as one doubling",
    f"transition: among the significant improvements (delta < -{NOISE_SIGMAS:g} x noise), the one with the largest "
    "gain per doubling",
    "diminishing returns: a significant improvement at a larger dP than the transition (so a smaller gain per "
    "doubling)",
    "improvement: a significant improvement at a smaller dP than the transition",
    "n/a: fewer than two seeds on a side, so no noise estimate",
]


def se_diff(std_a: float, n_a: int, std_b: float, n_b: int) -> float:
    """Standard error of the difference of two independent means (NaN when either has no std)."""
    if n_a < 2 or n_b < 2:
        return math.nan
    return math.sqrt(std_a**2 / n_a + std_b**2 / n_b)


def seed_table(points: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows per dP: added params, % of base, loss mean +- seed std, delta vs dP = 0 +- its standard error.

    points: dicts with ple_dim, seed, loss, params_added, params_base (one per finished run).
    """
    by_dim: dict[int, list[dict[str, Any]]] = {}
    for p in points:
        if p.get("loss") is not None and math.isfinite(p["loss"]):
            by_dim.setdefault(int(p["ple_dim"]), []).append(p)
    rows = []
    for dim in sorted(by_dim):
        runs = by_dim[dim]
        mean, std = stats.mean_std([r["loss"] for r in runs])
        added, base = runs[0].get("params_added") or 0, runs[0].get("params_base") or 0
        rows.append({"ple_dim": dim, "params_added": added, "params_base": base,
                     "pct_of_base": 100.0 * added / base if base else math.nan,
                     "n": len(runs), "seeds": sorted(r.get("seed") for r in runs),
                     "loss_mean": mean, "loss_std": std})
    ref = rows[0] if rows else None  # dP = 0 when the sweep has it (the smallest dP otherwise; see `reference`)
    for row in rows:
        row["delta"] = row["loss_mean"] - ref["loss_mean"]
        row["delta_se"] = se_diff(row["loss_std"], row["n"], ref["loss_std"], ref["n"]) if row is not ref else 0.0
        row["significant"] = _significant(row["delta"], row["delta_se"]) if row is not ref else False
    return rows


def paired_table(points: Iterable[dict[str, Any]], key: str = "loss") -> list[dict[str, Any]]:
    """Rows per dP > 0: the paired delta = point[key](dP) - point[key](dP=0) of the same seed, mean +- s.e. over seeds.

    Pairing removes what the seeds share (trunk init, data order), so the s.e. is that of the per-seed deltas,
    std/sqrt(n); seeds without a dP = 0 run (or without the value) are left out and counted in `unpaired`.
    A gain is significant by a two-sided 5 % paired t-test (PAIRED_RULE): with 3 seeds that is 4.30 s.e., not 2.
    Every row shares its seeds' dP = 0 runs, so the rows are not independent tests: `dose_response` is the
    seed-level test of the whole curve.
    """
    by_dim: dict[int, dict[Any, float]] = {}
    for p in points:
        value = p.get(key)
        if isinstance(value, (int, float)) and math.isfinite(value):
            by_dim.setdefault(int(p["ple_dim"]), {})[p.get("seed")] = float(value)
    base = by_dim.get(0, {})
    rows = []
    for dim in sorted(d for d in by_dim if d > 0):
        d = stats.paired(base, by_dim[dim])
        verdict = stats.compare(d["mean"], d["se"], d["n"])
        rows.append({"ple_dim": dim, "n": d["n"], "seeds": d["seeds"], "deltas": [d["per_seed"][s] for s in d["seeds"]],
                     "delta_mean": d["mean"], "delta_se": d["se"], "unpaired": len(by_dim[dim]) - d["n"],
                     "t": stats.t_critical(d["n"]), "p": verdict["p"], "ci95": verdict["ci95"],
                     "gain_significant": None if verdict["p"] is None else verdict["outcome"] == "better"})
    return rows


def dose_response(points: Iterable[dict[str, Any]], key: str = "loss") -> dict[str, Any]:
    """Per-seed slope of the paired delta (dP vs the seed's dP = 0 run) on log2 dP, tested across seeds.

    The seed-level test of "the loss falls as dP grows": every dP of a seed is used once, against one shared
    reference run, so one unusual dP = 0 run shifts that seed's deltas without changing its slope.
    """
    rows = paired_table(points, key)
    deltas = {r["ple_dim"]: dict(zip(r["seeds"], r["deltas"], strict=True)) for r in rows}
    return stats.dose_response(deltas)


def _significant(delta: float, noise: float) -> bool | None:
    return None if not math.isfinite(noise) else abs(delta) > NOISE_SIGMAS * noise


def classify_steps(rows: Sequence[dict[str, Any]], margin: float | None = None) -> list[dict[str, Any]]:
    """Each step between consecutive dP values classified by STEP_RULES (a dead zone needs `margin`)."""
    steps = []
    for a, b in zip(rows, rows[1:], strict=False):
        delta = b["loss_mean"] - a["loss_mean"]
        noise = se_diff(a["loss_std"], a["n"], b["loss_std"], b["n"])
        doublings = math.log2(b["ple_dim"] / a["ple_dim"]) if a["ple_dim"] > 0 else 1.0
        step = {"from": a["ple_dim"], "to": b["ple_dim"], "delta": delta, "noise": noise,
                "z": delta / noise if noise and math.isfinite(noise) else math.nan,
                "gain_per_doubling": -delta / doublings, "margin": margin}
        if not math.isfinite(noise):
            step["class"] = "n/a"
        elif abs(delta) <= NOISE_SIGMAS * noise:
            flat = margin and stats.tost(delta, noise, min(a["n"], b["n"]), margin)["equivalent"]
            step["class"] = "dead zone" if flat else "not resolved"
        elif delta > 0:
            step["class"] = "worse"
        else:
            step["class"] = "significant"  # refined below, once the transition is known
        steps.append(step)
    gains = [s for s in steps if s["class"] == "significant"]
    if gains:
        top = max(gains, key=lambda s: s["gain_per_doubling"])
        for s in gains:
            s["class"] = ("transition" if s is top else "diminishing returns" if s["from"] >= top["to"]
                          else "improvement")
    return steps


def conclusion(steps: Sequence[dict[str, Any]], table: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """Does the curve show the published pattern (a plateau, then a significant drop)? `table` adds the deltas vs
    dP=0. A plateau is claimed only from steps an equivalence test puts inside the margin ("dead zone")."""
    cls = [s["class"] for s in steps]
    names = [f"{s['from']} -> {s['to']}" for s in steps]
    sig = [i for i, c in enumerate(cls) if c in ("transition", "diminishing returns", "improvement")]
    dead = [i for i, c in enumerate(cls) if c == "dead zone"]
    open_ = [i for i, c in enumerate(cls) if c == "not resolved"]
    worse = [i for i, c in enumerate(cls) if c == "worse"]
    if not steps or all(c == "n/a" for c in cls):
        return {"pattern": "unknown", "dead_zone": None, "text": "not enough finished runs (two seeds per dP) to "
                "separate changes from noise"}
    if worse:
        # a step that raises the loss beyond noise is neither a plateau nor a gain: say so before any pattern
        which = ", ".join(names[i] for i in worse)
        return {"pattern": "a step worse", "dead_zone": None if not sig else False,
                "text": f"{which} raises the loss beyond noise" + (
                    f", while {', '.join(names[i] for i in sig)} lowers it" if sig else "")
                + ": no plateau-then-transition reading is drawn from a curve with a step that costs loss"}
    margin = f"the plan's +-{steps[0]['margin']:g} margin" if steps[0].get("margin") else "the margin"
    seed_like = [i for i in dead if any(j > i for j in sig)]
    if seed_like:
        later = ", ".join(names[j] for j in sig if j > seed_like[0])
        text = (f"a dead zone appears: {', '.join(names[i] for i in seed_like)} lies inside {margin} by an "
                f"equivalence test (a plateau at that resolution, not a proof of no change), and a later step "
                f"({later}) improves the loss beyond noise: at this margin, the shape of the published "
                "plateau-then-transition pattern")
        return {"pattern": "dead zone then transition", "dead_zone": True, "text": text}
    before = [i for i in open_ if any(j > i for j in sig)]
    if before:
        text = (f"{', '.join(names[i] for i in before)} is within noise but not shown inside a margin, and a later "
                f"step ({', '.join(names[j] for j in sig if j > before[0])}) improves the loss beyond noise: whether a "
                "plateau precedes the transition is not resolved")
        return {"pattern": "not resolved, then transition", "dead_zone": None, "text": text}
    better = [r for r in table[1:] if r.get("significant") and r["delta"] < 0]
    if not sig and better:
        which = ", ".join(f"dP={r['ple_dim']} ({r['delta']:+.4f} +- {r['delta_se']:.4f})" for r in better)
        inside = (f" ({', '.join(names[i] for i in dead)} inside {margin} by an equivalence test, yet larger dPs "
                  "beat dP=0: inside the margin is not a plateau here)") if dead else ""
        text = (f"no single step between consecutive dP values is resolved from the seed-to-seed noise{inside}, but "
                f"{which} beats dP={table[0]['ple_dim']} beyond noise: a gradual gain whose per-step size is below "
                "the noise, so at this noise level the loss curve cannot place a dead zone or a transition")
        return {"pattern": "gradual", "dead_zone": None, "text": text}
    if not sig and dead and not open_:
        return {"pattern": "flat", "dead_zone": True, "text": f"every step lies inside {margin} by an equivalence "
                "test: in this dP range PLE's steps change the loss by less than that"}
    if not sig:
        return {"pattern": "not resolved", "dead_zone": None, "text": "no step improves the loss beyond noise, and "
                "not every step is shown inside a margin: the range cannot tell a flat curve from a small gain"}
    after = dead + open_
    if after:
        text = (f"no plateau below the gains: every significant improvement comes first, then "
                f"{', '.join(names[i] for i in after)} " + (f"lies inside {margin} (saturation)" if not open_ else
                                                            "is within noise (not resolved: saturation or a gain "
                                                            "below the noise)"))
        return {"pattern": "saturation" if not open_ else "gains, then not resolved", "dead_zone": False,
                "text": text}
    return {"pattern": "monotonic", "dead_zone": False,
            "text": "no dead zone: every step changes the loss beyond noise"}


def domain_table(points: Sequence[dict[str, Any]], evals: dict[str, dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per domain: mean loss (and seed std) at each dP, and its delta vs the smallest dP (dP = 0); lists follow dims."""
    dims = sorted({int(p["ple_dim"]) for p in points})
    domains = sorted({d for p in points for d in evals.get(p["name"], {})})
    rows = []
    for dom in domains:
        cells = [stats.mean_std([evals[p["name"]][dom]["loss"] for p in points
                                 if int(p["ple_dim"]) == dim and dom in evals.get(p["name"], {})]) for dim in dims]
        means = [m for m, _ in cells]
        rows.append({"domain": dom, "mean": means, "std": [s for _, s in cells],
                     "delta": [m - means[0] for m in means]})
    improved = [sum(1 for r in rows if r["delta"][i] < 0) for i in range(len(dims))]
    return {"dims": dims, "domains": domains, "rows": rows, "improved_domains": improved}


def verdict_table(points: Sequence[dict[str, Any]], table: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per dP > 0: early and final used verdicts (dependence; old records' names mapped by
    diagnostics.verdict.used_label), their agreement, ablation deltas, injection ratio."""
    sig = {r["ple_dim"]: r["significant"] for r in table}
    rows, agree, total, proxy_agree = [], 0, 0, 0
    for dim in sorted({int(p["ple_dim"]) for p in points if p["ple_dim"]}):
        runs = [p for p in points if int(p["ple_dim"]) == dim]
        diag = [p.get("diagnostics") or {} for p in runs]
        final = [used_label((d.get("final") or {}).get("verdict")) for d in diag]
        early = [used_label((d.get("early") or {}).get("verdict")) for d in diag]
        proxy = [used_label((d.get("early") or {}).get("proxy_verdict")) for d in diag]
        pairs = [(e, f) for e, f in zip(early, final, strict=True) if e and f]
        proxy_pairs = [(e, f) for e, f in zip(proxy, final, strict=True) if e and f]
        agree += sum(e == f for e, f in pairs)
        total += len(pairs)
        proxy_agree += sum(e == f for e, f in proxy_pairs)
        rows.append({
            "ple_dim": dim, "n": len(runs), "final": _counts(final), "early": _counts(early),
            "early_proxy": _counts(proxy), "early_step": _first([(d.get("early") or {}).get("step") for d in diag]),
            "early_agrees": sum(e == f for e, f in pairs), "compared": len(pairs),
            "early_proxy_agrees": sum(e == f for e, f in proxy_pairs),
            "ablation_final": _mean_std_dict((d.get("final") or {}).get("ablation_delta_loss") for d in diag),
            "ablation_early": _mean_std_dict((d.get("early") or {}).get("ablation_delta_loss") for d in diag),
            "injection_ratio": _mean_std_dict(_mean(_nums(x.get("injection_ratio") for x in d.get("layers", [])))
                                              for d in diag),
            "loss_delta_beyond_2se_unpaired": sig.get(dim),
        })
    return {"rows": rows, "early_agrees": agree, "early_proxy_agrees": proxy_agree, "compared": total}


def _mean_std_dict(values: Iterable[Any]) -> dict[str, float]:
    nums = _nums(values)
    mean, std = stats.mean_std(nums)
    return {"mean": mean, "std": std, "n": len(nums)}


def _counts(values: Iterable[str | None]) -> dict[str, int]:
    return dict(Counter(v for v in values if v))


def _nums(values: Iterable[Any]) -> list[float]:
    return [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _first(values: Iterable[Any]) -> Any:
    return next((v for v in values if v is not None), None)


def _point(run: dict[str, Any], folder: Path) -> dict[str, Any]:
    summary = run.get("summary") or {}
    return {"name": run["name"], "dir": str(folder / "runs" / run["name"]), "values": run["point"],
            "ple_dim": run["ple_dim"], "seed": run["seed"], "loss": run["eval_loss"], "bpb": run["eval_bpb"],
            "train_loss": run["train_loss"], "tokens": run.get("tokens"), "params_added": run["params_added"],
            "params_base": run["params_base"],
            "diagnostics": summary.get("diagnostics") or {}}


def folder_note(points: list[dict[str, Any]]) -> str | None:
    """A note when finished runs have no training log on this disk (restored from a snapshot), else None."""
    missing = [p for p in points if not (Path(p["dir"]) / METRICS_FILE).is_file()]
    if not missing:
        return None
    shown = len(points) - len(missing)
    plots = (f"the training-loss curves and injection heatmaps show only the other {shown}" if shown else
             "there are no training-loss curves or injection heatmaps (the report as first committed has them)")
    return (f"{len(missing)} of {len(points)} finished runs have no run folder on this disk (restored from a "
            f"snapshot: `plelab sweep --restore`): their evaluations and results are in every table, but {plots}")


def with_eval_losses(point: dict[str, Any], domains: dict[str, dict[str, float]]) -> dict[str, Any]:
    """The point plus 'heldout' (the held-out split's loss, None when not evaluated) and 'domains_macro'.

    domains_macro is the macro loss over the other evaluation domains (the 16 of ../shared/data/valid).
    """
    held = (domains.get(HELDOUT_DOMAIN) or {}).get("loss")
    others = _nums(d.get("loss") for name, d in domains.items() if name != HELDOUT_DOMAIN)
    return {**point, "heldout": held, "domains_macro": _mean(others)}


def group_key(values: dict[str, Any]) -> str:
    """The grid values other than dP and seed, as one label ('' when dP and seed are the whole grid)."""
    return ",".join(f"{k}={json.dumps(v)}" for k, v in values.items() if k not in (DIM_KEY, SEED_KEY))


def analyze_group(points: list[dict[str, Any]], evals: dict[str, dict[str, dict[str, float]]],
                  margin: float | None = None) -> dict[str, Any]:
    """Seed table, steps, conclusion, per-domain and verdict tables of one group of runs (margin: the plan's, for
    calling a step a dead zone)."""
    table = seed_table(points)
    steps = classify_steps(table, margin)
    return {"runs": points, "table": table, "reference_dim": table[0]["ple_dim"] if table else None,
            "steps": steps, "conclusion": conclusion(steps, table),
            "domains": domain_table(points, evals) if points else {}, "verdicts": verdict_table(points, table),
            "paired": {key: paired_table(points, key) for key in ("loss", "heldout")},
            "dose_response": {key: dose_response(points, key) for key in ("loss", "heldout")}}


def analyze_sweep(folder: str | Path, plan: str | Path | None = None) -> dict[str, Any]:
    """The whole analysis of a sweep folder, JSON-ready (NaN -> None), with the registered plan's verdicts (or
    those of `plan`, a plan file given at report time: post hoc)."""
    from plelab.experiments.plan import folder_plan

    folder = Path(folder)
    if not (folder / DB_FILE).is_file():
        raise PlelabError(f"{folder} has no {DB_FILE}; run `plelab sweep SWEEP_FILE` first (or give its folder)")
    with SweepStore(folder / DB_FILE, readonly=True) as store:
        meta, runs, evals = store.meta(), store.runs(), store.evals()
    done = [with_eval_losses(_point(r, folder), evals.get(r["name"], {})) for r in runs if r["status"] == "done"]
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in done:
        groups.setdefault(group_key(p["values"]), []).append(p)
    notes = [n for n in (sample_note({p["name"]: evals.get(p["name"], {}) for p in done}), folder_note(done)) if n]
    plan_analysis = folder_plan(folder, plan)
    margin = ((plan_analysis or {}).get("evaluation") or {}).get("margin")
    analysed = [{"key": k, **analyze_group(v, evals, margin)} for k, v in groups.items()]
    return _jsonable({
        "sweep": meta.get("name", folder.name), "folder": str(folder), "grid": meta.get("grid", {}),
        "notes": notes,
        "counts": dict(Counter(r["status"] for r in runs)), "total_runs": len(runs),
        "rules": STEP_RULES, "noise_sigmas": NOISE_SIGMAS,
        "groups": analysed,
        "config": (runs[0]["config"] if runs else {}), "plan": plan_analysis,
        "schedules": sorted({(r["config"].get("max_steps"), r["config"].get("warmup_steps"))
                             for r in runs if r.get("config")}, key=lambda s: (s[0] or 0, s[1] or 0)),
    })
