"""`plelab` console entry point: one subcommand per module in plelab/cli/, each with --help and an example."""

from __future__ import annotations

import argparse
import importlib
import sys

from plelab.errors import PlelabError

# Modules in plelab.cli exposing `add_parser(subparsers)` (registering one or more subcommands), in --help order.
COMMAND_MODULES = [
    "plelab.cli.demo",
    "plelab.cli.params",
    "plelab.cli.data",
    "plelab.cli.train",
    "plelab.cli.evaluate",
    "plelab.cli.generate",
    "plelab.cli.diagnose",
    "plelab.cli.edge",
]


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every available subcommand registered."""
    parser = argparse.ArgumentParser(
        prog="plelab",
        description="Build, count, train, diagnose and ship per-layer-embedding (PLE) language models.",
        epilog="Example: plelab params seed-3b --sweep-ple 0,64,128,256,512",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # an optional part not installed (e.g. tokenizers)
            if exc.name and exc.name.startswith("plelab"):
                raise
            continue
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; user errors print one line on stderr and exit with status 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except PlelabError as exc:
        print(f"plelab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"plelab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
