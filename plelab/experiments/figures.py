"""Figures as PNG bytes for every study's report: matplotlib without a display, one colour per PLE width."""

from __future__ import annotations

import io
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a training box
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["dim_colors", "plt", "png"]


def png(fig: Any) -> bytes:
    """The figure as PNG bytes (closed afterwards, so a long report does not hold every figure in memory)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def dim_colors(dims: list[int]) -> dict[int, Any]:
    """One viridis colour per dP, in the order given, the same in every figure of a report."""
    cmap = plt.get_cmap("viridis")
    return {d: cmap(i / max(1, len(dims) - 1)) for i, d in enumerate(dims)}
