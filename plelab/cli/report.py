"""`plelab report`: analyse a finished (or partly finished) sweep and write report.html + report.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab report`."""
    p = add_command(
        sub, "report",
        "Analyse a sweep folder: the seed-style table (dP, added params, loss mean +- seed std, delta vs dP=0), "
        "dead-zone / transition / diminishing-returns steps, per-domain table, early vs final PLE verdicts, plots; "
        "writes DIR/report.html (self-contained) and DIR/report.md.",
        "plelab report runs/deadzone-small\n"
        "  plelab report runs/deadzone-small --out docs/deadzone-study --json",
        run,
    )
    p.add_argument("dir", help="sweep folder (holds sweep.sqlite)")
    p.add_argument("--out", help="where report.html, report.md and plots/ go (default: DIR, whose previous report "
                                 "is replaced); existing report files elsewhere need --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace report files that already exist in --out")
    p.add_argument("--json", action="store_true", help="print the analysis (tables, steps, verdicts) as JSON")


def run(args: argparse.Namespace) -> int:
    """Analyse, plot, write."""
    from plelab.experiments.analysis import analyze_sweep
    from plelab.experiments.report import write_report
    from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE

    analysis = analyze_sweep(args.dir)
    out = Path(args.out or args.dir)
    own = out.resolve() == Path(args.dir).resolve()  # the sweep folder's report is regenerated in place
    inputs = (Path(args.dir) / DB_FILE, Path(args.dir) / RESOLVED_FILE)
    paths = write_report(analysis, out, overwrite=own or args.overwrite, inputs=inputs)
    if args.json:
        print_json(analysis)
    else:
        for p in paths:
            print(p)
    return 0
