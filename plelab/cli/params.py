"""`plelab params`: exact parameter counts by part and per-token costs, computed analytically (no weights
allocated), and FFN widths matched to a reference model's budget."""

from __future__ import annotations

import argparse

from plelab.cli import options
from plelab.cli.common import add_command, add_set_flag, print_json
from plelab.edge.budget import (
    FREE_WIDTH,
    active_flops,
    active_params_per_token,
    budget_value,
    inference_bytes,
    match_ffn,
    with_width,
)
from plelab.edge.quant import EXPORT_QUANTS
from plelab.model.config import ModelConfig
from plelab.model.params import count_params, ple_table_reads, sweep_ple, with_ple_dim
from plelab.model.presets import PRESETS, load_model_config
from plelab.util.dataclass_config import ConfigError

PART_LABELS = {
    "embedding": "main embedding (V x H)",
    "attention": "attention (q, k, v, o)",
    "ffn": "FFN",
    "ffn_mask": "FFN masks (MGLU, 1 bit each at inference)",
    "norms": "norms",
    "output_head": "output head (untied)",
    "ple_table": "PLE table (rows x L x dP / heads)",
    "ple_model_projection": "PLE model projection + norm",
    "ple_per_layer": "PLE per-layer gate + projection + norm",
}
# --match-ffn choice -> plelab.edge.budget budget name
MATCH_BUDGETS = {"params": "ffn_params", "inference-bytes": "inference_bytes", "active-flops": "active_flops"}


def add_parser(sub) -> None:
    """Register `plelab params`."""
    p = add_command(
        sub, "params", "Count parameters exactly, by part (instant even for billions).",
        "plelab params seed-3b --sweep-ple 0,64,128,256,512\n"
        "  plelab params esp32-28m --json\n"
        "  plelab params seed-3b --set hidden_size=2048 --set num_layers=30 --set ple.vocab_size=262144 "
        "--ple-dim 256\n"
        "  plelab params small-ple --set ple.index=ngram --set ple.ngram.orders=[2,3] --set ple.ngram.heads=4\n"
        "  plelab params small-ple --set ffn.kind=mglu --match-ffn inference-bytes --quant int4\n"
        "  plelab params small-ple --set ffn.kind=moe --set ffn.shared_expert=true --match-ffn active-flops "
        "--reference-set ffn.intermediate_size=512",
        run,
    )
    p.add_argument("model", help=f"preset ({', '.join(PRESETS)}) or a TOML/YAML/JSON model config file")
    p.add_argument("--ple-dim", type=options.nonneg_int, help="set dP (PLE width) before counting")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sweep-ple", metavar="D1,D2,...", help="print the seed-style table over these dP values")
    mode.add_argument("--suggest-ple", action="store_true",
                      help="print the dP range the dead-zone law predicts for this hidden size, with its evidence")
    mode.add_argument("--match-ffn", choices=list(MATCH_BUDGETS),
                      help="solve the FFN's free width (intermediate_size; rank for lowrank, expert_size for moe, "
                           "prune_to for pruned) so the model's FFN params, inference bytes per token or active "
                           "FLOPs per token come as close as possible to the reference's without exceeding them "
                           "(an error when no width comes within 10 %% of it)")
    p.add_argument("--reference-set", dest="reference_overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="--match-ffn's reference: MODEL with these overrides only (not --set / --ple-dim); "
                        "default MODEL itself (repeatable)")
    p.add_argument("--quant", choices=EXPORT_QUANTS, default="fp16",
                   help="weight encoding of the edge export (as `plelab export --quant`) that inference bytes are "
                        "counted at (default fp16)")
    p.add_argument("--export-dtype", dest="quant", choices=EXPORT_QUANTS, default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)  # its old name
    p.add_argument("--json", action="store_true", help="machine-readable output")
    add_set_flag(p)


def _parse_dims(text: str) -> list[int]:
    try:
        dims = [int(x) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise ConfigError(f"--sweep-ple wants comma-separated integers, got {text!r}") from exc
    if not dims or any(d < 0 for d in dims):
        raise ConfigError(f"--sweep-ple wants non-negative integers, got {text!r}")
    return dims


def _suggest(model: str, hidden: int, as_json: bool) -> int:
    from plelab.studies.law.analysis import format_suggestion, load_law, suggest, suggestion_json

    advice = suggest(hidden, load_law())
    if as_json:
        print_json({"model": model, **suggestion_json(advice)})
    else:
        print(f"{model}: H = {hidden}\n{format_suggestion(advice)}")
    return 0


def _match(args: argparse.Namespace, cfg: ModelConfig) -> int:
    """Solve the FFN width for one budget and print it with the solved and reference values."""
    budget, quant = MATCH_BUDGETS[args.match_ffn], args.quant
    reference = load_model_config(args.model, args.reference_overrides)
    matched = match_ffn(cfg, reference, budget, quant)
    field = FREE_WIDTH[cfg.ffn.kind]
    width = getattr(matched.ffn, field)
    value, target = budget_value(matched, budget, quant), budget_value(reference, budget, quant)
    # pruned: prune_to must stay below intermediate_size, so there may be no next width to show
    allowed = cfg.ffn.kind != "pruned" or width + 1 < cfg.ffn.intermediate_size
    next_value = budget_value(with_width(matched, width + 1), budget, quant) if allowed else None
    result = {"model": args.model, "ffn_kind": cfg.ffn.kind, "budget": budget, "export_dtype": quant,
              "field": f"ffn.{field}", "width": width, "value": value, "reference_value": target,
              "next_value": next_value, "set": f"ffn.{field}={width}"}
    if args.json:
        print_json(result)
        return 0
    unit = f" ({quant} export)" if budget == "inference_bytes" else ""
    print(f"{args.model}: ffn={cfg.ffn.kind} matched to the reference's {budget.replace('_', ' ')}{unit}")
    print(f"  {'solved width':<28} ffn.{field} = {width}   (use --set ffn.{field}={width})")
    print(f"  {'value':<28} {value:>16,}  ({100 * value / target:.2f} % of the reference)")
    print(f"  {'reference value':<28} {target:>16,}")
    if next_value is not None:
        print(f"  {f'at {field} = {width + 1}':<28} {next_value:>16,}  (over the reference)")
    else:
        print("  prune_to is at its limit, intermediate_size - 1 (raise ffn.intermediate_size to go wider)")
    return 0


def _config_to_match(model: str, overrides: list[str]) -> ModelConfig:
    """The model whose FFN width --match-ffn solves. Its free width (FREE_WIDTH: rank, prune_to) is the answer, so it
    may be left unset: the kinds that require it get a placeholder of 1 (only the search's start)."""
    given = {o.split("=", 1)[0].strip() for o in overrides}
    placeholders = [f"ffn.{field}=1" for field in ("rank", "prune_to") if f"ffn.{field}" not in given]
    kind = load_model_config(model, [*placeholders, *overrides]).ffn.kind
    needed = [p for p in placeholders if p.split("=")[0] == f"ffn.{FREE_WIDTH[kind]}"]
    return load_model_config(model, [*needed, *overrides])


def _print_table(t: dict) -> None:
    """The PLE table's index: its rows, and the rows and values one token reads from it."""
    if t["index"] == "ngram":
        print(f"PLE table, n-gram index: orders {t['orders']} x {t['heads_per_order']} hash heads = {t['heads']} "
              "heads; rows per head "
              + ", ".join(f"{r:,} (order {n})" for n, r in zip(t["orders"], t["rows_per_head"], strict=True))
              + (f"; ids compressed by {t['id_map']}" if t["id_map"] else ""))
    else:
        print("PLE table, token index: one row per token id")
    print(f"  {'table rows':<42} {t['table_rows']:>16,}")
    print(f"  {'values per row':<42} {t['row_values']:>16,}")
    print(f"  {'rows read per token':<42} {t['rows_read_per_token']:>16,}")
    print(f"  {'table parameters read per token':<42} {t['table_params_per_token']:>16,}")
    print(f"  {'table bytes read per token (fp32, training)':<42} {t['table_bytes_per_token_fp32']:>16,}")


def run(args: argparse.Namespace) -> int:
    """Print the breakdown (or the dP sweep table, or a matched FFN width)."""
    if args.reference_overrides and not args.match_ffn:
        raise ConfigError("--reference-set only applies with --match-ffn")
    cfg = _config_to_match(args.model, args.overrides) if args.match_ffn else load_model_config(args.model,
                                                                                                 args.overrides)
    if args.ple_dim is not None:
        cfg = with_ple_dim(cfg, args.ple_dim)
    if args.match_ffn:
        return _match(args, cfg)
    if args.suggest_ple:
        return _suggest(args.model, cfg.hidden_size, args.json)
    if args.sweep_ple:
        rows = sweep_ple(cfg, _parse_dims(args.sweep_ple))
        if args.json:
            print_json({"model": args.model, "rows": rows})
            return 0
        base = rows[0]["base_total"]
        print(f"{args.model}: base (dP = 0) {base:,} parameters "
              f"(H={cfg.hidden_size}, L={cfg.num_layers}, V_ple={cfg.ple_vocab_size:,})")
        print(f"{'dP':>5} {'PLE table':>15} {'model proj':>12} {'per-layer':>13} {'added':>15} "
              f"{'% base':>8} {'table %':>8}")
        for r in rows:
            print(
                f"{r['ple_dim']:>5} {r['ple_table']:>15,} {r['ple_model_projection']:>12,} {r['ple_per_layer']:>13,} "
                f"{r['ple_added']:>15,} {r['pct_of_base']:>7.2f}% {100 * r['table_share_of_added']:>7.1f}%"
            )
        return 0
    c = count_params(cfg)
    per_token = {"active_params_per_token": active_params_per_token(cfg),
                 "inference_bytes": inference_bytes(cfg, args.quant), "active_flops": active_flops(cfg)}
    table = ple_table_reads(cfg)
    if args.json:
        print_json({"model": args.model, "ple_dim": cfg.ple.dim, **c,
                    "pct_of_base": 100.0 * c["ple_added"] / c["base_total"], **per_token,
                    "export_dtype": args.quant, "ple_table_index": table})
        return 0
    print(f"{args.model}: V={cfg.vocab_size:,} H={cfg.hidden_size} L={cfg.num_layers} heads={cfg.num_heads}/"
          f"{cfg.kv_heads} ffn={cfg.ffn.kind}:{cfg.ffn.intermediate_size} dP={cfg.ple.dim}")
    for key, label in PART_LABELS.items():
        if c[key] or key in ("embedding", "attention", "ffn", "norms"):
            print(f"  {label:<42} {c[key]:>16,}")
    print(f"  {'total':<42} {c['total']:>16,}")
    print(f"  {'base (dP = 0)':<42} {c['base_total']:>16,}")
    if c["ple_added"]:
        print(f"  {'PLE added':<42} {c['ple_added']:>16,}  (+{100 * c['ple_added'] / c['base_total']:.2f} %)")
        print(f"  {'rest (not PLE table, not main embedding)':<42} {c['rest']:>16,}")
        print(f"  PLE table share of total: {100 * c['ple_table'] / c['total']:.1f} %; "
              f"of PLE added: {100 * c['ple_table'] / c['ple_added']:.1f} %")
    if table:
        _print_table(table)
    print("per decoded token:")
    print(f"  {'active parameters':<42} {per_token['active_params_per_token']:>16,}")
    print(f"  {f'weight bytes read ({args.quant} export)':<42} {per_token['inference_bytes']:>16,}")
    print(f"  {'matmul FLOPs (attention scores apart)':<42} {per_token['active_flops']:>16,}")
    return 0
