"""Two questions about a PLE table, two verdicts: is it *used*, and does it *pay*?

- **used** (dependence): does the trained model rely on its table? Measured by ablation: the loss with the
  table switched off minus the loss with it on, paired over evaluation batches. A model trained with a table
  adapts to it, so switching it off costs loss even when the table bought nothing against a model trained
  without one: dependence is not benefit.
- **pays** (benefit): is the model better than its dP = 0 twin, trained on the same tokens with the same seed
  and steps? Measured as the paired loss difference on the same evaluation batches (plelab.diagnostics.benefit).
  Only this answers the question the dead-zone study asks ("does the table buy anything?").

Both rest on the four-way test the studies use (plelab.stats.compare): a difference is resolved when a two-sided t
test over the paired batches rejects 0; "no difference" (unused, equivalent) only when an equivalence test (TOST)
puts the whole 90 % interval inside a margin stated here beforehand and no difference is resolved; a resolved
difference inside the margin is "within margin", never "no difference"; anything else is "not resolved". pays
takes the test's outcome as it is; used keeps the ablation rule the studies have always applied to a table in use
(beyond max(margin, 2 s.e.)) and takes the rest from the test (USED). The unit is the evaluation batch of one
trained model (or one pair): the interval is evaluation noise, not seed-to-seed spread, which only a study over
seeds measures.

Without evaluation data the used verdict falls back on proxies (injection ratio, table health), is labelled
provisional, and the pays verdict is not measured.
"""

from __future__ import annotations

import math
import re
from typing import Any

from plelab import stats

USED_MARGIN = 0.01
"""Nats: an ablation larger than this (and than NOISE_SIGMAS standard errors) is "used"; one whose whole interval
lies inside +-this (TOST) is "unused"."""
NOISE_SIGMAS = 2.0
"""A delta counts as used only beyond this many standard errors of its paired per-batch differences."""
PAYS_MARGIN = 0.01
"""Nats: a paired difference to the dP = 0 twin whose interval lies inside +-this, none resolved, is "equivalent"."""
ALPHA = stats.ALPHA
"""Test level: two-sided for differences, per side for equivalence."""
DEAD_INJECTION_RATIO = 0.01
"""Proxy rule: an injection below 1 % of the hidden state's RMS is drowned by the trunk."""

USED = ("used", "used, within margin", "unused", "not resolved", "harmful, within margin", "harmful")
"""The used verdicts. used: switching the table off raises the loss by more than max(USED_MARGIN, NOISE_SIGMAS
s.e.) (the ablation rule the studies have always used for a table in use). unused: the ablation's 90 % interval
lies inside +-USED_MARGIN (TOST) and the t test resolves no change: no dependence beyond the margin. "used,
within margin": the t test resolves a rise and the 90 % interval lies inside the margin (a real dependence
smaller than USED_MARGIN: not unused). harmful / "harmful, within margin": the same for a fall (the model does
better without its table). not resolved: anything else, and always with one batch (no interval)."""
PAYS = ("better", "better, within margin", "equivalent", "worse", "worse, within margin", "not resolved",
        "not measured")
"""The pays verdicts, the studies' outcome labels (plelab.stats.OUTCOMES) for loss(model) - loss(twin): better =
the model's loss is lower than its twin's (resolved); "better, within margin" = resolved, with the 90 % interval
inside +-PAYS_MARGIN; equivalent = the interval lies inside +-PAYS_MARGIN with no difference resolved; not measured = no
twin."""

RULES = [
    f"used (dependence), primary: delta = loss with PLE switched off - loss with it on, paired over the evaluation "
    f"batches, the smallest over the zero, shuffle and table ablations (used only if every way of removing PLE "
    f"costs loss). used if delta > max({USED_MARGIN}, {NOISE_SIGMAS:g} x its standard error over the batches); "
    f"unused if its 90 % t interval lies inside +-{USED_MARGIN} nats (TOST at {ALPHA} per side) and a two-sided t "
    f"test (alpha {ALPHA}) resolves no change; 'used, within margin' if the t test resolves a rise and the 90 % "
    f"interval lies inside +-{USED_MARGIN} (a real dependence smaller than the margin, not unused); harmful if "
    f"delta < -max({USED_MARGIN}, {NOISE_SIGMAS:g} s.e.), 'harmful, within margin' the mirror of 'used, within "
    "margin'; not resolved otherwise, and always with one batch (no interval). Intervals printed beside a verdict "
    "are 95 % t intervals; the 90 % one is the equivalence test's. Per-layer verdicts are each their own test (no "
    "correction across layers).",
    "used (dependence) is not benefit: a model trained with a table depends on it whether or not it beats a model "
    "trained without one. Benefit is the pays verdict.",
    f"pays (benefit): delta = loss of this model - loss of its dP = 0 twin (same data, seed and steps) on the same "
    f"evaluation batches; better / worse when a two-sided t test over the batches resolves it (alpha {ALPHA}), "
    f"'within margin' when it is also inside +-{PAYS_MARGIN}; equivalent when the 90 % interval lies inside "
    f"+-{PAYS_MARGIN} and nothing is resolved; not resolved otherwise; not measured without a twin. One pair of "
    "runs: the interval is evaluation noise, not seed-to-seed spread (a study pairs over seeds).",
    f"proxies (only when no evaluation data can be found; provisional): unused if the injection ratio < "
    f"{DEAD_INJECTION_RATIO}; not resolved if the table slice is random-like in every available view; otherwise "
    "used. Overall: used if any layer is, unused if all are, not resolved otherwise. The gate is reported, not "
    "judged: behind the output RMSNorm its absolute scale is normalised away.",
    "supporting evidence (injection ratio, gate, table health) that points the other way is listed under "
    "'conflicts' but does not change an ablation verdict.",
]


RECORDED_BEFORE_EQUIVALENCE = {"alive": "used", "weak": "not used", "dead": "not used"}
"""Runs recorded before the used / pays verdicts said alive / weak / dead. alive is today's used (the same rule);
weak and dead meant "not used", and without the equivalence test they cannot be told apart into unused and not
resolved, so they are shown as "not used"."""


def used_label(recorded: str | None) -> str | None:
    """A recorded used verdict under today's names (old records: RECORDED_BEFORE_EQUIVALENCE)."""
    return RECORDED_BEFORE_EQUIVALENCE.get(recorded, recorded) if recorded else recorded


OLD_WORDS = [(re.compile(r"\bnot alive\b"), "not used"), (re.compile(r"\balive\b"), "used"),
             (re.compile(r"\b(?:dead|weak)\b(?! zone)"), "not used")]
"""The old verdict words inside recorded texts (a confusion key, a rule, a table cell), and today's names."""


def today_names(text: str) -> str:
    """A recorded text with its old verdict words in today's names (as used_label does for one verdict)."""
    for pattern, new in OLD_WORDS:
        text = pattern.sub(new, text)
    return text


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _interval(test: dict[str, Any]) -> str:
    ci = test.get("ci95")
    return "" if not ci else f" (95 % CI [{ci[0]:+.4f}, {ci[1]:+.4f}])"


def _equivalence(test: dict[str, Any], margin: float) -> str:
    """The equivalence test's own interval and p, said where "no difference" or "within margin" is claimed."""
    tost = test.get("tost") or {}
    lo, hi = tost.get("interval") or (math.nan, math.nan)
    return f"the 90 % interval [{lo:+.4f}, {hi:+.4f}] lies inside +-{margin:g} (TOST p {tost.get('p', math.nan):.2g})"


def noise_of(se: float | None) -> float:
    """The noise band of a delta from its standard error (0 when there is no estimate, e.g. one batch)."""
    return NOISE_SIGMAS * se if _finite(se) else 0.0


def used_verdict(delta: float, se: float | None, n: int, margin: float = USED_MARGIN,
                 alpha: float = ALPHA) -> dict[str, Any]:
    """{'verdict', 'reason', 'test'} of an ablation: delta = loss without PLE - loss with it, over n paired batches."""
    test = stats.compare(delta, se if _finite(se) else math.nan, n, margin, alpha)
    band = max(margin, noise_of(se))
    what = f"switching it off changes the loss by {delta:+.4f} nats{_interval(test)} over {n} batch(es)"
    outcome = test["outcome"]  # of loss(off) - loss(on): "worse" = switching the table off costs loss
    if outcome == "n/a":
        verdict, why = "not resolved", "one batch: no interval"
    elif delta > band:
        verdict, why = "used", f"more than max({margin:g}, {NOISE_SIGMAS:g} s.e.) = {band:.4f}"
    elif delta < -band:
        verdict, why = "harmful", f"a fall of more than {band:.4f}: the model does better without it"
    elif outcome == "equivalent":
        verdict, why = "unused", f"no change resolved, and {_equivalence(test, margin)}"
    elif outcome in ("worse, within margin", "better, within margin"):
        verdict = "used, within margin" if delta > 0 else "harmful, within margin"
        why = (f"a {'rise' if delta > 0 else 'fall'} resolved (p {test['p']:.2g}) and {_equivalence(test, margin)}: "
               "real, smaller than the margin")
    else:
        verdict = "not resolved"
        why = f"neither beyond {band:.4f} nor inside +-{margin:g} by the equivalence test"
    return {"verdict": verdict, "reason": f"{what}: {why}", "test": test}


def _table_random_like(table_views: dict | None) -> bool | None:
    """True if every available view calls the slice random-like; None if no view is available."""
    flags = [v.get("random_like") for v in (table_views or {}).values() if v and "random_like" in v]
    return all(flags) if flags else None


def proxy_verdict(probe: dict, table_views: dict | None) -> tuple[str, str]:
    """(used verdict, reason) from injection/gate statistics and table health alone (provisional)."""
    ratio = probe.get("injection_ratio")
    if _finite(ratio) and ratio < DEAD_INJECTION_RATIO:
        return "unused", f"injection ratio {ratio:.4f} < {DEAD_INJECTION_RATIO}"
    if _table_random_like(table_views):
        return "not resolved", "table slice random-like in every available view"
    return "used", f"injection ratio {ratio:.3f} and a structured table"


def layer_verdict(probe: dict, ablation: dict | None, table_views: dict | None) -> dict:
    """One PLE layer's used verdict: {'verdict', 'basis', 'reason', 'provisional', 'proxy_verdict', 'conflicts'}."""
    proxy, proxy_reason = proxy_verdict(probe, table_views)
    if ablation is None:
        return {"verdict": proxy, "basis": "proxies", "reason": f"{proxy_reason} (provisional: no ablation)",
                "provisional": True, "proxy_verdict": proxy, "conflicts": []}
    judged = used_verdict(ablation["delta"], ablation.get("se"), ablation.get("n", 0))
    conflicts = [] if proxy == judged["verdict"] else [f"proxies say {proxy}: {proxy_reason}"]
    return {"verdict": judged["verdict"], "basis": "ablation", "reason": judged["reason"], "provisional": False,
            "proxy_verdict": proxy, "conflicts": conflicts}


def overall_verdict(layer_verdicts: list[str], all_ablation: dict | None) -> dict:
    """PLE as a whole: the all-layers ablation's used verdict, else the layers' proxy verdicts (provisional)."""
    if all_ablation is not None:
        judged = used_verdict(all_ablation["delta"], all_ablation.get("se"), all_ablation.get("n", 0))
        return {"verdict": judged["verdict"], "basis": "ablation", "reason": f"all PLE layers off: {judged['reason']}",
                "provisional": False, "test": judged["test"]}
    if not layer_verdicts:
        return {"verdict": "n/a", "basis": "none", "reason": "the model has no PLE layers", "provisional": False}
    if "used" in layer_verdicts:
        verdict = "used"
    elif all(v == "unused" for v in layer_verdicts):
        verdict = "unused"
    else:
        verdict = "not resolved"
    counts = ", ".join(f"{layer_verdicts.count(v)} {v}" for v in USED if v in layer_verdicts)
    return {"verdict": verdict, "basis": "proxies", "reason": f"per-layer proxy verdicts: {counts} (provisional: "
            "no evaluation data, so no ablation)", "provisional": True}


def pays_verdict(delta: float, se: float | None, n: int, margin: float = PAYS_MARGIN,
                 alpha: float = ALPHA) -> dict[str, Any]:
    """{'verdict', 'reason', 'test'} of delta = loss(model) - loss(dP = 0 twin) over n paired evaluation batches."""
    test = stats.compare(delta, se if _finite(se) else math.nan, n, margin, alpha)
    verdict = "not resolved" if test["outcome"] == "n/a" else test["outcome"]
    said = {"equivalent": f"; {_equivalence(test, margin)}", "n/a": "; one batch: no interval"}
    said["better, within margin"] = said["worse, within margin"] = said["equivalent"]
    reason = (f"loss - twin's loss = {delta:+.4f} nats{_interval(test)} over {n} paired batch(es), margin "
              f"+-{margin:g}" + said.get(test["outcome"], ""))
    return {"verdict": verdict, "reason": reason, "test": test}


def pays_not_measured(why: str) -> dict[str, Any]:
    """The pays verdict when no twin could be evaluated, with why and what dependence does not say."""
    return {"verdict": "not measured", "reason": f"benefit was not measured: {why}. The used verdict says whether "
            "the trained model depends on its table, not whether the table bought anything: only a dP = 0 twin "
            "trained on the same tokens says that (plelab diagnose RUN --twin TWIN_RUN)", "test": None}
