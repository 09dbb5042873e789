"""Helpers shared by subcommands: example-bearing parsers, config overrides, JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_command(sub, name: str, help: str, example: str, func) -> argparse.ArgumentParser:
    """Register a subcommand whose --help ends with a runnable example."""
    p = sub.add_parser(
        name,
        help=help,
        description=help,
        epilog=f"Example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=func)
    return p


def add_set_flag(p: argparse.ArgumentParser) -> None:
    """`--set key=value` (repeatable) for dotted config overrides."""
    p.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config field with a dotted key, e.g. --set ple.dim=128 (repeatable)",
    )


def print_json(obj: Any) -> None:
    """Print a result as indented JSON on stdout."""
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
