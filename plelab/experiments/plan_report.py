"""Report blocks for the analysis plan (plan.plan_from_inputs: registration, verdicts) and its power estimate."""

from __future__ import annotations

import datetime
from typing import Any

from plelab.util.pages import Block, fmt

BANNER = {
    "registered": "Analysis plan `{source}` (sha256 {sha}) was registered in the sweep database on {when}, before "
                  "the first run. Its verdicts are in *Registered analysis* below; every other verdict in this report "
                  "(study tables, rules, conclusions) is **post hoc**: computed by rules the plan does not register.",
    "post hoc": "Analysis plan `{source}` (sha256 {sha}) was not registered before the runs ({started}): its "
                "verdicts below are **post hoc**, like every other verdict in this report.",
    "none": "No analysis plan was registered for this sweep: every verdict in this report is **post hoc** (the "
            "rules were not fixed before the runs). Register one with `[sweep] plan = \"FILE\"` before the first run.",
}


def _when(ts: Any) -> str:
    if not ts:
        return "-"
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def plan_banner(pa: dict[str, Any] | None) -> str:
    """One paragraph: which verdicts are registered and which are post hoc."""
    pa = pa or {"status": "none"}
    record = pa.get("record") or {}
    started = record.get("runs_started_before")
    return BANNER[pa["status"]].format(
        source=record.get("source", "-"), sha=(record.get("sha256") or "")[:12],
        when=_when(record.get("registered_at")),
        started="given at report time" if started is None else f"registered after {started} run(s) had started")


def _ci(ci: Any) -> str:
    return "-" if not ci else f"[{fmt(ci[0], '+.4f')}, {fmt(ci[1], '+.4f')}]"


def _decision(r: dict[str, Any], tost: dict[str, Any]) -> str:
    """The registered decision text, with the margin beside it where the outcome is an equivalence: a decision
    such as "changes nothing" is only ever shown inside a margin."""
    if not r["decision"]:
        return "-" if r["prediction"] is None else "no decision registered for this outcome"
    within = r["outcome"] in ("equivalent", "better, within margin", "worse, within margin") and tost.get("margin")
    return r["decision"] + (f" (within ±{tost['margin']:g} nats, by the equivalence test)" if within else "")


def plan_blocks(pa: dict[str, Any] | None) -> list[Block]:
    """The banner, then (with a plan) one row per registered comparison / dose-response with its decision."""
    blocks: list[Block] = [("p", plan_banner(pa))]
    ev = (pa or {}).get("evaluation")
    if not ev:
        return blocks
    label = "Registered analysis" if pa["status"] == "registered" else "Analysis under the plan (post hoc)"
    rows = []
    for r in ev["results"]:
        t = r["test"]
        tost = t.get("tost") or {}
        rows.append([r["name"] + (" (gate)" if r.get("gate") else ""), r["kind"].replace("_", "-"), r["metric"],
                     str(t["n"]),
                     f"{fmt(t['mean'], '+.4f')} ± {fmt(t['se'])}", _ci(t.get("ci95")), fmt(t.get("p"), ".3g"),
                     fmt(t.get("p_used"), ".3g"),
                     "-" if not tost else f"±{tost['margin']:g}: p {fmt(tost.get('p'), '.3g')}",
                     r["outcome"], r["predicted"] or "-", hits_text(r), r["prediction"] or "-",
                     _decision(r, tost)])
    gate = ev.get("gate")
    family = ev.get("family_size", len(rows))
    gating = "" if not gate else (
        f"Gate: {gate['name']} is tested first, alone at {ev['alpha']:g}, and came out {gate['outcome']} "
        f"(predicted {gate['predicted']}): " + ("passed, so the other tests are interpreted. " if gate["passed"] else
                                               "not passed, so the other tests are description only. "))
    head = (f"{ev['name']}: {ev['question']} " if ev.get("question") else f"{ev['name']}: ") + gating + (
        f"Test level {ev['alpha']:g}; correction over the plan's {family} {'other ' if gate else ''}tests: "
        f"{ev['correction']}; the seed is the unit (paired per-seed deltas; a dose-response is the per-seed slope "
        "on log2 dose).")
    blocks += [("h", 2, label), ("p", head),
               ("table", ["name", "kind", "metric", "seeds", "Δ ± s.e.", "95 % CI", "p", "p (corrected)",
                          "equivalence (TOST)", "outcome", "predicted", "counts as a hit", "prediction", "decision"],
                rows)]
    if ev.get("notes"):
        blocks.append(("list", ev["notes"]))
    return blocks


def hits_text(result: dict[str, Any]) -> str:
    """The outcomes a registered test counts as its hit, with "(default)" when its plan did not list them."""
    hits = result.get("hits") or []
    if not hits:
        return "-"
    return " / ".join(hits) + ("" if result.get("hits_stated") else " (default)")


def power_blocks(power: dict[str, Any]) -> list[Block]:
    """Per registered comparison: the pilot's seed spread, the effect the grid resolves, the seeds an effect needs."""
    rows = []
    for r in power["comparisons"]:
        p = r.get("power") or {}
        for_effect = "-" if not p.get("effect") else str(p.get("seeds_for_effect") or "> 500")
        for_margin = "-" if not p.get("margin") else str(p.get("seeds_for_equivalence") or "> 500")
        rows.append([r["name"] + (" (gate)" if r.get("gate") else ""), r["metric"], str(r.get("pilot_n") or "-"),
                     fmt(p.get("sd"), ".4f"), str(p.get("n") or "-"), fmt(p.get("mde"), ".4f"),
                     fmt(p.get("effect"), ".4f"), fmt(p.get("power_at_n"), ".2f"), for_effect,
                     strict_seeds(r), fmt(p.get("margin"), ".4f"), for_margin])
    level = power.get("strict_level")
    return [("h", 2, "Power at this study's size (post hoc)"),
            ("p", f"Post hoc, from this study's own seed spread (sd of its per-seed paired deltas), not from a "
                  f"pilot: the smallest |Δ| the study's {power['seeds']} seeds detect with probability "
                  f"{power['target']:g} (two-sided t test at {power['alpha']:g}, exact noncentral t), the power at "
                  "the effect of interest, and the seeds it needs (also at Holm's strictest step, "
                  + ("-" if level is None else f"{level:.3g}") + ", which a family's smallest p must pass; a gate "
                  "is tested alone); and the seeds TOST needs to show equivalence inside the margin when the true "
                  "Δ is 0. A study's size is set before its runs (`plelab sweep --power --pilot`, and the plan's "
                  "own size paragraph); this table only says what the finished study could resolve. The sd is "
                  "itself an estimate from few seeds."),
            ("table", ["comparison", "metric", "seeds", "sd (this study)", "sized at", "detectable |Δ|",
                       "effect of interest", "power", "seeds for the effect", "… at Holm's strictest step",
                       "margin", "seeds for equivalence"], rows)]


def strict_seeds(row: dict[str, Any]) -> str:
    """Seeds a comparison needs for the effect of interest at Holm's strictest step ("-" when not sized so)."""
    strict = row.get("strict") or {}
    if not strict.get("effect"):
        return "-"
    return str(strict.get("seeds_for_effect") or "> 500")


def reading_block(title: str, reading: str, rule: str, done: int, total: int | None, detail: str = "") -> Block:
    """A registered reading (several tests combined by a rule written in the plan) as one paragraph, labelled
    interim while the study's runs are not all in."""
    interim = "" if total and done >= total else f", interim at {done} of {total or '?'} runs"
    return ("p", f"**{title}{interim}: {reading.upper()}**{f' ({detail})' if detail else ''}. Rule: {rule}."
                 + (" An interim reading is no result: the registered size is all the runs." if interim else ""))


def interim_note(done: int, total: int | None) -> str:
    """'' when every run is in, else ' (interim: N of M runs)' for a one-line summary."""
    return "" if total and done >= total else f" (interim: {done} of {total or '?'} runs)"


def compute_block(compute: dict[str, Any] | None, done: int) -> Block:
    """One paragraph: the training compute the finished runs recorded (plelab.experiments.outcomes.training_compute)."""
    if not done:
        return ("p", "Compute: no run has finished yet.")
    if not compute:
        return ("p", "Compute: not recorded by these runs.")
    return ("p", f"Compute: {compute['train_core_hours']:.1f} hours of training, the {done} finished runs' training "
                 f"wall times summed ({compute['steps']:,} steps, {compute['tokens'] / 1e6:,.1f}M tokens): core-hours "
                 "when each run has one thread (the sweep's `threads = 1`); evaluation, restarts and any pilot are "
                 "not included.")
