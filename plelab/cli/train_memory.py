"""`plelab train-memory`: per-GPU memory of a DDP/FSDP training run, the micro-batch that fits, and GPU-hours."""

from __future__ import annotations

import argparse
import math
import re
import sys

from plelab.cli import options
from plelab.cli.common import add_command, add_set_flag, print_json

_UNITS = {"": 1000**3, "b": 1, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
          "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4,
          "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def memory_size(text: str) -> float:
    """Bytes from '80GB' (10^9), '80GiB' or '80G' (2^30), '512MB', ...; a bare number is GB."""
    if re.fullmatch(r"\s*-.*", text):
        raise argparse.ArgumentTypeError(f"must be a positive memory size (e.g. 80GB), got {text!r}")
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a memory size (e.g. 80GB, 80GiB, 141GB)")
    value = float(m.group(1)) * _UNITS[m.group(2).lower()]
    if not math.isfinite(value) or value < 1024**2:
        raise argparse.ArgumentTypeError(f"must be at least 1 MiB, got {text!r}")
    return value


def add_parser(sub) -> None:
    """Register `plelab train-memory` (`plan-train`, its former name, still works)."""
    from plelab.training.memory import DEFAULT_GPU, GPU_PEAKS

    peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in GPU_PEAKS.items())
    p = add_command(
        sub, "train-memory",
        "Memory and time of a multi-GPU training run: per-rank memory by part (DDP or FSDP, vocabulary-sharded PLE "
        "table), whether it fits, the largest micro-batch, tokens/s at an assumed MFU and GPU-hours for a token "
        "budget. (Its former name, plan-train, still works.)",
        "plelab train-memory seed-3b --set model.ple.dim=512 --global-batch 4096 --gpus 8 --gpu-memory 80GB "
        "--tokens 400e9\n"
        "  plelab train-memory configs/small-ple.toml --gpus 2 --gpu-memory 24GB --strategy ddp --json\n"
        "  plelab train-memory --finetune ~/models/gemma-3n-E2B --gpu-memory 24GB --set batch_size=4 "
        "--set seq_len=1024\n\n"
        "Formulas and assumptions: plelab/training/memory.py; the 3B sweep: docs/scaling.md.",
        run, aliases=("plan-train",),
    )
    p.add_argument("config", nargs="?",
                   help="training config (TOML/YAML/JSON) or a model preset (seed-3b, small-ple, ...); with "
                   "--finetune, an optional fine-tuning config")
    p.add_argument("--finetune", metavar="PATH",
                   help="the memory of LoRA fine-tuning (plelab finetune) of a Hugging Face Gemma 3n / Gemma 4 folder "
                   "or its config.json: one device's memory with the PLE table on disk and on the device; --set "
                   "batch_size / seq_len / finetune.rank / finetune.targets / finetune.table ... as for finetune")
    p.add_argument("--touched-rows", type=options.positive_int,
                   help="with --finetune and finetune.table=sparse: table rows the data touches (default: all)")
    p.add_argument("--gpus", type=options.positive_int, default=8, help="ranks (GPUs) in all (default 8)")
    p.add_argument("--gpu-memory", type=memory_size, default=memory_size("80GB"),
                   help="memory per GPU: 80GB (10^9 bytes), 80GiB or 80G (2^30) (default 80GB)")
    p.add_argument("--strategy", choices=("auto", "ddp", "fsdp"),
                   help="data-parallel strategy; auto = ddp when it fits, else fsdp "
                        "(default: the config's parallel setting, else auto)")
    p.add_argument("--micro-batch", type=options.positive_int,
                   help="sequences per rank per micro-step (default: the largest that fits)")
    p.add_argument("--global-batch", type=options.positive_int,
                   help="sequences per optimizer step over all ranks (default: the config's batch_size x grad_accum)")
    p.add_argument("--activation-checkpointing", action="store_true",
                   help="recompute each decoder layer in backward, keeping only its input "
                        "(default: the config's activation_checkpointing)")
    p.add_argument("--mfu", type=options.probability, default=0.4,
                   help="assumed model FLOPs utilisation, in (0, 1] (default 0.4)")
    p.add_argument("--gpu", choices=tuple(GPU_PEAKS), default=DEFAULT_GPU,
                   help=f"GPU whose dense bf16 peak to use, TFLOP/s: {peaks} (default {DEFAULT_GPU})")
    p.add_argument("--peak-tflops", type=options.positive_float,
                   help="peak FLOP/s per GPU in TFLOP/s, instead of --gpu's")
    p.add_argument("--tokens", type=options.positive_float, help="token budget for the GPU-hours, e.g. 400e9")
    p.add_argument("--overhead-gb", type=options.nonneg_float, default=3.0,
                   help="GiB per GPU kept for the CUDA context, NCCL and fragmentation (default 3)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_set_flag(p)


def _train_config(source: str, overrides: list[str]):
    import plelab.vision  # noqa: F401 - registers the [vision] section
    from plelab.model.presets import PRESETS
    from plelab.training.config import load_train_config

    if source in PRESETS:
        return load_train_config({"model": {"preset": source}}, overrides)
    return load_train_config(source, overrides)


def _gib(n: float) -> str:
    return f"{n / 1024**3:8.2f} GiB"


def run(args: argparse.Namespace) -> int:
    """Print the estimate."""
    from plelab.training.memory import GPU_PEAKS, GiB, MemoryRequest, training_memory

    if args.finetune:
        from plelab.cli.finetune import run_memory

        return run_memory(args)
    if not args.config:
        from plelab.errors import PlelabError

        raise PlelabError("give a training config or preset (or --finetune PATH for a fine-tune)")
    train = _train_config(args.config, args.overrides)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else GPU_PEAKS[args.gpu]
    parallel = getattr(train, "parallel", "none")
    strategy = args.strategy or (parallel if parallel in ("ddp", "fsdp") else "auto")
    checkpointing = args.activation_checkpointing or bool(getattr(train, "activation_checkpointing", False))
    req = MemoryRequest(train, args.gpus, args.gpu_memory, strategy, args.micro_batch, checkpointing, args.mfu,
                      peak, args.tokens, args.global_batch, args.overhead_gb * GiB)
    est = training_memory(req)
    if args.json:
        print_json({"config": args.config, "overrides": args.overrides, **est})
        return _fit_status(est)
    m = est["model"]
    print(f"{args.config}: {m['params_total']:,} params ({m['ple_table']:,} in the PLE table, dP {m['ple_dim']}), "
          f"seq {m['seq_len']}, {est['precision']}")
    print(f"{args.gpus} GPUs x {args.gpu_memory / 1e9:g} GB, {est['strategy']} ({est['strategy_choice']}), "
          f"global batch {est['global_batch_sequences']} seqs = {est['sequences_per_rank_per_step']}/rank: "
          f"micro-batch {est['micro_batch']} x grad_accum {est['grad_accum']}"
          + (", activation checkpointing" if est["activation_checkpointing"] else ""))
    for part, n in est["per_rank_bytes"].items():
        if part != "total":
            print(f"  {part.replace('_', ' '):<22} {_gib(n)}")
    verdict = "fits" if est["fits"] else "DOES NOT FIT"
    print(f"  {'total per rank':<22} {_gib(est['per_rank_bytes']['total'])}  {verdict}")
    largest = ", ".join(f"{k} {v}" for k, v in est["max_micro_batch"].items())
    print(f"largest micro-batch that fits (dividing {est['sequences_per_rank_per_step']} per rank): {largest}")
    if m["ple_table"]:
        print(f"vocabulary-sharded PLE table saves {_gib(est['ple_table_sharding_saves_bytes']).strip()} per rank "
              "against a replicated one")
    print(f"{est['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, {est['tokens_per_s']:,.0f} in all at MFU "
          f"{args.mfu:g} of {peak / 1e12:g} TFLOP/s")
    if "gpu_hours" in est:
        print(f"{args.tokens:.3g} tokens: {est['gpu_hours']:,.0f} GPU-hours ({est['wall_hours']:,.1f} h wall)")
    if "note" in est:
        print(f"note: {est['note']}")
    return _fit_status(est)


def _fit_status(est: dict) -> int:
    """0 when the run fits; else a hint on stderr and 1 (a valid answer, not a usage error)."""
    if est["fits"]:
        return 0
    print("plelab train-memory: the run does not fit in GPU memory; try --strategy fsdp, "
          "--activation-checkpointing, a smaller --micro-batch or more --gpus", file=sys.stderr)
    return 1
