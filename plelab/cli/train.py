"""`plelab train`: train a model from a config file into a run directory (resumable)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import textwrap
import time
from pathlib import Path

from plelab.cli.common import add_command, add_set_flag
from plelab.errors import PlelabError
from plelab.runs.run_dir import CONFIG_FILE, HISTORY_FILE, RESUMABLE_FIELDS, holds_run
from plelab.training.config import load_train_config

# How long a non-reporting rank waits, after a user error, for rank 0 to print it and exit (see `run`).
PEER_REPORT_WAIT_S = 30.0


def add_parser(sub) -> None:
    """Register `plelab train`."""
    p = add_command(
        sub, "train", "Train a (PLE) language model; kill it at any moment and continue with --resume.",
        "plelab train configs/small-ple.toml --out runs/small-ple --set max_steps=2000\n"
        "  plelab train configs/small-ple.toml --out runs/small-base --set model.ple.dim=0\n"
        "  plelab train --out runs/small-ple --resume --set max_steps=4000\n\n"
        + textwrap.fill(f"On --resume, only these settings may change: {', '.join(RESUMABLE_FIELDS)}.", 100)
        + f"\nEach change is recorded in RUN/{HISTORY_FILE}; changing anything else is refused.\n"
        "Resume starts from the newest checkpoint that passes its checksums; a newer corrupt one is skipped\n"
        "with a note. One process at a time may train into a run directory (it is locked).\n\n"
        "On several processes: torchrun --nproc_per_node 2 -m plelab train CONFIG --out RUN\n"
        "(DDP: parallel = auto; --set parallel=fsdp for FSDP2; the PLE table is split by vocabulary across ranks;\n"
        "see docs/distributed.md).",
        run,
    )
    p.add_argument("config", nargs="?", help="training config (TOML/YAML/JSON); optional with --resume")
    p.add_argument("--out", required=True, help="run directory (config, metrics.jsonl, checkpoints)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run in --out from its newest intact checkpoint (--out must hold a run)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a different plelab run in --out instead of refusing (other files are kept; a "
                   "folder holding a config.json that is not a run's, e.g. a model's, is refused)")
    p.add_argument("--init-from-hf", metavar="PATH",
                   help="start from a local Hugging Face Gemma 4 folder: its config.json replaces the config's "
                   "[model] (arch=gemma4), its safetensors weights the random initialisation (sets init_from_hf; "
                   "recorded, so --resume and torchrun ranks use it too)")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    add_set_flag(p)


def run(args: argparse.Namespace) -> int:
    """Build the trainer and run it (on every rank under torchrun; rank 0 alone reports user errors)."""
    return run_on_every_rank(_run, args)


def run_on_every_rank(body, args: argparse.Namespace) -> int:
    """`body(args)` on every rank torchrun started (or the one process); a user error is reported by rank 0 only."""
    from plelab.parallel.group import PeerLost, abandon_group, world_from_env

    world = world_from_env()
    try:
        return body(args)
    except PeerLost:
        raise  # the group is broken (destroying it can hang): say so and exit; torchrun stops the rest
    except PlelabError:
        abandon_group()
        if world.is_main:
            raise
        # The same error (or a PeerError naming it) is printed once, by rank 0. Exiting first would race it:
        # torchrun stops every worker as soon as one fails, and could kill rank 0 before it prints. So wait
        # for rank 0 to fail first (torchrun then stops this rank); the bound only matters if it never does.
        time.sleep(PEER_REPORT_WAIT_S)
        return 2


def _run(args: argparse.Namespace) -> int:
    import plelab.vision  # noqa: F401 - registers the [vision] section (vision runs train with this command)

    out = Path(args.out)
    if args.resume and args.overwrite:
        raise PlelabError("--resume continues the run in --out and --overwrite replaces it: give one of them")
    if args.resume and not holds_run(out):
        what = "does not exist" if not out.exists() else "holds no plelab run"
        raise PlelabError(f"--resume: {out} {what}; check --out, or drop --resume to start a new run")
    if args.config:
        cfg = load_train_config(args.config, args.overrides)
    elif args.resume:
        cfg = load_train_config(out / CONFIG_FILE, args.overrides)
    else:
        raise PlelabError("give a training config (or --resume an existing run directory)")
    if args.init_from_hf:
        if args.resume:
            raise PlelabError("--init-from-hf starts a new run; --resume continues one (its config.json records "
                              "the folder it started from)")
        cfg = dataclasses.replace(cfg, init_from_hf=args.init_from_hf)
    if cfg.init_from_hf:
        import plelab.hf.interop  # noqa: F401 - registers the reader of init_from_hf folders
    from plelab.parallel.engine import from_environment
    from plelab.training.trainer import trainer_for

    trainer = trainer_for(cfg)(cfg, out, resume=args.resume, quiet=args.quiet, overwrite=args.overwrite,
                               distribution=from_environment(cfg))
    try:
        final = trainer.run()
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(final, indent=2))
    return 0
