"""A predictor's accuracy means something only beside what a trivial predictor gets on the same cases.

Two baselines: for a yes/no prediction, the base-rate rule (always predict the class that is most common, in
the cases the rule was chosen on, or else in the cases themselves); for a ranking, the design variable alone
(dP/H, say), which a candidate signal must beat to add anything.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from plelab.stats.distributions import binomial_tail


def majority(labels: Sequence[Hashable]) -> Hashable | None:
    """The most common label (the first of the most common in order of appearance); None when empty."""
    counts = Counter(labels)
    if not counts:
        return None
    top = max(counts.values())
    return next(label for label in labels if counts[label] == top)


def accuracy_vs_base_rate(predicted: Sequence[Hashable], actual: Sequence[Hashable],
                          base_class: Hashable | None = None) -> dict[str, Any]:
    """The predictor's accuracy beside the base-rate rule's on the same cases, and an exact McNemar p.

    base_class: what the base-rate rule always says (default: the majority of `actual`, which flatters the
    baseline's side, so a predictor that does not beat it is plainly no better). McNemar: of the cases where
    exactly one of the two is right, is the predictor right more often than chance (two-sided exact binomial)?
    """
    if len(predicted) != len(actual):
        raise ValueError("predicted and actual differ in length")
    n = len(actual)
    base = majority(list(actual)) if base_class is None else base_class
    right = [p == a for p, a in zip(predicted, actual, strict=True)]
    base_right = [base == a for a in actual]
    only_rule = sum(r and not b for r, b in zip(right, base_right, strict=True))
    only_base = sum(b and not r for r, b in zip(right, base_right, strict=True))
    m = only_rule + only_base
    mcnemar = min(1.0, 2.0 * binomial_tail(max(only_rule, only_base), m)) if m else 1.0
    return {"n": n, "correct": sum(right), "accuracy": sum(right) / n if n else None,
            "base_class": base, "base_correct": sum(base_right), "base_accuracy": sum(base_right) / n if n else None,
            "beats_base_rate": sum(right) > sum(base_right), "only_rule_right": only_rule,
            "only_base_right": only_base, "mcnemar_p": mcnemar}


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties at mean ranks); None with fewer than 3 pairs or a constant side."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None
    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / math.sqrt(sxx * syy)


def ranker_vs_trivial(signal: Sequence[float], target: Sequence[float], trivial: Sequence[float]) -> dict[str, Any]:
    """Spearman rho of a signal with the target beside the trivial ranker's rho on the same cases."""
    rho, rho0 = spearman(signal, target), spearman(trivial, target)
    return {"n": len(target), "rho": rho, "rho_trivial": rho0,
            "gain_over_trivial": None if rho is None or rho0 is None else rho - rho0}
