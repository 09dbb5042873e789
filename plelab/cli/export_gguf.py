"""`plelab export-gguf`: a Gemma 4 model (plelab arch = "gemma4" run or Hugging Face folder) as a GGUF for llama.cpp."""

from __future__ import annotations

import argparse

from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab export-gguf`."""
    p = add_command(
        sub, "export-gguf",
        "Write a Gemma 4 model as a GGUF file for llama.cpp (and ollama, LM Studio): llama.cpp's tensor names, "
        "chosen types per tensor group, the model's own tokenizer.",
        "plelab export-gguf runs/gemma4-small gemma4-small.gguf --type q8_0\n"
        "  plelab export-gguf runs/gemma4-small g4-q4.gguf --type q4_0 --tensor-type ple_table=q8_0\n"
        "  plelab export-gguf --hf ~/models/gemma-4-E2B gemma-4-e2b-q4k.gguf --type q4_k "
        "--tensor-type 'blk\\.\\d+\\.proj'=q8_0\n"
        "Types: f32 f16 bf16 q8_0 q5_0 q5_1 q4_0 q4_1 (the gguf package) and q6_k q5_k q4_k q3_k q2_k iq4_nl iq4_xs\n"
        "(ggml's quantizer, from llama-cpp-python). 1-D tensors (norms, scalars) stay f32. Groups for --tensor-type:\n"
        "ple_table ple_context ple_projection ple_gate attention ffn embedding; any other PATTERN is a regular\n"
        "expression on llama.cpp's tensor names (blk.3.ffn_down.weight).",
        run,
    )
    p.add_argument("source", nargs="?", help="run directory (its newest intact checkpoint) or a checkpoint folder")
    p.add_argument("out", nargs="?", help="GGUF file to write")
    p.add_argument("--hf", metavar="PATH", help="read a Hugging Face Gemma 4 folder instead of a run (streamed)")
    p.add_argument("--type", default="f16", help="type of every matrix (default f16)")
    p.add_argument("--tensor-type", action="append", default=[], metavar="PATTERN=TYPE",
                   help="type of a group or of tensors whose llama.cpp name matches PATTERN (repeatable; last wins)")
    p.add_argument("--strict-types", action="store_true",
                   help="refuse a type whose blocks do not divide a tensor's rows, instead of falling back for that "
                   "tensor as llama.cpp's quantizer does (k-quants to q5_0 / q5_1 / q8_0 / iq4_nl, then f16)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing OUT file")
    p.add_argument("--json", action="store_true", help="print what was written as JSON")


def run(args: argparse.Namespace) -> int:
    """Export and print what was written."""
    from plelab.hf.gguf_export import GGUFExportError, export_gguf

    if args.hf:
        if args.out is not None:
            raise GGUFExportError("with --hf PATH give only OUT.gguf (plelab export-gguf --hf PATH OUT.gguf)")
        source, out = args.hf, args.source
    else:
        source, out = args.source, args.out
    if source is None or out is None:
        raise GGUFExportError("give RUN OUT.gguf, or --hf PATH OUT.gguf")
    result = export_gguf(source, out, args.type, args.tensor_type, hf=bool(args.hf), overwrite=args.overwrite,
                         strict=args.strict_types)
    if args.json:
        print_json(result.to_json())
        return 0
    for f in result.fallbacks:
        print(f"{f['tensor']}: rows of {f['row']} values do not divide into {f['wanted']}'s blocks; written as "
              f"{f['used']}")
    types = ", ".join(f"{n} {k}" for k, n in sorted(result.types.items()))
    fell = f"; {len(result.fallbacks)} fell back (--strict-types refuses instead)" if result.fallbacks else ""
    print(f"wrote {result.path}: {result.file_bytes:,} bytes, {result.tensors} tensors ({types}){fell}")
    return 0
