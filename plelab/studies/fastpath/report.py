"""The fast-path check's report: the four answers of check.check as tables, with each pass mark, written as
OUT/report.md and OUT/report.html."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab.diagnostics.verdict import RECORDED_BEFORE_EQUIVALENCE, used_label
from plelab.studies.fastpath.check import FAST, REFERENCE
from plelab.util.pages import Block, fmt, write_pages


def _ci(ci: Sequence[Any]) -> str:
    return f"[{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}]"


def final_blocks(result: dict[str, Any]) -> list[Block]:
    """Question 1: the final loss of both paths per dP, the paired Δ and its marks (held-out split, then macro)."""
    blocks: list[Block] = []
    for key, title in (("final_heldout", "Final held-out loss (val split)"), ("final_macro", "Final macro loss")):
        rows = [[str(r["dim"]), f"{fmt(r[REFERENCE]['mean'])} ± {fmt(r[REFERENCE]['seed_sd'])}",
                 f"{fmt(r[FAST]['mean'])} ± {fmt(r[FAST]['seed_sd'])}",
                 f"{fmt(r['delta']['mean'], '+.5f')} ± {fmt(r['delta']['se'], '.5f')}", _ci(r["delta"]["ci95"]),
                 str(r["passes"]), str(r["equivalent"])] for r in result[key]]
        blocks += [("h", 2, title),
                   ("table", ["dP", "fp32 mean ± seed sd", "bf16-head mean ± seed sd", "paired Δ ± s.e.",
                              "95 % interval", "abs(Δ) < seed sd", "equivalent"], rows)]
    return blocks


def effect_blocks(result: dict[str, Any]) -> list[Block]:
    """Question 2: the PLE effect on each path and the difference of the two effects."""
    rows = [[str(r["dim"]), f"{fmt(r['effect'][REFERENCE]['mean'], '+.4f')} ± {fmt(r['effect'][REFERENCE]['seed_sd'])}",
             f"{fmt(r['effect'][FAST]['mean'], '+.4f')} ± {fmt(r['effect'][FAST]['seed_sd'])}",
             f"{fmt(r['delta']['mean'], '+.4f')} ± {fmt(r['delta']['se'])}", str(r["passes"])]
            for r in result["ple_effect"]]
    return [("h", 2, "PLE effect (loss(dP) - loss(0), paired by seed, held-out)"),
            ("table", ["dP", "fp32 effect ± seed sd", "bf16-head effect ± seed sd", "difference ± s.e.",
                       "abs(diff) < seed sd"], rows)]


def curve_blocks(result: dict[str, Any]) -> list[Block]:
    """Question 3: the training-loss curves' mean difference against the seed spread."""
    rows = [[str(r["dim"]), str(r["steps"]), fmt(r["mean_diff"], "+.4f"), fmt(r["mean_abs_diff"]),
             fmt(r["mean_seed_sd"]), f"{fmt(r['mean_diff_over_seed_sd'], '+.3f')} (< {r['threshold']})",
             str(r["passes"])] for r in result["curves"]]
    return [("h", 2, "Training-loss curves"),
            ("table", ["dP", "steps compared", "mean diff", "mean abs(diff)", "mean seed sd", "mean diff / seed sd",
                       "passes"], rows)]


def verdict_blocks(result: dict[str, Any]) -> list[Block]:
    """Question 4: `plelab diagnose` on both paths' runs, pair by pair (nothing when it was skipped)."""
    v = result.get("verdicts")
    if not v:
        return [("h", 2, "plelab diagnose verdicts"), ("p", "Not run (--no-diagnose).")]
    def shown(d: dict[str, Any]) -> str:
        return f"{used_label(d['verdict'])} {[used_label(x) for x in d['layers']]}"
    rows = [[str(r["dim"]), str(r["seed"]), shown(r[REFERENCE]), shown(r[FAST])] for r in v["rows"]]
    recorded = {x for r in v["rows"] for side in (REFERENCE, FAST) for x in [r[side]["verdict"], *r[side]["layers"]]}
    old = sorted(recorded & set(RECORDED_BEFORE_EQUIVALENCE))
    note = ([("p", f"The used verdicts (overall, then per layer). Recorded before the equivalence test under the "
                   f"names {', '.join(old)}, shown under today's: alive is used; weak and dead are 'not used' "
                   "(unused and not resolved cannot be told apart without the test).")] if old else
            [("p", "The used verdicts (overall, then per layer).")])
    return [("h", 2, f"plelab diagnose verdicts: {v['agree']} of {v['compared']} pairs agree"), *note,
            ("table", ["dP", "seed", "fp32", "bf16-head"], rows)]


def fastpath_blocks(result: dict[str, Any]) -> list[Block]:
    """The whole report."""
    return [("h", 1, f"Fast-path check: {result['folder']}"),
            ("p", f"{result['runs']} finished runs, {result['steps']} steps. Overall: "
                  f"**{'PASS' if result['passes'] else 'FAIL'}** (criteria: plelab/studies/fastpath/check.py)."),
            *final_blocks(result), *effect_blocks(result), *curve_blocks(result), *verdict_blocks(result)]


def write_fastpath_report(result: dict[str, Any], out_dir: str | Path, *, overwrite: bool = True,
                          inputs: Sequence[str | Path] = (), records: dict[str, Any] | None = None) -> list[Path]:
    """Write OUT/report.md and OUT/report.html; return the paths."""
    return write_pages(fastpath_blocks(result), f"plelab fast-path check: {result['folder']}", out_dir, {},
                       overwrite=overwrite, inputs=inputs, records=records)
