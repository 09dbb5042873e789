"""`plelab export`, `plelab place`, `plelab run`: ship a PLE model to a device, place it in its memory, run it.

The three commands live in one module (they share the .ple file and the device profiles); main.py lists
each name, and `add_parser` registers whichever of them is not registered yet.
"""

from __future__ import annotations

import argparse
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

from plelab.cli import options
from plelab.cli.common import add_command, add_set_flag, print_json, utf8_text
from plelab.edge.format import MAX_ALIGN
from plelab.edge.mcu import DEFAULT_DEVICE as DEFAULT_MCU_DEVICE
from plelab.errors import PlelabError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register `export`, `place` (also under its former name, `plan`) and `run` (each once, however often this is
    called)."""
    for name, register in (("export", _add_export), ("place", _add_place), ("run", _add_run)):
        if name not in sub.choices:
            register(sub)


def _add_export(sub) -> None:

    p = add_command(
        sub, "export", "Export a checkpoint (or a preset, with random weights) to a .ple file for the edge runtime.",
        "plelab export runs/esp32 --quant int4 --group 128 --out esp32.ple\n"
        "  plelab export esp32-28m --quant int4 --out esp32-random.ple      # size a model before training it\n"
        "  plelab export --hf ~/models/gemma-3n-E2B-it --quant int4 --group 128 --out e2b-ple.ple  # its PLE table",
        run_export,
    )
    p.add_argument("source", nargs="?",
                   help="checkpoint or run directory (trained weights), or a preset / config file (random)")
    p.add_argument("--hf", metavar="PATH", help="a Hugging Face Gemma 3n / Gemma 4 folder instead: its PLE table "
                   "and main embedding, streamed from the safetensors (a table-only file: the core is not exported)")
    p.add_argument("--out", required=True, help="output .ple file (written atomically)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file (never an input)")
    _add_layout_flags(p)
    p.add_argument("--no-scale-search", action="store_true", help="plain absmax scales (faster, slightly worse)")
    p.add_argument("--no-tokenizer", action="store_true", help="do not embed the checkpoint's tokenizer.json")
    p.add_argument("--seed", type=options.nonneg_int, default=0,
                   help="seed of the random weights of a preset (default 0)")
    p.add_argument("--json", action="store_true", help="machine-readable summary")
    add_set_flag(p)


# Layout flags default to None (= ExportOptions' default) so `place` can tell which ones were given.
LAYOUT_FLAGS = {"quant": "--quant", "group": "--group", "embed_in_record": "--embed-in-record",
                "align": "--align", "page": "--page"}


def _add_layout_flags(p: argparse.ArgumentParser) -> None:
    from plelab.edge.quant import EXPORT_QUANTS  # NumPy only: `plelab run --engine c` stays free of torch

    p.add_argument("--quant", choices=EXPORT_QUANTS,
                   help="encoding of matrices and tables (default int4; vectors stay fp16/fp32)")
    p.add_argument("--group", type=options.positive_int, help="values per fp16 scale for int8/int4 (default 128)")
    p.add_argument("--embed-in-record", action="store_true", default=None,
                   help="store each token's embedding row inside its PLE record (one read per token; "
                        "a tied head then stores the embedding twice)")
    p.add_argument("--align", type=options.int_in_range(1, MAX_ALIGN),
                   help=f"PLE record stride multiple in bytes, at most {MAX_ALIGN} (default 1: packed)")
    p.add_argument("--page", type=options.nonneg_int,
                   help="flash page size: no PLE record straddles a page (default 0: none)")


def _options(args: argparse.Namespace):
    from plelab.edge.export import ExportOptions

    given = {k: getattr(args, k) for k in LAYOUT_FLAGS if getattr(args, k) is not None}
    return ExportOptions(**given, scale_search=not getattr(args, "no_scale_search", False))


def _layout_summary(layout) -> dict:
    ple = layout.table("ple")
    return {
        "file_bytes": layout.file_bytes,
        "quant": layout.quant,
        "sections": {s.name: {"offset": s.offset, "bytes": s.nbytes} for s in layout.sections},
        "ple_record_bytes": ple.record_bytes if ple else 0,
        "ple_record_stride": ple.stride if ple else 0,
        "ple_records_per_token": layout.ple_reads if ple else 0,
        "format_version": layout.version,
        "dense_bytes": sum(t.nbytes for t in layout.tensors),
    }


def run_export(args: argparse.Namespace) -> int:
    """Export and print what was written."""
    from plelab.edge.export import export_inputs, export_source
    from plelab.util.fs import check_output_path

    if (args.hf is None) == (args.source is None):
        raise PlelabError("give either a source (checkpoint, run, preset or config file) or --hf PATH")
    if args.hf is not None:
        from plelab.hf.ple_export import export_hf, hf_export_inputs

        if args.overrides:
            raise PlelabError("--set only applies to presets and config files, not to --hf")
        check_output_path(args.out, overwrite=args.overwrite, inputs=hf_export_inputs(args.hf))
        layout = export_hf(args.hf, args.out, _options(args), not args.no_tokenizer)
    else:
        check_output_path(args.out, overwrite=args.overwrite, inputs=export_inputs(args.source))
        layout = export_source(args.source, args.out, _options(args), args.overrides, args.seed,
                               not args.no_tokenizer)
    info = {"out": args.out, **_layout_summary(layout)}
    if args.json:
        print_json(info)
        return 0
    print(f"wrote {args.out}: {layout.file_bytes:,} bytes ({layout.quant['dtype']}, group {layout.quant['group']}, "
          f"format version {layout.version})")
    for name, s in info["sections"].items():
        print(f"  {name:<10} {s['bytes']:>15,} bytes at {s['offset']:,}")
    if info["ple_record_bytes"] and layout.ngram is not None:
        g = layout.ngram
        print(f"  PLE record: {info['ple_record_bytes']} bytes, stride {info['ple_record_stride']}; "
              f"{layout.ple_reads} per token, one per hash head (n-gram orders {list(g.orders)} x {g.heads} heads"
              + (", ids compressed by the file's id map)" if layout.id_map else ")"))
    elif info["ple_record_bytes"]:
        print(f"  PLE record: {info['ple_record_bytes']} bytes per token, stride {info['ple_record_stride']}"
              + (" (embedding row included)" if layout.quant["embed_in_record"] else ""))
    if layout.source.get("table_only"):
        print(f"  {layout.source['core']}")
    return 0


def _add_place(sub) -> None:
    p = add_command(
        sub, "place",
        "Place a model's tensors in a device's memory tiers; bytes, reads and time per token. (Its former name, "
        "plan, still works.)",
        "plelab place esp32.ple --device esp32-s3\n"
        "  plelab place esp32-28m --quant int4 --device esp32-s3 --json   # a preset, sized without weights",
        run_place, aliases=("plan",),
    )
    p.add_argument("model", help=".ple file, or a preset / config file / checkpoint (laid out as --quant etc. say)")
    p.add_argument("--device", required=True,
                   help="device profile name (esp32-s3, esp32-p4, phone-ufs4, phone-ufs3, desktop)")
    p.add_argument("--devices", help="TOML file with your own device profiles (schema: plelab/edge/devices.toml)")
    p.add_argument("--context", type=options.positive_int,
                   help="position at which KV traffic is counted (default and at most: max_seq_len)")
    p.add_argument("--kv-dtype", default="fp16", choices=["fp32", "fp16", "int8"], help="KV cache type (default fp16)")
    p.add_argument("--json", action="store_true", help="machine-readable placement")
    _add_layout_flags(p)
    add_set_flag(p)


def _load_layout(args: argparse.Namespace):
    """Layout of a .ple file (metadata only), or of a preset / config / checkpoint exported as the flags say.

    A .ple file's layout is fixed at export and a checkpoint's shape by its weights: flags that would change
    them are refused, not ignored.
    """
    path = Path(args.model)
    is_ple = path.is_file() and path.suffix == ".ple"
    if args.overrides and (is_ple or path.is_dir()):
        what = "a .ple file" if is_ple else "a checkpoint"
        raise PlelabError(f"--set applies to presets and config files, not to {what} (its shape is fixed)")
    if is_ple:
        from plelab.edge.format import PleFile

        given = [flag for key, flag in LAYOUT_FLAGS.items() if getattr(args, key) is not None]
        if given:
            raise PlelabError(f"{', '.join(given)} cannot change the layout of a .ple file (fixed at export); "
                              "re-export with them, or place the checkpoint or preset instead")
        with PleFile(path, verify="none") as f:
            return f.layout
    from plelab.edge.export import checkpoint_config, layout_for_config
    from plelab.hf.checkpoint import is_hf_folder
    from plelab.hf.ple_export import hf_layout
    from plelab.model.presets import load_model_config

    if is_hf_folder(path):  # a Hugging Face Gemma folder: its table-only layout, from config.json alone
        return hf_layout(path, _options(args))
    cfg = checkpoint_config(path) if path.is_dir() else load_model_config(args.model, args.overrides)
    return layout_for_config(cfg, _options(args))


def run_place(args: argparse.Namespace) -> int:
    """Print the placement; exit 2 with one line when the model does not fit."""
    from plelab.edge.placement import PlacementError, get_device, place_with_trade

    device = get_device(args.device, args.devices)
    layout = _load_layout(args)
    if args.context is not None and args.context > layout.model["max_seq_len"]:
        raise PlacementError(f"--context {args.context} is beyond the model's context ({layout.model['max_seq_len']})")
    result = place_with_trade(layout, device, args.context, args.kv_dtype)
    result["model"] = args.model
    if layout.source.get("table_only"):
        result["note"] = ("the core's weights are not counted (only the PLE table, the embedding and "
                          "the KV cache); " + layout.source["core"])
    if args.json:
        print_json(result)
    else:
        _print_placement(result)
    if not result["fits"]:
        worst = max(result["problems"], key=lambda p: p["missing_bytes"])
        raise PlacementError(f"{args.model} does not fit {args.device}: {worst['what']}; "
                        f"missing {worst['missing_bytes']:,} bytes")
    return 0


def _print_placement(r: dict) -> None:
    print(f"{r['model']} on {r['device']} ({r['description']})")
    if r.get("note"):
        print(f"  note: {r['note']}")
    print(f"  file {r['file_bytes']:,} bytes; context {r['context']}, KV {r['kv_dtype']}")
    for name, t in r["tiers"].items():
        placed = [it for it in r["items"] if it["tier"] == name]
        print(f"  {name:<6} {t['kind']:<8} used {t['used']:>13,} of {t['capacity']:>14,} bytes "
              f"({100 * t['used'] / t['capacity']:.1f} %), {len(placed)} item(s)")
        for it in _grouped(placed)[:8]:
            print(f"           {it}")
    print("  per token:" + "".join(f"  {k} {r['bytes_per_token'][k]:,.0f} B / {r['reads_per_token'][k]:g} reads"
                                   for k in r["tiers"]))
    if r["fits"]:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in r["est_ms_breakdown"].items())
        print(f"  estimated {r['est_ms_per_token']:.2f} ms/token ({r['est_tokens_per_s']:.1f} tokens/s): {parts} ms")
    for p in r["problems"]:
        print(f"  DOES NOT FIT: {p['what']}: missing {p['missing_bytes']:,} bytes")
    ple = next((it for it in r["items"] if it["name"] == "table:ple"), None)
    if ple and ple["tier"]:
        print(f"  PLE table left in {ple['tier']}: {ple['bytes']:,} bytes of RAM saved; "
              f"{ple['bytes_per_token']:,} B read per token")
    trade = r.get("embed_in_record_trade")
    if trade:
        a = trade["alternative"]
        print(f"  trade: the embedding row {'inside' if a['embed_in_record'] else 'outside'} the PLE record would "
              f"make the file {a['file_bytes_delta']:+,} bytes; per token {a['storage_tier']} "
              f"{a['storage_bytes_per_token']:,.0f} B in {a['storage_reads_per_token']:g} reads; "
              + ("fits" if a["fits"] else "does not fit")
              + (f", {a['est_ms_per_token']:.2f} ms/token" if a["est_ms_per_token"] else ""))


def _grouped(items: list[dict]) -> list[str]:
    """Item lines with per-layer tensors folded into `layers.*.name x N`, largest first."""
    import re

    groups: dict[str, list[dict]] = {}
    for it in items:
        groups.setdefault(re.sub(r"^layers\.\d+\.", "layers.*.", it["name"]), []).append(it)
    rows = sorted(groups.items(), key=lambda kv: -sum(i["bytes"] for i in kv[1]))
    return [f"{k}{f' x{len(v)}' if len(v) > 1 else ''}: {sum(i['bytes'] for i in v):,} B ({v[0]['what']})"
            for k, v in rows]


def _add_run(sub) -> None:
    p = add_command(
        sub, "run", "Run a .ple model: the NumPy runtime (the reference), the C runtime on this machine, or the C "
        "runtime bare-metal on an emulated microcontroller board. The PLE table stays in the file, rows read on "
        "demand.",
        "plelab run esp32.ple --prompt 'Once upon a time' --max-new-tokens 40\n"
        "  plelab run esp32.ple --prompt 'Hello' --device esp32-s3 --json   # traffic per esp32-s3 tier\n"
        "  plelab run esp32.ple --prompt 'Hello' --engine c --act int8 --kv-dtype int8 --head-skip --temperature 0\n"
        "  plelab run esp32.ple --engine mcu --board mps3-an547 --ids 1,2,3 --max-new-tokens 8 --json",
        run_run,
    )
    p.add_argument("model", help=".ple file")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", type=utf8_text,
                     help="prompt text (tokenized with the tokenizer stored in the file)")
    src.add_argument("--ids", help="prompt as comma-separated token ids")
    p.add_argument("--max-new-tokens", type=options.positive_int, default=32, help="tokens to generate (default 32)")
    options.add_sampling_flags(p)
    greedy_default = p._option_string_actions["--temperature"]
    greedy_default.help += "; --engine mcu decodes greedily (its default 0)"
    p.set_defaults(temperature=None)  # the engine's default, chosen in run_run
    p.add_argument("--tokenizer", help="tokenizer.json to use when the file has none")
    p.add_argument("--device", help="count traffic per tier of this device's plan (default: host file / ram; "
                   f"--engine mcu: {DEFAULT_MCU_DEVICE})")
    p.add_argument("--devices", help="TOML file with your own device profiles")
    p.add_argument("--verify", default="full", choices=["full", "core", "none"],
                   help="checksums to verify on open: every byte (default), all but the row tables, or none")
    p.add_argument("--engine", default="numpy", choices=["numpy", "c", "mcu"],
                   help="numpy (the reference, default); c: the C runtime, built with the system compiler on first "
                        "use and cached (docs/c-runtime.md); mcu: the C runtime bare-metal on an emulated board "
                        "(--board), its image built with the board's cross compiler and run under QEMU")
    p.add_argument("--board", help="--engine mcu: the emulated board (plelab mcu boards lists them; default the first)")
    p.add_argument("--kernel", help="--engine mcu: the build switch, portable, vector or an integer kernel of the "
                   "board's core (default: the best it has)")
    p.add_argument("--act", default="fp32", choices=["fp32", "int8"],
                   help="activations into int8 / int4 weights: fp32 (the reference, default) or int8 codes with one "
                        "scale per vector, as the integer kernels compute (every engine)")
    p.add_argument("--kv-dtype", default="fp32", choices=["fp32", "int8"],
                   help="what the KV cache keeps: fp32 (default) or int8 with one scale per head vector (every "
                        "engine; --device traffic counts it)")
    p.add_argument("--head-skip", action="store_true",
                   help="greedy, --engine c or mcu, --act int8: compute only the head rows that can still win "
                        "(same ids)")
    p.add_argument("--json", action="store_true", help="machine-readable result")


def _tokenizer(file, vocab: int, args: argparse.Namespace):
    """The file's tokenizer, else --tokenizer, else the plain byte tokenizer when the vocabulary allows it."""
    from plelab.data.tokenizer import Tokenizer

    try:
        text = file.tokenizer_json()
    except (zlib.error, UnicodeDecodeError) as exc:  # reachable with --verify core/none, which skip its checksum
        raise PlelabError(f"{args.model}: the embedded tokenizer is corrupt ({exc}); pass --tokenizer FILE") from exc
    if text is not None:
        return Tokenizer.from_json(text)
    if args.tokenizer:
        return Tokenizer.load(args.tokenizer)
    tok = Tokenizer.byte_level()
    if tok.vocab_size > vocab:
        raise PlelabError(f"{args.model} has no tokenizer and its vocabulary ({vocab}) is too small for "
                          "bytes; pass --tokenizer FILE or --ids")
    return tok


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise PlelabError(f"--ids wants comma-separated integers, got {text!r}") from exc


def _collect(tokens: Iterator[int], into: list[int]) -> Iterator[int]:
    """Pass `tokens` through, appending each to `into`."""
    for t in tokens:
        into.append(t)
        yield t


def _request(args: argparse.Namespace):
    """The engine request (ids checked against the model's vocabulary, fitted to its context) and the tokenizer."""
    from plelab.edge.engine import Request
    from plelab.edge.format import PleFile
    from plelab.edge.runtime import refuse_table_only
    from plelab.errors import token_id_message
    from plelab.inference.generate import fit_context

    with PleFile(args.model, verify="none") as f:  # the engine verifies; here the shape and the tokenizer
        refuse_table_only(args.model, f.layout)  # one wording for every engine
        cfg, tok = f.layout.model, None
        if args.prompt is not None:
            tok = _tokenizer(f, cfg["vocab_size"], args)
    ids = tok.encode(args.prompt) if tok else _parse_ids(args.ids)
    bad = [i for i in ids if not 0 <= i < cfg["vocab_size"]]
    if bad:  # before any engine starts: the same words whichever runs (a C long cannot hold every id)
        raise PlelabError(token_id_message(cfg["vocab_size"], bad))
    fit = fit_context(ids, args.max_new_tokens, cfg["max_seq_len"])
    if fit.note:
        print(f"plelab run: {fit.note}", file=sys.stderr)
    return Request(Path(args.model), fit.prompt, fit.max_new_tokens, options.sampling(args),
                   tok.eot_id if tok else None, args.act, args.kv_dtype, args.head_skip, args.verify, args.device,
                   args.devices, _placement(args)), tok


def _placement(args: argparse.Namespace) -> dict[str, str] | None:
    """The device placement (the NumPy engine counts traffic by it); refused when the model does not fit."""
    if not args.device or args.engine == "mcu":  # the board places the model itself (its regions, its profile)
        return None
    from plelab.edge.format import PleFile
    from plelab.edge.placement import get_device, place

    with PleFile(args.model, verify="none") as f:  # the KV cache the runtime keeps, as it keeps it
        planned = place(f.layout, get_device(args.device, args.devices), kv_dtype=args.kv_dtype)
    if not planned["fits"]:
        raise PlelabError(f"{args.model} does not fit {args.device} (see plelab place); "
                          "its traffic per tier would mean nothing")
    return planned["placement"]


def run_run(args: argparse.Namespace) -> int:
    """Generate with the chosen engine, then report text, speed and traffic per tier per token."""
    from plelab.edge.engine import get_engine
    from plelab.inference.generate import stream_text
    from plelab.inference.sampling import Sampling

    if Path(args.model).is_dir():
        raise PlelabError(f"{args.model} is a folder; give a .ple file (plelab export makes one from a run)")
    if args.temperature is None:
        args.temperature = 0.0 if args.engine == "mcu" else Sampling().temperature
    engine = get_engine(args.engine, args.board, args.kernel)
    request, tok = _request(args)
    engine.check(request)
    out: list[int] = []
    tokens = engine.generate(request)
    if tok and not args.json:
        for piece in stream_text(_collect(tokens, out), tok.decode):
            sys.stdout.write(piece)
            sys.stdout.flush()
    else:
        out.extend(tokens)
    result = {"model": args.model, "engine": engine.name, "prompt_tokens": len(request.prompt),
              "generated_ids": out, "text": tok.decode(out) if tok else None, **engine.report()}
    if args.json:
        print_json(result)
        return 0
    if result["text"] is None:
        print("ids:", ",".join(map(str, out)), flush=True)
    else:
        print(flush=True)
    if result.get("instructions_per_token"):
        speed = f"{result['instructions_per_token'] / 1e6:.2f} M instructions per token on {result['board']}"
    else:
        speed = f"{result['tokens_per_s']:.1f} tokens/s decode" if result["tokens_per_s"] else "n/a tokens/s"
    print(f"-- {len(out)} tokens, {speed}; per token: "
          + ", ".join(f"{k} {v:,.0f} B in {result['reads_per_token'][k]:g} reads"
                      for k, v in result["bytes_per_token"].items()), file=sys.stderr)
    return 0
