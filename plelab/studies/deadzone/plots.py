"""The dead-zone report's figures (PNG bytes): loss vs dP, loss curves, injection heatmaps, table health, domains.

Each function takes one analysed group (analysis.analyze_group) and returns PNG bytes, or None when the
sweep holds nothing to draw (e.g. no PLE run, no diagnostics logged).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from plelab.diagnostics.verdict import used_label
from plelab.experiments.figures import dim_colors, plt, png
from plelab.runs.metrics import read_metrics

CLASS_COLORS = {"dead zone": "tab:red", "not resolved": "tab:olive", "transition": "tab:green",
                "diminishing returns": "tab:orange", "improvement": "tab:blue", "worse": "tab:purple",
                "n/a": "tab:gray"}
LAYER_KEY = re.compile(r"^ple/injection_ratio/layer(\d+)$")


def _f(x: Any) -> float:
    return float(x) if isinstance(x, (int, float)) and x is not None else math.nan


def loss_vs_dim(group: dict[str, Any]) -> bytes | None:
    """Final loss (mean +- seed std, seeds as dots) at each dP, steps coloured by their class."""
    table = group["table"]
    if not table:
        return None
    x = np.arange(len(table))
    means = np.array([_f(r["loss_mean"]) for r in table])
    stds = np.nan_to_num(np.array([_f(r["loss_std"]) for r in table]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    ref = table[0]
    ax.axhspan(means[0] - stds[0], means[0] + stds[0], color="0.9", zorder=0, label=f"dP={ref['ple_dim']} +- std")
    for i, r in enumerate(table):
        seeds = [p["loss"] for p in group["runs"] if p["ple_dim"] == r["ple_dim"] and p["loss"] is not None]
        ax.scatter([i] * len(seeds), seeds, s=12, color="0.55", zorder=2)
    for i, s in enumerate(group["steps"]):
        ax.plot([i, i + 1], means[i:i + 2], color=CLASS_COLORS.get(s["class"], "k"), lw=2.5, zorder=1,
                label=s["class"])
    ax.errorbar(x, means, yerr=stds, fmt="o", color="k", capsize=4, zorder=3, label="mean +- seed std")
    labels = [f"{r['ple_dim']}\n+{r['pct_of_base'] or 0:.0f}%" for r in table]
    ax.set_xticks(x, labels)
    ax.set_xlabel("dP (PLE width)  /  added parameters as % of the dP=0 model")
    ax.set_ylabel("final eval loss (nats/token, macro over domains)")
    handles, names = ax.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax.legend(unique.values(), unique.keys(), fontsize=8)
    ax.set_title("Loss vs dP")
    ax.grid(alpha=0.3)
    return png(fig)


def _smooth(y: np.ndarray, window: int) -> np.ndarray:
    if window <= 1 or len(y) < window:
        return y
    kernel = np.ones(window) / window
    return np.convolve(y, kernel, mode="valid")


def _mean_curve(runs: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds of the loss curves (cut to the shortest), smoothed by a moving average of ~5 % of the steps."""
    n = min(len(s) for s, _ in runs)
    window = max(1, n // 20)
    y = _smooth(np.mean([loss[:n] for _, loss in runs], axis=0), window)
    return runs[0][0][:n][n - len(y):], y


def loss_curves(group: dict[str, Any]) -> bytes | None:
    """Training loss per dP (moving average, mean over seeds); right panel zooms into the second half."""
    dims = sorted({p["ple_dim"] for p in group["runs"]})
    colors = dim_colors(dims)
    curves: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
    for p in group["runs"]:
        train, _ = read_metrics(Path(p["dir"]))
        pts = [(m["step"], m["loss"]) for m in train if m.get("loss") is not None]
        if pts:
            curves.setdefault(p["ple_dim"], []).append(tuple(map(np.array, zip(*pts, strict=True))))
    if not curves:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    tails = []
    for dim in (d for d in dims if d in curves):
        x, y = _mean_curve(curves[dim])
        for ax in axes:
            ax.plot(x, y, color=colors[dim], label=f"dP={dim}")
        tails.append((x[len(x) // 2], y[len(y) // 2:]))
    lo = min(float(t.min()) for _, t in tails)
    hi = max(float(t.max()) for _, t in tails)
    pad = 0.05 * (hi - lo) + 1e-6
    axes[1].set_xlim(min(x0 for x0, _ in tails), None)
    axes[1].set_ylim(lo - pad, hi + pad)
    axes[0].set_title("training loss (moving average, mean over seeds)")
    axes[1].set_title("second half, zoomed")
    for ax in axes:
        ax.set_xlabel("step")
        ax.set_ylabel("loss (nats/token)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    return png(fig)


def injection_series(run_dir: Path) -> tuple[list[int], np.ndarray] | None:
    """(logged steps, layers x steps matrix) of `ple/injection_ratio/layer{i}` from a run's metrics.jsonl."""
    train, _ = read_metrics(run_dir)
    steps, cols = [], []
    for m in train:
        found = {int(mm.group(1)): v for k, v in m.items() if (mm := LAYER_KEY.match(k))}
        if found:
            steps.append(m["step"])
            cols.append(found)
    if not steps:
        return None
    layers = sorted({k for c in cols for k in c})
    mat = np.array([[_f(c.get(layer)) for c in cols] for layer in layers])
    return steps, mat


def injection_heatmap(group: dict[str, Any]) -> bytes | None:
    """Per dP: log10 injection ratio (PLE contribution RMS / hidden RMS), layer x step, mean over seeds."""
    per_dim: dict[int, list[tuple[list[int], np.ndarray]]] = {}
    for p in group["runs"]:
        if p["ple_dim"]:
            series = injection_series(Path(p["dir"]))
            if series:
                per_dim.setdefault(p["ple_dim"], []).append(series)
    if not per_dim:
        return None
    dims = sorted(per_dim)
    mats = {}
    for d in dims:
        n = min(len(s) for s, _ in per_dim[d])
        with np.errstate(divide="ignore", invalid="ignore"):
            mats[d] = (per_dim[d][0][0][:n], np.log10(np.nanmean([m[:, :n] for _, m in per_dim[d]], axis=0)))
    finite = np.concatenate([m[np.isfinite(m)].ravel() for _, m in mats.values()])
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (-3.0, 0.0)
    fig, axes = plt.subplots(len(dims), 1, figsize=(8, 1.1 + 0.9 * len(dims) + 0.15 * sum(
        m.shape[0] for _, m in mats.values())), squeeze=False)
    for ax, d in zip(axes[:, 0], dims, strict=True):
        steps, m = mats[d]
        im = ax.imshow(m, aspect="auto", origin="lower", cmap="magma", vmin=vmin, vmax=vmax, interpolation="nearest")
        ticks = np.linspace(0, len(steps) - 1, min(len(steps), 8)).astype(int)
        ax.set_xticks(ticks, [str(steps[t]) for t in ticks], fontsize=7)
        ax.set_yticks(range(m.shape[0]), [str(i) for i in range(m.shape[0])], fontsize=7)
        ax.set_ylabel(f"dP={d}\nlayer", fontsize=8)
    axes[-1, 0].set_xlabel("step")
    fig.colorbar(im, ax=axes[:, 0].tolist(), label="log10 injection ratio")
    axes[0, 0].set_title("Per-layer injection ratio over training (mean over seeds)")
    return png(fig)


def table_health(group: dict[str, Any]) -> bytes | None:
    """Final table health / random baseline (1 = random-like) per dP and layer, for both views."""
    panels = [("effective_rank", "frequent"), ("effective_rank", "delta"),
              ("pc1_explained_variance", "frequent"), ("pc1_explained_variance", "delta")]
    data: dict[tuple[str, str], dict[int, dict[int, list[float]]]] = {k: {} for k in panels}
    for p in group["runs"]:
        for layer in (p.get("diagnostics") or {}).get("layers", []):
            for metric, view in panels:
                t = (layer.get("table") or {}).get(view) or {}
                val, base = (t.get("metrics") or {}).get(metric), (t.get("random_empirical") or {}).get(metric)
                if val is not None and base:
                    data[(metric, view)].setdefault(p["ple_dim"], {}).setdefault(layer["layer"], []).append(val / base)
    if not any(data.values()):
        return None
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5), sharex=True)
    for ax, key in zip(axes.ravel(), panels, strict=True):
        by_dim = data[key]
        dims = sorted(by_dim)
        layers = sorted({layer for d in by_dim.values() for layer in d})
        width = 0.8 / max(1, len(layers))
        for j, layer in enumerate(layers):
            vals = [np.mean(by_dim[d].get(layer, [np.nan])) for d in dims]
            ax.bar(np.arange(len(dims)) + j * width - 0.4 + width / 2, vals, width, label=f"layer {layer}")
        ax.axhline(1.0, color="k", ls="--", lw=1, label="random Gaussian")
        ax.set_xticks(np.arange(len(dims)), [str(d) for d in dims])
        metric, view = key
        ax.set_title(f"{metric.replace('_', ' ')} / random, '{view}' view", fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    for ax in axes[1]:
        ax.set_xlabel("dP")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Table health at the end of training vs a random table of the same shape (mean over seeds)")
    return png(fig)


def domain_deltas(group: dict[str, Any]) -> bytes | None:
    """Heatmap of the per-domain loss change vs the reference dP (mean over seeds)."""
    dom = group.get("domains") or {}
    if not dom.get("rows") or len(dom["dims"]) < 2:
        return None
    dims = dom["dims"][1:]
    mat = np.array([[_f(v) for v in r["delta"][1:]] for r in dom["rows"]])
    lim = float(np.nanmax(np.abs(mat))) or 1e-3
    fig, ax = plt.subplots(figsize=(1.6 + 0.9 * len(dims), 0.9 + 0.3 * len(dom["rows"])))
    im = ax.imshow(mat, aspect="auto", cmap="RdBu_r", vmin=-lim, vmax=lim)
    ax.set_xticks(range(len(dims)), [f"dP={d}" for d in dims], fontsize=8)
    ax.set_yticks(range(len(dom["rows"])), [r["domain"] for r in dom["rows"]], fontsize=8)
    for i in range(mat.shape[0]):
        for j in range(mat.shape[1]):
            ax.text(j, i, f"{mat[i, j]:+.3f}", ha="center", va="center", fontsize=6)
    fig.colorbar(im, ax=ax, label=f"loss - loss at dP={dom['dims'][0]} (nats)")
    ax.set_title("Per-domain loss change", fontsize=10)
    return png(fig)


def early_vs_final(group: dict[str, Any]) -> bytes | None:
    """Early-warning ablation delta against the final one, per run (does the early number predict the end?)."""
    pts = []
    for p in group["runs"]:
        d = p.get("diagnostics") or {}
        e, f = (d.get("early") or {}).get("ablation_delta_loss"), (d.get("final") or {}).get("ablation_delta_loss")
        if e is not None and f is not None:
            pts.append((p["ple_dim"], e, f, used_label((d.get("final") or {}).get("verdict"))))
    if not pts:
        return None
    dims = sorted({p[0] for p in pts})
    colors = dim_colors(dims)
    markers = {"used": "o", "used, within margin": "o", "not resolved": "s", "unused": "x", "not used": "x",
               "harmful": "v", "harmful, within margin": "v"}
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for dim, e, f, verdict in pts:
        ax.scatter(e, f, color=colors[dim], marker=markers.get(verdict, "^"), s=40)
    for dim in dims:
        ax.scatter([], [], color=colors[dim], label=f"dP={dim}")
    for v, m in markers.items():
        if any(p[3] == v for p in pts):
            ax.scatter([], [], color="k", marker=m, label=f"final: {v}")
    lim = [min(min(p[1], p[2]) for p in pts), max(max(p[1], p[2]) for p in pts)]
    ax.plot(lim, lim, "k:", lw=1)
    ax.axhline(0, color="0.6", lw=0.8)
    ax.axvline(0, color="0.6", lw=0.8)
    ax.set_xlabel("early-warning ablation delta (nats: loss without PLE - with)")
    ax.set_ylabel("final ablation delta (nats)")
    ax.set_title("Early warning vs end of training, per run")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return png(fig)


def diagnostics_vs_dim(group: dict[str, Any]) -> bytes | None:
    """What PLE contributes inside each model, per dP: ablation delta (early and final) and injection ratio."""
    rows = (group.get("verdicts") or {}).get("rows") or []
    if not rows:
        return None
    x = np.arange(len(rows))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
    for key, label, style in (("ablation_final", "end of training", "o-"), ("ablation_early", "early warning", "s--")):
        m = np.array([_f(r[key]["mean"]) for r in rows])
        sd = np.nan_to_num(np.array([_f(r[key]["std"]) for r in rows]))
        ax1.errorbar(x, m, yerr=sd, fmt=style, capsize=4, label=label)
    for p in group["runs"]:
        final = ((p.get("diagnostics") or {}).get("final") or {}).get("ablation_delta_loss")
        if p["ple_dim"] and final is not None:
            ax1.scatter(next(i for i, r in enumerate(rows) if r["ple_dim"] == p["ple_dim"]), final, s=12, color="0.55")
    ax1.axhline(0, color="0.5", lw=0.8)
    ax1.set_ylabel("ablation delta (nats)")
    ax1.set_title("loss without PLE - loss with it (ablation)")
    ax1.legend(fontsize=8)
    m = np.array([_f(r["injection_ratio"]["mean"]) for r in rows])
    sd = np.nan_to_num(np.array([_f(r["injection_ratio"]["std"]) for r in rows]))
    ax2.errorbar(x, m, yerr=sd, fmt="o-", capsize=4)
    ax2.set_yscale("log")
    ax2.set_ylabel("injection ratio (final, layer mean)")
    ax2.set_title("PLE contribution RMS / hidden-state RMS")
    for ax in (ax1, ax2):
        ax.set_xticks(x, [str(r["ple_dim"]) for r in rows])
        ax.set_xlabel("dP")
        ax.grid(alpha=0.3)
    return png(fig)


FIGURES = [
    ("loss_vs_dim", "Final loss vs dP: mean +- seed-to-seed std (grey dots: single seeds); the segments are "
     "coloured by the step's class", loss_vs_dim),
    ("diagnostics_vs_dim", "PLE's contribution inside each model vs dP: ablation delta (mean +- seed std, grey dots: "
     "single runs) at the early warning and at the end, and the final injection ratio", diagnostics_vs_dim),
    ("loss_curves", "Training loss curves per dP", loss_curves),
    ("injection_heatmap", "Per-layer injection ratio over training (log10; PLEMonitor, probe batch)",
     injection_heatmap),
    ("table_health", "Table health vs random baseline at the end of training", table_health),
    ("domain_deltas", "Per-domain loss change vs the reference dP", domain_deltas),
    ("early_vs_final", "Early-warning vs final ablation delta", early_vs_final),
]
"""(file stem, caption, function) of every figure, in report order."""
