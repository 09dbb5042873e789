"""Pre-registered analysis plans: what a study will conclude from which outcome, fixed before its first run.

A plan file (TOML/YAML/JSON, `[sweep] plan = "FILE"` in the sweep file, relative to it) states the metrics, the
test level, the equivalence margins, the correction for several comparisons, the predicted outcome of each
comparison and the decision each outcome leads to. `plelab sweep` hashes it into the sweep database before the
first run starts; a plan changed after a run has started is refused. `plelab report` computes the verdicts of
the registered plan (`evaluate_plan`) and labels everything else it prints post hoc.

    [plan]
    name = "ffn-study-2"
    question = "Is MGLU uniformly worse once the FFN matters?"
    margin = 0.02                   # nats: the study's equivalence margin (a comparison may set its own)
    effect_of_interest = 0.041      # nats: what `plelab sweep --power` sizes the study for
    [[plan.comparisons]]
    name = "narrow_vs_full"
    variant = "swiglu_narrow"       # the arm: a [variants] name and/or grid values (where = {...})
    reference = "swiglu"
    metric = "val"                  # an evaluation domain, or "macro" (the domains other than the held-out split)
    predicted = "worse"
    decisions = { worse = "the FFN matters here: run MGLU", "not resolved" = "...", equivalent = "..." }
    gate = "narrow_vs_full"         # optional: tested first, alone at alpha; the rest are interpreted only if it
                                    # comes out as predicted (fixed-sequence gatekeeping: the family error stays alpha)
    [[plan.interactions]]           # does an effect differ between two conditions? (difference of differences)
    name = "harm_grows_with_passes"
    of = "random_vs_none_6pass"     # two registered comparisons on the same metric and seeds:
    minus = "random_vs_none_1pass"  # per seed, of's delta minus minus's delta
    predicted = "worse"             # of's delta is larger (positive = worse, as for a loss)

The canonical hash is taken over the parsed plan (sorted JSON), so comments and layout can change, content cannot.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.errors import PlelabError
from plelab.util.dataclass_config import ConfigError, from_dict, read_file, to_dict

PLAN_META = "analysis_plan"
"""The sweep database's meta key holding the registered plan."""
MACRO = "macro"
"""The metric name for the mean over the evaluation domains other than the held-out split."""
PREDICTIONS = ("", "worse", "better", "equivalent")
DECISION_KEYS = ("worse", "better", "equivalent", "not resolved", "worse, within margin", "better, within margin")
ALLOWED_HITS = {"worse": ("worse", "worse, within margin"), "better": ("better", "better, within margin"),
                "equivalent": ("equivalent", "worse, within margin", "better, within margin")}
"""The outcomes a test predicting each thing may count as its hit (`hits`). "better, within margin" is its own
outcome: a real gain (the t test rejects 0) that is also smaller than the margin (TOST). It may count for a
"better" prediction or, where a plan says so, for an "equivalent" one ("no gain larger than the margin"), never
silently: a plan that does not list it does not count it."""
DEFAULT_HITS = {"worse": ("worse", "worse, within margin"), "better": ("better", "better, within margin"),
                "equivalent": ("equivalent",)}
"""A test's hits when its plan lists none: a predicted difference is met by that difference, inside the margin or
not; a predicted equivalence only by "equivalent" (no difference shown and the interval inside the margin), since a
difference the t test resolves is not "no difference"."""


@dataclass
class RegisteredTest:
    """What every registered test states: its name, the outcome it predicts, and what each outcome decides."""

    kind = "test"
    name: str = ""
    """A short name the report and the decisions refer to."""
    margin: float = 0.0
    """Equivalence margin in the metric's unit (a dose-response's per doubling); 0 = the plan's margin (and with
    none, equivalence is not tested)."""
    predicted: str = ""
    """The outcome the study predicts: worse (the loss is higher / rises), better, equivalent ("" = none)."""
    hits: list[str] = field(default_factory=list)
    """The outcomes that count as the prediction coming true ([] = DEFAULT_HITS[predicted]); any other outcome
    but "not resolved" is a miss. Allowed per prediction: ALLOWED_HITS."""
    decisions: dict[str, str] = field(default_factory=dict)
    """Outcome -> what the study then does or concludes (keys: DECISION_KEYS). An outcome without one has no
    registered decision: "better, within margin" does not borrow "better"'s or "equivalent"'s."""

    def hit_outcomes(self) -> tuple[str, ...]:
        """The outcomes scored as a hit: the stated `hits`, else the prediction's default (none without one)."""
        if not self.predicted:
            return ()
        return tuple(self.hits) or DEFAULT_HITS[self.predicted]

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError(f"every {self.kind} needs a name")
        where = f"{self.kind} {self.name}"
        if self.margin < 0:
            raise ConfigError(f"{where}: margin must be >= 0, got {self.margin}")
        if self.predicted not in PREDICTIONS:
            raise ConfigError(f"{where}: predicted must be one of {', '.join(p for p in PREDICTIONS if p)}, "
                              f"got {self.predicted!r}")
        unknown = sorted(set(self.decisions) - set(DECISION_KEYS))
        if unknown:
            raise ConfigError(f"{where}: unknown decision key(s) {unknown}; use {', '.join(DECISION_KEYS)}")
        if self.hits and not self.predicted:
            raise ConfigError(f"{where}: hits needs a prediction (predicted = ...)")
        if self.hits:
            allowed = ALLOWED_HITS[self.predicted]
            wrong = [h for h in self.hits if h not in allowed]
            if wrong or len(set(self.hits)) != len(self.hits):
                raise ConfigError(f"{where}: hits for a {self.predicted!r} prediction are drawn, once each, from "
                                  f"{', '.join(repr(a) for a in allowed)}; got {self.hits}")


@dataclass
class Comparison(RegisteredTest):
    """One registered comparison: an arm against a reference, paired by seed, on one metric."""

    kind = "comparison"
    variant: str = ""
    """The arm's [variants] name ("" = any; then `where` selects it)."""
    where: dict[str, Any] = field(default_factory=dict)
    """Grid values the arm's runs have (e.g. {"model.ple.dim" = 4}), besides the seed."""
    reference: str = ""
    """The reference's [variants] name ("" = any; then `reference_where` selects it)."""
    reference_where: dict[str, Any] = field(default_factory=dict)
    """Grid values the reference's runs have (e.g. {"model.ple.dim" = 0})."""
    metric: str = HELDOUT_DOMAIN
    """An evaluation domain (e.g. "val", "captions") or "macro"."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not (self.variant or self.where) or not (self.reference or self.reference_where):
            raise ConfigError(f"comparison {self.name}: give the arm (variant / where) and the reference "
                              "(reference / reference_where)")


@dataclass
class DoseResponse(RegisteredTest):
    """One registered dose-response: per-seed slopes of the paired delta on log2(dose), tested across seeds."""

    kind = "dose_response"
    dose: str = "model.ple.dim"
    """The grid key that is the dose."""
    where: dict[str, Any] = field(default_factory=dict)
    """Grid values every run of it has (e.g. a variant or a width)."""
    reference_dose: float = 0.0
    """The dose each seed's deltas are taken against."""
    metric: str = HELDOUT_DOMAIN
    """An evaluation domain or "macro"."""


@dataclass
class Interaction(RegisteredTest):
    """A difference of two registered comparisons' deltas, seed by seed: does an effect change with a condition?
    (predicted worse: of's delta is the larger)."""

    kind = "interaction"
    of: str = ""
    """The comparison whose per-seed delta comes first."""
    minus: str = ""
    """The comparison whose per-seed delta is subtracted (both must be on one metric, paired by seed)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.of or not self.minus or self.of == self.minus:
            raise ConfigError(f"interaction {self.name}: name two different registered comparisons (of, minus)")


@dataclass
class AnalysisPlan:
    """A study's analysis plan (the [plan] table)."""

    name: str = ""
    """The study's name."""
    question: str = ""
    """The question, in one sentence."""
    alpha: float = 0.05
    """Test level: two-sided for differences, per side for equivalence (TOST)."""
    correction: str = "holm"
    """Over every comparison, dose-response and interaction of the plan but the gate: "holm" or "none"."""
    gate: str = ""
    """A registered comparison tested first, alone at alpha, predicting "worse" or "better": the other tests are
    interpreted only if it comes out exactly so, not "within margin" (fixed-sequence gatekeeping keeps the chance
    of any false claim at alpha, and the gate does not pay the correction the others share). "" = no gate."""
    margin: float = 0.0
    """The study's equivalence margin (metric units); 0 = none, so "no difference" cannot be concluded."""
    trained_tolerance: float = 0.05
    """Most the loss may still fall over the last doubling of tokens for a run to count as trained (nats)."""
    effect_of_interest: float = 0.0
    """The effect the study is sized for (`plelab sweep --power`); 0 = none given."""
    power: float = 0.8
    """Wanted power for the effect of interest."""
    comparisons: list[Comparison] = field(default_factory=list)
    """The registered comparisons."""
    dose_responses: list[DoseResponse] = field(default_factory=list)
    """The registered dose-responses."""
    interactions: list[Interaction] = field(default_factory=list)
    """The registered interactions (differences of two comparisons)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("plan.name is required")
        if not 0 < self.alpha < 0.5:
            raise ConfigError(f"plan.alpha must be in (0, 0.5), got {self.alpha}")
        if self.correction not in ("holm", "none"):
            raise ConfigError(f"plan.correction must be holm or none, got {self.correction!r}")
        if self.margin < 0 or self.effect_of_interest < 0 or self.trained_tolerance <= 0:
            raise ConfigError("plan.margin and plan.effect_of_interest must be >= 0, plan.trained_tolerance > 0")
        if not 0 < self.power < 1:
            raise ConfigError(f"plan.power must be in (0, 1), got {self.power}")
        names = [c.name for c in self.comparisons] + [d.name for d in self.dose_responses] + [
            i.name for i in self.interactions]
        if len(set(names)) != len(names):
            raise ConfigError(f"plan: comparison / dose_response / interaction names must be unique, got {names}")
        by_name = {c.name: c for c in self.comparisons}
        for i in self.interactions:
            missing = [n for n in (i.of, i.minus) if n not in by_name]
            if missing:
                raise ConfigError(f"interaction {i.name}: {', '.join(missing)} is not a registered comparison")
            if by_name[i.of].metric != by_name[i.minus].metric:
                raise ConfigError(f"interaction {i.name}: {i.of} and {i.minus} are on different metrics "
                                  f"({by_name[i.of].metric} / {by_name[i.minus].metric})")
        if not names:
            raise ConfigError("plan: register at least one comparison or dose_response")
        if self.gate:
            if self.gate not in by_name:
                raise ConfigError(f"plan.gate {self.gate!r} is not a registered comparison "
                                  f"({', '.join(by_name) or 'none'})")
            if by_name[self.gate].predicted not in ("worse", "better"):
                raise ConfigError(f"plan.gate {self.gate}: the gate must predict a difference (worse or better), "
                                  f"got {by_name[self.gate].predicted or 'no prediction'!r}")
            if len(names) < 2:
                raise ConfigError("plan.gate: a gate needs other tests to open")


# ------------------------------------------------------------------------------------------------ files, hash
def load_plan(source: str | Path | dict[str, Any]) -> AnalysisPlan:
    """Read and check a plan file (or its dict): the [plan] table."""
    data = read_file(source) if not isinstance(source, dict) else source
    unknown = sorted(set(data) - {"plan"})
    if unknown or "plan" not in data:
        raise ConfigError(f"a plan file holds one [plan] table (found: {', '.join(sorted(data)) or 'nothing'})")
    return from_dict(AnalysisPlan, data["plan"], prefix="plan.")


LATER_FIELDS = ("interactions", "gate")
"""Plan fields added after plans were first registered: hashed only when set, so a registered plan keeps its hash."""


TEST_LATER_FIELDS = ("hits",)
"""Fields of a registered test added after plans were first registered: hashed only when set, likewise."""
TEST_LISTS = ("comparisons", "dose_responses", "interactions")


def plan_hash(plan: AnalysisPlan) -> str:
    """sha256 of the parsed plan in canonical JSON: what is registered, and what a change is measured on."""
    canonical = {k: v for k, v in to_dict(plan).items() if not (k in LATER_FIELDS and not v)}
    for key in TEST_LISTS:
        if key in canonical:
            canonical[key] = [{k: v for k, v in t.items() if not (k in TEST_LATER_FIELDS and not v)}
                              for t in canonical[key]]
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def register_plan(store: Any, plan: AnalysisPlan, source: str) -> dict[str, Any]:
    """Hash the plan into the sweep database before any run starts; refuse one that changed after a run started.

    Returns the registration record. A plan first registered after runs had started is recorded with the count
    (`runs_started_before`), and everything evaluated under it is post hoc.
    """
    digest = plan_hash(plan)
    started = [r for r in store.runs(in_grid_only=False) if r["attempts"] or r["status"] != "pending"]
    old = store.meta().get(PLAN_META)
    if old is not None and old["sha256"] == digest:
        return old
    if old is not None and started:
        raise PlelabError(f"analysis plan {source} changed after the first run started (registered sha256 "
                          f"{old['sha256'][:12]} from {old['source']}, now {digest[:12]}): a registered plan is "
                          "fixed; restore it, or start a new sweep folder for a new plan")
    record = {"sha256": digest, "source": source, "plan": to_dict(plan), "registered_at": time.time(),
              "runs_started_before": len(started)}
    store.set_meta(**{PLAN_META: record})
    return record


def check_plan_fits(plan: AnalysisPlan, points: Sequence[dict[str, Any]]) -> None:
    """Refuse (one line) a plan whose test selects no run of the sweep (`points`: each run's grid values, its
    variant included): its test would have no seeds however long the sweep runs."""
    selections = [(c.name, "arm", c.variant, c.where) for c in plan.comparisons]
    selections += [(c.name, "reference", c.reference, c.reference_where) for c in plan.comparisons]
    selections += [(d.name, "runs", "", d.where) for d in plan.dose_responses]
    for name, role, variant, where in selections:
        if not any(_matches(p, variant, where) for p in points):
            wanted = ", ".join([f"variant {variant!r}"] * bool(variant) + [f"where {where}"] * bool(where))
            variants = sorted({str(p["variant"]) for p in points if p.get("variant")}) or ["none"]
            keys = sorted({k for p in points for k in p if k != "variant"})
            raise PlelabError(f"plan test {name}: no run of this sweep is its {role} ({wanted}; the sweep's "
                              f"variants: {', '.join(variants)}; grid keys: {', '.join(keys)}); fix the plan before "
                              "it is registered")
    for d in plan.dose_responses:
        doses = {p.get(d.dose) for p in points if _matches(p, "", d.where)}
        if len(doses - {None}) < 2:
            raise PlelabError(f"plan test {d.name}: the sweep's runs take {len(doses - {None})} value(s) of the "
                              f"dose {d.dose}; a dose-response needs two or more")


def registered_plan(store: Any) -> dict[str, Any] | None:
    """The registration record in a sweep database, or None."""
    return store.meta().get(PLAN_META)


def status_of(record: dict[str, Any] | None) -> str:
    """'registered' (before the first run), 'post hoc' (after runs had started) or 'none'."""
    if record is None:
        return "none"
    return "registered" if not record.get("runs_started_before") else "post hoc"


# ------------------------------------------------------------------------------------------------ evaluation
def _metric(evals: dict[str, dict[str, Any]], metric: str) -> float | None:
    if metric == MACRO:
        vals = [r["loss"] for d, r in evals.items() if d != HELDOUT_DOMAIN and _finite(r.get("loss"))]
        return sum(vals) / len(vals) if vals else None
    value = (evals.get(metric) or {}).get("loss")
    return float(value) if _finite(value) else None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _matches(point: dict[str, Any], variant: str, where: dict[str, Any]) -> bool:
    if variant and point.get("variant") != variant:
        return False
    return all(point.get(k) == v for k, v in where.items())


def _per_seed(runs: Sequence[dict[str, Any]], evals: dict[str, Any], variant: str, where: dict[str, Any],
              metric: str, notes: list[str], what: str) -> dict[Any, float]:
    """{seed: metric} of the finished runs matching (variant, where); a seed matched twice is a note."""
    out: dict[Any, float] = {}
    for r in runs:
        point = r.get("point") or {}
        if r["status"] != "done" or not _matches(point, variant, where):
            continue
        value = _metric(evals.get(r["name"], {}), metric)
        if value is None:
            continue
        if r["seed"] in out:
            notes.append(f"{what}: several runs match seed {r['seed']}; narrow its where")
        out[r["seed"]] = value
    return out


def _result(item: Any, metric: str, test: dict[str, Any], kind: str, extra: dict[str, Any]) -> dict[str, Any]:
    outcome = test["outcome"]
    hits = item.hit_outcomes()
    if not item.predicted or outcome == "n/a":
        verdict = None
    elif outcome == "not resolved":
        verdict = "unresolved"
    else:
        verdict = "hit" if outcome in hits else "miss"
    return {"name": item.name, "kind": kind, "metric": metric, **extra, "test": test, "outcome": outcome,
            "predicted": item.predicted or None, "hits": list(hits), "hits_stated": bool(item.hits),
            "prediction": verdict, "decision": item.decisions.get(outcome)}


def _comparison_deltas(plan: AnalysisPlan, runs: Sequence[dict[str, Any]], evals: dict[str, Any],
                       notes: list[str]) -> dict[str, dict[str, Any]]:
    """{comparison name: stats.paired(reference, arm) + its metric}, for every registered comparison."""
    out = {}
    for c in plan.comparisons:
        arm = _per_seed(runs, evals, c.variant, c.where, c.metric, notes, c.name)
        ref = _per_seed(runs, evals, c.reference, c.reference_where, c.metric, notes, c.name)
        out[c.name] = {**stats.paired(ref, arm), "metric": c.metric}
    return out


def _interaction_deltas(i: Interaction, deltas_of: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per seed, of's delta minus minus's delta (the seeds both comparisons paired)."""
    return stats.paired(deltas_of[i.minus]["per_seed"], deltas_of[i.of]["per_seed"])


def evaluate_plan(plan: AnalysisPlan | dict[str, Any], runs: Sequence[dict[str, Any]],
                  evals: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Every registered comparison and dose-response on the finished runs: paired by seed, Holm over the plan.

    runs: sweep database rows (name, status, seed, point); evals: {run: {domain: {"loss", ...}}}.
    """
    if isinstance(plan, dict):
        plan = from_dict(AnalysisPlan, plan, prefix="plan.")
    notes: list[str] = []
    items: list[tuple[Any, str, str, dict[str, Any], dict[str, Any]]] = []
    deltas_of = _comparison_deltas(plan, runs, evals, notes)
    for c in plan.comparisons:
        d = deltas_of[c.name]
        items.append((c, c.metric, "comparison", {"n": d["n"], "mean": d["mean"], "se": d["se"]},
                      {"per_seed": d["per_seed"], "seeds": d["seeds"]}))
    for r in plan.dose_responses:
        by_dose: dict[float, dict[Any, float]] = {}
        for run in runs:
            point = run.get("point") or {}
            if run["status"] != "done" or not _matches(point, "", r.where) or r.dose not in point:
                continue
            value = _metric(evals.get(run["name"], {}), r.metric)
            if value is not None:
                by_dose.setdefault(float(point[r.dose]), {})[run["seed"]] = value
        base = by_dose.get(float(r.reference_dose), {})
        deltas = {x: stats.paired(base, v)["per_seed"] for x, v in by_dose.items() if x != float(r.reference_dose)}
        dr = stats.dose_response(deltas)
        items.append((r, r.metric, "dose_response", {"n": dr["n"], "mean": dr["mean"], "se": dr["se"]},
                      {"per_seed_slope": dr["per_seed"], "doses": dr["doses"]}))
    for i in plan.interactions:
        d = _interaction_deltas(i, deltas_of)
        items.append((i, deltas_of[i.of]["metric"], "interaction", {"n": d["n"], "mean": d["mean"], "se": d["se"]},
                      {"per_seed": d["per_seed"], "seeds": d["seeds"], "of": i.of, "minus": i.minus}))
    raw = [stats.t_test(s["mean"], s["se"], s["n"])["p"] for _, _, _, s, _ in items]
    family = [k for k, (item, *_) in enumerate(items) if item.name != plan.gate]
    adjusted = list(raw)  # the gate keeps its own p: it is tested alone, before the family
    if plan.correction == "holm":
        for k, p in zip(family, stats.holm([raw[k] for k in family], plan.alpha)["adjusted"], strict=True):
            adjusted[k] = p
    results = []
    for (item, metric, kind, s, extra), p in zip(items, adjusted, strict=True):
        margin = item.margin or plan.margin or None
        test = stats.compare(s["mean"], s["se"], s["n"], margin, plan.alpha, p=p)
        results.append(_result(item, metric, test, kind, extra))
    gate = _apply_gate(plan, results) if plan.gate else None
    return {"name": plan.name, "question": plan.question, "alpha": plan.alpha, "correction": plan.correction,
            "margin": plan.margin or None, "family_size": len(family), "gate": gate, "results": results,
            "notes": notes}


def _apply_gate(plan: AnalysisPlan, results: list[dict[str, Any]]) -> dict[str, Any]:
    """Mark the gate's result; when it did not come out as predicted, every other test is description only."""
    by_name = {r["name"]: r for r in results}
    gate = by_name[plan.gate]
    # Exactly the predicted outcome: "worse, within margin" (significant, yet inside the equivalence margin) says
    # the difference is too small to open the question, so the gate stays shut.
    passed = gate["outcome"] == gate["predicted"]
    gate["gate"] = True
    for r in results:
        if r is gate or passed:
            continue
        r["gated"] = f"not interpreted: the gate {plan.gate} came out {gate['outcome']}, not {gate['predicted']}"
        r["prediction"] = "unresolved" if r["prediction"] else None
        r["decision"] = r["gated"]
    return {"name": plan.gate, "predicted": gate["predicted"], "outcome": gate["outcome"], "passed": passed}


def plan_margin(analysis: dict[str, Any] | None) -> tuple[float | None, float]:
    """(the plan's study-wide margin or None, its alpha) for the study-specific rules of a report."""
    ev = (analysis or {}).get("evaluation") or {}
    return ev.get("margin"), ev.get("alpha") or stats.ALPHA


# ------------------------------------------------------------------------------------------------ power
def plan_power(plan: AnalysisPlan | dict[str, Any], runs: Sequence[dict[str, Any]],
               evals: dict[str, dict[str, dict[str, Any]]], seeds: int) -> dict[str, Any]:
    """Power of each registered comparison and interaction at `seeds` seeds, from the pilot runs' seed spread.

    runs / evals: the pilot's (a finished sweep, or the study's own first seeds). A comparison the pilot cannot
    pair (no runs of one side) gets no estimate. Effect: plan.effect_of_interest; margin: the comparison's or
    the plan's. Under Holm a test is also sized at alpha / (tests in the family), Holm's strictest step, which
    its smallest p must pass (`strict`: what the family costs; the gate is tested alone at alpha).
    """
    if isinstance(plan, dict):
        plan = from_dict(AnalysisPlan, plan, prefix="plan.")
    family = len(plan.comparisons) + len(plan.dose_responses) + len(plan.interactions) - bool(plan.gate)
    strict_level = plan.alpha / family if plan.correction == "holm" and family > 1 else None
    rows = []
    deltas_of = _comparison_deltas(plan, runs, evals, [])
    named = [(c, deltas_of[c.name]) for c in plan.comparisons] + [
        (i, {**_interaction_deltas(i, deltas_of), "metric": deltas_of[i.of]["metric"]}) for i in plan.interactions]
    for c, d in named:
        ok = d["n"] >= 2 and _finite(d["sd"]) and d["sd"] > 0
        margin = c.margin or plan.margin or None
        strict = None if c.name == plan.gate else strict_level
        rows.append({"name": c.name, "metric": d["metric"], "pilot_n": d["n"], "pilot_mean": d["mean"],
                     "gate": c.name == plan.gate,
                     "power": stats.plan_power(d["sd"], seeds, plan.effect_of_interest or None, margin, plan.alpha,
                                               plan.power) if ok else None,
                     "strict": stats.plan_power(d["sd"], seeds, plan.effect_of_interest or None, None, strict,
                                                plan.power) if ok and strict else None})
    return {"seeds": seeds, "alpha": plan.alpha, "target": plan.power, "effect_of_interest":
            plan.effect_of_interest or None, "strict_level": strict_level, "comparisons": rows}


def plan_inputs(folder: str | Path, override: str | Path | None = None) -> dict[str, Any]:
    """Everything the plan's verdicts rest on, as plain data (a report's records.json keeps it): the
    registration record, a plan given at report time, and the finished runs' seeds, grid values and evaluations."""
    from plelab.experiments.sweep import DB_FILE
    from plelab.experiments.sweep_store import SweepStore

    with SweepStore(Path(folder) / DB_FILE, readonly=True) as store:
        # the training figures ride along so a records file can say what its study cost (plelab outcomes)
        runs = [{k: r[k] for k in ("name", "status", "seed", "point", "attempts", "train_seconds", "steps", "tokens")}
                for r in store.runs()]
        return {"record": registered_plan(store), "override": to_dict(load_plan(override)) if override else None,
                "override_source": str(override or ""), "runs": runs, "evals": store.evals()}


def plan_from_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """plan_analysis from plan_inputs' data, plus the power of the plan's comparisons at the seeds the runs have
    (from their own seed spread)."""
    record, override = inputs.get("record"), inputs.get("override")
    status = status_of(record)
    plan = (record or {}).get("plan")
    if override is not None and (record is None or plan_hash(from_dict(AnalysisPlan, override)) != record["sha256"]):
        plan, status = override, "post hoc"
        record = {"sha256": plan_hash(from_dict(AnalysisPlan, override)), "source": inputs.get("override_source"),
                  "registered_at": None, "runs_started_before": None}
    out: dict[str, Any] = {"status": status, "record": None if record is None else {
        k: record.get(k) for k in ("sha256", "source", "registered_at", "runs_started_before")}}
    if plan is not None:
        runs, evals = inputs["runs"], inputs["evals"]
        out["evaluation"] = evaluate_plan(plan, runs, evals)
        seeds = len({r["seed"] for r in runs if r["status"] == "done"})
        out["power"] = plan_power(plan, runs, evals, max(seeds, 2))
    return out


def folder_plan(folder: str | Path, override: str | Path | None = None) -> dict[str, Any]:
    """plan_from_inputs(plan_inputs(folder, override)): the plan's verdicts and power for a sweep folder."""
    return plan_from_inputs(plan_inputs(folder, override))
