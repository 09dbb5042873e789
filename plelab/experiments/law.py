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
from fractions import Fraction
from itertools import combinations
from pathlib import Path
from typing import Any

from plelab.diagnostics import early as E
from plelab.diagnostics.diagnose import jsonable
from plelab.errors import PlelabError
from plelab.experiments.analysis import PAIRED_RULE, analyze_sweep, mean_std, paired_table
from plelab.experiments.sweep import DB_FILE
from plelab.experiments.sweep_runner import read_metrics
from plelab.experiments.sweep_store import SweepStore

LAW_FILE = Path(__file__).with_name("deadzone_law.json")
"""The study's measured law and early rule, committed with the package (absent until the study has run)."""
PREDICTION_FILE = "prediction.json"
"""In the study folder: the prediction for the held-out width, written once before it runs, never overwritten."""

TRAINED_LATE_FRACTION = 0.2
TRAINED_MAX_LATE_SHARE = 0.1
SMOOTH_FRACTION = 0.05

CRITERIA = {
    "alive": "smallest tested dP whose final ablation verdict is alive in every seed",
    "gain": "smallest tested dP whose paired loss delta vs dP = 0 is a significant gain (mean delta < -t x "
            "std/sqrt(seeds), t = t(0.975, seeds - 1): 4.30 for 3 seeds; at least two seeds)",
}
TRAINED_RULE = (f"trained (the loss has bent): over the last {TRAINED_LATE_FRACTION:.0%} of the logged steps the "
                f"training loss drops by less than {TRAINED_MAX_LATE_SHARE:.0%} of its whole drop (each end the "
                f"mean of {SMOOTH_FRACTION:.0%} of the logged points)")

PUBLISHED = [{"source": "SPEC §3 (3B, 400B tokens)", "H": 2560, "form": "simple", "criterion": "gain",
              "bracket": [128, 256], "note": "64 -> 128 within noise, 128 -> 256 the transition"},
             {"source": "docs/deadzone-study.md (150 steps, unpaired seeds)", "H": 64, "form": "simple",
              "criterion": "alive", "bracket": [8, 16], "note": "dP = 8: 2 alive, 1 weak; dP = 16: 3 alive"}]
"""Points measured before this study, shown beside it and used by --suggest-ple until a law exists."""


# ------------------------------------------------------------------------------------------ trained criterion
def trained_criterion(losses: Sequence[float]) -> dict[str, Any]:
    """TRAINED_RULE on a run's logged training losses (in step order)."""
    values = [float(v) for v in losses if v is not None and math.isfinite(v)]
    if len(values) < 5:
        return {"trained": None, "late_share": None, "reason": f"{len(values)} logged losses: too few to judge"}
    w = max(1, round(SMOOTH_FRACTION * len(values)))
    at = min(len(values) - w, round((1 - TRAINED_LATE_FRACTION) * len(values)))
    start, mid, end = (sum(values[i:i + w]) / w for i in (0, at - w // 2, len(values) - w))
    total, late = start - end, mid - end
    if total <= 0:
        return {"trained": False, "late_share": None, "total_drop": total, "reason": "the loss did not fall"}
    share = late / total
    return {"trained": share < TRAINED_MAX_LATE_SHARE, "late_share": share, "total_drop": total, "late_drop": late,
            "reason": f"late drop {late:.4f} = {share:.1%} of the total drop {total:.4f}"}


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
    alive = [d for d in dims if verdicts[d] and all(v == "alive" for v in verdicts[d])]
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


def collapse(widths: Sequence[dict[str, Any]], form: str) -> dict[str, dict[str, Any]]:
    """Is the paired gain a function of dP/H (the law's premise) or of dP itself? Per axis, every pair of widths
    is compared where both tested the same axis value: z = (delta_1 - delta_2) / sqrt(se_1^2 + se_2^2).

    The axis on which the widths' curves coincide has the smaller sum of z^2 per shared point (about 1 when they
    coincide within noise). Descriptive: with 3 seeds each s.e. is itself noisy, so no p-value is claimed.
    """
    curves = {w["H"]: {r["ple_dim"]: r for r in w["paired"]
                       if all(isinstance(r.get(k), float) and math.isfinite(r[k]) for k in ("delta_mean", "delta_se"))}
              for w in widths if w["form"] == form}
    out = {}
    for axis, at in (("dP/H", lambda d, h: Fraction(d, h)), ("dP", lambda d, h: Fraction(d))):
        points = []
        for h1, h2 in combinations(sorted(curves), 2):
            a = {at(d, h1): r for d, r in curves[h1].items()}
            b = {at(d, h2): r for d, r in curves[h2].items()}
            for x in sorted(set(a) & set(b)):
                diff = a[x]["delta_mean"] - b[x]["delta_mean"]
                se = math.hypot(a[x]["delta_se"], b[x]["delta_se"])
                points.append({"H": [h1, h2], "x": float(x), "ple_dim": [a[x]["ple_dim"], b[x]["ple_dim"]],
                               "diff": diff, "z": diff / se if se > 0 else math.nan})
        zs = [p["z"] for p in points if math.isfinite(p["z"])]
        out[axis] = {"points": points, "k": len(zs), "chi2_per_point": sum(z * z for z in zs) / len(zs) if zs else None,
                     "mean_abs_diff": sum(abs(p["diff"]) for p in points) / len(points) if points else None}
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
            "trained": trained_criterion([m.get("loss") for m in metrics]),
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
        mean, std = mean_std([r["ablation_delta"] for r in at if isinstance(r.get("ablation_delta"), (int, float))])
        n = sum(isinstance(r.get("ablation_delta"), (int, float)) for r in at)
        ablation.append({"ple_dim": d, "mean": mean, "se": std / math.sqrt(n) if n > 1 else math.nan, "n": n,
                         "verdicts": {v: sum(r["verdict"] == v for r in at) for v in
                                      sorted({r["verdict"] for r in at if r["verdict"]})}})
    first = runs[0]
    return {"H": first["H"], "form": first["form"], "layers": first["layers"], "vocab": first["vocab"],
            "max_steps": first["max_steps"], "dims": dims,
            "paired": paired_table(runs, loss_key), "paired_secondary": paired_table(runs, "domains_macro"),
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
    """The compact result the study commits as LAW_FILE: the law, its evidence, the early rule and its accuracy."""
    early = analysis["early"] or {}
    test = early.get("test") or {}
    return {"form": analysis["form"], "criterion": "alive", "law": analysis["law"]["alive"],
            "law_gain": analysis["law"]["gain"], "fit_widths": analysis["fit_widths"],
            "widths_tested": sorted({w["H"] for w in analysis["widths"] if w["form"] == analysis["form"]}),
            "predictions": analysis["predictions"],
            "measured": [{"H": w["H"], **{c: w["thresholds"][c]["bracket"] for c in CRITERIA}}
                         for w in analysis["widths"] if w["form"] == analysis["form"]],
            "early_rule": None if early.get("rule") is None else {
                **early["rule"], "test_widths": sorted({p["H"] for p in analysis["predictions"]}),
                "test_correct": test.get("correct"), "test_n": test.get("n"), "test_accuracy": test.get("accuracy")}}


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
                            f"{bracket_text(p['bracket'])}, measured {bracket_text(p['measured'])}): a table that "
                            "is alive need not pay measurably; see the measured gain brackets and docs/deadzone-law.md")
    return {"H": width, "measured": True, "range": [c_lo * width, c_hi * width], "c": [c_lo, c_hi],
            "widths_tested": tested, "fit_widths": law.get("fit_widths"), "predictions": law.get("predictions"),
            "per_width": law.get("measured") or [], "early_accuracy": test.get("test_accuracy"),
            "warnings": warnings, "published": PUBLISHED}


def format_suggestion(advice: dict[str, Any]) -> str:
    """`suggest`'s answer as text: the range, its evidence, the warnings."""
    lines = [f"warning: {w}" for w in advice["warnings"]]
    if advice["measured"]:
        lo, hi = advice["range"][0], upper(advice["range"])
        early = advice.get("early_accuracy")
        c = f"dP*/H in ({ratio_text(advice['c'][0])}, {ratio_text(upper(advice['c']))}]"
        if not math.isfinite(hi):
            head = f"no tested dP/H was alive in every seed ({c})"
        elif lo <= 0:  # the smallest dP tested at every fit width was already alive: no dead zone was found
            head = (f"{_at_least(hi)}: alive in every seed; no dead zone was found (the smallest dP tested at every "
                    f"fit width was alive, so {c} is an upper bound on the threshold, not its location)")
        else:
            head = (f"{_at_least(hi)}: alive in every seed; dP <= {lo:.3g}: dead zone; between: unresolved by the "
                    f"grid ({c})")
        lines.insert(0, head)
        if advice["per_width"]:
            lines.append("measured dP* per width (alive in every seed / significant loss gain): " + "; ".join(
                f"H={m['H']} {bracket_text(m['alive'])} / {bracket_text(m['gain'])}" for m in advice["per_width"]))
        lines.append(f"evidence: widths tested {advice['widths_tested']}, law fitted on {advice['fit_widths']}; "
                     + "; ".join(f"H={p['H']} {p['criterion']}: {p['outcome']}" for p in advice["predictions"] or [])
                     + (f"; early rule accuracy on the held-out width {early:.0%}" if early is not None else ""))
    else:
        for p in advice["published"]:
            lo, hi = p["scaled"]
            lines.append(f"published ({p['source']}, H={p['H']}, {p['criterion']}): dP* in ({p['bracket'][0]}, "
                         f"{p['bracket'][1]}], dP/H ({ratio_text(p['ratio'][0])}, {ratio_text(p['ratio'][1])}]; "
                         f"at H={advice['H']} that would be dP in ({lo:.3g}, {hi:.3g}] (unverified)")
    return "\n".join(lines)
