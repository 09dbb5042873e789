"""The third round across its widths: each width's registered outcomes and, from the runs' held-out timelines, the
paired gain of every dP over the same seed's dP = 0 run against tokens per non-embedding parameter.

Each width is its own sweep (one folder each, e.g. runs/deadzone-onset/h64 and .../h32) with its own registered
plan; this module reads them side by side. A timeline point is one evaluation inside a run's cosine schedule, not a
run of that length, so the curve is description; the registered tests are the end-of-run comparisons.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.experiments.outcomes import training_compute
from plelab.experiments.plan import plan_from_inputs, plan_inputs
from plelab.experiments.sweep import DB_FILE
from plelab.experiments.sweep_store import SweepStore
from plelab.model.config import ModelConfig
from plelab.model.params import count_params
from plelab.util.dataclass_config import from_dict

RECORDS_KIND = "deadzone-onset"
SWEEP_PREFIX = "deadzone-onset"
"""The third round's sweeps are named deadzone-onset-<width>."""


def width_folders(folder: str | Path) -> list[Path]:
    """The round's sweep folders under `folder` (its subfolders holding a deadzone-onset sweep), by name."""
    out = []
    for sub in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else []:
        if (sub / DB_FILE).is_file():
            with SweepStore(sub / DB_FILE, readonly=True) as store:
                if str(store.meta().get("name", "")).startswith(SWEEP_PREFIX):
                    out.append(sub)
    return out


def is_onset_round(folder: str | Path) -> bool:
    """Does the folder hold the third round's width sweeps?"""
    return bool(width_folders(folder))


def non_embedding_params(model: dict[str, Any]) -> tuple[int, int]:
    """(total, non-embedding) parameters of a run's model with its table switched off (the dP = 0 trunk)."""
    cfg = from_dict(ModelConfig, model)
    cfg.ple.dim = 0
    counts = count_params(cfg)
    return counts["total"], counts["total"] - counts["embedding"]


def width_records(folder: Path) -> dict[str, Any]:
    """One width's plain data: its plan inputs, finished runs (seed, dP, model) and held-out timelines."""
    with SweepStore(folder / DB_FILE, readonly=True) as store:
        every = store.runs()
        runs = [r for r in every if r["status"] == "done"]
        timeline = store.timeline()
        name = store.meta().get("name", folder.name)
    # the width's shape from any run's config (every run of a width shares it), so a sweep not yet run has its H
    model = next((r["config"]["model"] for r in every if (r.get("config") or {}).get("model")), {})
    total, non_embedding = non_embedding_params(model) if model else (0, 0)
    return {"sweep": name, "hidden_size": model.get("hidden_size"), "params": total, "non_embedding": non_embedding,
            "total_runs": len(every),
            "runs": [{"name": r["name"], "seed": r["seed"], "ple_dim": r["ple_dim"], "tokens": r["tokens"]}
                     for r in runs],
            "timelines": {r["name"]: [{"step": p["step"], "tokens": p["tokens"],
                                       "loss": (p["domains"].get(HELDOUT_DOMAIN) or {}).get("loss")}
                                      for p in timeline.get(r["name"], [])] for r in runs},
            "plan_inputs": plan_inputs(folder)}


def round_records(folder: str | Path) -> dict[str, Any]:
    """Every width of the round, as records (what records.json keeps)."""
    return {"kind": RECORDS_KIND, "folder": str(folder), "widths": [width_records(f) for f in width_folders(folder)]}


def timeline_gains(width: dict[str, Any], margin: float | None = None) -> list[dict[str, Any]]:
    """Per dP > 0 and timeline step: the paired gain over dP = 0 (loss(0) - loss(dP), seeds paired), with its 95 %
    t interval, at that step's tokens per parameter and per non-embedding parameter; given the plan's margin, also
    the point's own outcome (unadjusted: a description of the curve, not a test of the round)."""
    by = {(r["seed"], r["ple_dim"]): {p["step"]: p for p in width["timelines"].get(r["name"], [])}
          for r in width["runs"]}
    dims = sorted({d for _, d in by if d})
    steps = sorted({s for points in by.values() for s in points})
    rows = []
    for dim in dims:
        for step in steps:
            base, arm = {}, {}
            for (seed, d), points in by.items():
                p = points.get(step)
                if p is None or not _finite(p["loss"]):
                    continue
                (base if d == 0 else arm if d == dim else {})[seed] = p["loss"]
            pair = stats.paired(arm, base)  # per seed loss(0) - loss(dP): positive = the table pays
            if pair["n"] < 2:
                continue
            tokens = next(p["tokens"] for points in by.values() if step in points for p in [points[step]])
            rows.append({"ple_dim": dim, "ratio": dim / width["hidden_size"], "step": step, "tokens": tokens,
                         "tokens_per_param": tokens / width["params"],
                         "tokens_per_non_embedding": tokens / width["non_embedding"], "n": pair["n"],
                         "gain": pair["mean"], "se": pair["se"],
                         "ci95": stats.t_interval(pair["mean"], pair["se"], pair["n"]),
                         # compare() reads a loss delta (positive = worse): the negated gain
                         "outcome": (stats.compare(-pair["mean"], pair["se"], pair["n"], margin)["outcome"]
                                     if margin else None)})
    return rows


def crossings(gains: list[dict[str, Any]], margin: float | None) -> list[dict[str, Any]]:
    """Per dP: the first timeline point whose gain lies below the margin, and the first whose point outcome is
    "equivalent" (its 90 % interval inside +-margin, nothing resolved), with whether the later points stay so.

    Description of one schedule's curve (unadjusted, points inside a run are not runs of that length): where the
    curve enters the margin, set beside the registered end-of-run tests, which alone grade a prediction."""
    if not margin:
        return []
    out = []
    for dim in sorted({r["ple_dim"] for r in gains}):
        rows = sorted((r for r in gains if r["ple_dim"] == dim), key=lambda r: r["step"])
        out.append({"ple_dim": dim, "ratio": rows[0]["ratio"], "margin": margin,
                    "below_margin": _first(rows, lambda r: r["gain"] < margin),
                    "equivalent": _first(rows, lambda r: r["outcome"] == "equivalent"),
                    "last": {k: rows[-1][k] for k in ("step", "tokens_per_non_embedding", "gain", "outcome")}})
    return out


def _first(rows: list[dict[str, Any]], holds: Any) -> dict[str, Any] | None:
    """The first row where `holds`, its tokens per non-embedding parameter, and whether every later row holds too."""
    for i, r in enumerate(rows):
        if holds(r):
            return {"step": r["step"], "tokens_per_non_embedding": r["tokens_per_non_embedding"],
                    "stays": all(holds(x) for x in rows[i:])}
    return None


SMALL_STEPS = ("gain_dp1", "doubling_1_to_2")
"""The registered tests of the smallest table and its first doubling, which the dead-zone reading needs equivalent."""
PAYS = ("better", "better, within margin")
READING_RULE = ("registered in each width's plan header, with the clarification written before any run finished "
                "(docs/deadzone-law.md) that a larger step's 'better' includes 'better, within margin', as in those "
                "tests' own hits: HIT when gain_dp1 and doubling_1_to_2 are equivalent and every larger doubling pays "
                "(better, within the margin or not); MISS when gain_dp1 or doubling_1_to_2 pays (a resolved gain, "
                "within the margin or not); unresolved otherwise")


def deadzone_reading(outcomes: dict[str, str]) -> str | None:
    """A width's registered dead-zone reading from its tests' outcomes: "hit", "miss" or "unresolved"
    (READING_RULE); "n/a" while none of its tests has paired seeds; None when the plan lacks the tests it combines."""
    large = [name for name in outcomes if name.startswith("doubling_") and name not in SMALL_STEPS]
    if not large or any(name not in outcomes for name in SMALL_STEPS):
        return None
    small = [outcomes[name] for name in SMALL_STEPS]
    if all(outcomes[name] == "n/a" for name in [*SMALL_STEPS, *large]):
        return "n/a"  # no test has its paired seeds yet: nothing to read, not an unresolved reading
    if any(o in PAYS for o in small):
        return "miss"
    if all(o == "equivalent" for o in small) and all(outcomes[name] in PAYS for name in large):
        return "hit"
    return "unresolved"


def _reading(plan: dict[str, Any] | None) -> dict[str, Any] | None:
    results = {r["name"]: r["outcome"] for r in ((plan or {}).get("evaluation") or {}).get("results", [])}
    reading = deadzone_reading(results)
    return None if reading is None else {"reading": reading, "rule": READING_RULE, "outcomes": results}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def analysis_from_records(rec: dict[str, Any]) -> dict[str, Any]:
    """Per width: its plan's verdicts, its parameter counts and its timeline gains."""
    widths = []
    for w in rec["widths"]:
        plan = plan_from_inputs(w["plan_inputs"])
        margin = ((plan or {}).get("evaluation") or {}).get("margin")
        gains = timeline_gains(w, margin)
        widths.append({"sweep": w["sweep"], "hidden_size": w["hidden_size"], "params": w["params"],
                       "non_embedding": w["non_embedding"], "runs_done": len(w["runs"]),
                       "total_runs": w.get("total_runs"),
                       "final_tokens": max((r["tokens"] or 0 for r in w["runs"]), default=0),
                       "plan": plan, "reading": _reading(plan), "gains": gains, "crossings": crossings(gains, margin),
                       "compute": training_compute((w["plan_inputs"] or {}).get("runs") or [])})
    return {"folder": rec["folder"], "widths": widths}
