"""Power before compute: from a pilot's seed spread, what a grid can resolve and how many seeds an effect needs.

The test is the one every study uses: a two-sided one-sample t test on n per-seed deltas whose standard
deviation is sd. Its power at a true mean delta d is that of the noncentral t (scipy.stats.nct), with
noncentrality lam = d sqrt(n) / sd, df = n - 1 and critical value c = t_{1 - alpha/2, df}. The equivalence test
(TOST) has no such closed form: its power integrates the normal over the chi distribution of the sample s.d.,

    power = E_u[ Phi(hi(u)) - Phi(lo(u)) ],  u ~ chi(df),  the bounds below (equivalence_power).

The pilot's sd is itself an estimate from few seeds; the numbers are a plan, not a promise.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
from scipy import special
from scipy import stats as scipy_stats

_GRID = 4001


@functools.lru_cache(maxsize=64)
def _chi_grid(df: int) -> tuple[np.ndarray, np.ndarray]:
    """Points u and trapezoid weights of the chi(df) density (weights normalised to sum to 1)."""
    hi = math.sqrt(df) + 12.0
    u = np.linspace(0.0, hi, _GRID)
    log_pdf = np.full(_GRID, -np.inf)
    inner = u > 0
    log_pdf[inner] = ((df - 1) * np.log(u[inner]) - u[inner] ** 2 / 2 - (df / 2 - 1) * math.log(2)
                      - math.lgamma(df / 2))
    if df == 1:  # chi(1) is the half-normal: finite and largest at u = 0
        log_pdf[0] = 0.5 * math.log(2 / math.pi)
    w = np.full(_GRID, hi / (_GRID - 1))
    w[0] = w[-1] = w[0] / 2
    weights = np.exp(log_pdf) * w
    return u, weights / weights.sum()


def power(delta: float, sd: float, n: int, alpha: float = 0.05) -> float:
    """Probability that the two-sided t test on n per-seed deltas (spread sd) rejects 0 when the mean is delta."""
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if delta != 0 else alpha
    df = n - 1
    c = scipy_stats.t.ppf(1 - alpha / 2, df)
    lam = abs(delta) * math.sqrt(n) / sd
    # The lower tail P(T' < -c) as the upper tail at -lam: scipy's noncentral t cdf returns NaN far out in the
    # left tail (df 4, lam 36, say), where its survival function at the mirrored noncentrality does not.
    return float(scipy_stats.nct.sf(c, df, lam) + scipy_stats.nct.sf(c, df, -lam))


def minimum_detectable_effect(sd: float, n: int, alpha: float = 0.05, target: float = 0.8) -> float | None:
    """The smallest |mean delta| the t test on n seeds detects with probability `target` (None for n < 2)."""
    if n < 2 or not (sd > 0 and math.isfinite(sd)):
        return None
    lo, hi = 0.0, sd
    while power(hi, sd, n, alpha) < target:
        hi *= 2
    for _ in range(60):
        mid = (lo + hi) / 2
        if power(mid, sd, n, alpha) < target:
            lo = mid
        else:
            hi = mid
    return hi


def seeds_needed(delta: float, sd: float, alpha: float = 0.05, target: float = 0.8, max_n: int = 500) -> int | None:
    """The fewest seeds whose t test detects a true mean delta with probability `target` (None beyond max_n)."""
    if not (sd > 0 and math.isfinite(sd)) or delta == 0:
        return None
    for n in range(2, max_n + 1):
        if power(delta, sd, n, alpha) >= target:
            return n
    return None


def equivalence_power(margin: float, sd: float, n: int, true_delta: float = 0.0, alpha: float = 0.05) -> float:
    """Probability that TOST on n seeds declares |mean| < margin when the true mean is true_delta."""
    if n < 2 or margin <= 0:
        return 0.0
    df = n - 1
    c = scipy_stats.t.ppf(1 - alpha, df)
    u, w = _chi_grid(df)
    s = u / math.sqrt(df)
    scale = sd / math.sqrt(n)
    # Equivalent when -margin + c se < mean_hat < margin - c se, se = scale * s, mean_hat ~ N(true, scale^2).
    upper = (margin - c * scale * s - true_delta) / scale
    lower = (-margin + c * scale * s - true_delta) / scale
    return float(np.sum(w * np.clip(special.ndtr(upper) - special.ndtr(lower), 0.0, 1.0)))


def seeds_for_equivalence(margin: float, sd: float, true_delta: float = 0.0, alpha: float = 0.05,
                          target: float = 0.8, max_n: int = 500) -> int | None:
    """The fewest seeds for TOST to show |mean| < margin with probability `target` (None beyond max_n)."""
    for n in range(2, max_n + 1):
        if equivalence_power(margin, sd, n, true_delta, alpha) >= target:
            return n
    return None


def plan_power(sd: float, n: int, effect: float | None = None, margin: float | None = None,
               alpha: float = 0.05, target: float = 0.8) -> dict[str, Any]:
    """One comparison's power summary: the effect n seeds resolve, and the seeds an effect or margin needs."""
    out: dict[str, Any] = {"sd": sd, "n": n, "alpha": alpha, "target_power": target,
                           "mde": minimum_detectable_effect(sd, n, alpha, target)}
    if effect is not None:
        out.update(effect=effect, power_at_n=power(effect, sd, n, alpha),
                   seeds_for_effect=seeds_needed(effect, sd, alpha, target))
    if margin is not None:
        out.update(margin=margin, equivalence_power_at_n=equivalence_power(margin, sd, n, 0.0, alpha),
                   seeds_for_equivalence=seeds_for_equivalence(margin, sd, 0.0, alpha, target))
    return out
