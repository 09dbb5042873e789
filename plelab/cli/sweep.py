"""`plelab sweep`: run a grid of training runs (dP x seeds, variants x seeds) resumably, or show its progress."""

from __future__ import annotations

import argparse

from plelab.cli import options
from plelab.cli.common import add_command, add_set_flag, print_json
from plelab.diagnostics.verdict import used_label
from plelab.util.tables import text_table


def add_parser(sub) -> None:
    """Register `plelab sweep`."""
    p = add_command(
        sub, "sweep",
        "Run every point of a sweep file's grid (crossed with its [variants.NAME] tables, if any) as a run under "
        "the sweep folder (resumable: rerun the same command after a kill), recording configs, metrics, final "
        "evaluations and evaluation timelines in SWEEP_DIR/sweep.sqlite.",
        "plelab sweep studies/deadzone/deadzone-small.toml\n"
        "  plelab sweep studies/deadzone/deadzone-small.toml --status\n"
        "  plelab sweep studies/deadzone/deadzone-small.toml --set base.data=/tmp/plelab-data --set grid.seed=[1]\n"
        "  plelab sweep studies/deadzone/deadzone-small.toml --restart-changed   # after editing trained runs' values\n"
        "  plelab sweep studies/ffn/ffn-study.toml --power --pilot runs/ffn-pilot   # size it before it runs\n"
        "  plelab sweep studies/deadzone/deadzone-small.toml --snapshot studies/deadzone/deadzone-small.sql   # keep "
        "finished runs in git\n"
        "  plelab sweep studies/deadzone/deadzone-small.toml --restore studies/deadzone/deadzone-small.sql   # on a "
        "new machine\n"
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
    p.add_argument("--power", action="store_true",
                   help="train nothing: from a pilot's seed spread, the smallest effect each comparison of the sweep's "
                        "analysis plan can resolve with the grid's seeds, and the seeds its effect of interest and "
                        "equivalence margin need")
    p.add_argument("--pilot", metavar="DIR",
                   help="with --power: the pilot sweep folder whose paired seed spread is used (default: this sweep's "
                        "own finished runs)")
    p.add_argument("--snapshot", metavar="FILE",
                   help="train nothing: write the sweep database as SQL text to FILE (finished runs' configs, results, "
                        "evaluations and timelines, the registered plan, and the hashes of the data they read), small "
                        "enough to commit, so a study survives the loss of its machine; an existing FILE is replaced "
                        "only when it is this sweep's own earlier snapshot")
    p.add_argument("--with-logs", action="store_true",
                   help="with --snapshot: also keep each finished run's training log (metrics.jsonl, gzip) in "
                        "FILE.logs/, for analyses that read per-step curves; --restore puts them back")
    p.add_argument("--restore", metavar="FILE",
                   help="train nothing: seed this sweep's folder, which must have no database yet, from a --snapshot "
                        "FILE; its finished runs count as done, unfinished ones train again from the start; refused "
                        "when the prepared data differs from what the snapshot's runs read")
    p.add_argument("--run", help=argparse.SUPPRESS)  # internal: one point, in a subprocess started by the sweep
    add_set_flag(p)


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "-" if x is None else format(x, spec)


def print_status(status: dict) -> None:
    """The status table (with the widths sweep.match_ffn solved, when it did) and a progress line."""
    solved = any(r.get("solved") for r in status["runs"])
    rows = []
    for r in status["runs"]:
        verdicts = ("/".join(used_label(v) or "-" for v in (r["verdict_early"], r["verdict_final"]))
                    if r["ple_dim"] else "-")
        matched = [" ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in r["solved"].items()) or "-"] if solved else []
        rows.append([r["name"], r["status"], f"{r['step'] or 0}/{r['max_steps']}", str(r["attempts"]), *matched,
                     _fmt(r["eval_loss"]), verdicts, _fmt(r["train_seconds"], ".0f"), r["error"] or ""])
    headers = ["run", "status", "step", "tries", *(["solved"] if solved else []), "eval loss", "early/final",
               "train s", "error"]
    print(text_table(headers, rows))
    counts = ", ".join(f"{n} {k}" for k, n in sorted(status["counts"].items()))
    left = status["training_left_seconds"]
    eta = "" if not left else (f"~{left / 3600:.1f} h of training left at {status['parallel']} at a time, at the "
                               f"pace of {status.get('pace_from', 'the finished runs')}; ")
    print(f"\n{status['sweep']}: {counts} of {status['total']} runs; {status['progress']:.0%} of all steps; "
          f"{eta}database {status['database']}")
    if status["not_in_grid"]:
        print(f"in the database but no longer in the grid: {', '.join(status['not_in_grid'])}")
    plan = status.get("plan")
    print("analysis plan: none registered (every verdict a report prints will be post hoc)" if plan is None else
          f"analysis plan: {plan['source']} (sha256 {plan['sha256'][:12]}), {plan['status']}")


def _power(sweep, args: argparse.Namespace) -> int:
    """`--power`: the plan's comparisons sized from the pilot's seed spread; printed, nothing trained."""
    from pathlib import Path

    from plelab.errors import PlelabError
    from plelab.experiments.plan import load_plan, plan_power
    from plelab.experiments.plan_report import strict_seeds
    from plelab.experiments.sweep import DB_FILE
    from plelab.experiments.sweep_store import SweepStore

    if not sweep.options.plan:
        raise PlelabError("--power needs the sweep's analysis plan ([sweep] plan = \"FILE\"): it names the "
                          "comparisons, the effect of interest and the margins")
    pilot = Path(args.pilot) if args.pilot else sweep.folder
    if not (pilot / DB_FILE).is_file():
        raise PlelabError(f"{pilot} has no {DB_FILE}: run a pilot first (a few seeds of the sweep) and give its "
                          "folder with --pilot")
    seeds = len({p.config.seed for p in sweep.points})
    with SweepStore(pilot / DB_FILE, readonly=True) as store:
        power = plan_power(load_plan(sweep.options.plan), store.runs(), store.evals(), seeds)
    if args.json:
        print_json(power)
        return 0
    rows = []
    for r in power["comparisons"]:
        p = r["power"] or {}
        rows.append([r["name"] + (" (gate)" if r["gate"] else ""), r["metric"], str(r["pilot_n"]), _fmt(p.get("sd")),
                     str(seeds), _fmt(p.get("mde")), _fmt(p.get("power_at_n"), ".2f"),
                     str(p.get("seeds_for_effect") or "-"), strict_seeds(r),
                     str(p.get("seeds_for_equivalence") or "-")])
    print(text_table(["comparison", "metric", "pilot seeds", "pilot sd", "seeds", "detectable |Δ|",
                      f"power at {_fmt(power['effect_of_interest'])}", "seeds for it", "at Holm's strictest step",
                      "seeds for equivalence"], rows))
    strict = power["strict_level"]
    print(f"\ntwo-sided t test at {power['alpha']:g}" + ("" if strict is None else f" (Holm's strictest step: "
          f"{strict:.3g})") + f", power target {power['target']:g}; pilot {pilot}")
    return 0


def _snapshot(sweep, args: argparse.Namespace) -> int:
    """`--snapshot FILE` / `--restore FILE`: the database to or from SQL text."""
    from plelab.experiments.sweep_snapshot import restore_snapshot, write_snapshot

    if args.snapshot and args.restore:
        raise SystemExit("plelab sweep: give --snapshot or --restore, not both")
    if args.with_logs and not args.snapshot:
        raise SystemExit("plelab sweep: --with-logs goes with --snapshot (--restore puts back whatever logs it finds)")
    result = (write_snapshot(sweep, args.snapshot, logs=args.with_logs) if args.snapshot
              else restore_snapshot(sweep, args.restore))
    if args.json:
        print_json(result)
        return 0
    runs = result.get("restored", result["runs"])
    counts = ", ".join(f"{n} {k}" for k, n in sorted(runs.items()))
    logs = result.get("logs_written", result.get("logs_restored"))
    counts += f"; {logs} training logs {'kept' if args.snapshot else 'restored'}" if logs else ""
    done = "unchanged since its last snapshot" if result.get("unchanged") else "wrote"
    print(f"{sweep.options.name}: {done} {args.snapshot} ({counts})" if args.snapshot else
          f"{sweep.options.name}: restored {sweep.db_path} from {args.restore} (taken {result['taken']}): {counts}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Expand the sweep, then show its status, run one point, or run them all."""
    from plelab.experiments.sweep import load_sweep
    from plelab.experiments.sweep_runner import run_one, run_sweep, sweep_status

    sweep = load_sweep(args.sweep_file, args.overrides, out=args.out)
    if args.parallel:
        sweep.options.parallel = args.parallel
    if args.run:
        return 0 if run_one(sweep, args.run) == "done" else 1
    if args.power:
        return _power(sweep, args)
    if args.snapshot or args.restore:
        return _snapshot(sweep, args)
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
