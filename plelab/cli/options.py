"""Range-checked argparse types: every numeric CLI option is validated here, so a bad value is one line, exit 2.

Use them as `p.add_argument("--top-p", type=options.probability, ...)`. argparse turns the ValueError into
`plelab CMD: error: argument --top-p: ...` (see `OneLineParser` in plelab/cli/main.py).
"""

from __future__ import annotations

import argparse
import math


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes, steps)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def nonneg_int(text: str) -> int:
    """An integer >= 0 (0 usually means 'none' or 'off')."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def nonneg_float(text: str) -> float:
    """A finite number >= 0 (e.g. a sampling temperature, where 0 means greedy)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def probability(text: str) -> float:
    """A number in (0, 1] (top-p, fractions)."""
    value = _number(text, float)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {value}")
    return value
