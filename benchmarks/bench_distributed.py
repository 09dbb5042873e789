"""Data-parallel training on the CPU: 2 ranks x 1 thread (torchrun, gloo, PLE table split by vocabulary)
against 1 process x 2 threads and 1 process x 1 thread, same model, same global batch, real `plelab train`.

Prints one JSON object: tokens/s of each (median over the steps after warm-up, from each run's
metrics.jsonl), `speedup_2x1_vs_1x2` (is data parallelism worth it on this machine's cores, against
letting one process use both), and `scaling_efficiency` = tokens/s(2 ranks) / (2 x tokens/s(1 rank, 1 thread)).
`bf16` repeats the 1 x 2 and 2 x 1 runs under bf16 autocast (where the CPU has native bf16) and gives the
bf16 / fp32 tokens/s ratios; benchmarks/bench_train_step.py has the per-step bf16 comparison with HF Llama.

    python3 benchmarks/bench_distributed.py            # mini-ple (byte vocab), about 2-3 minutes on 2 idle cores
    python3 benchmarks/bench_distributed.py --quick    # tiny smoke run
Run it on an idle machine: the three runs share its cores one after the other.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from plelab.data.prepare import prepare_dataset  # noqa: E402
from plelab.data.tokenizer import Tokenizer  # noqa: E402
from plelab.util.device import cpu_bf16_features  # noqa: E402

SHARED_TEXT = Path(__file__).resolve().parents[2] / "shared" / "data" / "train" / "en_gutenberg_children_00.txt"


def corpus(folder: Path, chars: int) -> Path:
    """A text file to train on: the shared Gutenberg text when present, else generated sentences."""
    text = SHARED_TEXT.read_text(encoding="utf-8")[:chars] if SHARED_TEXT.is_file() else ""
    if len(text) < chars:
        text += " ".join(f"Sentence {i} tells of the fox and the dog." for i in range(chars // 40))
    path = folder / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    return path


def train(folder: Path, name: str, config: Path, ranks: int, threads: int, dtype: str = "fp32") -> float:
    """Median tokens/s of one `plelab train` run (steps after the first third)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONWARNINGS": "ignore"}
    launcher = ([sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
                if ranks > 1 else [sys.executable])
    cmd = [*launcher, "-m", "plelab", "train", str(config), "--out", str(folder / name), "--quiet",
           "--set", f"parallel={'ddp' if ranks > 1 else 'none'}", "--set", f"dtype={dtype}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (folder / name / "metrics.jsonl").read_text().splitlines()]
    speeds = [r["tokens_per_s"] for r in rows if "tokens_per_s" in r]
    return statistics.median(speeds[len(speeds) // 3:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, few steps (a smoke run)")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    preset, seq, batch, steps = ("tiny", 32, 4, 8) if args.quick else ("mini-ple", 128, 16, 40)
    steps = args.steps or steps
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prepare_dataset([corpus(folder, 200_000 if args.quick else 2_000_000)], Tokenizer.byte_level(),
                        folder / "data", val_fraction=0.0, progress=False)
        config = folder / "train.toml"
        config.write_text("\n".join([
            f'data = "{folder / "data"}"', f"batch_size = {batch}", f"seq_len = {seq}", f"max_steps = {steps}",
            "warmup_steps = 2", f"ckpt_every = {steps}", "log_every = 1", 'device = "cpu"',
            "eval_tokens = 64", "[model]", f'preset = "{preset}"', "vocab_size = 258", f"max_seq_len = {seq}",
        ]) + "\n")
        one_by_two = train(folder, "1x2", config, ranks=1, threads=2)
        two_by_one = train(folder, "2x1", config, ranks=2, threads=1)
        one_by_one = train(folder, "1x1", config, ranks=1, threads=1)
        bf16 = None
        if cpu_bf16_features():
            bf16_1x2 = train(folder, "1x2-bf16", config, ranks=1, threads=2, dtype="bf16")
            bf16_2x1 = train(folder, "2x1-bf16", config, ranks=2, threads=1, dtype="bf16")
            bf16 = {"tokens_per_s": {"1_process_x_2_threads": round(bf16_1x2), "2_ranks_x_1_thread": round(bf16_2x1)},
                    "ratio_bf16_over_fp32_1x2": round(bf16_1x2 / one_by_two, 3),
                    "ratio_bf16_over_fp32_2x1": round(bf16_2x1 / two_by_one, 3)}
    print(json.dumps({
        "benchmark": "bench_distributed", "command": " ".join(["python3", *sys.argv]),
        "loadavg_1m_start": load_start, "loadavg_1m_end": os.getloadavg()[0], "quick": args.quick,
        "preset": preset, "seq_len": seq,
        "global_batch": batch, "steps": steps, "backend": "gloo", "dtype": "fp32 (bf16: see the bf16 key)",
        "tokens_per_s": {"1_process_x_2_threads": round(one_by_two), "2_ranks_x_1_thread": round(two_by_one),
                         "1_process_x_1_thread": round(one_by_one)},
        "speedup_2x1_vs_1x2": round(two_by_one / one_by_two, 3),
        "scaling_efficiency": round(two_by_one / (2 * one_by_one), 3),
        "bf16": bf16 if bf16 is not None else "not measured: this CPU has no native bf16",
    }, indent=2))


if __name__ == "__main__":
    main()
