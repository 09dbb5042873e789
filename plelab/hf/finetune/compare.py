"""Did fine-tuning change how much the model uses its PLE? The merged folder against its base, same batches.

"Use" is what `plelab diagnose` measures: the loss increase when every layer's PLE is switched off (zero,
shuffle or table ablation), per evaluation batch. Both models see the same batches, so the change is a paired
difference per batch, d_i = (off - full)_tuned,i - (off - full)_base,i, reported as its mean, standard error,
95 % t interval and two-sided t-test p for each mode (plelab.stats; the unit is the evaluation batch, so the
interval speaks about these evaluation data, not about repeating the fine-tune with other seeds).
The verdict uses the mode that is primary for the base model (the smallest loss increase,
as diagnose chooses it) and diagnose's used rule (plelab.diagnostics.verdict.used_verdict) on the change: "more" if
the mean change exceeds max(margin, 2 standard errors), "less" if it is below minus that, "unchanged" only when the
change's 90 % interval lies inside +-margin (an equivalence test) and no change is resolved, "more, within margin" /
"less, within margin" when a change is resolved inside the margin, else "not resolved". Per layer, the
injection ratio |y| / |h| of both models is shown beside it. The two models are measured one after the other,
so only one is in memory at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from plelab.data.tokenizer import Tokenizer, tokenizer_difference
from plelab.diagnostics import verdict as V
from plelab.diagnostics.ablation import ABLATION_MODES, pooled_loss
from plelab.errors import PlelabError
from plelab.hf.checkpoint import HFCheckpoint
from plelab.hf.diagnose import hf_batch_losses, hf_ple_ablated, hf_probe_layers
from plelab.hf.model import HFTextModel
from plelab.stats.paired import paired, t_interval, t_test


def measure_ple_use(model: HFTextModel, batches: list, layers: list[int] | None = None) -> dict[str, Any]:
    """Per-batch (loss, count) with PLE on and with all of it off in each ablation mode, and injection ratios."""
    layers = list(range(model.ckpt.num_layers)) if layers is None else layers
    device = next(model.lm.parameters()).device
    batches = [(x.to(device), y.to(device)) for x, y in batches]
    off = {}
    for mode in ABLATION_MODES:
        with hf_ple_ablated(model, layers, mode):
            off[mode] = hf_batch_losses(model, batches)
    probes = hf_probe_layers(model, batches, layers)
    return {"full": hf_batch_losses(model, batches), "off": off, "layers": layers,
            "injection_ratio": {i: probes[i]["injection_ratio"] for i in layers}}


def _paired(base: dict, tuned: dict, mode: str, idx: list[int]) -> dict[str, Any]:
    deltas = {}
    for name, m in (("base", base), ("tuned", tuned)):
        full, off = [m["full"][i] for i in idx], [m["off"][mode][i] for i in idx]
        per_batch = {i: o - f for i, (o, _), (f, _) in zip(idx, off, full, strict=True)}
        deltas[name] = (pooled_loss(off) - pooled_loss(full), per_batch)
    change = paired(deltas["base"][1], deltas["tuned"][1])  # per batch: tuned's increase minus base's
    return {"base_delta": deltas["base"][0], "tuned_delta": deltas["tuned"][0], "change": change["mean"],
            "se": change["se"], "n": change["n"], "ci95": t_interval(change["mean"], change["se"], change["n"]),
            "p": t_test(change["mean"], change["se"], change["n"])["p"]}


def _verdict(change: float, se: float, n: int) -> tuple[str, str]:
    """(more / less / unchanged / not resolved, reason): the used rule applied to the paired change in use."""
    judged = V.used_verdict(change, se, n)
    word = {"used": "more", "used, within margin": "more, within margin", "harmful": "less",
            "harmful, within margin": "less, within margin", "unused": "unchanged"}.get(judged["verdict"],
                                                                                       "not resolved")
    reason = judged["reason"].replace("switching it off changes the loss by", "the PLE-off loss increase changed by")
    return word, reason


def compare_ple_use(base: dict[str, Any], tuned: dict[str, Any], domains: list[str]) -> dict[str, Any]:
    """The paired comparison of two `measure_ple_use` results on the same batches (see the module doc)."""
    every = list(range(len(base["full"])))
    modes = {mode: _paired(base, tuned, mode, every) for mode in ABLATION_MODES}
    primary = min(ABLATION_MODES, key=lambda m: modes[m]["base_delta"])
    result: dict[str, Any] = {"primary_mode": primary, "modes": modes, "n_batches": len(every)}
    result["verdict"], result["reason"] = _verdict(modes[primary]["change"], modes[primary]["se"], modes[primary]["n"])
    result["domains"] = {}
    for name in dict.fromkeys(domains):
        d = _paired(base, tuned, primary, [k for k, dom in enumerate(domains) if dom == name])
        d["verdict"], d["reason"] = _verdict(d["change"], d["se"], d["n"])
        result["domains"][name] = d
    result["layers"] = {i: {"injection_ratio_base": base["injection_ratio"][i],
                            "injection_ratio_tuned": tuned["injection_ratio"][i]} for i in base["layers"]}
    result["definitions"] = {"change": "mean over batches of the tuned model's PLE-off loss increase minus the "
                                       "base model's, on the same batches (nats per token)",
                             "se": "standard error of that paired mean"}
    return result


def format_comparison(c: dict[str, Any], base: str) -> list[str]:
    """Text lines of a comparison for diagnose's report."""
    m = c["modes"][c["primary_mode"]]
    lines = [f"fine-tuning vs base {base}: PLE use {c['verdict'].upper()} ({c['reason']}; "
             f"{c['primary_mode']} ablation: base {m['base_delta']:+.4f}, fine-tuned {m['tuned_delta']:+.4f}, "
             f"paired change {m['change']:+.4f} +- {m['se']:.4f} SE over {c['n_batches']} batches)"]
    for name, d in c["domains"].items():
        lines.append(f"  domain {name:<18} change {d['change']:+.4f} +- {d['se']:.4f} -> {d['verdict']}")
    lines.append("  injection ratio per layer, base -> fine-tuned: " + "; ".join(
        f"{i}: {x['injection_ratio_base']:.4f} -> {x['injection_ratio_tuned']:.4f}" for i, x in c["layers"].items()))
    return lines


def check_comparable(tuned: str | Path, base: str | Path) -> None:
    """Refuse (one line) a base that cannot be what `tuned` was fine-tuned from: another family, another tensor
    shape anywhere in the text model (vocabulary, width, layers, PLE table), or another tokenizer."""
    a, b = HFCheckpoint.open(tuned), HFCheckpoint.open(base)
    why = None
    if a.family != b.family:
        why = f"it is a {b.family} checkpoint and {tuned} a {a.family} one"
    else:
        shapes_a, shapes_b = ({k: tuple(v.shape) for k, v in c.tensors.items()} for c in (a, b))
        name = next((k for k in sorted(shapes_a.keys() | shapes_b.keys()) if shapes_a.get(k) != shapes_b.get(k)), None)
        if name is not None:
            why = (f"its {name} is {shapes_b.get(name) or 'absent'} against {shapes_a.get(name) or 'absent'} in "
                   f"{tuned}")
        elif a.tokenizer_json and b.tokenizer_json:
            diff = tokenizer_difference(Tokenizer.load(a.tokenizer_json), Tokenizer.load(b.tokenizer_json))
            why = f"the tokenizers differ: {diff}" if diff else None
    if why:
        raise PlelabError(f"--base {base} is not the model {tuned} was fine-tuned from ({why}); give the folder "
                          "it was trained from")


def diagnose_against_base(path: str, data: str, base: str, progress: Callable[[str], None] | None = None,
                          **options: Any) -> dict[str, Any]:
    """`plelab diagnose --hf PATH` of a merged fine-tune, with report["finetune"]: its PLE use against the base
    folder's on the same batches (one model in memory at a time). options: those of open_for_diagnosis;
    progress: see diagnose_hf."""
    from plelab.hf.diagnose import folder_report, open_for_diagnosis

    gone = not Path(base).is_dir()
    if not gone:
        check_comparable(path, base)  # before either model is loaded
    model, kwargs, data_desc = open_for_diagnosis(path, data, **options)
    report = folder_report(model, kwargs, data_desc, progress)
    tuned = measure_ple_use(model, kwargs["batches"], options.get("layers"))
    del model
    if gone:
        report["notes"].append(f"the base folder {base} is gone: no comparison of PLE use with it (pass --base PATH)")
        return report
    options.pop("data", None)
    base_model, _, _ = open_for_diagnosis(base, None, **options)
    comparison = compare_ple_use(measure_ple_use(base_model, kwargs["batches"], options.get("layers")), tuned,
                                 kwargs["domains"])
    report["finetune"] = {"base": str(base), **comparison}
    return report
