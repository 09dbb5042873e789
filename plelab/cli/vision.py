"""`plelab vision`: the visual PLE lab (SPEC §4); `prepare` tokenizes an image set into a captioned corpus."""

from __future__ import annotations

import argparse
import sys

from plelab.cli import options
from plelab.cli.common import add_command, print_json
from plelab.vision.config import MAX_CODEBOOK

# The choices, kept here so `--help` and argument errors need neither torch nor the tokenizer libraries;
# tests/cli/test_vision_cli.py checks they equal plelab.vision.tokenizers.TOKENIZERS.
TOKENIZER_CHOICES = ("vqvae", "lfq", "bsq", "dct-kmeans", "features-kmeans", "random")


def _progress(message: str) -> None:
    print(f"plelab vision: {message}", file=sys.stderr, flush=True)


def _fmt(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def run_prepare(args: argparse.Namespace) -> int:
    """Prepare the corpus, then print a summary (or the manifest with --json)."""
    from plelab.vision.corpus import prepare_corpus

    manifest = prepare_corpus(args.images, args.tokenizer, args.codebook, args.out, patch_size=args.patch_size,
                              seed=args.seed, heldout=args.heldout, overwrite=args.overwrite,
                              progress=_progress, reuse_tokenizer=args.reuse_tokenizer)
    if args.json:
        print_json(manifest)
        return 0
    r, s = manifest["codebook_report"], manifest["splits"]
    h, w = manifest["image_shape"]
    print(f"wrote {args.out}: {s['train']['n']} train + {s['valid']['n']} valid images of {h}x{w}, "
          f"{manifest['patches_per_image']} patches of {args.patch_size}x{args.patch_size}")
    print(f"visual tokenizer: {manifest['tokenizer_kind']}, K = {manifest['codebook']}")
    print(f"captions: vocab {manifest['caption_vocab_size']}, up to {manifest['caption_length']} tokens")
    print(f"codebook on the held-out split: usage perplexity {_fmt(r.get('usage_perplexity'), '.1f')}, "
          f"codes used {_fmt(r.get('codes_used_fraction'))}, "
          f"reconstruction MSE {_fmt(r.get('reconstruction_mse'), '.4f')}")
    print(f"MI(patch id; digit) = {_fmt(r.get('mi_bits'))} bits (shuffled-label floor "
          f"{_fmt(r.get('mi_bits_random'))}); per patch position {_fmt(r.get('mi_bits_per_position'))} "
          f"(floor {_fmt(r.get('mi_bits_per_position_random'))})")
    return 0


def run_diagnose(args: argparse.Namespace) -> int:
    """Diagnose a vision run's visual table, then print a summary (or everything with --json)."""
    from plelab.util.json_values import jsonable
    from plelab.vision.diagnostics import diagnose_run, format_diagnosis

    result = diagnose_run(args.run, corpus=args.corpus, batch_size=args.batch_size)
    if args.json:
        print_json(jsonable(result))
    else:
        print(format_diagnosis(result))
    return 0


def add_parser(sub) -> None:
    """Register `plelab vision` and its subcommands."""
    p = add_command(
        sub, "vision", "Visual PLE lab: tokenize images into captioned corpora for multimodal PLE models.",
        "plelab vision prepare --images ../shared/data/images/mnist --tokenizer dct-kmeans --codebook 256 "
        "--out /tmp/mnist-dct",
        lambda args: (p.print_help(), 1)[1],
    )
    vsub = p.add_subparsers(dest="vision_command", metavar="SUBCOMMAND")
    pp = add_command(
        vsub, "prepare",
        "Fit a visual tokenizer on the training images, caption every image from its label and measured "
        "properties, and write patches, patch ids, caption ids and a manifest.",
        "plelab vision prepare --images ../shared/data/images/mnist --tokenizer dct-kmeans --codebook 256 "
        "--out /tmp/mnist-dct\n"
        "  plelab vision prepare --images ../shared/data/images/sklearn_digits --tokenizer random --codebook 64 "
        "--patch-size 4 --heldout 297 --out /tmp/digits-random --json\n"
        "The last --heldout images are the valid split; only the training split fits the tokenizers.",
        run_prepare,
    )
    pp.add_argument("--images", required=True,
                    help="image set: MNIST idx (.gz), scikit-learn digits csv(.gz), .npz, or a folder holding one")
    pp.add_argument("--tokenizer", required=True, choices=TOKENIZER_CHOICES, help="visual tokenizer kind")
    pp.add_argument("--codebook", required=True, type=options.int_in_range(2, MAX_CODEBOOK), metavar="K",
                    help=f"codebook size K (patch ids in [0, K)), at most {MAX_CODEBOOK}")
    pp.add_argument("--out", required=True, help="corpus folder to create")
    pp.add_argument("--patch-size", type=options.positive_int, default=7,
                    help="square patch side in pixels; must divide the image size (default 7)")
    pp.add_argument("--seed", type=options.nonneg_int, default=0, help="tokenizer and caption seed (default 0)")
    pp.add_argument("--heldout", type=options.positive_int, default=1000,
                    help="the last N images form the valid split (default 1000)")
    pp.add_argument("--reuse-tokenizer", metavar="DIR",
                    help="encode with this saved visual tokenizer (or a corpus folder's) instead of fitting one; "
                         "it must match --tokenizer, --codebook and --patch-size")
    pp.add_argument("--overwrite", action="store_true", help="replace an existing corpus at --out")
    pp.add_argument("--json", action="store_true", help="print the manifest as JSON on stdout")
    pd = add_command(
        vsub, "diagnose",
        "The visual PLE table of a vision run's latest checkpoint: mean |cos|, effective rank and PC1 variance beside "
        "a random table of the same shape, caption-loss ablation, injection ratio at patches, verdict "
        "(rules: docs/visual-ple-study.md).",
        "plelab vision diagnose runs/visual-ple-study/runs/variant=fix-aux1,seed=1\n"
        "  plelab vision diagnose RUN_DIR --corpus data/vision/mnist-dct-kmeans-k256 --json",
        run_diagnose,
    )
    pd.add_argument("run", help="vision run folder or one of its checkpoints")
    pd.add_argument("--corpus", help="prepared corpus whose held-out split to use (default: the run's vision.corpus)")
    pd.add_argument("--batch-size", type=options.positive_int, default=100,
                    help="held-out images per batch (the ablation's s.e. is over batches; default 100)")
    pd.add_argument("--json", action="store_true", help="print every statistic as JSON on stdout")
