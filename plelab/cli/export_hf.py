"""`plelab export-hf`: a trained arch = "gemma4" run as a Hugging Face folder (transformers loads it as Gemma 4)."""

from __future__ import annotations

import argparse

from plelab.cli.common import add_command


def add_parser(sub) -> None:
    """Register `plelab export-hf`."""
    p = add_command(
        sub, "export-hf",
        "Write a run trained with model.arch=gemma4 as a Hugging Face Gemma 4 folder (needs transformers).",
        "plelab export-hf runs/gemma4-small hf/gemma4-small\n"
        "  python convert_hf_to_gguf.py hf/gemma4-small --outtype f16   # llama.cpp's converter\n"
        "  python -c \"from transformers import AutoModelForCausalLM as M; M.from_pretrained('hf/gemma4-small')\"",
        run,
    )
    p.add_argument("run", help="run directory (its newest intact checkpoint) or a checkpoint folder")
    p.add_argument("out", help="folder to write: config.json, model.safetensors, tokenizer files")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT folder")
    p.add_argument("--transformers-only", action="store_true",
                   help="allow a run whose tokenizer is not Gemma-style (byte-level): the folder then loads in "
                        "transformers but llama.cpp's converter cannot read it (plelab export-gguf can)")


def run(args: argparse.Namespace) -> int:
    """Export and print where the folder went."""
    from plelab.hf.run_export import export_hf

    out = export_hf(args.run, args.out, overwrite=args.overwrite, transformers_only=args.transformers_only)
    print(f"wrote {out} (load with transformers.AutoModelForCausalLM.from_pretrained)")
    return 0
