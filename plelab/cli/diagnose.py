"""`plelab diagnose`: does a run use its PLE table (ablation), and does the table pay (against its dP = 0 twin)?"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from plelab.cli import options
from plelab.cli.common import add_command, print_json
from plelab.cli.finetune import finetune_base


def add_parser(sub) -> None:
    """Register `plelab diagnose`."""
    p = add_command(
        sub, "diagnose",
        "Diagnose a run's PLE with two verdicts. used (dependence): does the trained model rely on its table? "
        "Ablation: the loss with PLE switched off minus with it on (used / used, within margin / unused / not "
        "resolved / harmful, within margin / harmful). pays (benefit): is the model better than its dP = 0 twin "
        "trained on the same tokens? The paired loss difference on the same batches (better / better, within "
        "margin / equivalent / worse, within margin / worse / not resolved, with the 95 % interval; not measured "
        "without a twin). 'equivalent' and 'unused' need the 90 % interval inside +-0.01 nats with nothing "
        "resolved; a resolved difference inside it is 'within margin', never 'equivalent'. A model "
        "depends on a table it was trained with whether or not the table bought anything: only pays says that. "
        "Also per-layer injection ratio, gates and table health against random baselines.",
        "plelab diagnose runs/demo/ple          # the run's own eval data; the twin runs/demo/base found beside it\n"
        "  plelab diagnose runs/small-ple --twin runs/small-base --data data/prepared --json\n"
        "  plelab diagnose runs/small-ple/checkpoints/step_00002000 --data ../shared/data/valid\n"
        "  plelab diagnose --hf ~/models/gemma-3n-E2B-it --data ../shared/data/valid --layers 0,10,20",
        run,
    )
    p.add_argument("checkpoint", nargs="?", help="run directory (newest checkpoint) or checkpoint directory")
    p.add_argument("--hf", metavar="PATH", help="a local Hugging Face Gemma 3n / Gemma 4 folder instead "
                   "(config.json + safetensors + tokenizer.json; needs transformers; the PLE table stays on disk)")
    p.add_argument("--base", metavar="PATH", help="with --hf and --data: compare PLE use with this folder (default: "
                   "the base a merged fine-tune records in plelab_finetune.json, see plelab finetune --merge)")
    p.add_argument("--layers", type=_layer_list, help="with --hf: decoder layers to diagnose, e.g. 0,5,10 "
                   "(default all; each costs 3 ablation passes over the batches)")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], type=_precision,
                   help="with --hf: dtype of the in-memory model (default fp32; bf16 halves its RAM)")
    p.add_argument("--data", help="prepared dataset folder, folder of domain .txt files, or a .npy token array "
                   "(default: the run's recorded eval_data, else its training data's validation split; with none "
                   "found, only injection/gate statistics on random tokens and a provisional verdict)")
    p.add_argument("--twin", metavar="RUN", help="the run's dP = 0 twin (same data, seed, steps and config but "
                   "model.ple.dim = 0) for the pays verdict (default: found beside the run, e.g. the demo's base or "
                   "the same seed's dP = 0 run of a sweep); refused if it is not a twin")
    p.add_argument("--no-twin", action="store_true", help="do not look for a twin (pays: not measured)")
    p.add_argument("--batches", type=options.positive_int, default=8,
                   help="evaluation batches for ablation (default 8)")
    p.add_argument("--batch-size", type=options.positive_int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--seq-len", type=options.positive_int,
                   help="tokens per sequence (default: min(256, model context))")
    p.add_argument("--top-k", type=options.positive_int, default=None,
                   help="table rows (most frequent tokens) for table health")
    p.add_argument("--seed", type=options.nonneg_int, default=0, help="seed of the batch windows")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--early", action="store_true",
                   help="predict the final verdict from the run's logged trajectory (RUN_DIR/metrics.jsonl) by the "
                        "dead-zone-law study's early rule, with its measured accuracy; loads no model")


def _precision(text: str) -> str:
    """fp32 / bf16, the precision names training uses; the old float32 / bfloat16 are still accepted."""
    from plelab.util.device import OLD_PRECISION_NAMES

    return OLD_PRECISION_NAMES.get(text, text)


def _layer_list(text: str) -> list[int]:
    try:
        layers = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative layer indices, got {text!r}")
    return layers


def run(args: argparse.Namespace) -> int:
    """Diagnose (plelab.diagnostics.diagnose_run / plelab.hf.diagnose), print the report or its JSON."""
    if args.early:
        return run_early(args)
    from plelab.diagnostics.diagnose_run import format_report
    from plelab.errors import PlelabError

    if (args.hf is None) == (args.checkpoint is None):
        raise PlelabError("give either a run/checkpoint directory or --hf PATH (a Hugging Face folder)")
    if args.hf is not None and args.twin:
        raise PlelabError("--twin applies to plelab runs; for a Hugging Face folder use --base (PLE use before and "
                          "after a fine-tune)")
    common = dict(device=args.device, batches=args.batches, batch_size=args.batch_size, seq_len=args.seq_len,
                  top_k=args.top_k, seed=args.seed)
    if args.hf is not None:
        from plelab.hf.diagnose import diagnose_hf_folder

        if args.base and not args.data:
            raise PlelabError("--base compares PLE use by ablation on evaluation data: give --data too")
        if args.base and not Path(args.base).is_dir():
            raise PlelabError(f"--base {args.base}: no such folder (give the Hugging Face folder the fine-tune "
                              "started from)")
        base = finetune_base(args.hf, args.base) if args.data else None
        hf = dict(layers=args.layers, dtype=args.dtype, progress=_to_stderr, **common)
        if base:  # a merged fine-tune (plelab finetune --merge) against the folder it came from
            from plelab.hf.finetune.compare import diagnose_against_base

            report = diagnose_against_base(args.hf, args.data, base, **hf)
        else:
            report = diagnose_hf_folder(args.hf, args.data, **hf)
    else:
        if args.layers is not None:
            raise PlelabError("--layers applies to --hf checkpoints only")
        if args.twin and args.no_twin:
            raise PlelabError("--twin and --no-twin contradict each other: give one")
        from plelab.diagnostics.diagnose_run import diagnose_run

        report = diagnose_run(args.checkpoint, args.data, twin=args.twin, find=not args.no_twin, **common)
    if args.json:
        print_json(report)
    else:
        lines = [format_report(report)]
        if "finetune" in report:
            from plelab.hf.finetune.compare import format_comparison

            lines += format_comparison(report["finetune"], report["finetune"]["base"])
        print("\n".join(lines))
    return 0


def _to_stderr(line: str) -> None:
    """Progress of a long diagnosis, beside its result (stdout stays the report or its JSON)."""
    print(line, file=sys.stderr, flush=True)


def run_early(args: argparse.Namespace) -> int:
    """`--early`: the study's early rule (plelab/studies/law/deadzone_law.json) on a run's logged signals."""
    from plelab.diagnostics.early import format_prediction, predict_from_run
    from plelab.errors import PlelabError
    from plelab.studies.law.analysis import load_law

    if not args.checkpoint:
        raise PlelabError("--early wants a run directory with metrics.jsonl and config.json, got .")
    report = predict_from_run(Path(args.checkpoint or ""), (load_law() or {}).get("early_rule"))
    if args.json:
        print_json(report)
    else:
        print(format_prediction(report))
    return 0
