"""`plelab` console entry point: one subcommand per module in plelab/cli/, each with --help and an example."""

from __future__ import annotations

import argparse
import importlib
import re
import sys

from plelab.errors import PlelabError

# Subcommand -> module in plelab.cli whose `add_parser(subparsers)` registers it (a module may register several).
# Only the module of the command being run is imported, so e.g. `plelab run` (NumPy runtime) never loads torch.
COMMANDS = {
    "demo": "plelab.cli.demo",
    "params": "plelab.cli.params",
    "data": "plelab.cli.data",
    "train": "plelab.cli.train",
    "finetune": "plelab.cli.finetune",
    "train-memory": "plelab.cli.train_memory",
    "eval": "plelab.cli.evaluate",
    "generate": "plelab.cli.generate",
    "diagnose": "plelab.cli.diagnose",
    "sweep": "plelab.cli.sweep",
    "report": "plelab.cli.report",
    "outcomes": "plelab.cli.outcomes",
    "export": "plelab.cli.edge",
    "export-hf": "plelab.cli.export_hf",
    "export-gguf": "plelab.cli.export_gguf",
    "quant-recipe": "plelab.cli.quant_recipe",
    "place": "plelab.cli.edge",
    "run": "plelab.cli.edge",
    "c": "plelab.cli.c_runtime",
    "mcu": "plelab.cli.c_runtime",
    "vision": "plelab.cli.vision",
}
ALIASES = {"plan-train": "train-memory", "plan": "place"}
"""Former command names that still work (the module registers them as argparse aliases)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr (no usage block) and exit status 2."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # A negative value with a unit (`--gpu-memory -80GB`) is a value for its option to refuse in its own words,
        # not an unknown option leaving the flag "expected one argument" (argparse only knows -80 and -.5).
        self._negative_number_matcher = re.compile(r"^-\d*\.?\d+(?:[eE][+-]?\d+)?[a-zA-Z%]*$")

    def error(self, message: str):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser: only `command`'s module registered when given, else every subcommand."""
    parser = OneLineParser(
        prog="plelab",
        description="Build, count, train, diagnose and ship per-layer-embedding (PLE) language models.",
        epilog="Example: plelab params seed-3b --sweep-ple 0,64,128,256,512",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    command = ALIASES.get(command, command)
    modules = [COMMANDS[command]] if command in COMMANDS else list(dict.fromkeys(COMMANDS.values()))
    for module in modules:
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
    argv = sys.argv[1:] if argv is None else argv
    command = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(command)
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except PlelabError as exc:
        print(f"plelab {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # unreadable/unwritable paths, disk full: the message names the file, no traceback
        where = f": {exc.filename}" if exc.filename else ""
        print(f"plelab {args.command}: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except MemoryError as exc:  # an allocation the machine cannot make: say so in one line, not a traceback
        why = str(exc).splitlines()[0] if str(exc) else "an allocation failed"
        print(f"plelab {args.command}: error: out of memory ({why}); ask for less or use a larger machine",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"plelab {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
