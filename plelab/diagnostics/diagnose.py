"""One call that runs every diagnostic on a model and returns a JSON-ready report with its used verdict.

The report answers whether the model *uses* its table (ablation: dependence). Whether the table *pays* (the
model against its dP = 0 twin) needs a second model: plelab.diagnostics.diagnose_run adds it."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import nn

from plelab.diagnostics import verdict as V
from plelab.diagnostics.ablation import ABLATION_MODES, ablation_study
from plelab.diagnostics.batches import random_batches
from plelab.diagnostics.gates import GATE_NEAR_ZERO
from plelab.diagnostics.grads import grad_norm_ratios
from plelab.diagnostics.injection import probe_layers
from plelab.diagnostics.model_parts import as_batches, lm_loss, model_device, ple_layers, unwrap
from plelab.diagnostics.table_health import DEFAULT_TOP_K, table_health
from plelab.util.json_values import jsonable

DEFINITIONS = {
    "injection_ratio": "RMS of the PLE contribution y that the layer adds to the residual / RMS of the hidden "
    "state h it is added to (after the layer's attention and FFN), pooled over the probe batches",
    "gate_mean_abs": "mean |g| of the gate that multiplies the layer's PLE vector (per token and channel for "
    "the input-dependent gate, the learned value for scalar/vector gates); behind the output RMSNorm its absolute "
    "scale is normalised away, so the injection ratio, not |g|, says whether the signal reaches the residual",
    "gate_near_zero_frac": f"fraction of gate elements with |g| < {GATE_NEAR_ZERO}",
    "ablation_delta_loss": "loss with the layer's PLE switched off - loss with it on (nats/token; positive = the "
    "trained model depends on it, which is not the same as PLE helping: see pays): the smallest of the 'zero' "
    "(y := 0), 'shuffle' (y permuted across token positions) and 'table' (the layer's table rows permuted across "
    "positions) ablations",
    "ablation_se": "standard error of the paired per-batch deltas of that ablation",
    "grad_ratio_gate / _proj / _table": "||grad|| of the layer's gate weights / its dP->H projection / its table "
    "slice, divided by ||grad|| of all non-PLE (trunk) parameters, from one backward pass",
}

THRESHOLDS = {
    "USED_MARGIN": V.USED_MARGIN, "NOISE_SIGMAS": V.NOISE_SIGMAS, "PAYS_MARGIN": V.PAYS_MARGIN, "ALPHA": V.ALPHA,
    "DEAD_INJECTION_RATIO": V.DEAD_INJECTION_RATIO,
    "GATE_NEAR_ZERO": GATE_NEAR_ZERO,
}


def _one_backward_grad_ratios(model: nn.Module, batch: tuple) -> dict | None:
    """Gradient ratios from one backward pass on `batch`, leaving the model's .grad as it found them."""
    params = list(model.parameters())
    if any(p.grad is not None for p in params):
        return None
    try:
        loss, _ = lm_loss(model, *batch)
        loss.backward()
        return grad_norm_ratios(model)
    finally:
        for p in params:
            p.grad = None


def layer_record(i: int, probe: dict, abl: dict | None, table: dict, grads: dict | None) -> dict:
    """One layer's report row: probes, ablation, table health and its used verdict."""
    views = {name: view["layers"][i] for name, view in table.get("views", {}).items() if view.get("available")}
    judged = V.layer_verdict(probe, abl, views)
    rec = {"layer": i, **judged, **probe}
    rec["ablation_delta_loss"] = abl["delta"] if abl else None
    rec["ablation_se"] = abl["se"] if abl else None
    rec["noise"] = V.noise_of(abl["se"]) if abl else None
    for mode in ABLATION_MODES:
        rec[f"ablation_delta_loss_{mode}"] = abl[mode]["delta"] if abl and mode in abl else None
    g = (grads or {}).get("layers", {}).get(i, {})
    for part in ("gate", "proj", "table"):
        rec[f"grad_ratio_{part}"] = g.get(part)
    rec["table"] = views
    return rec


def diagnose_model(
    model: nn.Module,
    batches: Iterable | None = None,
    token_ids: np.ndarray | None = None,
    freq_source: str = "the given token ids",
    init_table: np.ndarray | torch.Tensor | None = None,
    init_note: str = "no initial table given",
    top_k: int = DEFAULT_TOP_K,
    with_grads: bool = False,
    probe_shape: tuple[int, int] = (4, 64),
) -> dict:
    """Every PLE diagnostic plus the used verdicts, as a JSON-ready dict (see DEFINITIONS and verdict.RULES).

    batches: (x, y) evaluation batches; they drive the probe, the ablation and (with_grads) one backward pass.
    Without them, random token batches of `probe_shape` feed only the injection/gate probe and the verdict
    falls back on proxies. token_ids: ids whose frequencies pick the table rows (e.g. training tokens; default:
    the evaluation batches' inputs).
    """
    bare = unwrap(model)
    cfg = bare.config
    layers = ple_layers(bare)
    report: dict = {
        "model": {"hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "ple_dim": cfg.ple.dim,
                  "ple_layers": layers, "ple_vocab_size": cfg.ple_vocab_size if layers else 0},
        "rules": V.RULES, "thresholds": THRESHOLDS, "definitions": DEFINITIONS, "notes": [],
    }
    if not layers:
        report.update(used=V.overall_verdict([], None), layers=[], table_health={})
        report["notes"].append("the model has no PLE (dP = 0): nothing to diagnose")
        return jsonable(report)
    data = as_batches(batches, model_device(bare), cfg.vocab_size) if batches is not None else []
    labelled = [b for b in data if b[1] is not None]
    if labelled:
        probe_data = labelled
        report["data"] = {"batches": len(labelled), "tokens": sum(int(x.numel()) for x, _ in labelled)}
    else:
        b, t = probe_shape
        length = min(t, cfg.max_seq_len)
        probe_data = as_batches(random_batches(cfg.vocab_size, b, length, 2), model_device(bare))
        report["data"] = {"batches": 0, "tokens": 0}
        report["notes"].append("no evaluation data: injection and gate statistics come from random token batches, "
                               "and the verdict rests on proxies; ablation (the primary evidence) needs data")
    if token_ids is None and labelled:
        token_ids = torch.cat([x.reshape(-1) for x, _ in labelled]).cpu().numpy()
        freq_source = "the evaluation batches"
    probes = probe_layers(bare, probe_data)
    abl = ablation_study(bare, labelled) if labelled else None
    if abl and abl["n_batches"] < 2:
        report["notes"].append("one evaluation batch: no noise estimate, so the noise band is taken as 0")
    grads = _one_backward_grad_ratios(bare, labelled[0]) if with_grads and labelled else None
    table = table_health(bare, token_ids, init_table, top_k, freq_source, init_note)
    recs = [layer_record(i, probes[i], abl["layers"][i] if abl else None, table, grads) for i in layers]
    used = V.overall_verdict([r["verdict"] for r in recs], abl["all"] if abl else None)
    if abl:
        used.update(loss_full=abl["loss_full"], ablation_delta_loss=abl["all"]["delta"],
                    ablation_se=abl["all"]["se"], noise=V.noise_of(abl["all"]["se"]),
                    **{f"ablation_delta_loss_{m}": abl["all"][m]["delta"] for m in abl["modes"]})
    report.update(used=used, layers=recs)
    report["table_health"] = {
        "top_k": table["top_k"],
        "views": {k: {kk: vv for kk, vv in v.items() if kk != "layers"} for k, v in table["views"].items()},
        "definitions": table["definitions"],
    }
    if grads is not None:
        report["grad_ratios"] = {k: v for k, v in grads.items() if k != "layers"}
    return jsonable(report)
