"""Peak memory (RSS) per rank when a PLE-table run starts on 2 ranks (torchrun, gloo): is the table ever whole on a
rank? Two starts, real `Trainer`s: a new run, and the resume of a 1-process checkpoint.

Each rank reports its peak RSS (ru_maxrss) just before the Trainer is built (torch, plelab and the modules a run
imports already loaded, the process group up, one throwaway tiny model built so torch's one-off meta-device
start-up is counted there) and after it is built (model materialised, table sharded,
optimizer made; for the resume, the checkpoint's weights and Adam moments loaded). `growth` is the difference:
what starting the run cost. It is compared with what the rank must hold: its rows of the table plus the rest of the
model (a new run), and that plus its rows' two Adam moments and the dense Adam state (the resume). The goal for a
new run is growth <= 1.1 x (shard + rest).

    python3 benchmarks/bench_table_memory.py                    # 1 GiB table: 262144 rows x 2 layers x dP 512
    python3 benchmarks/bench_table_memory.py --rows 16384       # a 64 MiB table (quick)
    python3 benchmarks/bench_table_memory.py --code DIR         # measure the plelab checkout in DIR instead
    python3 benchmarks/bench_table_memory.py --no-resume        # only the new run

RSS does not depend on the machine's load; the 1 GiB run needs about 3.5 GB of RAM in one process (to write the
1-process checkpoint) and takes a few minutes on 2 cores. --code lets the same measurement run on the code before
a change (e.g. `git worktree add /tmp/before COMMIT`), whose Trainer has the same constructor.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
MIB = 1 << 20


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def worker(config: str, run: str, out: str, resume: bool) -> None:
    """One rank: load what a run loads, note the peak, build the Trainer, note the peak again, write both."""
    import gc

    import safetensors.torch  # noqa: F401 - imported by checkpoint loading; loaded before the baseline
    import torch
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.nn.parallel  # noqa: F401

    from plelab.parallel.group import init_group, world_from_env
    from plelab.training.config import load_train_config
    from plelab.training.trainer import Trainer

    world = world_from_env()
    init_group(world, torch.device("cpu"))
    cfg = load_train_config(config)
    # torch's one-off start-up of meta-device construction (~75 MB measured, the same for any model: its meta
    # registrations and decompositions load on first use) goes into the baseline: build a throwaway tiny model.
    from plelab.model.presets import load_model_config
    from plelab.model.transformer import LanguageModel

    LanguageModel(load_model_config("tiny"), device="cpu")
    gc.collect()
    before = peak_rss_bytes()
    trainer = Trainer(cfg, run, resume=resume, quiet=True)
    after = peak_rss_bytes()
    table = trainer.parallel.table
    shard = table.weight.numel() * table.weight.element_size() if table is not None else 0
    rest = sum(t.numel() * t.element_size() for t in trainer.model.state_dict().values()) - shard
    dense_adam = 2 * sum(p.numel() * p.element_size() for p in trainer.model.parameters()) - 2 * shard
    Path(out, f"rank{world.rank}.json").write_text(json.dumps({
        "rank": world.rank, "peak_rss_before_mib": round(before / MIB, 1), "peak_rss_after_mib": round(after / MIB, 1),
        "growth_mib": round((after - before) / MIB, 1), "table_rows_held": table.weight.shape[0] if table else 0,
        "shard_mib": round(shard / MIB, 1), "rest_of_model_mib": round(rest / MIB, 1),
        "must_hold_mib": round((shard + rest + (2 * shard + dense_adam if resume else 0)) / MIB, 1),
    }))
    trainer.close()
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run(cmd: list[str], env: dict[str, str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")


def measure(folder: Path, name: str, config: Path, run_dir: Path, resume: bool, env: dict[str, str]) -> dict:
    out = folder / name
    out.mkdir()
    run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, "--worker",
         str(config), str(run_dir), str(out), "resume" if resume else "new"], env)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for r in ranks:
        r["growth_over_must_hold"] = round(r["growth_mib"] / r["must_hold_mib"], 3)
    return {"ranks": ranks, "goal_growth_le_1.1x_must_hold": all(r["growth_over_must_hold"] <= 1.1 for r in ranks)}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(*sys.argv[2:5], resume=sys.argv[5] == "resume")
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=262144, help="PLE table rows (default 262144: 1 GiB at dP 512)")
    ap.add_argument("--dim", type=int, default=512, help="dP (the tiny preset has 2 layers)")
    ap.add_argument("--code", default=str(HERE), help="the plelab checkout to measure (default: this one)")
    ap.add_argument("--no-resume", action="store_true", help="skip the resume of a 1-process checkpoint")
    args = ap.parse_args()
    code = Path(args.code).resolve()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "PYTHONPATH": str(code)}
    git = subprocess.run(["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = git.stdout.strip() or "unknown"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sys.path.insert(0, str(code))
        from plelab.data.prepare import prepare_dataset
        from plelab.data.tokenizer import Tokenizer

        text = " ".join(f"Sentence {i} tells of the fox and the dog." for i in range(2000))
        (folder / "corpus.txt").write_text(text)
        prepare_dataset([folder / "corpus.txt"], Tokenizer.byte_level(), folder / "data", val_fraction=0.0,
                        progress=False)
        config = folder / "train.toml"
        config.write_text("\n".join([
            f'data = "{folder / "data"}"', "batch_size = 2", "seq_len = 32", "max_steps = 1", "ckpt_every = 1",
            "log_every = 1", 'device = "cpu"', 'dtype = "fp32"', 'parallel = "ddp"', "eval_tokens = 64",
            "[model]", 'preset = "tiny"', "vocab_size = 258", "max_seq_len = 32",
            "[model.ple]", f"dim = {args.dim}", f"vocab_size = {args.rows}",
        ]) + "\n")
        result = {"new_run": measure(folder, "new", config, folder / "new-run", False, env)}
        if not args.no_resume:
            run([sys.executable, "-m", "plelab", "train", str(config), "--out", str(folder / "one"), "--quiet",
                 "--set", "parallel=none"], env)
            result["resume_of_1_process_checkpoint"] = measure(folder, "resume", config, folder / "one", True, env)
    table_mib = args.rows * 2 * args.dim * 4 / MIB
    print(json.dumps({
        "benchmark": "bench_table_memory", "command": " ".join(["python3", *sys.argv]), "code": str(code),
        "commit": commit, "ranks": 2, "backend": "gloo", "table": f"{args.rows} rows x 2 layers x dP {args.dim}",
        "table_mib": round(table_mib, 1), **result,
    }, indent=2))


if __name__ == "__main__":
    main()
