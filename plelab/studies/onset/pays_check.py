"""`plelab diagnose`'s pays verdict on every dP > 0 run of a folder of runs, against the same seed's dP = 0 run:
what a user running diagnose on one run of the round would be told, set beside the round's registered tests.

One run against its twin on evaluation batches: the interval is evaluation noise, not seed-to-seed spread, so a
verdict here agrees with a registered test when it points the same way, not when it is as sure. Results go to a
JSON file after every run, so an interrupted check resumes where it stopped.

    python3 -m plelab.studies.onset.pays_check ../plelab-study-onset/runs/deadzone-onset/h64/runs \\
        --data /tmp/plelab-data --batches 64 --out studies/onset/pays-h64.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from plelab.diagnostics.diagnose_run import pays_between
from plelab.diagnostics.twin import find_twin, read_checkpointed
from plelab.errors import PlelabError
from plelab.runs.checkpoint import CheckpointError
from plelab.util.fs import atomic_write_bytes


def table_runs(folder: str | Path) -> list[tuple[Path, int, int]]:
    """(run folder, seed, dP) of every finished run under `folder` (its newest checkpoint at its last step) with a
    table (dP > 0); a run still training is left for a later call."""
    out = []
    for run in sorted(p for p in Path(folder).iterdir() if (p / "checkpoints").is_dir()):
        try:
            got = read_checkpointed(run)
        except CheckpointError:
            continue  # no complete checkpoint yet
        dim = int(((got.train.get("model") or {}).get("ple") or {}).get("dim") or 0)
        if dim and got.step == got.train.get("max_steps"):
            out.append((run, int(got.train.get("seed") or 0), dim))
    return out


def check_runs(folder: str | Path, out: str | Path, data: str | None = None, batches: int = 64,
               say: Any = print) -> dict[str, Any]:
    """Each table run's pays verdict against its found twin, appended to `out` (JSON) run by run; runs already
    there are kept, not measured again. Returns {"rows": [...], "summary": {dP: {verdict: count}}}."""
    out = Path(out)
    if batches < 2:
        raise ValueError(f"--batches must be at least 2 (an interval needs two batches), got {batches}")
    kept = json.loads(out.read_text(encoding="utf-8")) if out.is_file() else {"rows": []}
    done = kept.get("rows") if isinstance(kept, dict) else None
    if not isinstance(done, list):
        raise ValueError(f"{out} exists and is not a pays check's file (no 'rows'): give another --out")
    have = {r["run"] for r in done}
    for run, seed, dim in table_runs(folder):
        if str(run) in have:
            continue
        twin, where = find_twin(run)
        if twin is None:
            row = {"run": str(run), "seed": seed, "ple_dim": dim, "verdict": "not measured", "reason": where}
        else:
            pays = pays_between(run, twin, data, batches=batches)
            test = pays.get("test") or {}
            row = {"run": str(run), "seed": seed, "ple_dim": dim, "twin": str(twin), "verdict": pays["verdict"],
                   "delta": pays.get("delta"), "ci95": test.get("ci95"), "n_batches": pays.get("n_batches"),
                   "data": pays.get("data"), "reason": pays["reason"]}
        done.append(row)
        say(f"{run.name}: pays {row['verdict']} ({row['reason']})")
        atomic_write_bytes(out, json.dumps(_result(done), indent=2).encode())
    result = _result(done)
    atomic_write_bytes(out, json.dumps(result, indent=2).encode())
    return result


def _result(rows: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[int, dict[str, int]] = {}
    for r in rows:
        counts = summary.setdefault(r["ple_dim"], {})
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
    return {"what": "plelab diagnose's pays verdict per run against the same seed's dP = 0 run (evaluation noise "
                    "only: one pair of runs each)", "rows": rows,
            "summary": {str(d): summary[d] for d in sorted(summary)}}


def markdown_table(result: dict[str, Any]) -> str:
    """The verdicts as a markdown table, one row per run by dP then seed (what a write-up quotes)."""
    lines = ["| dP | seed | loss - twin's loss (95 % CI, evaluation noise) | batches | pays verdict |",
             "|---|---|---|---|---|"]
    for r in sorted(result["rows"], key=lambda r: (r["ple_dim"], r["seed"])):
        ci = r.get("ci95")
        delta = (f"{r['delta']:+.4f} [{ci[0]:+.4f}, {ci[1]:+.4f}]" if r.get("delta") is not None and ci
                 else r.get("reason", "-"))
        lines.append(f"| {r['ple_dim']} | {r['seed']} | {delta} | {r.get('n_batches') or '-'} | {r['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The command line (module doc)."""
    p = argparse.ArgumentParser(prog="python3 -m plelab.studies.onset.pays_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("folder", help="a folder of run folders (a sweep's runs/)")
    p.add_argument("--out", required=True, help="the JSON file the verdicts go to (resumed when it exists)")
    p.add_argument("--data", help="evaluation data (default: each run's recorded eval data)")
    p.add_argument("--batches", type=int, default=64, help="evaluation batches per pair (default 64)")
    p.add_argument("--markdown", action="store_true", help="print the verdicts as a markdown table, not the summary")
    args = p.parse_args(argv)
    try:
        result = check_runs(args.folder, args.out, args.data, args.batches)
    except (PlelabError, OSError, ValueError) as exc:
        print(f"pays_check: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(result) if args.markdown else json.dumps(result["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
