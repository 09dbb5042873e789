"""The dead-zone law: per (width, form) threshold brackets on the dP grid, dP*/H = c fitted on some widths, predicted
for another, with the "trained" criterion per run and the early predictor chosen and tested the same way.

A threshold is only known to lie between two tested dP values, so everything here is a bracket (lo, hi]:
dP* is the smallest tested dP that meets the criterion, lo the tested dP below it. A width gives the bracket
(lo/H, hi/H] for c; the law holds on the fit widths if their brackets intersect (then c is in the
intersection), and the prediction for width H is (c_lo H, c_hi H]. A prediction is a hit when the width's
measured bracket overlaps it: the grid cannot tell the two apart any better.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.diagnostics import early as E
from plelab.diagnostics.verdict import used_label
from plelab.errors import PlelabError
from plelab.experiments.sweep import DB_FILE
from plelab.experiments.sweep_store import SweepStore
from plelab.runs.metrics import read_metrics
from plelab.studies.deadzone.analysis import PAIRED_RULE, analyze_sweep, dose_response, paired_table
from plelab.util.json_values import jsonable

LAW_FILE = Path(__file__).with_name("deadzone_law.json")
"""The study's measured law and early rule, committed with the package (absent until the study has run)."""
PREDICTION_FILE = "prediction.json"
"""In the study folder: the prediction for the held-out width, written once before it runs, never overwritten."""

TRAINED_TOLERANCE = 0.05
"""nats: the most the loss may still fall over the last doubling of tokens for a run to count as trained."""
SMOOTH_FRACTION = 0.05
LATE_FRACTION = 0.2
"""Only for the descriptive late share (the former criterion, kept in the records)."""

CRITERIA = {
    "alive": "smallest tested dP whose final used verdict (ablation > max(0.01, 2 s.e.): the trained model depends on "
             "its table; dependence, not benefit) holds in every seed. Its key keeps the name the study's records "
             "gave it, 'alive'",
    "gain": "smallest tested dP whose paired loss delta vs dP = 0 is a significant gain (mean delta < -t x "
            "std/sqrt(seeds), t = t(0.975, seeds - 1): 4.30 for 3 seeds; at least two seeds)",
}
TRAINED_RULE = (f"trained: the loss falls by at most {TRAINED_TOLERANCE:g} nats over the last doubling of tokens "
                f"(from half the run's tokens to the end; the held-out timeline when the run has one, else the "
                f"training loss, each point the mean of {SMOOTH_FRACTION:.0%} of the logged points around it). A run "
                "still falling faster would rank differently with more tokens. (Replaces 'the last 20 % of steps fall "
                "by < 10 % of the whole fall', which a run still dropping 0.3 nats passed: with cosine decay the "
                "learning rate is small over the last 20 %, and the whole fall starts at ln V.)")

PUBLISHED = [{"source": "SPEC §3 (3B, 400B tokens)", "H": 2560, "form": "simple", "criterion": "gain",
              "bracket": [128, 256], "note": "64 -> 128: 2.149 -> 2.149, no change at three decimals (one run each, no "
              "interval); 128 -> 256 the transition"},
             {"source": "docs/deadzone-study.md (150 steps, unpaired seeds)", "H": 64, "form": "simple",
              "criterion": "alive", "bracket": [8, 16],
              "note": "dP = 8: 2 used, 1 not used; dP = 16: 3 used"}]
"""Points measured before this study, shown beside it and used by --suggest-ple until a law exists."""


# ------------------------------------------------------------------------------------------ trained criterion
def trained_criterion(points: Sequence[Any], tolerance: float = TRAINED_TOLERANCE) -> dict[str, Any]:
    """TRAINED_RULE on a loss series: (tokens or step, loss) pairs in order, or bare losses (index = step).

    The drop over the last doubling is L(x_end / 2) - L(x_end), L the series smoothed over SMOOTH_FRACTION of its
    points (interpolated linearly in log x at x_end / 2). `late_share`, the former criterion's number (the fall
    over the last LATE_FRACTION of the points as a share of the whole fall), is kept as a description.
    """
    pairs = [(float(p[0]), p[1]) if isinstance(p, (tuple, list)) else (float(i + 1), p) for i, p in enumerate(points)]
    pairs = [(x, float(v)) for x, v in pairs if v is not None and math.isfinite(v) and x > 0]
    if len(pairs) < 5:
        return {"trained": None, "doubling_drop": None, "late_share": None,
                "reason": f"{len(pairs)} logged losses: too few to judge"}
    xs, ys = [x for x, _ in pairs], [v for _, v in pairs]
    w = max(1, round(SMOOTH_FRACTION * len(ys)))
    smooth = [sum(ys[max(0, i - w // 2):i - w // 2 + w]) / len(ys[max(0, i - w // 2):i - w // 2 + w])
              for i in range(len(ys))]
    end = sum(ys[-w:]) / w
    half = xs[-1] / 2
    if half < xs[0]:
        return {"trained": None, "doubling_drop": None, "late_share": None,
                "reason": f"the series starts at {xs[0]:g}, after half the run ({half:g}): no doubling to measure"}
    j = next(i for i in range(1, len(xs)) if xs[i] >= half)
    x0, x1 = math.log(xs[j - 1]), math.log(xs[j])
    frac = 0.0 if x1 == x0 else (math.log(half) - x0) / (x1 - x0)
    at_half = smooth[j - 1] + frac * (smooth[j] - smooth[j - 1])
    drop = at_half - end
    start = sum(ys[:w]) / w
    at = min(len(ys) - w, round((1 - LATE_FRACTION) * len(ys)))
    late_start = sum(ys[at - w // 2:at - w // 2 + w]) / w
    total = start - end
    late_share = (late_start - end) / total if total > 0 else None
    if total <= 0:
        return {"trained": False, "doubling_drop": drop, "tolerance": tolerance, "late_share": None,
                "total_drop": total, "reason": "the loss did not fall"}
    return {"trained": drop <= tolerance, "doubling_drop": drop, "tolerance": tolerance, "late_share": late_share,
            "total_drop": total, "reason": f"the loss fell {drop:.4f} nats over the last doubling "
                                           f"({half:g} -> {xs[-1]:g}); limit {tolerance:g}"}


# ------------------------------------------------------------------------------------------ thresholds
def bracket_of(dims: Sequence[int], first: int | None) -> tuple[float, float]:
    """(lo, hi]: the tested dP below the first that meets a criterion, and that one; (largest, inf) if none does."""
    tested = sorted(d for d in dims if d > 0)
    if first is None:
        return (float(tested[-1]) if tested else 0.0, math.inf)
    below = [d for d in tested if d < first]
    return (float(below[-1]) if below else 0.0, float(first))


def thresholds(points: Sequence[dict[str, Any]], loss_key: str) -> dict[str, dict[str, Any]]:
    """Both criteria of CRITERIA on one (width, form): the first dP meeting each, its bracket, exceptions above it."""
    dims = sorted({int(p["ple_dim"]) for p in points if p["ple_dim"]})
    verdicts = {d: [p.get("verdict") for p in points if p["ple_dim"] == d] for d in dims}
    alive = [d for d in dims if verdicts[d] and all(used_label(v) == "used" for v in verdicts[d])]
    gains = [r["ple_dim"] for r in paired_table(points, loss_key) if r["gain_significant"]]
    out = {}
    for name, meets in (("alive", alive), ("gain", gains)):
        first = meets[0] if meets else None
        out[name] = {"first": first, "bracket": list(bracket_of(dims, first)),
                     "exceptions": [d for d in dims if first is not None and d > first and d not in meets]}
    return out


def fit_law(brackets: dict[int, Sequence[float]]) -> dict[str, Any]:
    """c = dP*/H from each width's bracket (lo, hi]: the intersection of (lo/H, hi/H] over widths."""
    if not brackets:
        return {"consistent": False, "c": None, "reason": "no width measured"}
    brackets = {h: (float(b[0]), upper(b)) for h, b in brackets.items()}  # JSON stores an open end as null
    c_lo = max(lo / h for h, (lo, _) in brackets.items())
    c_hi = min(hi / h for h, (_, hi) in brackets.items())
    widths = sorted(brackets)
    per = {h: [brackets[h][0] / h, brackets[h][1] / h] for h in widths}
    if c_lo >= c_hi:
        return {"consistent": False, "c": None, "per_width": per,
                "reason": f"the widths' brackets of dP*/H do not overlap ({_brackets_text(per)}): no single c fits"}
    estimate = math.sqrt(c_lo * c_hi) if c_lo > 0 and math.isfinite(c_hi) else None
    bound = "" if math.isfinite(c_hi) else " (a lower bound only: no fit width reached the criterion in its grid)"
    return {"consistent": True, "c": [c_lo, c_hi], "estimate": estimate, "per_width": per,
            "reason": f"dP*/H in ({ratio_text(c_lo)}, {ratio_text(c_hi)}] fits every fit width "
                      f"({_brackets_text(per)}){bound}"}


def predict(law: dict[str, Any], width: int) -> list[float] | None:
    """The dP* bracket (c_lo H, c_hi H] the law predicts at `width`; None without a consistent law."""
    return [law["c"][0] * width, law["c"][1] * width] if law.get("consistent") else None


def outcome(predicted: Sequence[float | None] | None, measured: Sequence[float | None] | None) -> str:
    """'hit' when the measured bracket overlaps the predicted one, 'miss' otherwise; 'no prediction' / 'not run'."""
    if predicted is None:
        return "no prediction"
    if measured is None:
        return "not run"
    return "hit" if measured[0] < upper(predicted) and predicted[0] < upper(measured) else "miss"


def upper(bracket: Sequence[float | None]) -> float:
    """A bracket's upper end; JSON stores an unbounded one (nothing tested met the criterion) as null."""
    return math.inf if bracket[1] is None else float(bracket[1])


def _at_least(dp: float) -> str:
    """'dP >= x' for a suggested lower end; a fractional dP means every dP there is (the smallest is 1)."""
    return "any dP >= 1" if dp <= 1 else f"dP >= {dp:.3g}"


def ratio_text(x: float) -> str:
    """dP/H as text: '1/64' below 1, '2' from 1 on, '0', '∞'."""
    if not math.isfinite(x):
        return "∞"
    return f"1/{1 / x:.3g}" if 0 < x < 1 else f"{x:.3g}"


def bracket_text(b: Sequence[float | None] | None, width: int | None = None) -> str:
    """A dP* bracket as '(lo, hi]' ('> lo' when nothing tested met it, '-' when there is none), with dP/H if given H."""
    if b is None:
        return "-"
    lo, hi = b[0], upper(b)
    text = f"({lo:g}, {hi:g}]" if math.isfinite(hi) else f"> {lo:g} (none tested met it)"
    return text if width is None else f"{text}, dP/H {ratio_text(lo / width)}–{ratio_text(hi / width)}"


def _brackets_text(per: dict[int, Sequence[float]]) -> str:
    return "; ".join(f"H={h}: ({ratio_text(lo)}, {ratio_text(hi)}]" for h, (lo, hi) in per.items())


def collapse(widths: Sequence[dict[str, Any]], form: str, draws: int = 20_000) -> dict[str, dict[str, Any]]:
    """Is the paired gain a function of dP/H (the law's premise) or of dP itself? Per axis, every pair of widths
    is compared where both tested the same axis value: z = (delta_1 - delta_2) / sqrt(se_1^2 + se_2^2).

    The statistic is the mean z^2 over the shared points. It is held against its simulated null
    (stats.curves_agree: each width redrawn with its own seeds' spread and no difference between widths), not
    against 1: with 3 seeds a side z is t-like and the points share runs, so two curves that coincide exactly
    give a mean z^2 near 2 and often far above. Two nulls: `p` keeps the seeds' correlation across dP (heavy-
    tailed with 3 seeds: conservative), `p_independent` drops it (liberal). Small p = the widths' curves differ
    on that axis. leave_one_out: the statistic without each point (one point can carry it).
    """
    out = {}
    for axis, scale in (("dP/H", True), ("dP", False)):
        curves = {}
        for w in widths:
            if w["form"] != form:
                continue
            seeds: dict[Any, dict[float, float]] = {}
            for r in w["paired"]:
                x = r["ple_dim"] / w["H"] if scale else float(r["ple_dim"])
                for s, d in zip(r.get("seeds") or [], r.get("deltas") or [], strict=True):
                    if isinstance(d, (int, float)) and math.isfinite(d):
                        seeds.setdefault(s, {})[x] = float(d)
            curves[w["H"]] = seeds
        res = stats.curves_agree(curves, draws=draws)
        alt = stats.curves_agree(curves, draws=draws, correlated=False)
        res.update(p_independent=alt["p"], null_median_independent=alt["null_median"],
                   null_p95_independent=alt["null_p95"])
        for p in res["points"]:
            h1, h2 = p.pop("curves")
            p["H"] = [h1, h2]
            p["ple_dim"] = [round(p["x"] * h1) if scale else int(p["x"]), round(p["x"] * h2) if scale else int(p["x"])]
        out[axis] = {**res, "chi2_per_point": res["statistic"]}
    return out


# ------------------------------------------------------------------------------------------ gathering runs
def form_of(config: dict[str, Any]) -> str:
    """'gemma' (input-dependent gate) or 'simple' (scalar / vector gate)."""
    return "gemma" if (config.get("model", {}).get("ple", {}) or {}).get("gate") == "input" else "simple"


def _run_record(point: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    config = row["config"]
    metrics, _ = read_metrics(Path(point["dir"]))
    model = config.get("model", {})
    final = (point.get("diagnostics") or {}).get("final") or {}
    return {**{k: point.get(k) for k in ("name", "dir", "ple_dim", "seed", "loss", "heldout", "domains_macro")},
            "H": int(model.get("hidden_size", 0)), "form": form_of(config), "layers": model.get("num_layers"),
            "vocab": model.get("vocab_size"), "max_steps": config.get("max_steps"),
            "verdict": final.get("verdict"), "ablation_delta": final.get("ablation_delta_loss"),
            "train_seconds": row.get("train_seconds"),
            "trained": trained_criterion([(m.get("step", i + 1), m.get("loss")) for i, m in enumerate(metrics)]),
            "signals": E.run_signals(metrics, int(config.get("max_steps") or 0)) if point["ple_dim"] else {}}


def gather(folder: str | Path) -> list[dict[str, Any]]:
    """Every finished run under `folder`: a sweep folder, or a folder whose subfolders are sweep folders."""
    folder = Path(folder)
    sweeps = [folder] if (folder / DB_FILE).is_file() else sorted(p.parent for p in folder.glob(f"*/{DB_FILE}"))
    if not sweeps:
        raise PlelabError(f"{folder} holds no {DB_FILE} (nor do its subfolders): run the study's sweeps first")
    records = []
    for sweep in sweeps:
        with SweepStore(sweep / DB_FILE, readonly=True) as store:
            rows = {r["name"]: r for r in store.runs() if r["status"] == "done"}
        for group in analyze_sweep(sweep)["groups"]:
            records += [_run_record(p, rows[p["name"]]) for p in group["runs"]]
    return records


# ------------------------------------------------------------------------------------------ the analysis
def width_table(runs: Sequence[dict[str, Any]], loss_key: str) -> dict[str, Any]:
    """One (width, form): paired deltas (primary and secondary loss), ablation per dP, thresholds, trained runs."""
    dims = sorted({r["ple_dim"] for r in runs if r["ple_dim"]})
    ablation = []
    for d in dims:
        at = [r for r in runs if r["ple_dim"] == d]
        mean, std = stats.mean_std([r["ablation_delta"] for r in at
                                    if isinstance(r.get("ablation_delta"), (int, float))])
        n = sum(isinstance(r.get("ablation_delta"), (int, float)) for r in at)
        ablation.append({"ple_dim": d, "mean": mean, "se": std / math.sqrt(n) if n > 1 else math.nan, "n": n,
                         "verdicts": {v: sum(r["verdict"] == v for r in at) for v in
                                      sorted({r["verdict"] for r in at if r["verdict"]})}})
    first = runs[0]
    return {"H": first["H"], "form": first["form"], "layers": first["layers"], "vocab": first["vocab"],
            "max_steps": first["max_steps"], "dims": dims,
            "paired": paired_table(runs, loss_key), "paired_secondary": paired_table(runs, "domains_macro"),
            "dose_response": dose_response(runs, loss_key),
            "ablation": ablation, "thresholds": thresholds(runs, loss_key),
            "train_hours": sum(r.get("train_seconds") or 0.0 for r in runs) / 3600,
            "trained": [{"name": r["name"], **r["trained"]} for r in runs]}


def _with_gain(runs: Sequence[dict[str, Any]], loss_key: str) -> list[dict[str, Any]]:
    """Each PLE run with 'gain' = its own dP = 0 run's loss minus its loss (same width, form, seed; None if none)."""
    base = {(r["H"], r["form"], r["seed"]): r.get(loss_key) for r in runs if not r["ple_dim"]}
    out = []
    for r in runs:
        if r["ple_dim"]:
            b, v = base.get((r["H"], r["form"], r["seed"])), r.get(loss_key)
            out.append({**r, "gain": float(b - v) if isinstance(b, (int, float)) and isinstance(v, (int, float))
                        else None})
    return out


def _early(train: Sequence[dict[str, Any]], test: Sequence[dict[str, Any]]) -> dict[str, Any]:
    tracking = {"fit": E.tracks_gain(train), "test": E.tracks_gain(test) if test else None}
    rule = E.choose_rule(train)
    if rule is None:
        return {"rule": None, "tracks_gain": tracking,
                "reason": "no fit run has both a final verdict and a logged signal at 5-20 % of training"}
    out = {"rule": rule, "fit": E.evaluate_rule(rule, train), "test": E.evaluate_rule(rule, test) if test else None,
           "text": E.describe_rule(rule), "tracks_gain": tracking, "post_hoc": None}
    post_hoc = E.choose_rule([*train, *test]) if test else None
    if post_hoc is not None:  # what the held-out width would have changed; in-sample, so no test of anything
        out["post_hoc"] = {"rule": post_hoc, "fit": E.evaluate_rule(post_hoc, [*train, *test]),
                           "text": E.describe_rule(post_hoc)}
    return out


def law_analysis(runs: Sequence[dict[str, Any]], fit_widths: Sequence[int] | None = None,
                 predict_widths: Sequence[int] = (), form: str | None = None,
                 prediction: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole study: per-width tables, the law on `fit_widths` of `form`, predictions, outcomes, early rule.

    form: the PLE form the law is fitted on; default the simple form when any run has it (the study's main line).

    runs: records as `gather` makes them. With a frozen `prediction` (PREDICTION_FILE), its fit widths and
    predicted brackets are used as written, and each predicted width's measured bracket is scored against them.
    """
    if not runs:
        raise PlelabError("no finished runs to analyse")
    loss_key = "heldout" if all(r.get("heldout") is not None for r in runs) else "loss"
    notes = [] if loss_key == "heldout" else [
        "the held-out split was not evaluated in every run: the primary loss is the macro loss over the evaluation "
        "domains"]
    by_key: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in runs:
        by_key.setdefault((r["H"], r["form"]), []).append(r)
    widths = [width_table(by_key[k], loss_key) for k in sorted(by_key, key=lambda k: (k[1] != "simple", k))]
    form = form or (prediction or {}).get("form") or widths[0]["form"]
    measured = {w["H"]: w for w in widths if w["form"] == form}
    if prediction is not None:
        fit_widths, predict_widths = prediction["fit_widths"], sorted({p["H"] for p in prediction["predictions"]})
    fit_widths = sorted(fit_widths if fit_widths is not None else [h for h in measured if h not in predict_widths])
    missing = [h for h in fit_widths if h not in measured]
    if not fit_widths:
        raise PlelabError(f"no {form}-form width with finished runs is left to fit the law on "
                          f"(measured: {sorted(measured)}; to predict: {list(predict_widths)})")
    if missing:
        raise PlelabError(f"fit width(s) {missing} have no finished {form}-form runs (measured: {sorted(measured)})")
    law = {c: fit_law({h: measured[h]["thresholds"][c]["bracket"] for h in fit_widths}) for c in CRITERIA}
    frozen = {(p["H"], p["criterion"]): p["bracket"] for p in (prediction or {}).get("predictions", [])}
    predictions = []
    for h in predict_widths:
        for c in CRITERIA:
            bracket = frozen.get((h, c), predict(law[c], h)) if prediction else predict(law[c], h)
            got = measured[h]["thresholds"][c]["bracket"] if h in measured else None
            predictions.append({"H": h, "criterion": c, "bracket": bracket, "measured": got,
                                "outcome": outcome(bracket, got)})
    scored = _with_gain(runs, loss_key)
    train = [r for r in scored if r["form"] == form and r["H"] in fit_widths]
    test = [r for r in scored if r["form"] == form and r["H"] in predict_widths]
    return jsonable({"form": form, "primary_loss": loss_key, "notes": notes, "criteria": CRITERIA,
                      "trained_rule": TRAINED_RULE, "paired_rule": PAIRED_RULE, "widths": widths,
                      "fit_widths": fit_widths, "law": law, "predictions": predictions,
                      "collapse": collapse(widths, form),
                      "early": _early(train, test), "published": PUBLISHED})


# ------------------------------------------------------------------------------------------ files
def prediction_record(analysis: dict[str, Any]) -> dict[str, Any]:
    """What PREDICTION_FILE freezes: fit widths, the law and the predicted brackets (no outcome)."""
    return {"form": analysis["form"], "fit_widths": analysis["fit_widths"], "law": analysis["law"],
            "predictions": [{k: p[k] for k in ("H", "criterion", "bracket")} for p in analysis["predictions"]],
            "early_rule": (analysis["early"] or {}).get("rule")}


def law_summary(analysis: dict[str, Any]) -> dict[str, Any]:
    """The compact result the study commits as LAW_FILE: the law on every measured width, its evidence, the frozen
    prediction's fit and outcomes, the early rule and its accuracy beside the base-rate rule's.

    `law` / `law_gain` are fitted on *every* measured width of the form (a held-out width, once measured, is
    evidence like the others); `law_fit_widths` is the fit the prediction was made from, kept as it was.
    """
    early = analysis["early"] or {}
    test = early.get("test") or {}
    form = analysis["form"]
    measured = [w for w in analysis["widths"] if w["form"] == form]
    every = {c: fit_law({w["H"]: w["thresholds"][c]["bracket"] for w in measured}) for c in CRITERIA}
    base = test.get("base_rate") or {}
    return {"form": form, "criterion": "alive", "law": every["alive"], "law_gain": every["gain"],
            "fit_widths": sorted(w["H"] for w in measured), "law_fit_widths": analysis["law"],
            "prediction_fit_widths": analysis["fit_widths"],
            "widths_tested": sorted({w["H"] for w in measured}),
            "predictions": analysis["predictions"],
            "measured": [{"H": w["H"], **{c: w["thresholds"][c]["bracket"] for c in CRITERIA}} for w in measured],
            "early_rule": None if early.get("rule") is None else {
                **early["rule"], "test_widths": sorted({p["H"] for p in analysis["predictions"]}),
                "test_correct": test.get("correct"), "test_n": test.get("n"), "test_accuracy": test.get("accuracy"),
                "test_base_rate_correct": base.get("base_correct"), "test_base_class": base.get("base_class"),
                "test_beats_base_rate": base.get("beats_base_rate")}}


def load_law(path: str | Path | None = None) -> dict[str, Any] | None:
    """The committed law (LAW_FILE by default), or None when the study has not written one yet."""
    path = Path(path) if path else LAW_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is damaged ({exc})") from None


def suggest(width: int, law: dict[str, Any] | None) -> dict[str, Any]:
    """The dP range suggested for hidden size `width`, with its evidence and plain warnings."""
    if width < 1:
        raise PlelabError(f"hidden size must be >= 1, got {width}")
    if law is not None and law.get("measured"):  # every measured width, the held-out one included
        law = {**law, "law": fit_law({m["H"]: m["alive"] for m in law["measured"] if m.get("alive")}),
               "fit_widths": sorted(m["H"] for m in law["measured"] if m.get("alive"))}
    if law is None or not (law.get("law") or {}).get("consistent"):
        points = [{**p, "ratio": [p["bracket"][0] / p["H"], p["bracket"][1] / p["H"]],
                   "scaled": [p["bracket"][0] / p["H"] * width, p["bracket"][1] / p["H"] * width]} for p in PUBLISHED]
        why = "no law has been measured yet" if law is None else "the study found no single dP*/H (see its report)"
        return {"H": width, "measured": False, "range": None, "published": points,
                "warnings": [f"{why}: below are the published points only, scaled by dP/H as an unverified guess"]}
    c_lo, c_hi = law["law"]["c"][0], upper(law["law"]["c"])
    tested = law.get("widths_tested") or []
    warnings = []
    if tested and not min(tested) <= width <= max(tested):
        warnings.append(f"H = {width} is outside the tested widths {tested}: this is an extrapolation")
    test = law.get("early_rule") or {}
    for p in law.get("predictions") or []:
        if p["criterion"] == "gain" and p["outcome"] == "miss":
            warnings.append(f"the loss-gain prediction missed at H = {p['H']} (predicted dP* in "
                            f"{bracket_text(p['bracket'])}, measured {bracket_text(p['measured'])}): a table the "
                            "model uses need not pay measurably; see the measured gain brackets and "
                            "docs/deadzone-law.md")
    if test.get("test_beats_base_rate") is False:
        warnings.append(f"the early rule ({test.get('test_correct')}/{test.get('test_n')} right on the held-out "
                        f"width) does not beat always saying '{used_label(test.get('test_base_class'))}' "
                        f"({test.get('test_base_rate_correct')}/{test.get('test_n')}) there: it has not been shown "
                        "to predict anything")
    return {"H": width, "measured": True, "range": [c_lo * width, c_hi * width], "c": [c_lo, c_hi],
            "widths_tested": tested, "fit_widths": law.get("fit_widths"), "predictions": law.get("predictions"),
            "per_width": law.get("measured") or [], "early_accuracy": test.get("test_accuracy"),
            "warnings": warnings, "published": PUBLISHED}


JSON_CRITERIA = {"alive": "used", "gain": "pays"}
"""The law's criteria as --json names them: the records keep their first names (alive, gain); what a user scripts
against says used (dependence) and pays (a resolved gain), as the text does."""


def suggestion_json(advice: dict[str, Any]) -> dict[str, Any]:
    """`suggest`'s answer for --json, its criteria under today's names (JSON_CRITERIA)."""
    def named(rows: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        return None if rows is None else [
            {JSON_CRITERIA.get(k, k): (JSON_CRITERIA.get(v, v) if k == "criterion" else v) for k, v in r.items()}
            for r in rows]
    return {**advice, **{k: named(advice.get(k)) for k in ("predictions", "per_width", "published") if k in advice}}


def format_suggestion(advice: dict[str, Any]) -> str:
    """`suggest`'s answer as text, benefit first: where a table paid (a resolved gain over the dP = 0 run of the
    same seed), then where the model used it (dependence, which is not benefit), its evidence and the warnings."""
    lines = [f"warning: {w}" for w in advice["warnings"]]
    if advice["measured"]:
        lo, hi = advice["range"][0], upper(advice["range"])
        early = advice.get("early_accuracy")
        c = f"dP*/H in ({ratio_text(advice['c'][0])}, {ratio_text(upper(advice['c']))}]"
        head = []
        if advice["per_width"]:
            head.append("pays (a resolved loss gain over the same seed's dP = 0 run, per-dP paired tests; the smallest "
                        "such dP per measured width): " + "; ".join(
                            f"H={m['H']} {bracket_text(m['gain'])}" for m in advice["per_width"])
                        + ". No single dP/H fits the gain across widths; at more tokens every gain shrank (the "
                        "tokens round), but none was shown to reach zero: the third round found dP = H/32 still "
                        "paying at H=32 to 247 tokens per non-embedding parameter, and dP = H/64 unresolved at H=64 "
                        "to 124 (docs/deadzone-law.md)")
        if not math.isfinite(hi):
            used = f"used in every seed: no tested dP/H ({c})"
        elif lo <= 0:  # the smallest dP tested at every fit width was already used
            used = (f"used in every seed (dependence, not benefit): {_at_least(hi)}; the smallest dP tested at every "
                    f"fit width was used, so {c} bounds the threshold from above, not its location")
        else:
            used = (f"used in every seed (dependence, not benefit): {_at_least(hi)} at every measured width; "
                    f"dP <= {lo:.3g}: not used in every seed at some width; between: unresolved by the grid ({c}, "
                    "fitted on every measured width)")
        lines[:0] = [*head, used]
        lines.append(f"evidence: widths tested {advice['widths_tested']}, law fitted on {advice['fit_widths']}; "
                     + "; ".join(f"H={p['H']} {'used' if p['criterion'] == 'alive' else 'pays'}: "
                                 f"{p['outcome']}" for p in advice["predictions"] or [])
                     + (f"; early rule accuracy on the held-out width {early:.0%}" if early is not None else ""))
    else:
        for p in advice["published"]:
            lo, hi = p["scaled"]
            what = "pays" if p["criterion"] == "gain" else "used"
            lines.append(f"published ({p['source']}, H={p['H']}, {what}): dP* in ({p['bracket'][0]}, "
                         f"{p['bracket'][1]}], dP/H ({ratio_text(p['ratio'][0])}, {ratio_text(p['ratio'][1])}]; "
                         f"at H={advice['H']} that would be dP in ({lo:.3g}, {hi:.3g}] (unverified)")
    return "\n".join(lines)
