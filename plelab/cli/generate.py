"""`plelab generate`: sample text from a checkpoint with a KV cache, streaming tokens as they come."""

from __future__ import annotations

import argparse
import sys

from plelab.cli import options
from plelab.cli.common import add_command, utf8_text


def add_parser(sub) -> None:
    """Register `plelab generate`."""
    p = add_command(
        sub, "generate", "Generate text from a run or checkpoint (KV cache, temperature / top-k / top-p, streaming).",
        'plelab generate runs/small-ple --prompt "Once upon a time" --max-new-tokens 100 --temperature 0.8 --top-k 50',
        run,
    )
    p.add_argument("checkpoint", help="run directory (newest checkpoint) or checkpoint directory")
    p.add_argument("--prompt", required=True, type=utf8_text, help="text to continue")
    p.add_argument("--max-new-tokens", type=options.positive_int, default=100, help="tokens to generate (default 100)")
    options.add_sampling_flags(p)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps, ...")


def run(args: argparse.Namespace) -> int:
    """Stream a continuation of the prompt to stdout; one line on stderr when the context cuts the request."""
    from plelab.inference.generate import fit_context, generate, stream_text
    from plelab.inference.load import load_for_inference
    from plelab.util.device import pick_device

    model, tokenizer = load_for_inference(args.checkpoint, pick_device(args.device))
    fit = fit_context(tokenizer.encode(args.prompt), args.max_new_tokens, model.config.max_seq_len)
    if fit.note:
        print(f"plelab generate: {fit.note}", file=sys.stderr)
    sys.stdout.write(args.prompt)
    ids = generate(model, fit.prompt, fit.max_new_tokens, options.sampling(args), stop_id=tokenizer.eot_id)
    for piece in stream_text(ids, tokenizer.decode):
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0
