"""`plelab data`: train tokenizers, prepare token shards, inspect datasets, tokenize evaluation domains."""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from plelab.cli import options
from plelab.cli.common import add_command, print_json
from plelab.data.loader import is_prepared_dataset
from plelab.data.prepare import (
    DEFAULT_SHARD_TOKENS,
    DEFAULT_TOKENIZER_SAMPLE,
    MAX_SHARDS,
    load_eval_domains,
    prepare_dataset,
    resolve_tokenizer,
    train_tokenizer,
)
from plelab.data.sources import KINDS, DataError, SourceOptions, resolve_sources
from plelab.data.tokenizer import KINDS as TOKENIZER_KINDS
from plelab.data.tokenizer import Tokenizer
from plelab.util.fs import check_output_path
from plelab.util.units import parse_size


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever sys.stderr is at the time (it may be swapped, e.g. by test capture)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def _setup_logging() -> None:
    logger = logging.getLogger("plelab.data")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("plelab data: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def _add_source_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--format", default="auto", choices=("auto", *KINDS),
                   help="input type; auto = by suffix (.txt/.md/.rst text, .jsonl/.json JSON Lines, .parquet, "
                        ".gz for text/JSONL) and datasets save_to_disk folders")
    p.add_argument("--text-field", default="text", help="JSONL key / parquet or datasets column holding the text")
    p.add_argument("--hf-split", help="split of a DatasetDict folder (default: train)")


def _options(args: argparse.Namespace) -> SourceOptions:
    return SourceOptions(format=args.format, text_field=args.text_field, hf_split=args.hf_split)


def add_parser(sub) -> None:
    """Register `plelab data` and its subcommands."""
    p = add_command(
        sub, "data", "Tokenizers and token datasets: train a tokenizer, prepare shards, inspect, eval domains.",
        "plelab data prepare ../shared/data/train --tokenizer tok8k.json --vocab-size 8192 --out /tmp/plelab-data\n"
        "  plelab data tokenizer ../shared/data/train --vocab-size 8192 --out tok8k.json\n"
        "  plelab data info /tmp/plelab-data\n"
        "  plelab data eval-domains ../shared/data/valid --tokenizer /tmp/plelab-data/tokenizer.json\n"
        "  plelab data id-map /tmp/plelab-data/tokenizer.json --out runs/idmap.json",
        lambda args: (p.print_help(), 1)[1],
    )
    dsub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")

    pp = add_command(
        dsub, "prepare",
        "Tokenize text files, folders, JSONL, parquet or datasets folders into train/val token shards + manifest.",
        "plelab data prepare ../shared/data/train --tokenizer tok8k.json --vocab-size 8192 --out /tmp/plelab-data\n"
        "  plelab data prepare notes/ more.jsonl --text-field content --tokenizer byte --out data/mine\n"
        "  plelab data prepare corpus.parquet --tokenizer /tmp/plelab-data/tokenizer.json --out data/pq --overwrite\n"
        "A --tokenizer file that does not exist is trained on the inputs first when --vocab-size is given.\n"
        f"Each split is written as at most {MAX_SHARDS} shard files of --shard-tokens tokens.",
        run_prepare,
    )
    pp.add_argument("inputs", nargs="+", metavar="INPUT", help="files or folders")
    pp.add_argument("--tokenizer", required=True,
                    help="tokenizer.json (or a folder with one); 'byte' = plain byte tokenizer")
    pp.add_argument("--out", required=True, help="dataset folder to create")
    pp.add_argument("--vocab-size", type=options.positive_int,
                    help="train a BPE of this size if --tokenizer does not exist")
    pp.add_argument("--tokenizer-kind", choices=TOKENIZER_KINDS,
                    help="kind of BPE trained when --tokenizer does not exist: byte-level (default) or gemma "
                         "(Gemma's tokenizer.json form; needed to convert the model with llama.cpp); an existing "
                         "--tokenizer of another kind is refused")
    pp.add_argument("--tokenizer-max-bytes", default="20M",
                    help="text sampled evenly across inputs to train the tokenizer (default 20M; 'all')")
    pp.add_argument("--val-fraction", type=options.fraction, default=0.005,
                    help="share of documents held out (default 0.005)")
    pp.add_argument("--seed", type=options.nonneg_int, default=0, help="seed of the train/val split hash (default 0)")
    pp.add_argument("--shard-tokens", type=options.positive_int, default=DEFAULT_SHARD_TOKENS,
                    help="tokens per shard file")
    pp.add_argument("--overwrite", action="store_true", help="replace an existing prepared dataset at --out")
    pp.add_argument("--no-progress", action="store_true", help="no progress bar")
    pp.add_argument("--json", action="store_true", help="print the manifest as JSON")
    _add_source_flags(pp)

    pt = add_command(
        dsub, "tokenizer", "Train a BPE tokenizer, byte-level or Gemma-style (a tokenizer.json transformers loads).",
        "plelab data tokenizer ../shared/data/train --vocab-size 8192 --out tok8k.json\n"
        "  plelab data tokenizer ../shared/data/train --kind gemma --vocab-size 8192 --out gemma8k.json\n"
        "  plelab data tokenizer docs/ --vocab-size 4096 --max-bytes all --out tok4k.json\n"
        "  plelab data tokenizer --byte --out byte.json",
        run_tokenizer,
    )
    pt.add_argument("inputs", nargs="*", metavar="INPUT", help="files or folders to train on")
    pt.add_argument("--vocab-size", type=options.positive_int, help="vocabulary size including the special tokens")
    pt.add_argument("--out", required=True, help="tokenizer.json to write (a folder gets OUT/tokenizer.json)")
    pt.add_argument("--overwrite", action="store_true", help="replace an existing file at --out")
    pt.add_argument("--max-bytes", default=f"{DEFAULT_TOKENIZER_SAMPLE // 1_000_000}M",
                    help="sample at most this much text, evenly across inputs (default 20M; 'all')")
    pt.add_argument("--kind", choices=TOKENIZER_KINDS, default="byte-level",
                    help="byte-level (default): GPT-2 style bytes; gemma: Gemma's tokenizer.json form (characters "
                         "with byte fallback, spaces as U+2581), the one llama.cpp's Gemma 4 converter reads")
    pt.add_argument("--byte", action="store_true", help="write the plain byte tokenizer (no training)")
    pt.add_argument("--json", action="store_true", help="machine-readable output")
    _add_source_flags(pt)

    pi = add_command(dsub, "info", "Summarise a prepared dataset (splits, tokens, sources, tokenizer).",
                     "plelab data info /tmp/plelab-data --sample 40", run_info)
    pi.add_argument("dataset", help="prepared dataset folder")
    pi.add_argument("--sample", type=options.nonneg_int, default=0, metavar="N",
                    help="also decode the first N val/train tokens")
    pi.add_argument("--verify", action="store_true", help="check shard checksums and token ranges (reads all)")
    pi.add_argument("--json", action="store_true", help="print the manifest as JSON")

    pm = add_command(
        dsub, "id-map",
        "Map token ids to compressed ids for an n-gram PLE table (ple.ngram.id_map): ids that decode to one word up to "
        "case, accents and whitespace share an id.",
        "plelab data id-map /tmp/plelab-data/tokenizer.json --out runs/idmap.json\n"
        "  plelab train configs/ngram-small.toml --out runs/ng --set model.ple.ngram.id_map=runs/idmap.json",
        run_id_map,
    )
    pm.add_argument("tokenizer", help="tokenizer.json or a prepared dataset / run folder holding one")
    pm.add_argument("--out", required=True, help="the id-map JSON file to write")
    pm.add_argument("--overwrite", action="store_true", help="replace an existing file at --out")
    pm.add_argument("--json", action="store_true", help="machine-readable summary")

    pe = add_command(
        dsub, "eval-domains", "Tokenize evaluation domains (one per *.txt): tokens, bytes, bytes per token.",
        "plelab data eval-domains ../shared/data/valid --tokenizer /tmp/plelab-data/tokenizer.json --cache /tmp/ev",
        run_eval_domains,
    )
    pe.add_argument("valid_dir", help="folder of domain .txt files (or one file)")
    pe.add_argument("--tokenizer", required=True, help="tokenizer.json or folder; 'byte' = byte tokenizer")
    pe.add_argument("--cache", help="cache folder for tokenized domains")
    pe.add_argument("--json", action="store_true", help="machine-readable output")


def run_prepare(args: argparse.Namespace) -> int:
    """Prepare a dataset, training the tokenizer first if asked."""
    _setup_logging()
    opts = _options(args)
    progress = not args.no_progress and sys.stderr.isatty()
    tok = resolve_tokenizer(args.tokenizer, args.inputs, vocab_size=args.vocab_size,
                            max_bytes=parse_size(args.tokenizer_max_bytes), options=opts, show_progress=progress,
                            kind=args.tokenizer_kind)
    m = prepare_dataset(args.inputs, tok, args.out, val_fraction=args.val_fraction, seed=args.seed, options=opts,
                        shard_tokens=args.shard_tokens, overwrite=args.overwrite, progress=progress)
    if args.json:
        print_json(m)
        return 0
    tr, va = m["splits"]["train"], m["splits"]["val"]
    print(f"{args.out}: train {tr['tokens']:,} tokens / {tr['documents']:,} docs / {tr['bytes']:,} bytes; "
          f"val {va['tokens']:,} tokens / {va['documents']:,} docs; {m['dtype']}, vocab {tok.vocab_size:,}")
    print(f"  {m['elapsed_s']:.1f} s, {m['tokens_per_s']:,} tokens/s, "
          f"{(tr['bytes'] + va['bytes']) / max(tr['tokens'] + va['tokens'], 1):.2f} bytes/token, "
          f"tokenizer {tok.sha256[:12]}")
    return 0


def run_tokenizer(args: argparse.Namespace) -> int:
    """Train (or write the byte) tokenizer and save it."""
    _setup_logging()
    t0 = time.perf_counter()
    if not args.byte and args.vocab_size is None:
        raise DataError("--vocab-size is required (or --byte for the byte tokenizer)")
    if not args.byte and not args.inputs:
        raise DataError("no inputs to train on")
    sources = [] if args.byte else resolve_sources(list(args.inputs), _options(args))
    out = Path(args.out) / "tokenizer.json" if Path(args.out).is_dir() else Path(args.out)
    # Checked before training (minutes): never a corpus file, never inside a corpus folder (a .json there would be
    # read as corpus text next time), never an existing file without --overwrite.
    check_output_path(out, overwrite=args.overwrite, inputs=(*args.inputs, *(s.path for s in sources)))
    if is_prepared_dataset(out.parent):  # its shards' ids mean what the tokenizer there says
        raise DataError(f"output {out} is in the prepared dataset {out.parent}, whose tokenizer is the one its "
                        "tokens were made with; write the new tokenizer elsewhere (and prepare data with it)")
    if args.byte:
        tok = Tokenizer.byte_level()
    else:
        tok = train_tokenizer(sources, args.vocab_size, max_bytes=parse_size(args.max_bytes),
                              options=_options(args), show_progress=sys.stderr.isatty(), kind=args.kind)
    path = tok.save(out)
    info = {"path": str(path), "vocab_size": tok.vocab_size, "eot_id": tok.eot_id, "pad_id": tok.pad_id,
            "kind": tok.kind, "sha256": tok.sha256, "seconds": round(time.perf_counter() - t0, 2)}
    if args.json:
        print_json(info)
    else:
        print(f"{path}: vocab {tok.vocab_size:,} (eot {tok.eot_id}, pad {tok.pad_id}), sha256 {tok.sha256[:12]}, "
              f"{info['seconds']:.1f} s")
    return 0


def run_info(args: argparse.Namespace) -> int:
    """Print a dataset summary."""
    from plelab.data.loader import TokenDataset, read_manifest

    m = read_manifest(args.dataset)
    if args.verify:
        for split, info in m["splits"].items():
            if info["tokens"]:
                TokenDataset(args.dataset, split).verify()
    if args.json:
        print_json(m)
        return 0
    t = m["tokenizer"]
    print(f"{args.dataset}: {m['format']}, {m['dtype']}, tokenizer vocab {t['vocab_size']:,} "
          f"sha256 {t['sha256'][:12]}, created {m['created']}")
    for split, info in m["splits"].items():
        print(f"  {split:<5} {info['tokens']:>14,} tokens {info['documents']:>9,} docs {info['bytes']:>14,} bytes "
              f"{len(info['shards'])} shard(s)")
    for s in m["sources"]:
        extra = f", {s['replaced_utf8_sequences']} bad UTF-8 replaced" if s["replaced_utf8_sequences"] else ""
        print(f"  source {s['path']} ({s['kind']}, {s['documents']:,} docs, sha256 {s['sha256'][:12]}{extra})")
    if args.verify:
        print("  verified: shard checksums and token ranges match the manifest")
    if args.sample:
        split = "val" if m["splits"]["val"]["tokens"] else "train"
        ds = TokenDataset(args.dataset, split)
        tok = Tokenizer.load(ds.tokenizer_path)
        print(f"  first {args.sample} {split} tokens: {tok.decode(ds.get(0, min(args.sample, len(ds))))!r}")
    return 0


def run_eval_domains(args: argparse.Namespace) -> int:
    """Tokenize the domains and print their sizes."""
    _setup_logging()
    tok = resolve_tokenizer(args.tokenizer)
    doms = load_eval_domains(args.valid_dir, tok, args.cache)
    rows = {n: {"documents": d.n_docs, "tokens": len(d.tokens), "bytes": d.n_bytes,
                "bytes_per_token": round(d.n_bytes / max(d.n_targets, 1), 3)} for n, d in doms.items()}
    if args.json:
        print_json({"tokenizer": tok.sha256, "domains": rows})
        return 0
    print(f"{'domain':<22} {'docs':>7} {'tokens':>10} {'bytes':>11} {'bytes/tok':>9}")
    for n, r in rows.items():
        print(f"{n:<22} {r['documents']:>7,} {r['tokens']:>10,} {r['bytes']:>11,} {r['bytes_per_token']:>9.2f}")
    return 0


def run_id_map(args: argparse.Namespace) -> int:
    """Build the id compression map of a tokenizer and write it (plelab.model.ngram.build_id_map)."""
    import json
    from collections import Counter

    from plelab.model.ngram import build_id_map, id_map_document
    from plelab.util.fs import atomic_write_bytes

    out = check_output_path(args.out, overwrite=args.overwrite)
    tok = resolve_tokenizer(args.tokenizer)
    ids = build_id_map(tok.vocab_size, lambda i: tok.decode([i]))
    atomic_write_bytes(out, json.dumps(id_map_document(ids, tok.sha256)).encode())
    groups = [g for g, n in Counter(ids).most_common() if n > 1]
    examples = [[tok.decode([t]) for t in range(tok.vocab_size) if ids[t] == g] for g in groups[:3]]
    info = {"path": str(out), "vocab_size": tok.vocab_size, "num_ids": max(ids) + 1,
            "merged_ids": tok.vocab_size - (max(ids) + 1), "tokenizer_sha256": tok.sha256, "examples": examples}
    if args.json:
        print_json(info)
        return 0
    print(f"{out}: {tok.vocab_size:,} token ids -> {info['num_ids']:,} compressed ids "
          f"({100 * info['merged_ids'] / tok.vocab_size:.1f} % fewer); e.g. "
          + "; ".join(" = ".join(repr(t) for t in group[:4]) for group in examples))
    return 0
