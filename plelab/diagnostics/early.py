"""The early predictor: candidate PLE signals early in training, a threshold rule chosen on some runs, tested on others.

Every candidate is read from the monitor's logged trajectory (RUN_DIR/metrics.jsonl) at a fraction of training,
so a rule can be applied to a run while it trains, with no extra model evaluation. A rule is
`signal at fraction f of training > threshold  ->  used`, else not used (the final used verdict: does the trained
model depend on its table? Dependence, not benefit); it is chosen on the
runs of some widths (best accuracy, then the earliest fraction, then the widest margin) and its accuracy is
measured on a width it never saw: that accuracy, not the fit's, is what `plelab diagnose --early` quotes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from plelab.diagnostics.verdict import USED_MARGIN
from plelab.errors import PlelabError
from plelab.runs.metrics import read_metrics
from plelab.stats import accuracy_vs_base_rate, majority, spearman

FRACTIONS = (0.05, 0.1, 0.15, 0.2)
"""Where in training (fraction of the run's total steps) the candidates are read."""


def _last(lines: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [m[key] for m in lines if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    return float(values[-1]) if values else None


def _layer_mean(lines: Sequence[dict[str, Any]], prefix: str) -> float | None:
    """Mean over layers of the last logged `prefix/layerI` values."""
    keys = sorted({k for m in lines for k in m if k.startswith(prefix + "/layer")})
    values = [v for v in (_last(lines, k) for k in keys) if v is not None]
    return sum(values) / len(values) if values else None


def _recovery(lines: Sequence[dict[str, Any]]) -> float | None:
    """Injection ratio now / its minimum so far: > 1 once the ratio climbs out of its early trough."""
    key = "ple/injection_ratio/mean"
    values = [m[key] for m in lines if isinstance(m.get(key), (int, float)) and math.isfinite(m[key])]
    if not values or min(values) <= 0:
        return None
    return values[-1] / min(values)


SIGNALS: dict[str, tuple[str, Callable[[Sequence[dict[str, Any]]], float | None]]] = {
    "injection_ratio": ("mean injection ratio |injection| / |h| over PLE layers",
                        lambda lines: _last(lines, "ple/injection_ratio/mean")),
    "injection_recovery": ("injection ratio divided by its minimum so far (the trough)", _recovery),
    "grad_ratio_table": ("table gradient norm / trunk gradient norm",
                         lambda lines: _last(lines, "ple/grad_ratio_table")),
    "grad_ratio_gate": ("gate gradient norm / trunk gradient norm, mean over layers",
                        lambda lines: _layer_mean(lines, "ple/grad_ratio_gate")),
    "grad_ratio_proj": ("projection gradient norm / trunk gradient norm, mean over layers",
                        lambda lines: _layer_mean(lines, "ple/grad_ratio_proj")),
    "table_movement": ("|table - table at init| / |table at init| (Frobenius)",
                       lambda lines: _last(lines, "ple/table_movement")),
    "ablation_delta": ("loss with every PLE layer zeroed minus loss with PLE, on the monitor's probe batches",
                       lambda lines: _last(lines, "ple/ablation_delta")),
}
"""name -> (what it measures, how to read it from the logged lines up to a step). Larger = more used."""


def signals_at(metrics: Sequence[dict[str, Any]], total_steps: int, fraction: float) -> dict[str, Any]:
    """Every candidate read from the training lines logged at or before step round(fraction * total_steps)."""
    step = max(1, round(fraction * total_steps))
    lines = [m for m in metrics if int(m.get("step", 0)) <= step]
    reached = bool(metrics) and max(int(m.get("step", 0)) for m in metrics) >= step
    return {"fraction": fraction, "step": step, "reached": reached,
            "values": {name: fn(lines) for name, (_, fn) in SIGNALS.items()}}


def run_signals(metrics: Sequence[dict[str, Any]], total_steps: int,
                fractions: Sequence[float] = FRACTIONS) -> dict[float, dict[str, float | None]]:
    """{fraction: {signal: value}} for one run (only fractions the run has reached)."""
    out = {}
    for f in fractions:
        at = signals_at(metrics, total_steps, f)
        if at["reached"]:
            out[f] = at["values"]
    return out


USED_LABELS = ("used", "alive")
"""Final verdicts that count as the positive class: "used" and, in runs recorded before the used / pays verdicts,
"alive", the same ablation rule under its old name (delta > max(0.01, 2 s.e.))."""


def apply_rule(rule: dict[str, Any], value: float | None) -> str | None:
    """'used' / 'not used' by the rule, None when the signal is missing. The early rule has two classes: 'not used'
    is every final verdict but used (unused, the within-margin ones, not resolved, harmful), not 'unused'."""
    if value is None or not math.isfinite(value):
        return None
    return "used" if value > rule["threshold"] else "not used"


def _label(verdict: str | None) -> str | None:
    return None if verdict is None else "used" if verdict in USED_LABELS else "not used"


def _cut(lo: float, hi: float) -> float:
    """A threshold between two sorted values: geometric midpoint for positive values (signals span decades)."""
    return math.sqrt(lo * hi) if lo > 0 and hi > 0 else (lo + hi) / 2


def _margin(lo: float, hi: float) -> float:
    return math.log(hi / lo) if lo > 0 and hi > 0 else (hi - lo) / max(abs(hi), abs(lo), 1e-12)


def _best_threshold(pairs: list[tuple[float, str]]) -> tuple[int, float, float]:
    """(correct, threshold, margin) of the best cut of (value, label) pairs by 'value > threshold -> used'."""
    values = sorted({v for v, _ in pairs})
    cuts = [(values[0] - abs(values[0]) - 1.0, 0.0)]  # everything used
    cuts += [(_cut(a, b), _margin(a, b)) for a, b in zip(values, values[1:], strict=False)]
    cuts.append((values[-1] + abs(values[-1]) + 1.0, 0.0))  # nothing used
    best = (-1, 0.0, 0.0)
    for threshold, margin in cuts:
        correct = sum((v > threshold) == (label == "used") for v, label in pairs)
        if (correct, margin) > (best[0], best[2]):
            best = (correct, threshold, margin)
    return best


def _pairs(runs: Sequence[dict[str, Any]], fraction: float, name: str) -> list[tuple[float, str]]:
    """(signal value, final label) of every run that has both at this fraction."""
    pairs = [(r["signals"][fraction][name], _label(r["verdict"])) for r in runs
             if _label(r.get("verdict")) and r["signals"].get(fraction, {}).get(name) is not None]
    return [(v, lab) for v, lab in pairs if math.isfinite(v)]


def _verdict_line_rule(runs: Sequence[dict[str, Any]], label: str,
                       fractions: Sequence[float]) -> dict[str, Any] | None:
    """When every run ends `label`: the final verdict's own line applied early, at the best (then earliest) fraction.

    A threshold fitted to one class would sit anywhere beyond the data, so none is fitted: the monitor's ablation
    delta is held against USED_MARGIN, the line the final verdict uses, and only the fraction is chosen.
    """
    best: tuple | None = None
    for fi, f in enumerate(fractions):
        pairs = _pairs(runs, f, "ablation_delta")
        if pairs:
            correct = sum((v > USED_MARGIN) == (lab == "used") for v, lab in pairs)
            if best is None or (correct / len(pairs), -fi) > best[0]:
                best = ((correct / len(pairs), -fi), f, correct, len(pairs))
    if best is None:
        return None
    _, f, correct, n = best
    return {"signal": "ablation_delta", "fraction": f, "threshold": USED_MARGIN, "fit_correct": correct, "fit_n": n,
            "fit_accuracy": correct / n, "description": SIGNALS["ablation_delta"][0], "one_class": label,
            "note": one_class_note(label, USED_MARGIN)}


def one_class_note(label: str, threshold: float) -> str:
    """Why a rule fitted on runs of one final class is not a fitted threshold (today's class names)."""
    label = _label(label) or label
    other = "not used" if label == "used" else "used"
    return (f"every fit run ended {label}: the threshold is the floor of the final verdict's used line ({threshold:g} "
            "nats; the final line is max(0.01, 2 s.e.)), not fitted; only the fraction was chosen, and how the rule "
            f"does on runs that end {other} is untested")


def choose_rule(runs: Sequence[dict[str, Any]], fractions: Sequence[float] = FRACTIONS) -> dict[str, Any] | None:
    """The best single-threshold rule on these runs; runs: {'signals': run_signals(...), 'verdict': final verdict}.

    Best = most runs right, then the earliest fraction, then the widest margin (log ratio of the two values the
    threshold separates), then SIGNALS order. When the runs' verdicts are all used or all not used, any
    threshold beyond the data would 'fit', so `_verdict_line_rule` is used instead (marked `one_class`). None
    when no run has both a verdict and a signal.
    """
    labels = {_label(r.get("verdict")) for r in runs} - {None}
    if len(labels) == 1:
        return _verdict_line_rule(runs, labels.pop(), fractions)
    if not labels:
        return None
    best: tuple | None = None
    for fi, f in enumerate(fractions):
        for si, name in enumerate(SIGNALS):
            pairs = _pairs(runs, f, name)
            if not pairs:
                continue
            correct, threshold, margin = _best_threshold(pairs)
            key = (correct / len(pairs), -fi, margin, -si)
            if best is None or key > best[0]:
                best = (key, {"signal": name, "fraction": f, "threshold": threshold, "fit_correct": correct,
                              "fit_n": len(pairs), "fit_accuracy": correct / len(pairs),
                              "description": SIGNALS[name][0]})
    if best is None:
        return None
    # The base-rate rule a held-out accuracy is compared with: always say what the fit runs mostly ended as.
    return {**best[1], "majority": majority([_label(r.get("verdict")) for r in runs if _label(r.get("verdict"))])}


def evaluate_rule(rule: dict[str, Any], runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How often the rule gets the final verdict (used vs not) right on these runs; missing signals count apart.

    `base_rate` puts the accuracy beside the base-rate rule's on the same runs: always predicting the class the
    fit runs mostly ended as (rule['one_class'] / rule['majority']). A rule that does not beat it predicts nothing.
    """
    missing = 0
    guesses, truths = [], []
    confusion: dict[str, int] = {}
    for r in runs:
        truth = _label(r.get("verdict"))
        if truth is None:
            continue
        guess = apply_rule(rule, r["signals"].get(rule["fraction"], {}).get(rule["signal"]))
        if guess is None:
            missing += 1
            continue
        guesses.append(guess)
        truths.append(truth)
        key = f"predicted {guess}, final {truth}"
        confusion[key] = confusion.get(key, 0) + 1
    correct, n = sum(g == t for g, t in zip(guesses, truths, strict=True)), len(truths)
    base = _label(rule.get("one_class") or rule.get("majority"))
    return {"correct": correct, "n": n, "accuracy": correct / n if n else None, "missing": missing,
            "confusion": confusion, "base_rate": accuracy_vs_base_rate(guesses, truths, base) if n else None}


def describe_rule(rule: dict[str, Any]) -> str:
    """The rule in one line."""
    text = (f"used if {rule['signal']} at {rule['fraction']:.0%} of training > {rule['threshold']:.4g} "
            f"({rule.get('description') or SIGNALS[rule['signal']][0]})")
    # a one-class rule's note is rebuilt, so rules recorded under the old class names read in today's
    note = one_class_note(rule["one_class"], rule["threshold"]) if rule.get("one_class") else rule.get("note")
    return f"{text} [{note}]" if note else text


def rule_in_todays_names(rule: dict[str, Any] | None) -> dict[str, Any] | None:
    """A committed rule as --json shows it: its class fields and note in today's names (used / not used), so a
    script never reads a rule recorded before the used / pays verdicts under the old ones."""
    if rule is None:
        return None
    out = {**rule, **{k: _label(rule[k]) for k in ("one_class", "majority", "test_base_class") if rule.get(k)}}
    if rule.get("one_class"):
        out["note"] = one_class_note(rule["one_class"], rule["threshold"])
    return out


def predict_run(metrics: Sequence[dict[str, Any]], total_steps: int, rule: dict[str, Any] | None) -> dict[str, Any]:
    """The early prediction for one run: every candidate at each fraction reached, and the rule's call if any.

    rule: the study's `early_rule` (with its measured test accuracy), or None before the study has chosen one.
    """
    at = {f: signals_at(metrics, total_steps, f) for f in FRACTIONS}
    out: dict[str, Any] = {"total_steps": total_steps, "last_step": max((int(m.get("step", 0)) for m in metrics),
                                                                        default=0),
                           "signals": {f: a["values"] for f, a in at.items() if a["reached"]},
                           "rule": rule_in_todays_names(rule)}
    if rule is None:
        out["prediction"] = None
        out["text"] = ("no early rule has been measured yet: the dead-zone-law study (docs/deadzone-law.md) chooses "
                       "one and commits it with its accuracy; the candidate signals are listed without a verdict")
        return out
    reached = at.get(rule["fraction"]) or signals_at(metrics, total_steps, rule["fraction"])
    accuracy = (f"right in {rule['test_correct']}/{rule['test_n']} runs of the held-out width(s) "
                f"{rule.get('test_widths')}" if rule.get("test_n") else "no held-out accuracy measured")
    if not reached["reached"]:
        out["prediction"] = None
        out["text"] = (f"the rule reads step {reached['step']} ({rule['fraction']:.0%} of {total_steps}); the run has "
                       f"logged up to step {out['last_step']}")
        return out
    value = reached["values"].get(rule["signal"])
    out["prediction"] = apply_rule(rule, value)
    out["value"] = value
    said = {"not used": "not used (the final verdict will not be 'used': unused, not resolved or harmful)"}
    shown = said.get(out["prediction"], out["prediction"]) or "unknown (signal not logged)"
    out["text"] = (f"early prediction: {shown} - {describe_rule(rule)}; "
                   f"here {value if value is None else format(value, '.4g')} at step {reached['step']}; "
                   f"measured accuracy: {accuracy}")
    return out


def predict_from_run(run_dir: str | Path, rule: dict[str, Any] | None) -> dict[str, Any]:
    """`predict_run` on a run directory's logged trajectory (RUN_DIR/metrics.jsonl, max_steps from config.json)."""
    run_dir = Path(run_dir)
    config = run_dir / "config.json"
    if not (run_dir / "metrics.jsonl").is_file() or not config.is_file():
        raise PlelabError(f"--early wants a run directory with metrics.jsonl and config.json, got {run_dir}")
    try:
        total = int(json.loads(config.read_text(encoding="utf-8"))["max_steps"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{config}: no readable max_steps ({exc})") from None
    metrics, _ = read_metrics(run_dir)
    return predict_run(metrics, total, rule)


def format_prediction(report: dict[str, Any]) -> str:
    """The early prediction and the candidates as text."""
    lines = [report["text"], "", f"{'signal':<20}" + "".join(f"{f:>11.0%}" for f in report["signals"])]
    for name in SIGNALS:
        cells = [report["signals"][f].get(name) for f in report["signals"]]
        lines.append(f"{name:<20}" + "".join(f"{'-' if v is None else format(v, '.3g'):>11}" for v in cells))
    return "\n".join(lines)


TRIVIAL_RANKER = "dP/H (trivial ranker)"
"""tracks_gain's baseline row: the runs ranked by their design ratio alone."""


def tracks_gain(runs: Sequence[dict[str, Any]], fractions: Sequence[float] = FRACTIONS) -> dict[str, dict[float, Any]]:
    """How well each candidate, read early, ranks the runs' final gain: {signal: {fraction: {"rho", "n"}}}.

    runs: {'signals': run_signals(...), 'gain': final loss gain of the run over its own dP = 0 run (positive =
    better)}. A verdict can only say used or not; when every run ends used this is what is left to predict.
    With 'ple_dim' and 'H' on the runs, TRIVIAL_RANKER (dP/H, known before training) gets a row too: a signal is
    only worth reading early if it ranks the gain better than the design does.
    """
    out: dict[str, dict[float, Any]] = {}
    scored = [r for r in runs if isinstance(r.get("gain"), float) and r.get("ple_dim") and r.get("H")]
    if scored:
        rho = spearman([r["ple_dim"] / r["H"] for r in scored], [r["gain"] for r in scored])
        out[TRIVIAL_RANKER] = {f: {"rho": rho, "n": len(scored)} for f in fractions}
    for name in SIGNALS:
        out[name] = {}
        for f in fractions:
            pairs = [(r["signals"][f][name], r["gain"]) for r in runs
                     if isinstance(r.get("gain"), float) and r["signals"].get(f, {}).get(name) is not None
                     and math.isfinite(r["signals"][f][name])]
            rho = spearman([p[0] for p in pairs], [p[1] for p in pairs])
            out[name][f] = {"rho": rho, "n": len(pairs)}
    return out
