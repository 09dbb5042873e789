"""Dose-response at the level of seeds: one least-squares slope per seed, then a t test across the seeds.

When every dose is compared with one shared reference run per seed (every dP > 0 against the same seed's
dP = 0 run), the per-dose tests are not independent: one unusual reference run moves them all. The slope of
each seed's deltas on log2(dose) uses every dose of that seed once, and the seeds are the independent units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from plelab.stats.paired import compare, summarize


def slope(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of ys on xs; None with fewer than two distinct xs."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


def dose_response(deltas: Mapping[float, Mapping[Any, float]], transform: str = "log2",
                  margin: float | None = None, alpha: float = 0.05) -> dict[str, Any]:
    """Per-seed slopes of delta on transform(dose) and their seed-level verdict.

    deltas: {dose: {seed: delta vs the seed's reference}}; doses <= 0 are left out under "log2" (the reference
    itself, delta 0 by construction, carries no information about the slope). A seed needs two doses.
    The verdict is `compare` on the slopes (negative = the loss falls as the dose grows).
    """
    if transform not in ("log2", "linear"):
        raise ValueError(f"transform must be 'log2' or 'linear', got {transform!r}")
    doses = sorted(d for d in deltas if transform == "linear" or d > 0)
    seeds = sorted({s for d in doses for s in deltas[d]})
    slopes: dict[Any, float] = {}
    for s in seeds:
        pts = [(math.log2(d) if transform == "log2" else float(d), float(deltas[d][s])) for d in doses
               if s in deltas[d] and math.isfinite(deltas[d][s])]
        b = slope([x for x, _ in pts], [y for _, y in pts])
        if b is not None:
            slopes[s] = b
    stats = summarize(slopes.values())
    verdict = compare(stats["mean"], stats["se"], stats["n"], margin, alpha)
    return {"transform": transform, "doses": doses, "per_seed": slopes, **stats, "negative": sum(b < 0 for b in
            slopes.values()), "verdict": verdict}
