"""Paired per-seed deltas and what can honestly be said about their mean: t test, t interval, equivalence.

The unit of every test is the seed: a delta is one seed's variant minus the same seed's reference, and n is the
number of seeds. Domains, dP values or timeline points scored on the same runs are not independent samples and
are never counted as such here.

Verdicts are four-way (`compare`): a mean is *worse* or *better* when a two-sided t test rejects 0, *equivalent*
when a two-one-sided test (TOST) puts it inside a margin stated beforehand, and *not resolved* otherwise.
"Not significant" alone never reads as "no difference".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from scipy import stats as scipy_stats

ALPHA = 0.05
"""Default test level: two-sided 5 % for differences, 5 % per side for equivalence (a 90 % interval)."""

OUTCOMES = ("worse", "better", "worse, within margin", "better, within margin", "equivalent", "not resolved", "n/a")
"""What `compare` can say about a mean delta of a loss (positive = worse)."""


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (ddof = 1; NaN mean with no value, NaN std with fewer than two)."""
    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sd / sqrt(n); NaN with fewer than two values)."""
    mean, std = mean_std(values)
    return mean, std / math.sqrt(len(values)) if len(values) > 1 else math.nan


def summarize(values: Iterable[float]) -> dict[str, Any]:
    """{"n", "mean", "sd", "se", "values"} of the finite values."""
    vals = [float(v) for v in values if _finite(v)]
    mean, sd = mean_std(vals)
    return {"n": len(vals), "mean": mean, "sd": sd, "se": sd / math.sqrt(len(vals)) if len(vals) > 1 else math.nan,
            "values": vals}


def paired(reference: Mapping[Any, float], other: Mapping[Any, float]) -> dict[str, Any]:
    """Per-seed deltas other[s] - reference[s] over the seeds both have, with their mean, sd and s.e.

    Seeds only one side has (or with a non-finite value) are left out and listed in `unpaired`.
    """
    seeds = sorted(s for s in other if s in reference and _finite(other[s]) and _finite(reference[s]))
    deltas = [float(other[s]) - float(reference[s]) for s in seeds]
    out = summarize(deltas)
    unpaired = sorted(s for s in set(reference) | set(other) if s not in seeds)
    return {**out, "seeds": seeds, "per_seed": dict(zip(seeds, deltas, strict=True)), "unpaired": unpaired}


def t_critical(n: int, level: float = 0.95) -> float:
    """t_{(1 + level)/2, n - 1}: the two-sided threshold in s.e. for a mean of n paired deltas (NaN for n < 2)."""
    return float(scipy_stats.t.ppf(0.5 + level / 2, n - 1)) if n >= 2 else math.nan


def t_test(mean: float, se: float, n: int, null: float = 0.0) -> dict[str, Any]:
    """Two-sided one-sample t test of `mean` (s.e. `se`, n values) against `null`: {"t", "df", "p"}.

    p is None without a test (n < 2 or no finite s.e.); a zero s.e. gives p = 0 unless the mean is the null.
    """
    if n < 2 or not (_finite(mean) and _finite(se)):
        return {"t": None, "df": max(n - 1, 0), "p": None}
    if se == 0:
        return {"t": math.copysign(math.inf, mean - null) if mean != null else 0.0, "df": n - 1,
                "p": 0.0 if mean != null else 1.0}
    t = (mean - null) / se
    return {"t": t, "df": n - 1, "p": float(2.0 * scipy_stats.t.sf(abs(t), n - 1))}


def t_interval(mean: float, se: float, n: int, level: float = 0.95) -> list[float] | None:
    """The two-sided t confidence interval [lo, hi] of a mean of n values; None without a s.e."""
    if n < 2 or not (_finite(mean) and _finite(se)):
        return None
    half = t_critical(n, level) * se
    return [mean - half, mean + half]


def significance(mean: float, se: float, n: int, alpha: float = ALPHA) -> int | None:
    """+1 significantly above 0, -1 significantly below, 0 not resolved, None without a test (two-sided t)."""
    p = t_test(mean, se, n)["p"]
    if p is None:
        return None
    return 0 if p >= alpha else (1 if mean > 0 else -1)


def tost(mean: float, se: float, n: int, margin: float, alpha: float = ALPHA) -> dict[str, Any]:
    """Two one-sided t tests of |true mean| < margin: equivalent when both reject at `alpha`.

    Equivalently the (1 - 2 alpha) t interval lies inside (-margin, margin). p = the larger one-sided p.
    """
    if not (_finite(margin) and margin > 0):
        raise ValueError(f"an equivalence margin must be a positive number, got {margin!r}")
    if n < 2 or not (_finite(mean) and _finite(se)):
        return {"margin": margin, "p": None, "equivalent": None, "interval": None}
    if se == 0:
        inside = -margin < mean < margin
        return {"margin": margin, "p": 0.0 if inside else 1.0, "equivalent": inside, "interval": [mean, mean]}
    df = n - 1
    p_low = float(scipy_stats.t.sf((mean + margin) / se, df))   # H0: mean <= -margin
    p_high = float(scipy_stats.t.cdf((mean - margin) / se, df))  # H0: mean >= +margin
    p = max(p_low, p_high)
    return {"margin": margin, "p": p, "equivalent": p < alpha,
            "interval": t_interval(mean, se, n, 1.0 - 2.0 * alpha)}


def compare(mean: float, se: float, n: int, margin: float | None = None, alpha: float = ALPHA,
            p: float | None = None) -> dict[str, Any]:
    """The four-way verdict on a mean delta of a loss (positive = worse), with its t test and intervals.

    margin: the equivalence margin stated before the data (None: equivalence cannot be claimed, so a mean
    that is not significant is *not resolved*). p: a p value to decide significance with instead of the plain
    t test's (e.g. Holm-adjusted); the interval stays the unadjusted 95 % one.
    """
    test = t_test(mean, se, n)
    out: dict[str, Any] = {"mean": mean, "se": se, "n": n, **test, "p_used": test["p"] if p is None else p,
                           "ci95": t_interval(mean, se, n), "margin": margin, "tost": None}
    if test["p"] is None:
        out["outcome"] = "n/a"
        return out
    significant = out["p_used"] < alpha
    if margin is not None:
        out["tost"] = tost(mean, se, n, margin, alpha)
    equivalent = bool(out["tost"] and out["tost"]["equivalent"])
    if significant:
        side = "worse" if mean > 0 else "better"
        out["outcome"] = f"{side}, within margin" if equivalent else side
    else:
        out["outcome"] = "equivalent" if equivalent else "not resolved"
    return out


def outcome_text(c: dict[str, Any], digits: int = 4) -> str:
    """'+0.0124 ± 0.0069 (95 % CI [-0.0173, +0.0421], p = 0.21): not resolved' for a `compare` result."""
    if c.get("outcome") == "n/a" or c.get("ci95") is None:
        return f"{c['mean']:+.{digits}f} (n = {c['n']}): n/a"
    lo, hi = c["ci95"]
    p = c["p_used"]
    eq = c.get("tost") or {}
    margin = f", TOST margin ±{eq['margin']:g}: p = {eq['p']:.2g}" if eq.get("p") is not None else ""
    return (f"{c['mean']:+.{digits}f} ± {c['se']:.{digits}f} (95 % CI [{lo:+.{digits}f}, {hi:+.{digits}f}], "
            f"p = {p:.2g}{margin}): {c['outcome']}")
