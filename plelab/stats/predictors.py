"""A predictor's accuracy means something only beside what a trivial predictor gets on the same cases.

Two baselines: for a yes/no prediction, the base-rate rule (always predict the class that is most common, in
the cases the rule was chosen on, or else in the cases themselves); for a ranking, the design variable alone
(dP/H, say), which a candidate signal must beat to add anything.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Sequence
from typing import Any

from scipy import stats as scipy_stats


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
    mcnemar = sign_test_p(only_rule, only_base)
    return {"n": n, "correct": sum(right), "accuracy": sum(right) / n if n else None,
            "base_class": base, "base_correct": sum(base_right), "base_accuracy": sum(base_right) / n if n else None,
            "beats_base_rate": sum(right) > sum(base_right), "only_rule_right": only_rule,
            "only_base_right": only_base, "mcnemar_p": mcnemar}


def sign_test_p(positive: int, negative: int) -> float:
    """Two-sided exact binomial p of `positive` of positive + negative at probability 1/2 (1.0 when none).

    Valid only when the signs are independent (one per seed, say), not for domains scored on the same runs.
    """
    m = positive + negative
    return 1.0 if m == 0 else float(scipy_stats.binomtest(positive, m, 0.5).pvalue)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation (ties at mean ranks); None with fewer than 3 pairs or a constant side."""
    if len(xs) != len(ys) or len(xs) < 3 or len(set(xs)) < 2 or len(set(ys)) < 2:
        return None
    return float(scipy_stats.spearmanr(xs, ys).statistic)


def ranker_vs_trivial(signal: Sequence[float], target: Sequence[float], trivial: Sequence[float]) -> dict[str, Any]:
    """Spearman rho of a signal with the target beside the trivial ranker's rho on the same cases."""
    rho, rho0 = spearman(signal, target), spearman(trivial, target)
    return {"n": len(target), "rho": rho, "rho_trivial": rho0,
            "gain_over_trivial": None if rho is None or rho0 is None else rho - rho0}
