"""Train an n-gram PLE table larger than this machine's RAM with `ple_table = "disk"`: peak RSS and step time.

The table and its two Adam moments are memory-mapped sparse files (plelab/training/disk_table.py). Two runs of the
same model and data, each in a fresh process, differ only in the table's rows per head: a small table (default
64 MiB) and a large one (default 36 GiB, 1.5 x a 24 GiB machine). If only a step's rows are ever resident, the
large run's peak RSS is the small run's plus the bookkeeping that grows with rows (one byte per row marking the
rows trained, plus page-table pages), not plus the table: the benchmark reports both peaks, their difference and
that difference over the table's bytes, and the files' allocated bytes on disk (rows actually written).

    python3 benchmarks/bench_disk_table.py                          # 36 GiB table, 20 steps
    python3 benchmarks/bench_disk_table.py --table-gib 1 --steps 5  # a quick check
    python3 benchmarks/bench_disk_table.py --folder /big/disk       # where the runs (and sparse files) go

RSS does not depend on the machine's load; step time does (measure it on an idle machine). Disk: the large table's
files are 3 x its size apparent but take only the written rows (each step's rows, a 4 KiB page each at most), so
a few hundred MB for the default run; its start draws (and discards) as many random numbers as the table has values,
~30 s for 36 GiB, so that every other weight is the one an in-memory table gives.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_table_memory import MIB, peak_rss_bytes  # noqa: E402 - the same RSS measurement

GIB = 1 << 30
ORDERS, HEADS, DIM, LAYERS = (2, 3), 4, 512, 2
WIDTH = LAYERS * DIM // (len(ORDERS) * HEADS)  # values per row: 128 (512 bytes)


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (RssAnon: the process's own memory; RssFile: mapped file pages)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def worker(config: str, run: str, out: str) -> None:
    """One run: build the Trainer, note the peak RSS, train, note it again, write both with the step times."""
    import time

    import torch

    from plelab.training.config import load_train_config
    from plelab.training.trainer import Trainer

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    cfg = load_train_config(config)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, run, quiet=True)
    built, build_s = peak_rss_bytes(), time.perf_counter() - t0
    trainer.run()
    steps = [json.loads(line) for line in Path(run, "metrics.jsonl").read_text().splitlines()]
    times = [m["step_time"] for m in steps if "step_time" in m]
    table = Path(run, ".ple_table")
    files = list(table.iterdir())
    Path(out).write_text(json.dumps({
        "table_gib": round(os.path.getsize(table / "weight.f32") / GIB, 3),
        "peak_rss_after_build_mib": round(built / MIB, 1), "peak_rss_mib": round(peak_rss_bytes() / MIB, 1),
        "rss_anon_end_mib": round(status_kib("RssAnon") / 1024, 1),
        "rss_file_end_mib": round(status_kib("RssFile") / 1024, 1),
        "build_s": round(build_s, 1), "steps": len(times),
        "step_time_s_median": sorted(times)[len(times) // 2] if times else None,
        "step_time_s_first": times[0] if times else None,
        "files_apparent_gib": round(sum(f.stat().st_size for f in files) / GIB, 2),
        "files_allocated_mib": round(sum(f.stat().st_blocks * 512 for f in files) / MIB, 1),
    }))


def rows_per_head(table_bytes: int) -> int:
    """The smallest prime number of rows per head that makes the table at least `table_bytes`."""
    sys.path.insert(0, str(HERE))
    from plelab.model.ngram import next_prime

    return next_prime(-(-table_bytes // (4 * WIDTH * len(ORDERS) * HEADS)))


def write_config(folder: Path, data: Path, rows: int, steps: int) -> Path:
    path = folder / f"train-{rows}.toml"
    path.write_text("\n".join([
        f'data = "{data}"', "batch_size = 8", "seq_len = 128", f"max_steps = {steps}", "warmup_steps = 2",
        f"ckpt_every = {steps}", "log_every = 1", 'device = "cpu"', 'dtype = "fp32"', 'ple_table = "disk"',
        "[model]", 'preset = "tiny"', "vocab_size = 258", "max_seq_len = 128",
        "[model.ple]", f"dim = {DIM}", 'index = "ngram"', "table_init_std = 0.0",
        "[model.ple.ngram]", f"orders = {list(ORDERS)}", f"heads = {HEADS}", f"rows = [{rows}]",
    ]) + "\n")
    return path


def measure(folder: Path, name: str, config: Path, env: dict[str, str]) -> dict:
    out = folder / f"{name}.json"
    proc = subprocess.run([sys.executable, __file__, "--worker", str(config), str(folder / name), str(out)],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(out.read_text())


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5])
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table-gib", type=float, default=36.0, help="size of the large table (default 36)")
    ap.add_argument("--small-mib", type=float, default=64.0, help="size of the small table (default 64)")
    ap.add_argument("--steps", type=int, default=20, help="training steps per run (default 20)")
    ap.add_argument("--text", default=str(HERE.parent / "shared" / "data" / "valid" / "en_novel.txt"),
                    help="real text to train on (byte-level tokens)")
    ap.add_argument("--folder", help="where the runs go (default: a temporary folder, removed after)")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(HERE)}
    git = subprocess.run(["git", "-C", str(HERE), "rev-parse", "HEAD"], capture_output=True, text=True)
    with tempfile.TemporaryDirectory(dir=args.folder) as tmp:
        folder = Path(tmp)
        sys.path.insert(0, str(HERE))
        from plelab.data.prepare import prepare_dataset
        from plelab.data.tokenizer import Tokenizer

        prepare_dataset([Path(args.text)], Tokenizer.byte_level(), folder / "data", val_fraction=0.0, progress=False)
        runs = {}
        for name, size in (("small", args.small_mib * MIB), ("large", args.table_gib * GIB)):
            rows = rows_per_head(int(size))
            runs[name] = {"rows_per_head": rows, **measure(folder, name, write_config(folder, folder / "data", rows,
                                                                                      args.steps), env)}
    small, large = runs["small"], runs["large"]
    grew = large["peak_rss_mib"] - small["peak_rss_mib"]
    print(json.dumps({
        "benchmark": "bench_disk_table", "command": " ".join(["python3", *sys.argv]), "commit": git.stdout.strip(),
        "machine_ram_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB, 1),
        "model": f"tiny (H 32, 2 layers), n-gram orders {list(ORDERS)} x {HEADS} heads, dP {DIM}, rows of {WIDTH} "
                 "float32; batch 8 x 128 byte tokens; fp32, 1 thread",
        "runs": runs,
        "peak_rss_growth_mib": round(grew, 1),
        "peak_rss_growth_over_large_table": round(grew * MIB / (large["table_gib"] * GIB), 5),
        # the ratio of the two runs of this invocation: what the table living on disk at 1.5 x RAM costs a step
        # against the same model with a table that stays in the page cache
        "step_time_ratio_large_over_small": (round(large["step_time_s_median"] / small["step_time_s_median"], 3)
                                             if large["step_time_s_median"] and small["step_time_s_median"] else None),
        "note": "step time is load-dependent: quote it only from an idle machine",
    }, indent=2))


if __name__ == "__main__":
    main()
