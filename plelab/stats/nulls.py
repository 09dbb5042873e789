"""Nulls that are computed, not assumed: exact sign-flip permutations, and simulated curve-agreement statistics.

`curves_agree` asks whether several curves (one per width, say) coincide on an axis. Its statistic is the
mean z^2 over every pair of curves at every shared axis value, z = difference of the two means / its s.e. With
few seeds per mean each s.e. is itself noisy, so z is t-like (E[z^2] ~ 2 with 3 seeds a side) and the points
share runs (every delta of a seed shares that seed's reference run): "mean z^2 about 1" is not the null. The
null here is simulated: every curve is redrawn with mean zero and its own seeds' spread, and the statistic is
recomputed the same way. Two nulls bracket what few seeds can say about the correlation between a curve's
points: `correlated` keeps the covariance of the seeds' residuals across axis values (shared reference runs;
with 3 seeds that covariance has rank 2, so this null is heavy-tailed, i.e. conservative), `independent` gives
each point its own variance and no correlation (light-tailed: liberal). A conclusion that holds under both
does not hang on the unknown correlation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from plelab.stats.paired import mean_se


def sign_flip_p(values: Sequence[float]) -> float | None:
    """Exact two-sided sign-flip permutation p of mean(values) = 0 (2^n flips; None for no values).

    With n seeds the smallest possible p is 2 / 2^n (0.25 for 3 seeds): a permutation test cannot resolve
    anything with 3 seeds, which is worth knowing before a study is sized.
    """
    vals = [float(v) for v in values]
    if not vals:
        return None
    observed = abs(sum(vals))
    hits = sum(abs(sum(s * v for s, v in zip(signs, vals, strict=True))) >= observed - 1e-12
               for signs in itertools.product((1.0, -1.0), repeat=len(vals)))
    return hits / 2 ** len(vals)


Curves = Mapping[Hashable, Mapping[Hashable, Mapping[Hashable, float]]]
"""{curve: {seed: {axis value: value}}}: each curve's per-seed values along a shared axis."""


def _matrix(curve: Mapping[Hashable, Mapping[Hashable, float]]) -> tuple[list[Hashable], np.ndarray]:
    """(axis values, seeds x values matrix) over the axis values every seed of the curve has."""
    seeds = sorted(curve, key=str)
    xs = sorted(set.intersection(*(set(curve[s]) for s in seeds)) if seeds else set(), key=float)
    return xs, np.array([[float(curve[s][x]) for x in xs] for s in seeds], dtype=float).reshape(len(seeds), len(xs))


def _statistic(means: dict, ses: dict, pairs: list[tuple]) -> np.ndarray:
    """Mean z^2 over (curve a, index in a, curve b, index in b) pairs; arrays broadcast over simulations."""
    zs = [(means[a][..., i] - means[b][..., j]) / np.sqrt(ses[a][..., i] ** 2 + ses[b][..., j] ** 2)
          for a, i, b, j in pairs]
    return np.mean(np.stack(zs) ** 2, axis=0)


def curves_agree(curves: Curves, draws: int = 20_000, seed: int = 0, correlated: bool = True) -> dict[str, Any]:
    """Do the curves coincide on their shared axis values? Observed mean z^2 against its simulated null.

    Returns the shared points (pair, x, difference, z), the observed statistic, the null's median, 95th
    percentile and the p value P(null >= observed) (with the +1 correction), and the statistic with each
    point left out in turn (one outlying point can carry the whole statistic). Curves need 2+ seeds.
    correlated: the null keeps the seeds' covariance across axis values (else each point is independent).
    """
    mats = {c: _matrix(curves[c]) for c in curves}
    mats = {c: m for c, m in mats.items() if m[1].shape[0] >= 2 and m[0]}
    names = sorted(mats, key=str)
    pairs, points = [], []
    obs_mean = {c: mats[c][1].mean(axis=0) for c in names}
    obs_se = {c: mats[c][1].std(axis=0, ddof=1) / math.sqrt(mats[c][1].shape[0]) for c in names}
    for a, b in itertools.combinations(names, 2):
        xa, xb = mats[a][0], mats[b][0]
        for x in sorted(set(xa) & set(xb), key=float):
            i, j = xa.index(x), xb.index(x)
            se = math.hypot(obs_se[a][i], obs_se[b][j])
            if se > 0:
                pairs.append((a, i, b, j))
                diff = float(obs_mean[a][i] - obs_mean[b][j])
                points.append({"curves": [a, b], "x": x, "diff": diff, "z": diff / se})
    if not pairs:
        return {"k": 0, "points": [], "statistic": None, "null_median": None, "null_p95": None, "p": None,
                "leave_one_out": []}
    observed = float(_statistic(obs_mean, obs_se, pairs))
    rng = np.random.default_rng(seed)
    sim_mean, sim_se = {}, {}
    for c in names:
        m = mats[c][1]
        n = m.shape[0]
        resid = m - m.mean(axis=0)
        if correlated:  # n Gaussian seeds with the residuals' covariance: g @ resid / sqrt(n - 1), g ~ N(0, I)
            sim = rng.standard_normal((draws, n, n)) @ resid / math.sqrt(n - 1)
        else:           # each axis value on its own, with its own seed variance
            sim = rng.standard_normal((draws, n, m.shape[1])) * m.std(axis=0, ddof=1)
        sim_mean[c] = sim.mean(axis=1)
        sim_se[c] = sim.std(axis=1, ddof=1) / math.sqrt(n)
    null = _statistic(sim_mean, sim_se, pairs)
    null = null[np.isfinite(null)]
    loo = []
    for k in range(len(pairs)):
        rest = pairs[:k] + pairs[k + 1:]
        loo.append(float(_statistic(obs_mean, obs_se, rest)) if rest else None)
    return {"k": len(pairs), "points": points, "statistic": observed, "null": "correlated" if correlated else
            "independent",
            "null_median": float(np.median(null)), "null_p95": float(np.quantile(null, 0.95)),
            "p": float((1 + np.sum(null >= observed)) / (1 + null.size)), "draws": int(null.size),
            "leave_one_out": loo, "mean_abs_diff": float(np.mean([abs(p["diff"]) for p in points]))}


def curve_means(curve: Mapping[Hashable, Mapping[Hashable, float]]) -> dict[Hashable, tuple[float, float]]:
    """{axis value: (mean, s.e.)} over a curve's seeds (descriptive helper for reports)."""
    xs, m = _matrix(curve)
    return {x: mean_se(list(m[:, i])) for i, x in enumerate(xs)}
