"""Helpers shared by subcommands: example-bearing parsers, config overrides, JSON output."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_command(sub, name: str, help: str, example: str, func,
                aliases: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """Register a subcommand whose --help ends with a runnable example (`aliases`: former names that still work)."""
    p = sub.add_parser(
        name,
        aliases=list(aliases),
        help=help.replace("%", "%%"),  # argparse %-formats the listing's help (a "95 %" would crash `plelab --help`)
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


def utf8_text(text: str) -> str:
    """Text that is valid UTF-8 (a prompt): argv bytes that are not reach Python as lone surrogates, which no
    tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = exc.object[exc.start]
        byte = f" 0x{ord(bad) - 0xDC00:02x}" if 0xDC80 <= ord(bad) <= 0xDCFF else ""
        raise argparse.ArgumentTypeError(f"is not valid UTF-8 text (byte{byte} at character {exc.start}); "
                                         "give the text in UTF-8") from None
    return text


def print_json(obj: Any) -> None:
    """Print a result as indented JSON on stdout."""
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
