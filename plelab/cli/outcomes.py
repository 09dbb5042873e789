"""`plelab outcomes`: the registered outcomes of several studies in one table, recomputed from their data."""

from __future__ import annotations

import argparse

from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab outcomes`."""
    p = add_command(
        sub, "outcomes",
        "Every registered test of one or more studies in one table (delta, 95 % interval, corrected p, outcome, "
        "prediction hit / miss / unresolved), recomputed from each study's registered plan and per-seed "
        "evaluations, with the runs finished and the core-hours of training: the table a study's closing note "
        "quotes, without copying numbers by hand. Reads a sweep folder or the records.json a report committed.",
        "plelab outcomes runs/ffn-study-2 ../plelab-study-tokens/runs/deadzone-tokens\n"
        "  plelab outcomes studies/visual/visual-ple-ids/records.json --markdown   (a table to paste into a note)\n"
        "  plelab outcomes runs/ffn-study-2 --json",
        run,
    )
    p.add_argument("sources", nargs="+", metavar="DIR_OR_RECORDS",
                   help="sweep folders (hold sweep.sqlite) or records.json files written by `plelab report`")
    p.add_argument("--markdown", action="store_true", help="print a Markdown table instead of a text one")
    p.add_argument("--json", action="store_true", help="print every study's analysis as JSON")


def run(args: argparse.Namespace) -> int:
    """Recompute each study's registered outcomes and print them together."""
    from plelab.experiments.outcomes import OUTCOME_HEADERS, outcome_rows, study_lines, study_outcomes
    from plelab.util.tables import markdown_table, text_table

    studies = [study_outcomes(s) for s in args.sources]
    if args.json:
        print_json(studies)
        return 0
    table = markdown_table if args.markdown else text_table
    rows = outcome_rows(studies)
    print(table(OUTCOME_HEADERS, rows) if rows else "no registered tests: none of these studies has a plan")
    print()
    for line in study_lines(studies):
        print(("- " if args.markdown else "") + line)
    return 0
