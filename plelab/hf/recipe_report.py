"""The quantization recipe's report: the per-group KL table, the chosen recipes beside the uniform baselines, and
a heatmap (OUT/report.md, OUT/report.html, OUT/plots/recipe_kl.png)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

GROUP_LABELS = {
    "ple_table": "PLE table", "ple_context": "PLE context projection", "ple_projection": "PLE projections (per layer)",
    "ple_gate": "PLE gates (per layer)", "attention": "attention", "ffn": "FFN", "embedding": "embedding / head",
}


KL_FLOOR = 1e-8
"""KL values below this are float32 rounding (an f16 copy of the weights measures ~1e-9 .. 1e-8; exactly
equal weights can come out slightly negative): shown as '<1e-8'."""


def kl_text(x: float | None) -> str:
    """A KL value for a table cell (3 significant digits; '-' for none; '<1e-8' at the numerical floor)."""
    if x is None or not math.isfinite(x):
        return "-"
    return f"<{KL_FLOOR:.0e}" if x < KL_FLOOR else f"{x:.3g}"


def table_rows(result: dict[str, Any], key: str = "kl") -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the per-group table: one row per group, one column per format."""
    formats = result["formats"]
    headers = ["group", "params", *formats]
    rows = []
    for g, row in result["table"].items():
        cells = [GROUP_LABELS.get(g, g), f"{result['group_params'].get(g, 0):,}"]
        for f in formats:
            c = row.get(f, {})
            cells.append("n/a" if not c.get("bytes") else kl_text(c.get(key)))
        rows.append(cells)
    return headers, rows


def _pm(m: dict[str, Any], key: str, spec: str) -> str:
    se = m.get(f"{key}_se")
    return format(m[key], spec) + (f" ± {format(se, '.2g')}" if se is not None else "")


def recipe_rows(result: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): each family's recipe and its uniform baselines, with bytes, measured KL and Δloss (± the
    standard error over windows), and the recipe's KL minus each baseline's, paired window by window."""
    headers = ["family", "weights", "bytes", "KL (nats/token)", "Δloss (nats/token)", "recipe KL − this", "formats"]
    rows = []
    for family, r in result["recipes"].items():
        chosen = ", ".join(f"{GROUP_LABELS.get(g, g)} {f}" for g, f in r["formats"].items())
        rows.append([family, f"recipe within {r['budget_text']}", f"{r['bytes']:,}", _pm(r["measured"], "kl", ".3g"),
                     _pm(r["measured"], "delta_loss", "+.4f"), "", chosen])
        for name, b in r["baselines"].items():
            p = b.get("recipe_minus_this")
            diff = f"{p['kl_diff']:+.3g} ± {p['se']:.2g}" if p else ""
            rows.append([family, f"uniform {name}", f"{b['bytes']:,}", _pm(b, "kl", ".3g"),
                         _pm(b, "delta_loss", "+.4f"), diff, ""])
    return headers, rows


def heatmap_png(result: dict[str, Any]) -> bytes | None:
    """log10 KL per group x format (None without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:
        return None
    groups = list(result["table"])
    formats = result["formats"]
    grid = np.full((len(groups), len(formats)), np.nan)
    for i, g in enumerate(groups):
        for j, f in enumerate(formats):
            c = result["table"][g].get(f, {})
            if c.get("bytes") and c.get("kl") is not None:
                grid[i, j] = math.log10(max(c["kl"], KL_FLOOR))
    fig, ax = plt.subplots(figsize=(max(6.0, 2.5 + 0.75 * len(formats)), 1.2 + 0.45 * len(groups)))
    im = ax.imshow(grid, cmap="magma_r", aspect="auto")
    ax.set_xticks(range(len(formats)), formats, rotation=45, ha="right")
    ax.set_yticks(range(len(groups)), [GROUP_LABELS.get(g, g) for g in groups])
    for i in range(len(groups)):
        for j in range(len(formats)):
            if math.isfinite(grid[i, j]):
                label = f"{10 ** grid[i, j]:.2g}" if grid[i, j] > math.log10(KL_FLOOR) else "<1e-8"
                ax.text(j, i, label, ha="center", va="center", fontsize=7,
                        color="white" if grid[i, j] > np.nanmean(grid) else "black")
    fig.colorbar(im, ax=ax, label="log10 KL to the unquantized model (nats/token)")
    ax.set_title("One group quantized at a time (blank: the format cannot hold the group)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def write_recipe_report(result: dict[str, Any], out: Path) -> list[Path]:
    """Write report.md / report.html / plots/recipe_kl.png into `out`."""
    from plelab.util.pages import write_pages

    headers, rows = table_rows(result)
    dh, drows = table_rows(result, "delta_loss")
    rh, rrows = recipe_rows(result)
    ref = result["reference"]
    blocks = [
        ("h", 1, f"Quantization recipe: {result['source']}"),
        ("p", f"Held-out: {result['held_out']}; {result['positions']:,} scored positions; unquantized loss "
              f"{ref['loss']:.4f} nats/token. KL(p_unquantized || p_quantized) is averaged over positions."),
        ("h", 2, "KL when one group is quantized (nats/token)"),
        ("table", headers, rows),
        ("h", 2, "Δloss when one group is quantized (nats/token)"),
        ("table", dh, drows),
        ("h", 2, "Recipes, measured with every chosen group quantized at once"),
        ("table", rh, rrows),
    ]
    for family, f in result.get("files", {}).items():
        line = f"{family} file: `{f['path']}` ({f['file_bytes']:,} bytes)"
        m = f.get("measured") or f.get("measured_in_llama_cpp")
        if m and "kl" in m:
            where = "in llama.cpp" if family == "gguf" else "in the NumPy runtime"
            line += f"; measured {where}: KL {_pm(m, 'kl', '.3g')}, Δloss {_pm(m, 'delta_loss', '+.4f')}"
        elif m:
            line += f"; its table rows equal the measured ones (max |Δ| {m['max_abs_diff_to_measured']:.3g} over " \
                    f"{m['rows_checked']} rows)"
        blocks.append(("p", line))
    if result.get("notes"):
        blocks.append(("list", result["notes"]))
    png = heatmap_png(result)
    if png is not None:
        blocks.append(("img", "recipe_kl", "log10 KL per group and format (one group quantized at a time)", png))
    return write_pages(blocks, "plelab quantization recipe", out, {"recipe_kl": png} if png else {})
