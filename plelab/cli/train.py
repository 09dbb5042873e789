"""`plelab train`: train a model from a config file into a run directory (resumable)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plelab.cli.common import add_command, add_set_flag
from plelab.errors import PlelabError
from plelab.training.config import load_train_config


def add_parser(sub) -> None:
    """Register `plelab train`."""
    p = add_command(
        sub, "train", "Train a (PLE) language model; kill it at any moment and continue with --resume.",
        "plelab train configs/small-ple.toml --out runs/small-ple --set max_steps=2000\n"
        "  plelab train configs/small-ple.toml --out runs/small-base --set model.ple.dim=0\n"
        "  plelab train --out runs/small-ple --resume",
        run,
    )
    p.add_argument("config", nargs="?", help="training config (TOML/YAML/JSON); optional with --resume")
    p.add_argument("--out", required=True, help="run directory (config, metrics.jsonl, checkpoints)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its newest checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--json", action="store_true", help="print the final metrics as JSON")
    add_set_flag(p)


def build_callbacks(cfg) -> list:
    """Callbacks the config asks for: PLE diagnostics monitor, TensorBoard, W&B."""
    from plelab.training.loggers import optional_loggers

    callbacks, notes = optional_loggers(cfg.tensorboard, cfg.wandb)
    for note in notes:
        print(f"note: {note}")
    if cfg.diagnostics_every and cfg.model.ple.dim:
        from plelab.diagnostics.monitor import PLEMonitor

        callbacks.append(PLEMonitor(every=cfg.diagnostics_every, early_fraction=cfg.early_warning_fraction))
    return callbacks


def run(args: argparse.Namespace) -> int:
    """Build the trainer and run it."""
    from plelab.training.trainer import Trainer

    out = Path(args.out)
    if args.config:
        cfg = load_train_config(args.config, args.overrides)
    elif args.resume and (out / "config.json").is_file():
        cfg = load_train_config(out / "config.json", args.overrides)
    else:
        raise PlelabError("give a training config (or --resume an existing run directory)")
    trainer = Trainer(cfg, out, callbacks=build_callbacks(cfg), resume=args.resume, quiet=args.quiet)
    try:
        final = trainer.run()
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(final, indent=2))
    return 0
