"""Verdicts: is each PLE layer (and PLE as a whole) alive, weak or dead, and by which rule.

Ablation is the primary evidence when evaluation batches exist: it measures what the loss loses without
PLE. Without them, the verdict falls back on proxies (injection ratio, gate, table health) and says so.
Supporting evidence that disagrees with the primary verdict is listed, never silently overruled.
"""

from __future__ import annotations

import math

ALIVE_DELTA = 0.01
"""Nats: an ablation that costs more than this (and more than the noise) means PLE is alive."""
DEAD_DELTA = 0.002
"""Nats: an ablation that costs at most this (or at most the noise) means dead; visual PLE's 0.001-0.002 was."""
NOISE_SIGMAS = 2.0
"""The noise of a delta is this many standard errors of its paired per-batch differences."""
DEAD_INJECTION_RATIO = 0.01
"""Proxy rule: an injection below 1 % of the hidden state's RMS is drowned by the trunk (SPEC §3's loop)."""

VERDICTS = ("alive", "weak", "dead")

RULES = [
    "ablation (primary): delta = loss with the layer's PLE off - loss with it on, the smallest over the zero, "
    "shuffle and table ablations (alive only if every way of removing PLE costs loss); "
    f"noise = {NOISE_SIGMAS:g} x standard error of the paired per-batch deltas. "
    f"alive if delta > max({ALIVE_DELTA}, noise); dead if delta <= max({DEAD_DELTA}, noise); weak in between.",
    "overall (ablation): the same rule applied to switching off every PLE layer at once.",
    f"proxies (only without evaluation data): dead if injection ratio < {DEAD_INJECTION_RATIO}; weak if the "
    "table slice is random-like in every available view; otherwise alive (provisional). overall: alive if any "
    "layer is alive, dead if all are dead, weak otherwise. The gate is reported, not judged: a closed gate shows "
    "as a small injection ratio, and behind the output RMSNorm the gate's absolute scale is normalised away.",
    "supporting evidence (injection ratio, gate, table health) that points the other way is listed under "
    "'conflicts' but does not change an ablation verdict.",
]


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def noise_of(se: float | None) -> float:
    """The noise band of a delta from its standard error (0 when there is no estimate, e.g. one batch)."""
    return NOISE_SIGMAS * se if _finite(se) else 0.0


def ablation_verdict(delta: float, se: float | None) -> tuple[str, str]:
    """(verdict, reason) from an ablation delta and its standard error."""
    noise = noise_of(se)
    alive_at, dead_at = max(ALIVE_DELTA, noise), max(DEAD_DELTA, noise)
    if delta > alive_at:
        return "alive", f"ablation delta {delta:+.4f} > {alive_at:.4f}"
    if delta <= dead_at:
        return "dead", f"ablation delta {delta:+.4f} <= {dead_at:.4f}"
    return "weak", f"ablation delta {delta:+.4f} in ({dead_at:.4f}, {alive_at:.4f}]"


def _table_random_like(table_views: dict | None) -> bool | None:
    """True if every available view calls the slice random-like; None if no view is available."""
    flags = [v.get("random_like") for v in (table_views or {}).values() if v and "random_like" in v]
    return all(flags) if flags else None


def proxy_verdict(probe: dict, table_views: dict | None) -> tuple[str, str]:
    """(verdict, reason) from injection/gate statistics and table health alone."""
    ratio = probe.get("injection_ratio")
    if _finite(ratio) and ratio < DEAD_INJECTION_RATIO:
        return "dead", f"injection ratio {ratio:.4f} < {DEAD_INJECTION_RATIO}"
    if _table_random_like(table_views):
        return "weak", "table slice random-like in every available view"
    return "alive", f"injection ratio {ratio:.3f} and a structured table (provisional: no ablation)"


def layer_verdict(probe: dict, ablation: dict | None, table_views: dict | None) -> dict:
    """Verdict of one PLE layer: {'verdict', 'basis', 'reason', 'proxy_verdict', 'conflicts'}."""
    proxy, proxy_reason = proxy_verdict(probe, table_views)
    if ablation is None:
        return {"verdict": proxy, "basis": "proxies", "reason": proxy_reason, "proxy_verdict": proxy, "conflicts": []}
    verdict, reason = ablation_verdict(ablation["delta"], ablation.get("se"))
    conflicts = [] if proxy == verdict else [f"proxies say {proxy}: {proxy_reason}"]
    return {"verdict": verdict, "basis": "ablation", "reason": reason, "proxy_verdict": proxy, "conflicts": conflicts}


def overall_verdict(layer_verdicts: list[str], all_ablation: dict | None) -> dict:
    """Verdict of PLE as a whole: from the all-layers ablation, else aggregated proxy verdicts."""
    if all_ablation is not None:
        verdict, reason = ablation_verdict(all_ablation["delta"], all_ablation.get("se"))
        return {"verdict": verdict, "basis": "ablation", "reason": f"all PLE layers off: {reason}"}
    if not layer_verdicts:
        return {"verdict": "n/a", "basis": "none", "reason": "the model has no PLE layers"}
    if "alive" in layer_verdicts:
        verdict = "alive"
    elif all(v == "dead" for v in layer_verdicts):
        verdict = "dead"
    else:
        verdict = "weak"
    counts = ", ".join(f"{layer_verdicts.count(v)} {v}" for v in VERDICTS if v in layer_verdicts)
    return {"verdict": verdict, "basis": "proxies", "reason": f"per-layer proxy verdicts: {counts}"}
