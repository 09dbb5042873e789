"""Is run B's loss curve within noise of run A's? Per-step loss difference against the seed-to-seed noise.

    python3 scripts/compare_runs.py runs/fp32 runs/bf16 --noise runs/fp32-seed2

A and B differ in one setting (e.g. dtype); NOISE differs from A only in the seed. Steps are grouped in
windows (per-step losses are noisy); for each window the script prints the mean loss of A, the mean of
B - A and of NOISE - A, and the mean |B - A| and |NOISE - A|. The verdict compares the whole curve after
warm-up: B is within noise when mean |B - A| <= mean |NOISE - A|, and the final-window gap |B - A| is no
larger than the seed-to-seed gap. Without --noise only the differences are printed. --json prints one object.

The bf16 check of issue 12 (the coordinator runs it on an idle machine: 3 x 300 steps of small-ple, on the
data that configs/small-ple.toml names, prepared once as its header says):

    plelab data prepare ../shared/data/train --tokenizer runs/tok8k.json --vocab-size 8192 --out runs/shared-data
    plelab train configs/small-ple.toml --out runs/cmp-fp32  --set max_steps=300 --set dtype=fp32
    plelab train configs/small-ple.toml --out runs/cmp-bf16  --set max_steps=300 --set dtype=bf16
    plelab train configs/small-ple.toml --out runs/cmp-seed2 --set max_steps=300 --set dtype=fp32 --set seed=1338
    python3 scripts/compare_runs.py runs/cmp-fp32 runs/cmp-bf16 --noise runs/cmp-seed2 --skip 25
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def read_losses(run: Path) -> dict[int, float]:
    """{step: training loss} from RUN/metrics.jsonl (skipped steps and evaluation lines left out)."""
    path = Path(run) / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"compare_runs: {path} not found (is {run} a plelab run directory?)")
    out = {}
    for line in path.read_text().splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if isinstance(m.get("loss"), (int, float)) and "eval" not in m:
            out[int(m["step"])] = float(m["loss"])
    return out


def compare(a: dict[int, float], b: dict[int, float], noise: dict[int, float] | None,
            window: int, skip: int) -> dict:
    """Windowed differences of b (and noise) against a over their common steps after `skip` warm-up steps."""
    steps = sorted(set(a) & set(b) & (set(noise) if noise is not None else set(a)))
    steps = [s for s in steps if s > skip]
    if not steps:
        raise SystemExit("compare_runs: the runs share no logged steps after the warm-up")
    rows = []
    for start in range(0, len(steps), window):
        chunk = steps[start : start + window]
        row = {"steps": f"{chunk[0]}-{chunk[-1]}", "loss_a": statistics.fmean(a[s] for s in chunk),
               "b_minus_a": statistics.fmean(b[s] - a[s] for s in chunk),
               "abs_b_minus_a": statistics.fmean(abs(b[s] - a[s]) for s in chunk)}
        if noise is not None:
            row["noise_minus_a"] = statistics.fmean(noise[s] - a[s] for s in chunk)
            row["abs_noise_minus_a"] = statistics.fmean(abs(noise[s] - a[s]) for s in chunk)
        rows.append(row)
    result: dict = {"steps_compared": len(steps), "first_step": steps[0], "last_step": steps[-1],
                    "mean_abs_b_minus_a": statistics.fmean(abs(b[s] - a[s]) for s in steps), "windows": rows}
    if noise is not None:
        result["mean_abs_noise_minus_a"] = statistics.fmean(abs(noise[s] - a[s]) for s in steps)
        last = rows[-1]
        result["within_noise"] = (result["mean_abs_b_minus_a"] <= result["mean_abs_noise_minus_a"]
                                  and abs(last["b_minus_a"]) <= max(abs(last["noise_minus_a"]),
                                                                    last["abs_noise_minus_a"]))
    return result


def main(argv: list[str] | None = None) -> int:
    """Print the comparison; exit 0 (1 when --noise is given and B is outside the noise)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path, help="reference run directory (e.g. fp32)")
    p.add_argument("b", type=Path, help="run to compare (e.g. bf16), same seed as A")
    p.add_argument("--noise", type=Path, help="run identical to A but for the seed: the seed-to-seed noise")
    p.add_argument("--window", type=int, default=25, help="steps per window (default 25)")
    p.add_argument("--skip", type=int, default=0, help="leave out the first N steps (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    args = p.parse_args(argv)
    if args.window < 1 or args.skip < 0:
        p.error("--window must be >= 1 and --skip >= 0")
    noise = read_losses(args.noise) if args.noise else None
    r = compare(read_losses(args.a), read_losses(args.b), noise, args.window, args.skip)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        head = f"{'steps':>11} {'loss A':>8} {'B-A':>8} {'|B-A|':>8}"
        print(head + (f" {'N-A':>8} {'|N-A|':>8}" if noise is not None else ""))
        for w in r["windows"]:
            line = f"{w['steps']:>11} {w['loss_a']:8.4f} {w['b_minus_a']:+8.4f} {w['abs_b_minus_a']:8.4f}"
            if noise is not None:
                line += f" {w['noise_minus_a']:+8.4f} {w['abs_noise_minus_a']:8.4f}"
            print(line)
        print(f"mean |B-A| over steps {r['first_step']}-{r['last_step']}: {r['mean_abs_b_minus_a']:.4f}", end="")
        if noise is not None:
            verdict = "within" if r["within_noise"] else "OUTSIDE"
            print(f"; seed-to-seed mean |N-A|: {r['mean_abs_noise_minus_a']:.4f} -> B is {verdict} the noise")
        else:
            print()
    return 0 if r.get("within_noise", True) else 1


if __name__ == "__main__":
    sys.exit(main())
