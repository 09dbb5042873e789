"""The registered outcomes of several studies in one table, computed from their data (`plelab outcomes`).

A study's write-up and the note that closes it quote the same numbers as its report: each registered test's
delta, interval, corrected p, outcome and whether the prediction hit. Copying them by hand from several reports
invites slips, so this reads each study's registered plan and per-seed evaluations (a sweep folder, or the
records.json a committed report keeps) and recomputes them with `plelab.experiments.plan`, the code the reports
use; and the runs finished and the core-hours of training spent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from plelab.experiments.plan_report import hits_text
from plelab.util.pages import fmt


def study_outcomes(source: str | Path) -> dict[str, Any]:
    """One study's registered verdicts (plan.plan_from_inputs), runs finished and training compute."""
    from plelab.errors import PlelabError
    from plelab.experiments.plan import plan_from_inputs, plan_inputs
    from plelab.experiments.records import load_records

    path = Path(source)
    if path.is_file():
        rec = load_records(path)
        if not rec.get("plan_inputs"):
            raise PlelabError(f"{path} keeps no analysis-plan inputs (a report written before plans were recorded)")
        inputs = rec["plan_inputs"]
    elif path.is_dir():
        from plelab.experiments.sweep import DB_FILE

        if not (path / DB_FILE).is_file():
            raise PlelabError(f"{path} is not a sweep folder (it has no {DB_FILE}); give a folder `plelab sweep` "
                              "wrote, or a records.json `plelab report` wrote")
        inputs = plan_inputs(path)
    else:
        raise PlelabError(f"{path}: no such sweep folder or records file")
    analysis = plan_from_inputs(inputs)
    runs = inputs["runs"]
    compute = training_compute(runs)
    record = analysis.get("record") or {}
    return {"source": str(path), "status": analysis["status"], "sha256": record.get("sha256"),
            "evaluation": analysis.get("evaluation"),
            "runs_done": sum(r["status"] == "done" for r in runs), "runs_total": len(runs), "compute": compute}


def training_compute(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Core-hours of training the finished runs recorded (evaluation and restarts not included); None when the
    runs do not carry it (a records file written before plan_inputs kept the training figures, or a run that did
    not record its training time)."""
    done = [r for r in runs if r["status"] == "done"]
    if any(r.get("train_seconds") is None for r in done):
        return None
    return {"train_core_hours": sum(r["train_seconds"] for r in done) / 3600,
            "steps": sum(r["steps"] or 0 for r in done), "tokens": sum(r["tokens"] or 0 for r in done)}


def outcome_rows(studies: list[dict[str, Any]]) -> list[list[str]]:
    """One row per registered test of every study: study, test, metric, seeds, delta, CI, p, outcome, prediction."""
    rows = []
    for s in studies:
        ev = s.get("evaluation") or {}
        study = ev.get("name") or s["source"]
        for r in ev.get("results", []):
            t = r["test"]
            ci = t.get("ci95")
            rows.append([study, r["name"] + (" (gate)" if r.get("gate") else ""), r["metric"], str(t["n"]),
                         "-" if not t["n"] else f"{fmt(t['mean'], '+.4f')} ± {fmt(t['se'], '.4f')}",
                         "-" if not ci else f"[{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}]",
                         # behind a gate that did not pass, the test's outcome is description, not a finding
                         fmt(t.get("p_used"), ".2g"), r["outcome"] + (" (gate not passed)" if r.get("gated") else ""),
                         r["predicted"] or "-", hits_text(r), r["prediction"] or "-"])
    return rows


OUTCOME_HEADERS = ["study", "test", "metric", "seeds", "Δ ± s.e. (nats)", "95 % CI",
                   "p (as tested: the plan's correction; a gate alone)", "outcome", "predicted", "counts as a hit",
                   "prediction"]


def study_lines(studies: list[dict[str, Any]]) -> list[str]:
    """Per study: plan status and hash, runs finished, compute, and the gate when the plan has one."""
    lines = []
    for s in studies:
        ev = s.get("evaluation") or {}
        compute = s.get("compute")
        spent = ("compute: not recorded (a records file written before records kept it, or a run without its "
                 "training time)") if compute is None else (
            f"{compute['train_core_hours']:.2f} core-hours of training, {compute['tokens'] / 1e6:,.1f}M tokens")
        gate = ev.get("gate")
        if not gate:
            gated = ""
        elif gate["outcome"] == "n/a":
            gated = f"; gate {gate['name']}: no paired seeds yet"
        elif s["runs_done"] < s["runs_total"]:
            gated = f"; gate {gate['name']}: {gate['outcome']} so far (interim: the study is unfinished)"
        else:
            gated = (f"; gate {gate['name']}: {gate['outcome']} "
                     f"({'passed' if gate['passed'] else 'not passed: the rest is description only'})")
        unfinished = " (unfinished: every outcome above is interim)" if s["runs_done"] < s["runs_total"] else ""
        lines.append(f"{ev.get('name') or s['source']}{unfinished}: plan {s['status']}"
                     f"{' (sha256 ' + s['sha256'][:12] + ')' if s.get('sha256') else ''}; {s['runs_done']} of "
                     f"{s['runs_total']} runs done; {spent}{gated}; from {s['source']}")
    return lines
