"""Every numeric option of every subcommand is range-checked by plelab/cli/options.py: a bad value is one line
on stderr and exit 2, before any work is done. Walks the real parsers, so a new option is covered unasked."""

from __future__ import annotations

import argparse
import math

import pytest

from plelab.cli import options
from plelab.cli.main import build_parser, main

ALWAYS_BAD = ("-1", "nan", "inf", "-inf", "abc", "")


def subcommands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(argv prefix, parser) for every leaf subcommand, nested ones (`data prepare`) included."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from subcommands(sub, (*path, name))


def numeric_options() -> list[tuple[tuple[str, ...], argparse.Action]]:
    found = []
    for path, parser in subcommands(build_parser()):
        for action in parser._actions:
            if action.option_strings and (action.type in (int, float) or _from_options(action.type)):
                found.append((path, action))
    return found


def _from_options(fn) -> bool:
    return getattr(fn, "__module__", None) == options.__name__


NUMERIC = numeric_options()
IDS = [f"{' '.join(path)} {action.option_strings[-1]}" for path, action in NUMERIC]


def test_the_walk_finds_the_options_it_must():
    names = set(IDS)
    for must in ("generate --temperature", "generate --top-p", "run --top-k", "run --max-new-tokens",
                 "plan --context", "export --group", "export --align", "eval --seq-len", "eval --batch-size",
                 "eval --max-tokens", "diagnose --batches", "diagnose --seq-len", "data prepare --shard-tokens"):
        assert must in names, f"{must} not found: is the subcommand registered?"


@pytest.mark.parametrize(("path", "action"), NUMERIC, ids=IDS)
def test_numeric_option_uses_a_range_checked_type(path, action):
    assert _from_options(action.type), f"{' '.join(path)} {action.option_strings[-1]} uses a bare {action.type}"
    if action.default is not None:  # the default itself is in range
        assert action.type(str(action.default)) == action.default


@pytest.mark.parametrize(("path", "action"), NUMERIC, ids=IDS)
def test_out_of_range_values_are_one_line_and_exit_2(path, action, capsys):
    bad = list(ALWAYS_BAD)
    for edge in ("0", "1", "1.5", "1e999"):
        try:
            value = action.type(edge)
        except argparse.ArgumentTypeError:
            bad.append(edge)
        else:
            assert not isinstance(value, float) or math.isfinite(value)
    flag = action.option_strings[-1]
    for value in bad:
        with pytest.raises(SystemExit) as exc:
            main([*path, f"{flag}={value}"])
        err = capsys.readouterr().err
        assert exc.value.code == 2, (flag, value)
        assert err.count("\n") == 1 and flag in err and "Traceback" not in err, err


@pytest.mark.parametrize(("check", "good", "bad"), [
    (options.positive_int, ["1", "7"], ["0", "-3", "2.5", "1e3"]),
    (options.nonneg_int, ["0", "5"], ["-1", "x"]),
    (options.positive_float, ["0.5", "3"], ["0", "-0.1", "nan"]),
    (options.nonneg_float, ["0", "2.5"], ["-1e-9", "inf"]),
    (options.probability, ["1", "0.9"], ["0", "1.01", "-0.5"]),
    (options.fraction, ["0", "0.5"], ["1", "-0.1"]),
    (options.int_at_least(1024), ["1024"], ["1023", "nan"]),
])
def test_validators(check, good, bad):
    for text in good:
        check(text)
    for text in bad:
        with pytest.raises(argparse.ArgumentTypeError):
            check(text)
