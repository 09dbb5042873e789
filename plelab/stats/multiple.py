"""Holm's step-down correction: several tests in one study, one family-wise error rate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def holm(pvalues: Sequence[float | None], alpha: float = 0.05) -> dict[str, Any]:
    """Holm-adjusted p values (same order; None stays None) and which tests are rejected at `alpha`.

    Sorted ascending, p_(i) is multiplied by (m - i) (i from 0), kept monotone and capped at 1; m counts the
    tests that have a p value. Controls the family-wise error rate under any dependence between the tests.
    """
    order = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m = len(order)
    adjusted: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        adjusted[i] = running
    return {"adjusted": adjusted, "reject": [None if a is None else a < alpha for a in adjusted], "m": m,
            "alpha": alpha}
