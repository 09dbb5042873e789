"""`plelab sweep`: run a grid of training runs (dP x seeds, variants x seeds) resumably, or show its progress."""

from __future__ import annotations

import argparse

from plelab.cli import options
from plelab.cli.common import add_command, add_set_flag, print_json
from plelab.experiments.tables import text_table


def add_parser(sub) -> None:
    """Register `plelab sweep`."""
    p = add_command(
        sub, "sweep",
        "Run every point of a sweep file's grid (crossed with its [variants.NAME] tables, if any) as a run under "
        "the sweep folder (resumable: rerun the same command after a kill), recording configs, metrics, final "
        "evaluations and evaluation timelines in SWEEP_DIR/sweep.sqlite.",
        "plelab sweep configs/sweeps/deadzone-small.toml\n"
        "  plelab sweep configs/sweeps/deadzone-small.toml --status\n"
        "  plelab sweep configs/sweeps/deadzone-small.toml --set base.data=/tmp/plelab-data --set grid.seed=[1]\n"
        "  plelab sweep configs/sweeps/deadzone-small.toml --restart-changed   # after editing trained runs' values\n"
        "  plelab report runs/deadzone-small",
        run,
    )
    p.add_argument("sweep_file", help="sweep file (TOML/YAML/JSON with [sweep], [base], [grid], [variants.NAME])")
    p.add_argument("--status", action="store_true", help="show every run's state and the progress; train nothing")
    p.add_argument("--json", action="store_true", help="with --status: machine-readable output")
    p.add_argument("--out", help="sweep folder (default: [sweep] out, else runs/<name>)")
    p.add_argument("--parallel", type=options.positive_int, help="runs at once (each in its own subprocess when > 1)")
    p.add_argument("--restart-changed", action="store_true",
                   help="retrain from scratch the runs whose config the sweep file changed since they were trained "
                        "(their old folders move to SWEEP_DIR/superseded/); without it such a sweep is refused")
    p.add_argument("--quiet", action="store_true", help="only one line per run (progress goes to RUN_DIR/train.log)")
    p.add_argument("--run", help=argparse.SUPPRESS)  # internal: one point, in a subprocess started by the sweep
    add_set_flag(p)


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def print_status(status: dict) -> None:
    """The status table (with the widths sweep.match_ffn solved, when it did) and a progress line."""
    solved = any(r.get("solved") for r in status["runs"])
    rows = []
    for r in status["runs"]:
        verdicts = "/".join(v or "-" for v in (r["verdict_early"], r["verdict_final"])) if r["ple_dim"] else "-"
        matched = [" ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in r["solved"].items()) or "-"] if solved else []
        rows.append([r["name"], r["status"], f"{r['step'] or 0}/{r['max_steps']}", str(r["attempts"]), *matched,
                     _fmt(r["eval_loss"]), verdicts, _fmt(r["train_seconds"], ".0f"), r["error"] or ""])
    headers = ["run", "status", "step", "tries", *(["solved"] if solved else []), "eval loss", "early/final",
               "train s", "error"]
    print(text_table(headers, rows))
    counts = ", ".join(f"{n} {k}" for k, n in sorted(status["counts"].items()))
    print(f"\n{status['sweep']}: {counts} of {status['total']} runs; {status['progress']:.0%} of all steps; "
          f"database {status['database']}")
    if status["not_in_grid"]:
        print(f"in the database but no longer in the grid: {', '.join(status['not_in_grid'])}")


def run(args: argparse.Namespace) -> int:
    """Expand the sweep, then show its status, run one point, or run them all."""
    from plelab.experiments.sweep import load_sweep
    from plelab.experiments.sweep_runner import run_one, run_sweep, sweep_status

    sweep = load_sweep(args.sweep_file, args.overrides, out=args.out)
    if args.parallel:
        sweep.options.parallel = args.parallel
    if args.run:
        return 0 if run_one(sweep, args.run) == "done" else 1
    if args.status:
        status = sweep_status(sweep)
        print_json(status) if args.json else print_status(status)
        return 0
    try:
        counts = run_sweep(sweep, quiet=args.quiet, restart_changed=args.restart_changed)
    except KeyboardInterrupt:
        print("sweep interrupted; rerun the same command to continue")
        return 130
    print(f"sweep finished: {', '.join(f'{n} {k}' for k, n in sorted(counts.items()))}; "
          f"report with: plelab report {sweep.folder}")
    return 0 if not counts.get("failed") else 1
