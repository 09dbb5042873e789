"""Every `plelab` subcommand has --help that ends with a runnable example."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from plelab.cli.main import ALIASES, COMMANDS, build_parser, main


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_subcommand_has_help_with_an_example(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "Example:" in out and f"plelab {command}" in out.split("Example:", 1)[1]


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_a_former_command_name_shows_the_current_ones_help(alias, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([alias, "--help"])
    assert exit_.value.code == 0
    assert f"plelab {ALIASES[alias]}" in capsys.readouterr().out.split("Example:", 1)[1]


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """Every parser under `parser` (subcommands and their own subcommands), with the words that reach it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, (*path, name))


def test_top_level_help_and_every_nested_help_render():
    # A subcommand's help is %-formatted in the listing, so "95 % interval" once crashed `plelab --help`.
    parsers = list(_parsers(build_parser()))
    assert {path[0] for path, _ in parsers if path} == set(COMMANDS) | set(ALIASES)
    assert any(len(path) == 2 for path, _ in parsers)  # nested ones (`plelab data prepare`) are walked too
    for path, parser in parsers:
        text = parser.format_help()
        assert text.startswith("usage: plelab"), path


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_top_level_help_lists_every_command(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([flag])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert all(command in out for command in COMMANDS)


def test_python_m_plelab_help_exits_zero():
    done = subprocess.run([sys.executable, "-m", "plelab", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "outcomes" in done.stdout and "Traceback" not in done.stderr
