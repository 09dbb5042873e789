"""`plelab quant-recipe`: per-group quantization sensitivity of a PLE model and a budgeted per-group recipe."""

from __future__ import annotations

import argparse
import sys

from plelab.cli import options
from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab quant-recipe`."""
    p = add_command(
        sub, "quant-recipe",
        "Measure how much each tensor group (PLE table, PLE projections, gates, context projection, attention, "
        "FFN, embedding) suffers in each format (.ple int8/int4 and GGUF types), then choose a format per group "
        "for a byte budget, measure the choice, and export it as .ple and GGUF.",
        "plelab quant-recipe runs/gemma4-small --eval ../shared/data/valid --out recipe-small\n"
        "  plelab quant-recipe --hf ~/models/gemma-3n-E2B --eval ../shared/data/valid --out recipe-e2b "
        "--tokens 1024 --gguf-budget q4_k\n"
        "Budgets are a size (12M, 3.5GB: all weights) or a format name (the bytes that format takes on every "
        "group).\nAn interrupted run resumes from OUT/measurements.json.",
        run,
    )
    p.add_argument("source", nargs="?", help="plelab run directory or checkpoint folder")
    p.add_argument("--hf", metavar="PATH", help="a Hugging Face Gemma 3n / Gemma 4 folder instead of a run")
    p.add_argument("--eval", required=True, help="held-out text: a folder of .txt domains, one .txt, or a .npy of ids")
    p.add_argument("--out", required=True, help="folder for recipe.json, the report, recipe.ple and recipe.gguf")
    p.add_argument("--budget", default="int4/32", help=".ple budget (default int4/32: uniform int4/32's bytes)")
    p.add_argument("--gguf-budget", default="q4_0", help="GGUF budget (default q4_0: uniform q4_0's bytes)")
    p.add_argument("--formats", help="comma-separated formats to measure (default: fp16,int8/32,int8/128,int4/32,"
                                     "int4/128,f16,q8_0,q6_k,q5_k,q4_k,q4_0,q3_k,q2_k)")
    p.add_argument("--tokens", type=options.positive_int, default=2048, help="held-out tokens per domain (2048)")
    p.add_argument("--seq-len", type=options.positive_int,
                   help="window length (default 128, or the model's context when shorter)")
    p.add_argument("--batch-size", type=options.positive_int, default=8, help="windows per forward pass (8)")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda")
    p.add_argument("--no-export", action="store_true", help="measure and choose only")
    p.add_argument("--overwrite", action="store_true", help="replace a finished recipe in OUT")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """Measure, choose, export; print the recipes."""
    from plelab.hf.quant_recipe import RecipeError
    from plelab.hf.recipe_report import recipe_rows
    from plelab.hf.recipe_run import run_recipe
    from plelab.util.device import pick_device

    if (args.source is None) == (args.hf is None):
        raise RecipeError("give a run directory or --hf PATH (one of them)")
    formats = [f for f in args.formats.split(",") if f.strip()] if args.formats else None
    quiet = args.json or not sys.stderr.isatty()
    result = run_recipe(
        args.hf or args.source, args.eval, args.out, hf=bool(args.hf), formats=formats,
        budgets={"ple": args.budget, "gguf": args.gguf_budget}, tokens=args.tokens, seq_len=args.seq_len,
        batch=args.batch_size, overwrite=args.overwrite, export=not args.no_export, device=pick_device(args.device),
        progress=None if quiet else lambda what: print(f"measuring {what}", file=sys.stderr, flush=True),
    )
    if args.json:
        print_json(result)
        return 0
    from plelab.util.tables import text_table

    headers, rows = recipe_rows(result)
    print(text_table(headers, rows))
    for f in result["files"].values():
        print(f"wrote {f['path']} ({f['file_bytes']:,} bytes)")
    print(f"report: {args.out}/report.html")
    return 0
