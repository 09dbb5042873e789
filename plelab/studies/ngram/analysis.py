"""Token PLE or an n-gram table? The arithmetic of the study, on plain per-seed data (records).

The sweep crosses [variants] with seeds: a dP = 0 baseline and, per table size, a token-indexed and an n-gram
table of the same bytes and the same table values read per token. Registered tests come from the sweep's analysis
plan (plelab.experiments.plan); beside them, as description: each variant's gain over the same seed's baseline
(held-out split and macro), and per domain the n-gram table's loss minus the token table's of the same size, so the
report can show which domains an n-gram table helps (code should, if it works by remembering short phrases).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.experiments.outcomes import training_compute
from plelab.experiments.plan import plan_from_inputs, plan_inputs
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE
from plelab.experiments.sweep_results import load_variant_sweep, read_json, seed_keys
from plelab.model.config import ModelConfig
from plelab.model.params import count_params, ple_table_reads
from plelab.util.dataclass_config import from_dict

RECORDS_KIND = "ngram-study"
"""records.json's kind for this study."""
MACRO = "macro"


def is_ngram_sweep(folder: str | Path) -> bool:
    """Is the folder a variant sweep with at least one n-gram-indexed variant?"""
    folder = Path(folder)
    if not (folder / DB_FILE).is_file():
        return False
    variants = (read_json(folder / RESOLVED_FILE) or {}).get("variants") or {}
    return any((v or {}).get("model.ple.index") == "ngram" for v in variants.values())


def study_records(folder: str | Path, plan: str | Path | None = None) -> dict[str, Any]:
    """Everything the analysis rests on, as plain data: variants, their model configs, per-seed final evaluations,
    and the plan's inputs."""
    data = load_variant_sweep(folder)
    return {"kind": RECORDS_KIND, "sweep": data["sweep"], "baseline": data["baseline"], "variants": data["variants"],
            "models": {v: c["model"] for v, c in data["configs"].items()},
            "finals": data["finals"], "counts": data["counts"], "total_runs": data["total_runs"],
            "plan_inputs": plan_inputs(folder, plan)}


def _metric(domains: dict[str, dict[str, float]], metric: str) -> float | None:
    if metric == MACRO:
        vals = [d["loss"] for name, d in domains.items() if name != HELDOUT_DOMAIN and _finite(d.get("loss"))]
        return sum(vals) / len(vals) if vals else None
    value = (domains.get(metric) or {}).get("loss")
    return value if _finite(value) else None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def paired_metric(finals: dict[str, dict[int, Any]], arm: str, reference: str, metric: str,
                  margin: float | None, alpha: float = stats.ALPHA) -> dict[str, Any]:
    """loss(arm) - loss(reference) per seed on one metric, and its four-way verdict (plelab.stats.compare)."""
    ref = {s: _metric(d, metric) for s, d in finals.get(reference, {}).items()}
    mine = {s: _metric(d, metric) for s, d in finals.get(arm, {}).items()}
    p = stats.paired({s: v for s, v in ref.items() if v is not None}, {s: v for s, v in mine.items() if v is not None})
    return {"arm": arm, "reference": reference, "metric": metric, "n": p["n"], "mean": p["mean"], "se": p["se"],
            "per_seed": p["per_seed"], **{k: v for k, v in stats.compare(p["mean"], p["se"], p["n"], margin,
                                                                           alpha).items()
                                          if k in ("ci95", "p", "outcome")}}


def table_shape(model: dict[str, Any]) -> dict[str, Any]:
    """Index, dP, table parameters and table values read per token of a variant's model (plelab.model.params)."""
    cfg = from_dict(ModelConfig, model)
    counts, index = count_params(cfg), ple_table_reads(cfg)
    return {"index": cfg.ple.index, "dim": cfg.ple.dim, "table_params": counts["ple_table"],
            "rows_read_per_token": index.get("rows_read_per_token", 0),
            "table_params_per_token": index.get("table_params_per_token", 0), "total": counts["total"]}


def pairs_by_size(shapes: dict[str, dict[str, Any]]) -> list[tuple[int, str, str]]:
    """(dP, token variant, n-gram variant) for every table size that has one of each."""
    out = []
    for dim in sorted({s["dim"] for s in shapes.values() if s["dim"]}):
        token = [v for v, s in shapes.items() if s["dim"] == dim and s["index"] == "token"]
        ngram = [v for v, s in shapes.items() if s["dim"] == dim and s["index"] == "ngram"]
        if token and ngram:
            out.append((dim, token[0], ngram[0]))
    return out


LONGCAT_TESTS = ("ngram_vs_token_4", "ngram_vs_token_16")
"""The registered tests the LongCat reading (an n-gram table >= the token table of the same size) combines."""
LONGCAT_RULE = ("registered in the plan's header: HIT when ngram_vs_token_4 and ngram_vs_token_16 are each better "
                "(within margin or not) or equivalent, the n-gram table not worse at either size; MISS when either "
                "is worse, within margin or not (the write-up's dated clarification: a resolved loss to the token "
                "table); unresolved otherwise")


def longcat_reading(outcomes: dict[str, str]) -> str:
    """The LongCat reading from the registered tests' outcomes: "hit", "miss" or "unresolved" (LONGCAT_RULE);
    "n/a" while none of them has paired seeds."""
    got = [outcomes.get(name, "not resolved") for name in LONGCAT_TESTS]
    if all(o == "n/a" for o in got):
        return "n/a"  # no test has its paired seeds yet: nothing to read, not an unresolved reading
    if any(o in ("worse", "worse, within margin") for o in got):
        return "miss"
    if all(o in ("better", "better, within margin", "equivalent") for o in got):
        return "hit"
    return "unresolved"


def analysis_from_records(rec: dict[str, Any]) -> dict[str, Any]:
    """The study's analysis from its records alone (plan verdicts, gains, per-domain n-gram minus token)."""
    finals = seed_keys(rec["finals"])
    plan = plan_from_inputs(rec["plan_inputs"])
    margin = (plan.get("evaluation") or {}).get("margin")
    shapes = {v: table_shape(m) for v, m in rec["models"].items()}
    base = rec["baseline"]
    gains = {v: {metric: paired_metric(finals, v, base, metric, margin) for metric in (HELDOUT_DOMAIN, MACRO)}
             for v in rec["variants"] if v != base}
    domains = sorted({d for seeds in finals.values() for run in seeds.values() for d in run if d != HELDOUT_DOMAIN})
    by_size = [{"dim": dim, "token": t, "ngram": n,
                "overall": {m: paired_metric(finals, n, t, m, margin) for m in (HELDOUT_DOMAIN, MACRO)},
                "domains": {d: paired_metric(finals, n, t, d, None) for d in domains}}
               for dim, t, n in pairs_by_size(shapes)]
    results = {r["name"]: r["outcome"] for r in ((plan or {}).get("evaluation") or {}).get("results", [])}
    longcat = None
    if all(name in results for name in LONGCAT_TESTS):
        longcat = {"reading": longcat_reading(results), "rule": LONGCAT_RULE,
                   "outcomes": {name: results[name] for name in LONGCAT_TESTS}}
    return {"sweep": rec["sweep"], "baseline": base, "variants": rec["variants"], "shapes": shapes,
            "gains": gains, "ngram_vs_token": by_size, "domains": domains, "margin": margin, "plan": plan,
            "longcat": longcat, "counts": rec["counts"], "total_runs": rec["total_runs"],
            "compute": training_compute((rec["plan_inputs"] or {}).get("runs") or [])}
