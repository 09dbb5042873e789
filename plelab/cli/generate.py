"""`plelab generate`: sample text from a checkpoint with a KV cache, streaming tokens as they come."""

from __future__ import annotations

import argparse
import sys

import torch

from plelab.cli.common import add_command


def add_parser(sub) -> None:
    """Register `plelab generate`."""
    p = add_command(
        sub, "generate", "Generate text from a run or checkpoint (KV cache, temperature / top-k / top-p, streaming).",
        'plelab generate runs/small-ple --prompt "Once upon a time" --max-new-tokens 100 --temperature 0.8 --top-k 50',
        run,
    )
    p.add_argument("checkpoint", help="run directory (newest checkpoint) or checkpoint directory")
    p.add_argument("--prompt", required=True, help="text to continue")
    p.add_argument("--max-new-tokens", type=int, default=100)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto")


def run(args: argparse.Namespace) -> int:
    """Stream a continuation of the prompt to stdout."""
    from plelab.errors import PlelabError
    from plelab.training.data_access import load_for_inference
    from plelab.training.trainer import pick_device

    device = pick_device(args.device)
    model, tokenizer = load_for_inference(args.checkpoint, device)
    ids = tokenizer.encode(args.prompt)
    if not ids:
        raise PlelabError("the prompt encodes to no tokens")
    room = model.config.max_seq_len - len(ids)
    if room <= 0:
        raise PlelabError(f"the prompt is {len(ids)} tokens; the model's context is {model.config.max_seq_len}")
    steps = min(args.max_new_tokens, room)
    gen = torch.Generator(device=device).manual_seed(args.seed)
    x = torch.tensor([ids], device=device)
    out: list[int] = []
    shown = ""
    sys.stdout.write(args.prompt)
    for tok in model.generate(x, steps, args.temperature, args.top_k, args.top_p, generator=gen):
        t = int(tok)
        if t == tokenizer.eot_id:
            break
        out.append(t)
        text = tokenizer.decode(out)
        # Byte-level BPE can end mid-character; print only once the text is stable.
        if not text.endswith("\ufffd"):
            sys.stdout.write(text[len(shown):])
            sys.stdout.flush()
            shown = text
    sys.stdout.write(tokenizer.decode(out)[len(shown):] + "\n")
    return 0
