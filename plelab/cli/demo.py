"""`plelab demo`: the main job — a small PLE model against its dP = 0 twin, same tokens, per-domain table."""

from __future__ import annotations

import argparse
from pathlib import Path

from plelab.cli import options
from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab demo`."""
    p = add_command(
        sub, "demo",
        "Train a small PLE model and its dP=0 twin on the same tokens (default corpus: this Python's standard "
        "library) and print the per-domain comparison. Interrupt and rerun to resume.",
        "plelab demo --out runs/demo\n  plelab demo --data ../shared/data --out runs/demo-shared --minutes 20",
        run,
    )
    p.add_argument("--out", default="runs/demo", help="work folder (tokenizer, data, both runs, summary.json)")
    p.add_argument("--data", type=Path, default=None, help="folder with train/ and valid/ (e.g. ../shared/data)")
    p.add_argument("--minutes", type=options.positive_float, default=6.0,
                   help="wall-clock budget used to pick the step count")
    p.add_argument("--steps", type=options.positive_int, default=None, help="fix the step count instead of timing")
    p.add_argument("--preset", default="mini-ple", help="model preset with PLE (its twin sets ple.dim=0)")
    p.add_argument("--vocab-size", type=options.positive_int, default=4096, help="BPE vocabulary trained on the corpus")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    """Run the demo and print the comparison."""
    from plelab.experiments.demo import format_comparison, run_demo

    summary = run_demo(Path(args.out), args.data, args.minutes, args.preset, args.vocab_size, steps=args.steps)
    if args.json:
        print_json(summary)
    else:
        print()
        print(format_comparison(summary))
    return 0
