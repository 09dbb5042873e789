"""`plelab finetune`: LoRA fine-tuning of a Hugging Face Gemma 3n / Gemma 4 folder, its PLE table left on disk."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plelab.cli.common import add_command, add_set_flag, print_json
from plelab.errors import PlelabError


def add_parser(sub) -> None:
    """Register `plelab finetune`."""
    p = add_command(
        sub, "finetune",
        "LoRA fine-tuning of a local Gemma 3n / Gemma 4 checkpoint whose PLE table stays in its safetensors "
        "shards (each batch's rows are read from disk); the same config fields, --set and --resume as "
        "`plelab train`, a peft adapter in RUN/adapter, and --merge for a merged Hugging Face folder.",
        "plelab finetune --hf ~/models/gemma-3n-E2B --data data/mine --out runs/e2b-lora "
        "--set eval_data=../shared/data/valid\n"
        "  plelab finetune --out runs/e2b-lora --resume --set max_steps=1000\n"
        "  plelab finetune --out runs/e2b-lora --merge ~/models/gemma-3n-E2B-mine     (merge only)\n"
        "  plelab finetune --hf G --data D --out R --set finetune.targets=attention,mlp,ple "
        "--set finetune.table=sparse\n\n"
        "--data is a folder from `plelab data prepare SOURCES --tokenizer CHECKPOINT/tokenizer.json --out DIR`.\n"
        "Fine-tuning settings ([finetune] in a config file): rank, alpha, dropout, targets (attention, mlp, ple\n"
        "or module names), table (frozen | sparse), base_dtype, attention. See docs/finetune.md.\n\n"
        "On several processes: torchrun --nproc_per_node 2 -m plelab finetune ... --set parallel=ddp",
        run,
    )
    p.add_argument("config", nargs="?", help="training config (TOML/YAML/JSON), optional: defaults suit LoRA")
    p.add_argument("--hf", metavar="PATH", help="the Hugging Face Gemma 3n / Gemma 4 folder to fine-tune")
    p.add_argument("--data", metavar="DIR", help="prepared training data (tokenized with the checkpoint's tokenizer)")
    p.add_argument("--out", required=True, help="run directory (config, metrics.jsonl, checkpoints, adapter/)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest intact checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a different plelab run in --out (other "
                   "files are kept; a folder holding a config.json that is not a run's is refused)")
    p.add_argument("--merge", metavar="OUT", help="after training (or alone, for a finished run): write the "
                   "checkpoint with the adapter (and table delta) merged in as a Hugging Face folder OUT")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the final metrics (and merge summary) as JSON")
    add_set_flag(p)


def run(args: argparse.Namespace) -> int:
    """Train (every rank under torchrun), then merge on rank 0 when asked."""
    from plelab.cli.train import run_on_every_rank

    return run_on_every_rank(_run, args)


def _run(args: argparse.Namespace) -> int:
    from plelab.hf.finetune.config import DEFAULT_SEQ_LEN, load_finetune_config
    from plelab.runs.run_dir import CONFIG_FILE, holds_run
    from plelab.util.fs import check_output_path

    out = Path(args.out)
    merge_only = args.merge and not (args.config or args.hf or args.data or args.resume or args.overrides)
    if args.resume and args.overwrite:
        raise PlelabError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if (args.resume or merge_only) and not holds_run(out):
        what = "does not exist" if not out.exists() else "holds no plelab run"
        raise PlelabError(f"{'--merge' if merge_only else '--resume'}: {out} {what}; check --out")
    if args.merge:
        merged = Path(args.merge)
        if merged.is_dir() and any(merged.iterdir()):  # --overwrite is the run's; a merge never replaces a folder
            raise PlelabError(f"--merge {args.merge} already exists and is not empty; merge into a new folder "
                              "(a merge never replaces one)")
        check_output_path(args.merge, is_dir=True, inputs=(out,))
    if merge_only:
        summary = _merge(args)
        if args.json:
            print_json(summary)
        return 0
    source = out / CONFIG_FILE if args.resume and not args.config else args.config
    hf = str(Path(args.hf).resolve()) if args.hf else None
    data = str(Path(args.data).resolve()) if args.data else None
    cfg, ckpt = load_finetune_config(source, args.overrides, {"finetune.hf": hf, "data": data})
    if cfg.seq_len < DEFAULT_SEQ_LEN and cfg.seq_len == cfg.model.max_seq_len and not args.quiet and not args.resume:
        print(f"seq_len = {cfg.seq_len}, the checkpoint's context (shorter than the default {DEFAULT_SEQ_LEN})",
              file=sys.stderr)
    from plelab.hf.finetune.checks import check_finetune_inputs
    from plelab.hf.finetune.trainer import FinetuneTrainer
    from plelab.parallel.engine import from_environment

    check_finetune_inputs(cfg, ckpt)
    trainer = FinetuneTrainer(cfg, out, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite,
                              distribution=from_environment(cfg))
    world = trainer.world
    try:
        final = trainer.run()
    except KeyboardInterrupt:
        return 130
    if not world.is_main:
        return 0
    final["adapter"] = str(out / "adapter")
    if args.merge:
        final["merge"] = _merge(args)
    if args.json:
        print_json(final)
    return 0


def _merge(args: argparse.Namespace) -> dict:
    """Merge RUN/adapter into the checkpoint it was trained from, as a Hugging Face folder at --merge."""
    from plelab.hf.finetune.merge import merge_adapter
    from plelab.hf.finetune.trainer import ADAPTER_DIR, read_run_record

    record = read_run_record(Path(args.out))
    summary = merge_adapter(record["base"], Path(args.out) / ADAPTER_DIR, args.merge,
                            {"run": str(Path(args.out).resolve()), "step": record.get("step")})
    if not (args.quiet or args.json):
        print(f"merged {summary['merged_weights']} adapted weight(s) and {summary['table_rows_changed']} table "
              f"row change(s) of {args.out} (step {record.get('step')}) into {args.merge}; compare it with the "
              f"base: plelab diagnose --hf {args.merge} --data EVAL_DIR")
    return summary


def finetune_base(folder: str, base: str | None) -> str | None:
    """The base folder a diagnosis of `folder` is compared with: --base, else the one a merge recorded."""
    if base:
        return base
    from plelab.hf.finetune.adapter import read_record

    return (read_record(Path(folder)) or {}).get("base")


def run_memory(args: argparse.Namespace) -> int:
    """`plelab train-memory --finetune PATH`: one device's memory for a LoRA fine-tune, table on disk vs on device."""
    from plelab.hf.finetune.config import FinetuneConfig, fit_seq_len, model_config_of
    from plelab.hf.finetune.memory import PUBLIC_REPORT, CheckpointShape, FinetuneMemoryRequest, finetune_memory, gib
    from plelab.training.memory import GiB
    from plelab.util.dataclass_config import apply_overrides, from_dict, read_file, to_dict

    shape = CheckpointShape.of(args.finetune)
    data = apply_overrides(read_file(args.config) if args.config else {}, args.overrides)
    if "model" in data or "tokenizer" in data:
        raise PlelabError("model and tokenizer come from the checkpoint (--finetune PATH); do not set them")
    cfg = from_dict(FinetuneConfig, fit_seq_len({**data, "model": to_dict(model_config_of(shape))}))
    req = FinetuneMemoryRequest(shape, cfg.finetune, cfg.batch_size, cfg.context, cfg.dtype != "fp32",
                       args.activation_checkpointing or cfg.activation_checkpointing, args.touched_rows,
                       args.overhead_gb * GiB, args.gpu_memory)
    plan = finetune_memory(req)
    plan["public_report"] = PUBLIC_REPORT
    if args.json:
        print_json({"finetune": str(args.finetune), "overrides": args.overrides, **plan})
        return 0
    m, st = plan["model"], plan["step"]
    disk, device = plan["table_on_disk_bytes"], plan["table_on_device_bytes"]
    print(f"{args.finetune}: {m['family']}, {m['frozen_params_without_table']:,} frozen parameters + a PLE table of "
          f"{m['ple_table_params']:,} ({m['table_shape'][0]:,} x {m['table_shape'][1]:,}); LoRA r={m['rank']} on "
          f"{', '.join(m['adapted'])}: {m['lora_params']:,} trained")
    print(f"step: {st['micro_batch']} x {st['seq_len']} tokens, {st['compute']}, frozen weights at "
          f"{st['frozen_bytes_per_value']} bytes, table {st['table']}"
          + (", activation checkpointing" if st["activation_checkpointing"] else ""))
    print(f"  {'part':<22} {'table on disk':>14} {'table on device':>16}")
    for part in disk:
        if part != "total":
            print(f"  {part.replace('_', ' '):<22} {gib(disk[part]):>14} {gib(device[part]):>16}")
    print(f"  {'total':<22} {gib(disk['total']):>14} {gib(device['total']):>16}")
    print(f"leaving the table on disk saves {gib(plan['table_saving_bytes']).strip()} per device"
          + (f"; fits in {args.gpu_memory / 1e9:g} GB: on disk {'yes' if plan['fits']['table_on_disk'] else 'NO'}, "
             f"on device {'yes' if plan['fits']['table_on_device'] else 'NO'}" if "fits" in plan else ""))
    print(f"beside the public report ({PUBLIC_REPORT['before_gb']} -> {PUBLIC_REPORT['after_gb']} GB): "
          f"{PUBLIC_REPORT['differs']}")
    return 0
