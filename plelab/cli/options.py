"""Range-checked argparse types: every numeric CLI option is validated here, so a bad value is one line, exit 2.

Use them as `p.add_argument("--top-p", type=options.probability, ...)`; tests/cli/test_cli_ranges.py checks
that every numeric option of every subcommand does. argparse turns the ValueError into
`plelab CMD: error: argument --top-p: ...` (see `OneLineParser` in plelab/cli/main.py).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from plelab.inference.sampling import Sampling


def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def _ranged(kind: type, name: str, doc: str, low: float | None = None, high: float | None = None,
            low_open: bool = False, high_open: bool = False) -> Callable[[str], int | float]:
    """One validator: parse as `kind`, then check low <= value <= high (strict where the side is open)."""

    def check(text: str) -> int | float:
        value = _number(text, kind)
        too_low = low is not None and (value <= low if low_open else value < low)
        too_high = high is not None and (value >= high if high_open else value > high)
        if too_low or too_high:
            raise argparse.ArgumentTypeError(f"must be {range_text}, got {value}")
        return value

    if high is None:
        range_text = f"{'>' if low_open else '>='} {low}"
    else:
        range_text = f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"
    check.__name__, check.__doc__ = name, doc
    return check


positive_int = _ranged(int, "positive_int", "An integer >= 1 (counts, sizes, steps).", low=1)
nonneg_int = _ranged(int, "nonneg_int", "An integer >= 0 (0 usually means 'none' or 'off').", low=0)
positive_float = _ranged(float, "positive_float", "A finite number > 0.", low=0, low_open=True)
nonneg_float = _ranged(float, "nonneg_float", "A finite number >= 0 (a temperature: 0 means greedy).", low=0)
probability = _ranged(float, "probability", "A number in (0, 1] (top-p, fractions).", 0, 1, low_open=True)
fraction = _ranged(float, "fraction", "A number in [0, 1) (a share held out, a drop rate).", 0, 1, high_open=True)


def int_at_least(minimum: int) -> Callable[[str], int]:
    """A validator for integers >= `minimum` (a floor that keeps a run sane, e.g. tokens per shard)."""
    return _ranged(int, f"int_at_least_{minimum}", f"An integer >= {minimum}.", low=minimum)


def int_in_range(minimum: int, maximum: int) -> Callable[[str], int]:
    """A validator for integers in [minimum, maximum] (a ceiling where more would only exhaust memory)."""
    return _ranged(int, f"int_in_range_{minimum}_{maximum}", f"An integer in [{minimum}, {maximum}].",
                   low=minimum, high=maximum)


def add_sampling_flags(p: argparse.ArgumentParser) -> None:
    """--temperature, --top-k, --top-p, --seed with the defaults of `plelab.inference.sampling.Sampling`."""
    d = Sampling()
    p.add_argument("--temperature", type=nonneg_float, default=d.temperature,
                   help=f"softmax temperature, 0 = greedy (default {d.temperature})")
    p.add_argument("--top-k", type=nonneg_int, default=d.top_k,
                   help="sample among the k most likely tokens (default 0 = off)")
    p.add_argument("--top-p", type=probability, default=d.top_p,
                   help="sample among the most likely tokens holding this much probability (default 1 = off)")
    p.add_argument("--seed", type=nonneg_int, default=d.seed, help=f"sampling seed (default {d.seed})")


def sampling(args: argparse.Namespace) -> Sampling:
    """The `Sampling` that `add_sampling_flags` options describe."""
    return Sampling(args.temperature, args.top_k, args.top_p, args.seed)
