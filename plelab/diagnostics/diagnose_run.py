"""Diagnose a trained run or checkpoint: does the model use its PLE table, and does the table pay? The report's
text form is what `plelab diagnose` prints; `--json` prints the dict itself.

Evaluation data, in this order: the data given, the evaluation data the run recorded (config eval_data), the
validation split of the data it trained on; proxies (provisional) only when none can be found. The twin: the one
given, else the run's dP = 0 twin found beside it (plelab.diagnostics.twin); without one, benefit is not measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.diagnostics import verdict as V
from plelab.diagnostics.batches import batches_from_tokens
from plelab.diagnostics.benefit import paired_gain
from plelab.diagnostics.data_sources import load_diagnostic_data
from plelab.diagnostics.diagnose import diagnose_model
from plelab.diagnostics.hashing import diagnose_hashing, format_hashing
from plelab.diagnostics.run_files import load_init_table, monitor_summaries
from plelab.diagnostics.table_health import DEFAULT_TOP_K
from plelab.diagnostics.twin import check_twin, find_twin
from plelab.inference.evaluate import check_seq_len
from plelab.inference.load import load_model
from plelab.util.device import pick_device


def run_dir_of(ckpt: Path) -> Path | None:
    """The run directory a checkpoint sits in (RUN/checkpoints/step_N), or None for a loose checkpoint."""
    return ckpt.parent.parent if ckpt.parent.name == "checkpoints" else None


def recorded_data(train: dict[str, Any]) -> tuple[str | None, str]:
    """(the evaluation data a run recorded that exists on this machine, or None; where it came from)."""
    for key, what in (("eval_data", "the run's recorded eval_data"), ("data", "the run's training data's "
                                                                              "validation split")):
        value = train.get(key)
        if value and Path(value).exists():
            return str(value), f"{what} ({value})"
    missing = [f"{k} = {train[k]}" for k in ("eval_data", "data") if train.get(k)]
    return None, ("no evaluation data given, and " + (f"the run's recorded {' and '.join(missing)} not found here"
                                                      if missing else "the run recorded none"))


def diagnose_run(path: str | Path, data: str | None = None, *, twin: str | Path | None = None,
                 find: bool = True, device: str = "cpu", batches: int = 8, batch_size: int = 8,
                 seq_len: int | None = None, top_k: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The diagnosis of a run's newest checkpoint (or a checkpoint folder) as a JSON-ready dict: the used verdict
    (ablation, on evaluation data) and the pays verdict (against the dP = 0 twin, on the same batches).

    data: a prepared dataset, a folder of domain .txt files or a .npy token array (default: what the run
    recorded); twin: the run's dP = 0 twin (default: found beside the run when `find`). seq_len defaults to
    min(256, the model's context).
    """
    model, meta = load_model(path, device=pick_device(device))
    ckpt = Path(model.checkpoint_dir)
    run_dir = run_dir_of(ckpt)
    init, init_note = load_init_table(run_dir) if run_dir else (None, "checkpoint outside a run directory")
    seq_len = check_seq_len(seq_len or min(256, model.config.max_seq_len), model.config.max_seq_len)
    kwargs: dict = {"init_table": init, "init_note": init_note, "top_k": top_k or DEFAULT_TOP_K}
    data_desc, data_note = None, None
    if not data:
        data, data_note = recorded_data(meta.get("train") or {})
    eval_batches = found = None
    if data:
        found = load_diagnostic_data(data, ckpt, model.config.vocab_size)
        eval_batches = batches_from_tokens(found.eval_tokens, batch_size, seq_len, batches, seed)
        kwargs.update(batches=eval_batches, token_ids=found.freq_tokens, freq_source=found.freq_source,
                      with_grads=True)
        data_desc = found.eval_source + (f", from {data_note}" if data_note else "")
    report = diagnose_model(model, **kwargs)
    report = {"checkpoint": str(ckpt), "run_dir": str(run_dir) if run_dir else None, **report}
    report.setdefault("data", {})["source"] = data_desc
    if data_note and not data:
        report["notes"].append(data_note)
    if report["layers"]:
        report["pays"] = _pays(model, path, twin, find and run_dir is not None, eval_batches, device)
    report["monitor"] = monitor_summaries(run_dir)
    hashing = diagnose_hashing(model, meta, found.eval_tokens if found else None, init, init_note)
    if hashing:
        report["hashing"] = hashing
    return report


def _pays(model: Any, path: str | Path, twin: str | Path | None, find: bool, eval_batches: list | None,
          device: str) -> dict[str, Any]:
    """The pays verdict against the given or found twin, or why it was not measured."""
    if twin is None and find:
        twin, where = find_twin(run_dir_of(Path(model.checkpoint_dir)) or Path(path))
        if twin is None:
            return V.pays_not_measured(f"no dP = 0 twin given, and {where}")
    elif twin is None:
        return V.pays_not_measured("no dP = 0 twin given")
    else:
        where = f"given: {twin}"
    checked = check_twin(path, twin)
    if eval_batches is None:
        return {**V.pays_not_measured(f"the twin {twin} was found, but no evaluation data was"), "twin": str(twin)}
    other, _ = load_model(checked.path, device=pick_device(device))
    return {**paired_gain(model, other, eval_batches), "twin": str(checked.path), "twin_found": where,
            "steps": checked.step}


def pays_between(run: str | Path, twin: str | Path, data: str | None = None, *, device: str = "cpu",
                 batches: int = 16, batch_size: int = 8, seq_len: int | None = None, seed: int = 0) -> dict[str, Any]:
    """The pays verdict alone: a run against its checked dP = 0 twin on evaluation batches (default: the run's
    recorded evaluation data), what `plelab diagnose` reports as pays and the demo ends with."""
    model, meta = load_model(run, device=pick_device(device))
    checked = check_twin(run, twin)
    note = None
    if not data:
        data, note = recorded_data(meta.get("train") or {})
    if not data:
        return {**V.pays_not_measured(f"the twin {twin} was found, but {note}"), "twin": str(twin)}
    seq_len = check_seq_len(seq_len or min(256, model.config.max_seq_len), model.config.max_seq_len)
    found = load_diagnostic_data(data, Path(model.checkpoint_dir), model.config.vocab_size)
    eval_batches = batches_from_tokens(found.eval_tokens, batch_size, seq_len, batches, seed)
    other, _ = load_model(checked.path, device=pick_device(device))
    return {**paired_gain(model, other, eval_batches), "twin": str(checked.path), "steps": checked.step,
            "data": found.eval_source}


def pays_line(pays: dict[str, Any]) -> str:
    """The pays verdict in one line, with what its interval is (and is not)."""
    if not pays.get("test"):
        return f"pays: {pays['verdict'].upper()} ({pays['reason']})"
    return (f"pays: {pays['verdict'].upper()} against the dP = 0 twin {pays['twin']} ({pays['reason']}; one pair of "
            "runs: the interval is evaluation noise over the batches, not seed-to-seed spread)")


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def _health(rec: dict, view: str) -> str:
    h = rec.get("table", {}).get(view)
    if not h or "metrics" not in h:
        return "-"
    m, b = h["metrics"], h["random_empirical"]
    return (f"{m['effective_rank']:.1f}/{b['effective_rank']:.1f} "
            f"{m['pc1_explained_variance']:.3f}/{b['pc1_explained_variance']:.3f} {m['mean_cosine']:+.3f}")


def verdict_lines(r: dict) -> list[str]:
    """The two verdicts, each with what it measures: used (dependence) and pays (benefit)."""
    used = r["used"]
    lines = [f"used: {used['verdict'].upper()}{' (provisional)' if used.get('provisional') else ''} "
             f"({used['basis']}: {used['reason']})"]
    if r.get("pays"):
        lines.append(pays_line(r["pays"]))
    lines.append("  used = does the trained model depend on its table (ablation); pays = is it better than the same "
                 "training without a table (twin). Dependence is not benefit.")
    return lines


def format_report(r: dict) -> str:
    """The human-readable table of a diagnosis."""
    m = r["model"]
    lines = [f"checkpoint {r['checkpoint']}: H={m['hidden_size']} L={m['num_layers']} dP={m['ple_dim']} "
             f"PLE layers {m['ple_layers']}"]
    o = r["used"]
    if not r["layers"]:
        return "\n".join(lines + [f"used: n/a ({o['reason']})"] + [f"note: {n}" for n in r["notes"]])
    lines += verdict_lines(r)
    data = r.get("data", {})
    if data.get("batches"):
        lines.append(f"data: {data['batches']} batches, {data['tokens']:,} tokens from {data.get('source')}")
        lines.append(f"loss with PLE {o['loss_full']:.4f}; all PLE off: delta {o['ablation_delta_loss']:+.4f} "
                     f"(zero {o['ablation_delta_loss_zero']:+.4f}, shuffle {o['ablation_delta_loss_shuffle']:+.4f}, "
                     f"table {o['ablation_delta_loss_table']:+.4f}), noise {o['noise']:.4f}")
    for name, d in r.get("domains", {}).items():
        lines.append(f"  domain {name:<18} loss {d['loss_full']:.4f}  all PLE off: delta {d['delta']:+.4f} "
                     f"({d['primary_mode']}), noise {d['noise']:.4f} -> {d['verdict']}")
    header = (f"{'layer':>5} {'used':<12} {'inj.ratio':>9} {'|gate|':>7} {'gate~0':>7} {'dL zero':>8} "
              f"{'dL shuf':>8} {'dL table':>8} {'dL':>8} {'noise':>7}  {'frequent: erank/rand PC1/rand cos':<34} "
              f"{'delta: erank/rand PC1/rand cos'}")
    lines += ["", header]
    for x in r["layers"]:
        lines.append(
            f"{x['layer']:>5} {x['verdict']:<12} {_num(x['injection_ratio'], '9.4f')}"
            f" {_num(x['gate_mean_abs'], '7.4f')} {_num(x['gate_near_zero_frac'], '7.1%')}"
            f" {_num(x['ablation_delta_loss_zero'], '+8.4f')}"
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
        lines.append(f"monitor {name} used verdict (step {s.get('step')}): {V.used_label(s.get('verdict'))}")
    lines += ["", "rules:"] + [f"  - {rule}" for rule in r["rules"]]
    defs = {**r["definitions"], **r["table_health"]["definitions"]}
    lines += ["definitions:"] + [f"  {k}: {v}" for k, v in defs.items()]
    lines += [f"note: {n}" for n in r["notes"]]
    return "\n".join(lines)
