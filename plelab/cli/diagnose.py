"""`plelab diagnose`: is a run's PLE alive, weak or dead? Ablation, injection, gates and table health per layer."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from plelab.cli import options
from plelab.cli.common import add_command, print_json


def add_parser(sub) -> None:
    """Register `plelab diagnose`."""
    p = add_command(
        sub, "diagnose",
        "Diagnose a run's PLE: per-layer injection ratio, gates, table health against random baselines, "
        "ablation losses, and an alive / weak / dead verdict with the rule behind it.",
        "plelab diagnose runs/small-ple --data data/prepared --json\n"
        "  plelab diagnose runs/small-ple/checkpoints/step_00002000 --data ../shared/data/valid\n"
        "  plelab diagnose --hf ~/models/gemma-3n-E2B-it --data ../shared/data/valid --layers 0,10,20",
        run,
    )
    p.add_argument("checkpoint", nargs="?", help="run directory (newest checkpoint) or checkpoint directory")
    p.add_argument("--hf", metavar="PATH", help="a local Hugging Face Gemma 3n / Gemma 4 folder instead "
                   "(config.json + safetensors + tokenizer.json; needs transformers; the PLE table stays on disk)")
    p.add_argument("--layers", type=_layer_list, help="with --hf: decoder layers to diagnose, e.g. 0,5,10 "
                   "(default all; each costs 3 ablation passes over the batches)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                   help="with --hf: dtype of the in-memory model (default float32; bfloat16 halves its RAM)")
    p.add_argument("--data", help="prepared dataset folder, folder of domain .txt files, or a .npy token array; "
                   "without it only injection/gate statistics on random tokens (no ablation)")
    p.add_argument("--batches", type=options.positive_int, default=8,
                   help="evaluation batches for ablation (default 8)")
    p.add_argument("--batch-size", type=options.positive_int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--seq-len", type=options.positive_int,
                   help="tokens per sequence (default: min(256, model context))")
    p.add_argument("--top-k", type=options.positive_int, default=None,
                   help="table rows (most frequent tokens) for table health")
    p.add_argument("--seed", type=options.nonneg_int, default=0, help="seed of the batch windows")
    p.add_argument("--device", default="cpu", help="cpu, cuda, ...")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--early", action="store_true",
                   help="predict the final verdict from the run's logged trajectory (RUN_DIR/metrics.jsonl) by the "
                        "dead-zone-law study's early rule, with its measured accuracy; loads no model")


def _layer_list(text: str) -> list[int]:
    try:
        layers = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer indices, got {text!r}") from None
    if not layers or min(layers) < 0:
        raise argparse.ArgumentTypeError(f"expected non-negative layer indices, got {text!r}")
    return layers


def _run_dir_of(ckpt: Path) -> Path | None:
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def _monitor_summaries(run_dir: Path | None) -> dict:
    out = {}
    for name in ("early", "final"):
        f = run_dir / "diagnostics" / f"{name}.json" if run_dir else None
        if f is not None and f.is_file():
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):  # a damaged monitor file must not hide the diagnosis itself
                out[name] = {"verdict": f"unreadable ({f})"}
                continue
            out[name] = data.get("summary") or {"verdict": data.get("verdict")}
    return out


def run(args: argparse.Namespace) -> int:
    """Load the checkpoint, gather data, diagnose, print."""
    if args.early:
        return run_early(args)
    from plelab.errors import PlelabError

    if (args.hf is None) == (args.checkpoint is None):
        raise PlelabError("give either a run/checkpoint directory or --hf PATH (a Hugging Face folder)")
    if args.hf is not None:
        return run_hf(args)
    if args.layers is not None:
        raise PlelabError("--layers applies to --hf checkpoints only")
    from plelab.diagnostics.batches import batches_from_tokens
    from plelab.diagnostics.data_sources import load_diagnostic_data
    from plelab.diagnostics.diagnose import diagnose_model
    from plelab.diagnostics.table_health import DEFAULT_TOP_K
    from plelab.inference.evaluate import check_seq_len
    from plelab.inference.load import load_model
    from plelab.training.ple_monitor import load_init_table
    from plelab.util.device import pick_device

    model, _ = load_model(args.checkpoint, device=pick_device(args.device))
    ckpt = Path(model.checkpoint_dir)
    run_dir = _run_dir_of(ckpt)
    init, init_note = load_init_table(run_dir) if run_dir else (None, "checkpoint outside a run directory")
    seq_len = check_seq_len(args.seq_len or min(256, model.config.max_seq_len), model.config.max_seq_len)
    kwargs: dict = {"init_table": init, "init_note": init_note, "top_k": args.top_k or DEFAULT_TOP_K}
    data_desc = None
    if args.data:
        data = load_diagnostic_data(args.data, ckpt, model.config.vocab_size)
        kwargs.update(batches=batches_from_tokens(data.eval_tokens, args.batch_size, seq_len, args.batches, args.seed),
                      token_ids=data.freq_tokens, freq_source=data.freq_source, with_grads=True)
        data_desc = data.eval_source
    report = diagnose_model(model, **kwargs)
    report = {"checkpoint": str(ckpt), "run_dir": str(run_dir) if run_dir else None, **report}
    report.setdefault("data", {})["source"] = data_desc
    report["monitor"] = _monitor_summaries(run_dir)
    if args.json:
        print_json(report)
    else:
        print(format_report(report))
    return 0


def run_hf(args: argparse.Namespace) -> int:
    """`--hf PATH`: the same diagnosis for a Gemma 3n / Gemma 4 checkpoint, with per-domain deltas."""
    import torch

    from plelab.diagnostics.table_health import DEFAULT_TOP_K
    from plelab.errors import PlelabError
    from plelab.hf.checkpoint import HFCheckpoint
    from plelab.hf.diagnose import diagnose_hf, hf_eval_batches
    from plelab.hf.model import load_text_model
    from plelab.inference.evaluate import check_seq_len
    from plelab.util.device import pick_device

    ckpt = HFCheckpoint.open(args.hf)
    if args.layers is not None and max(args.layers) >= ckpt.num_layers:  # before loading gigabytes
        raise PlelabError(f"--layers: {args.hf} has layers 0..{ckpt.num_layers - 1}, got {max(args.layers)}")
    context = ckpt.text_config.get("max_position_embeddings") or 256
    seq_len = check_seq_len(args.seq_len or min(256, context), context)
    model = load_text_model(ckpt, getattr(torch, args.dtype))
    model.lm.to(pick_device(args.device))
    kwargs: dict = {"layers": args.layers, "top_k": args.top_k or DEFAULT_TOP_K}
    data_desc = None
    if args.data:
        batches, domains, tokens, data_desc = hf_eval_batches(args.data, model, args.batch_size, seq_len,
                                                              args.batches, args.seed)
        kwargs.update(batches=batches, domains=domains, token_ids=tokens, freq_source="the evaluation batches")
    report = {"checkpoint": str(ckpt.path), "run_dir": None, **diagnose_hf(model, **kwargs)}
    report.setdefault("data", {})["source"] = data_desc
    if args.json:
        print_json(report)
    else:
        print(format_report(report))
    return 0


def run_early(args: argparse.Namespace) -> int:
    """`--early`: the study's early rule (plelab/experiments/deadzone_law.json) on a run's logged signals."""
    from plelab.diagnostics.early import format_prediction, predict_run
    from plelab.errors import PlelabError
    from plelab.experiments.law import load_law
    from plelab.experiments.sweep_runner import read_metrics

    run_dir = Path(args.checkpoint or "")
    config = run_dir / "config.json"
    if not args.checkpoint or not (run_dir / "metrics.jsonl").is_file() or not config.is_file():
        raise PlelabError(f"--early wants a run directory with metrics.jsonl and config.json, got {run_dir}")
    try:
        total = int(json.loads(config.read_text(encoding="utf-8"))["max_steps"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{config}: no readable max_steps ({exc})") from None
    metrics, _ = read_metrics(run_dir)
    report = predict_run(metrics, total, (load_law() or {}).get("early_rule"))
    if args.json:
        print_json(report)
    else:
        print(format_prediction(report))
    return 0


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _health(rec: dict, view: str) -> str:
    h = rec.get("table", {}).get(view)
    if not h or "metrics" not in h:
        return "-"
    m, b = h["metrics"], h["random_empirical"]
    return (f"{m['effective_rank']:.1f}/{b['effective_rank']:.1f} "
            f"{m['pc1_explained_variance']:.3f}/{b['pc1_explained_variance']:.3f} {m['mean_cosine']:+.3f}")


def format_report(r: dict) -> str:
    """The human-readable table of a diagnosis."""
    m = r["model"]
    lines = [f"checkpoint {r['checkpoint']}: H={m['hidden_size']} L={m['num_layers']} dP={m['ple_dim']} "
             f"PLE layers {m['ple_layers']}"]
    o = r["overall"]
    lines.append(f"verdict: {r['verdict'].upper()} ({o['basis']}: {o['reason']})")
    if not r["layers"]:
        return "\n".join(lines + [f"note: {n}" for n in r["notes"]])
    data = r.get("data", {})
    if data.get("batches"):
        lines.append(f"data: {data['batches']} batches, {data['tokens']:,} tokens from {data.get('source')}")
        lines.append(f"loss with PLE {o['loss_full']:.4f}; all PLE off: delta {o['ablation_delta_loss']:+.4f} "
                     f"(zero {o['ablation_delta_loss_zero']:+.4f}, shuffle {o['ablation_delta_loss_shuffle']:+.4f}, "
                     f"table {o['ablation_delta_loss_table']:+.4f}), noise {o['noise']:.4f}")
    for name, d in r.get("domains", {}).items():
        lines.append(f"  domain {name:<18} loss {d['loss_full']:.4f}  all PLE off: delta {d['delta']:+.4f} "
                     f"({d['primary_mode']}), noise {d['noise']:.4f} -> {d['verdict']}")
    header = (f"{'layer':>5} {'verdict':<7} {'inj.ratio':>9} {'|gate|':>7} {'gate~0':>7} {'dL zero':>8} "
              f"{'dL shuf':>8} {'dL table':>8} {'dL':>8} {'noise':>7}  {'frequent: erank/rand PC1/rand cos':<34} "
              f"{'delta: erank/rand PC1/rand cos'}")
    lines += ["", header]
    for x in r["layers"]:
        lines.append(
            f"{x['layer']:>5} {x['verdict']:<7} {_num(x['injection_ratio'], '9.4f')} {_num(x['gate_mean_abs'], '7.4f')}"
            f" {_num(x['gate_near_zero_frac'], '7.1%')} {_num(x['ablation_delta_loss_zero'], '+8.4f')}"
            f" {_num(x['ablation_delta_loss_shuffle'], '+8.4f')} {_num(x['ablation_delta_loss_table'], '+8.4f')}"
            f" {_num(x['ablation_delta_loss'], '+8.4f')} {_num(x['noise'], '7.4f')}  {_health(x, 'frequent'):<34}"
            f" {_health(x, 'delta')}"
        )
        if x["conflicts"]:
            lines.append(f"{'':>5} note: {'; '.join(x['conflicts'])}")
    lines.append("")
    if r.get("grad_ratios"):
        lines.append("gradient norm / trunk gradient norm (one backward pass): "
                     + "; ".join(f"layer {x['layer']} gate {_num(x['grad_ratio_gate'], '.3g')} proj "
                                 f"{_num(x['grad_ratio_proj'], '.3g')} table {_num(x['grad_ratio_table'], '.3g')}"
                                 for x in r["layers"]))
    for name, view in r["table_health"]["views"].items():
        lines.append(f"table view '{name}': {view['rows'] if view['available'] else 'unavailable: ' + view['reason']}")
    for name, s in r.get("monitor", {}).items():
        lines.append(f"monitor {name} verdict (step {s.get('step')}): {s.get('verdict')}")
    lines += ["", "rules:"] + [f"  - {rule}" for rule in r["rules"]]
    defs = {**r["definitions"], **r["table_health"]["definitions"]}
    lines += ["definitions:"] + [f"  {k}: {v}" for k, v in defs.items()]
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
