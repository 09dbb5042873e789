"""`plelab report`: analyse a finished (or partly finished) sweep and write report.html + report.md."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plelab.cli import options
from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab report`."""
    p = add_command(
        sub, "report",
        "Analyse a sweep folder with the study it belongs to (plelab.studies.registry) and write DIR/report.html "
        "(self-contained) and DIR/report.md with its plots. Any dP sweep gets the dead-zone report: the seed-style "
        "table (dP, added params, loss mean +- seed std, delta vs dP=0), dead-zone / transition / diminishing-returns "
        "steps, paired deltas, per-domain table, early vs final PLE verdicts; a dP sweep over several training "
        "lengths adds the gain against tokens (the tokens study); a sweep with [variants] gets the FFN study's "
        "per-domain paired deltas, verdicts and gap timeline, or the visual PLE study's or the fast-path check's "
        "report when its runs are of that kind.",
        "plelab report runs/deadzone-small\n"
        "  plelab report runs/ffn-study --json   (a sweep with [variants]; see docs/ffn-study.md)\n"
        "  plelab report runs/deadzone-small --out studies/deadzone/deadzone-small --json\n"
        "  plelab report runs/deadzone-law --law --predict 128   (see docs/deadzone-law.md)\n"
        "  plelab report runs/fastpath-check --no-diagnose   (fp32 vs bf16-head, without plelab diagnose)\n"
        "  plelab report studies/ffn/ffn-study-2/records.json --out /tmp/ffn   (from the committed records)\n"
        "  plelab report studies/ffn/ffn-study --review   (a committed report without records, current rules)",
        run,
    )
    p.add_argument("dir", help="sweep folder (holds sweep.sqlite), or a records.json a study report wrote (the report "
                               "is then recomputed from the per-seed records alone)")
    p.add_argument("--out", help="where report.html, report.md and plots/ go (default: DIR, whose previous report "
                                 "is replaced); existing report files elsewhere need --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace report files that already exist in --out")
    p.add_argument("--json", action="store_true", help="print the analysis (tables, steps, verdicts) as JSON")
    p.add_argument("--law", action="store_true",
                   help="the dead-zone law over DIR's sweep folders (one per width/form): paired deltas, threshold "
                        "brackets, dP*/H fit, prediction and its outcome, early rule; writes law.md/html/json")
    p.add_argument("--predict", metavar="H1,H2", type=_widths,
                   help="with --law: fit on the other widths and freeze the prediction for these in "
                        "DIR/prediction.json (written once, never overwritten)")
    p.add_argument("--review", action="store_true",
                   help="DIR is a committed study report (law.json, or an FFN / visual-PLE report.md) whose sweep "
                        "folder is gone: recompute what its committed numbers allow under the current rules "
                        "(post hoc); the law's report is regenerated into DIR/review/, the others' review into "
                        "DIR/review.md, review.html, review.json")
    p.add_argument("--plan", metavar="FILE",
                   help="evaluate this analysis plan instead of the registered one; its verdicts are labelled post "
                        "hoc unless it is the plan the sweep registered before its first run")
    p.add_argument("--measure-decode", action="store_true",
                   help="variant sweeps: export each variant's first seed, time greedy decoding and count bytes read "
                        "per token; writes DIR/decode.json (later reports reuse it). Run it on an idle machine: "
                        "the timings are only comparable when nothing else runs")
    p.add_argument("--decode-tokens", type=options.positive_int, default=64,
                   help="with --measure-decode: tokens decoded per variant (default 64)")
    p.add_argument("--decode-runtime", choices=("numpy", "c"), default="numpy",
                   help="with --measure-decode: the edge runtime that decodes (default numpy)")
    p.add_argument("--no-diagnose", action="store_true",
                   help="the fast-path check (a sweep of fp32 and bf16-head variants): skip its fourth question, "
                        "`plelab diagnose` on every run's final checkpoint")


def _widths(text: str) -> list[int]:
    try:
        widths = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated hidden sizes, got {text!r}") from None
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"expected hidden sizes >= 1, got {text!r}")
    return widths


def run(args: argparse.Namespace) -> int:
    """Analyse with the folder's study (plelab.studies.registry), write, print the summary or the JSON."""
    from plelab.studies.registry import make_report, report_from_records, review_report

    if args.review:
        for path in review_report(args.dir, args.out, overwrite=args.overwrite):
            print(path)
        return 0

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if Path(args.dir).is_file():
        study, analysis, paths = report_from_records(args.dir, args.out, overwrite=args.overwrite)
    else:
        study, analysis, paths = make_report(
            args.dir, args.out, flags=("law",) if args.law or args.predict else (), overwrite=args.overwrite,
            say=say, predict=args.predict, measure_decode=args.measure_decode, decode_tokens=args.decode_tokens,
            decode_runtime=args.decode_runtime, no_diagnose=args.no_diagnose, plan=args.plan)
    if args.json:
        print_json(study.to_json(analysis))
        return 0
    for line in study.summary(analysis, Path(args.dir), {"predict": args.predict}):
        print(line)
    for p in paths:
        print(p)
    return 0
