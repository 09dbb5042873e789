"""`plelab eval`: per-domain loss and bits per byte of a checkpoint on a folder of domain files."""

from __future__ import annotations

import argparse

from plelab.cli import options
from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab eval`."""
    p = add_command(
        sub, "eval", "Evaluate a run or checkpoint: loss (nats/token) and bits per byte per domain, macro average.",
        "plelab eval runs/small-ple --data ../shared/data/valid --json",
        run,
    )
    p.add_argument("checkpoint", help="run directory (newest checkpoint) or checkpoint directory")
    p.add_argument("--data", required=True, help="folder of <domain>.txt files, or one .txt file")
    p.add_argument("--max-tokens", type=options.positive_int, default=None, help="cap tokens per domain (default: all)")
    p.add_argument("--sample", choices=("spread", "head", "all"), default="spread",
                   help="with --max-tokens: windows spread evenly over each domain (default), its first documents, "
                        "or every token")
    p.add_argument("--batch-size", type=options.positive_int, default=8, help="sequences per forward pass")
    p.add_argument("--seq-len", type=options.positive_int, help="window length (default: the model's max_seq_len)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, ...")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    """Load, evaluate, print."""
    from plelab.data.prepare import load_eval_domains
    from plelab.inference.evaluate import check_seq_len, evaluate_domains
    from plelab.inference.load import load_for_inference
    from plelab.util.device import pick_device

    device = pick_device(args.device)
    model, tokenizer = load_for_inference(args.checkpoint, device)
    domains = load_eval_domains(args.data, tokenizer)
    seq_len = check_seq_len(args.seq_len or 0, model.config.max_seq_len)
    results = evaluate_domains(model, domains, seq_len, args.batch_size, args.max_tokens, sample=args.sample)
    results["checkpoint"] = str(model.checkpoint_dir)
    if args.json:
        print_json(results)
        return 0
    print(f"{'domain':<22} {'loss':>8} {'± s.e.':>8} {'bpb':>8} {'tokens':>10}")
    for name, r in results["domains"].items():
        print(f"{name:<22} {r['loss']:>8.4f} {r['loss_se']:>8.4f} {r['bpb']:>8.4f} {r['tokens']:>10,}")
    print(f"{'macro':<22} {results['macro']['loss']:>8.4f} {results['macro']['bpb']:>8.4f}")
    return 0
