"""Diagnose a trained run or checkpoint: load it, gather evaluation batches, run every diagnostic, and the
report's text form (what `plelab diagnose` prints; `--json` prints the dict itself)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.diagnostics.batches import batches_from_tokens
from plelab.diagnostics.data_sources import load_diagnostic_data
from plelab.diagnostics.diagnose import diagnose_model
from plelab.diagnostics.hashing import diagnose_hashing, format_hashing
from plelab.diagnostics.run_files import load_init_table, monitor_summaries
from plelab.diagnostics.table_health import DEFAULT_TOP_K
from plelab.inference.evaluate import check_seq_len
from plelab.inference.load import load_model
from plelab.runs.checkpoint import read_checkpoint_json
from plelab.util.device import pick_device


def run_dir_of(ckpt: Path) -> Path | None:
    """The run directory a checkpoint sits in (RUN/checkpoints/step_N), or None for a loose checkpoint."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def diagnose_run(path: str | Path, data: str | None = None, *, device: str = "cpu", batches: int = 8,
                 batch_size: int = 8, seq_len: int | None = None, top_k: int | None = None,
                 seed: int = 0) -> dict[str, Any]:
    """The diagnosis of a run's newest checkpoint (or a checkpoint folder) as a JSON-ready dict.

    data: a prepared dataset, a folder of domain .txt files or a .npy token array; without it only injection
    and gate statistics on random tokens (no ablation). seq_len defaults to min(256, the model's context).
    """
    model, _ = load_model(path, device=pick_device(device))
    ckpt = Path(model.checkpoint_dir)
    run_dir = run_dir_of(ckpt)
    init, init_note = load_init_table(run_dir) if run_dir else (None, "checkpoint outside a run directory")
    seq_len = check_seq_len(seq_len or min(256, model.config.max_seq_len), model.config.max_seq_len)
    kwargs: dict = {"init_table": init, "init_note": init_note, "top_k": top_k or DEFAULT_TOP_K}
    data_desc = found = None
    if data:
        found = load_diagnostic_data(data, ckpt, model.config.vocab_size)
        kwargs.update(batches=batches_from_tokens(found.eval_tokens, batch_size, seq_len, batches, seed),
                      token_ids=found.freq_tokens, freq_source=found.freq_source, with_grads=True)
        data_desc = found.eval_source
    report = diagnose_model(model, **kwargs)
    report = {"checkpoint": str(ckpt), "run_dir": str(run_dir) if run_dir else None, **report}
    report.setdefault("data", {})["source"] = data_desc
    report["monitor"] = monitor_summaries(run_dir)
    hashing = diagnose_hashing(model, read_checkpoint_json(ckpt / "config.json"),
                               found.eval_tokens if found else None, init, init_note)
    if hashing:
        report["hashing"] = hashing
    return report


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
    lines += format_hashing(r.get("hashing", {}))
    for name, s in r.get("monitor", {}).items():
        lines.append(f"monitor {name} verdict (step {s.get('step')}): {s.get('verdict')}")
    lines += ["", "rules:"] + [f"  - {rule}" for rule in r["rules"]]
    defs = {**r["definitions"], **r["table_health"]["definitions"]}
    lines += ["definitions:"] + [f"  {k}: {v}" for k, v in defs.items()]
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
