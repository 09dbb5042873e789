"""The FFN-sharing study (SPEC §5): per-domain paired deltas, one verdict per variant, and the gap timeline.

Everything above `is_variant_sweep` is pure arithmetic on plain dicts, so each rule is tested on constructed numbers
and `plelab report DIR --json` prints exactly what the report shows. The rules (also in the output, RULES):

- Pairing: a variant's run with seed s is compared with the baseline's run with the same seed s (same data
  order; the seed's noise is shared), so each quantity is a per-seed delta d_s = variant_s - baseline_s, and
  its mean over the n paired seeds is reported with s.e. = sd(d_s) / sqrt(n). Seeds without a partner are
  left out and named in the notes.
- Macro: per seed, the mean over the evaluation domains (the 16 of ../shared/data/valid; the prepared data's
  held-out split `val` is shown as a row but is never part of the macro or the domain counts), then paired.
- Significance (one test everywhere): the two-sided paired t test over the n seeds at alpha = 5 % (p from
  Student's t with n - 1 df; with 3 seeds a mean must be 4.30 s.e. from 0). The seed is the unit: domains
  scored on the same runs are never counted as independent samples.
- Several comparisons, one error rate: the variants' macro tests form one family and are Holm-corrected
  (with 6 variants the smallest p needs p < 0.05/6, |t| > 10.9 with 3 seeds); each variant's 16 per-domain tests are
  Holm-corrected among themselves for the domain counts.
- "No difference" needs an equivalence test: two one-sided t tests (TOST) against a margin stated before the
  runs (the registered plan's `margin`). Without a margin a mean that is not significant is *not resolved*,
  printed with its 95 % interval, never "no difference".
- Domains worse / better: the number of domains whose paired Δ is significantly worse / better (Holm over
  the domains). Domains with Δ > 0: a count that describes consistency of direction; it is not a test (the
  domains share each run: one bad run moves all 16 the same way).
- Verdict, first that applies: *n/a* (fewer than 2 paired seeds); *uniform degradation*: macro significantly
  worse (Holm over the variants), no domain significantly better, Δ > 0 on at least 7/8 of the domains;
  *uniform gain*: the mirror; *trade-off*: at least one domain significantly worse and one significantly
  better; *degradation (not uniform)* / *gain (not uniform)*: the macro is significant, the domains do not
  agree enough; *equivalent*: the macro passes TOST within the margin; *not resolved*: otherwise.
- Gap timeline: at every token count both runs of a seed evaluated, gap_s = macro_variant_s - macro_baseline_s,
  mean ± s.e. over seeds. *Open* at a point: significantly non-zero and not inside the margin; *closed*: inside
  the margin by TOST (needs a margin); *not resolved*: neither. *Illusory convergence*: the gap is open at
  some point, closed at a later point i, and open again towards worse at a point j after i, with the per-seed
  rise gap_s(j) - gap_s(i) itself significantly > 0. Without a margin no gap is ever called closed, so
  nothing can be flagged: the timeline then only says where the gap was open.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.experiments.sweep import DB_FILE, DIM_KEY, VARIANT_KEY
from plelab.experiments.sweep_results import (
    Finals,
    Timelines,
    load_variant_sweep,
    read_json,
    sample_note,
    seed_keys,
)
from plelab.experiments.sweep_store import SweepStore
from plelab.util.json_values import jsonable

UNIFORM_SHARE = 7 / 8
"""A *uniform* verdict needs Δ on the same side on at least this share of the domains (14 of 16): descriptive."""
EXPORT_QUANT = "fp16"
"""Export encoding (`plelab export --quant`) the study's inference bytes are counted at."""
DECODE_FILE = "decode.json"
"""In the sweep folder: {variant: measure_decode(...) result} for the variant's first seed."""

VERDICTS = ("uniform degradation", "uniform gain", "trade-off", "degradation (not uniform)", "gain (not uniform)",
            "equivalent", "not resolved", "n/a")

RULES = {
    "pairing": "each variant run is compared with the baseline run of the same seed; Δ = variant − baseline "
               "(positive = worse), mean over paired seeds ± s.e. = sd/√n; the seed is the unit of every test",
    "macro": f"per seed, the mean over the evaluation domains (the held-out split '{HELDOUT_DOMAIN}' is a row but "
             "not in the macro or the counts), then paired across seeds",
    "significance": "two-sided paired t test over the seeds at 5 % (t = 4.30 s.e. for 3 seeds); fewer than 2 "
                    "paired seeds: no test",
    "multiplicity": "the variants' macro tests are one family, Holm-corrected; each variant's per-domain tests "
                    "are Holm-corrected among themselves",
    "equivalence": "'no difference' only by TOST (two one-sided t tests, 5 % each) inside a margin stated before "
                   "the runs; without one, a mean that is not significant is 'not resolved' (95 % CI printed)",
    "domains_worse": "number of domains whose paired Δ is significantly worse (Holm over the domains)",
    "domains_positive": "number of domains with mean Δ > 0: consistency of direction, not a test (the domains "
                        "share each run)",
    "verdict": f"first that applies: n/a (< 2 paired seeds); uniform degradation (macro significantly worse after "
               f"Holm, no domain significantly better, Δ > 0 on >= {UNIFORM_SHARE:.0%} of the domains); uniform "
               "gain (the mirror); trade-off (>= 1 domain significantly worse and >= 1 significantly better); "
               "degradation / gain (not uniform) (macro significant, domains not uniform); equivalent (macro "
               "inside the margin by TOST); not resolved (otherwise)",
    "illusory_convergence": "open = significant and not inside the margin; closed = inside the margin by TOST "
                            "with no gap resolved (needs a margin; without one nothing is ever closed); 'open, "
                            "within margin' = significant and inside the margin (neither open nor closed); flagged "
                            "when the gap is open at some point, closed at a later one, and open again (worse) "
                            "after that, with the per-seed rise from the closed point itself significantly > 0",
}

# SPEC §5: the published MGLU (n_m = 1) vs SwiGLU study, 3B parameters trained from scratch.
PUBLISHED_TIMELINE = [  # (tokens, baseline loss, MGLU loss)
    (4.1e9, 4.35, 4.43), (8.2e9, 2.63, 2.63), (16.4e9, 2.14, 2.32), (24.6e9, 2.17, 2.21),
]
PUBLISHED_DOMAINS = {  # at 24.6B tokens: domain -> (baseline loss, MGLU loss)
    "en_math": (1.6904, 1.7353), "en_novel": (3.0276, 3.0818), "en_world_knowledge": (2.1081, 2.1525),
    "gsm8k": (1.1599, 1.1644), "zh_news": (2.8981, 2.9558), "zh_qa": (3.7321, 3.7831), "code": (1.1397, 1.1743),
    "en_news": (2.6333, 2.6778), "en_qa": (2.7868, 2.8218), "zh_math": (1.5917, 1.6289),
    "zh_novel": (3.3541, 3.4116), "zh_world_knowledge": (2.9545, 3.0174), "code_python": (0.9499, 0.9888),
    "code_java": (0.7672, 0.7888), "code_javascript": (0.9374, 0.9858), "code_c++": (1.0754, 1.0958),
}

# ----------------------------------------------------------------------------------------------- statistics
def paired_delta(base: dict[Any, float], variant: dict[Any, float]) -> dict[str, Any]:
    """stats.paired with the study's key names: {"delta", "se", "n", "seeds", "per_seed"}."""
    p = stats.paired(base, variant)
    return {"delta": p["mean"], "se": p["se"], "n": p["n"], "seeds": p["seeds"], "per_seed": p["per_seed"]}


def verdict(domain_signs: Sequence[int | None], positive: int, negative: int, macro_sign: int | None,
            macro_equivalent: bool | None = None) -> str:
    """The variant's verdict (RULES['verdict']) from the Holm-corrected per-domain signs, the counts of domains on
    each side, the macro's Holm-corrected sign and whether the macro passed TOST within the margin."""
    if macro_sign is None:
        return "n/a"
    worse, better = domain_signs.count(1), domain_signs.count(-1)
    total = positive + negative
    if macro_sign == 1 and better == 0 and total and positive >= UNIFORM_SHARE * total:
        return "uniform degradation"
    if macro_sign == -1 and worse == 0 and total and negative >= UNIFORM_SHARE * total:
        return "uniform gain"
    if worse and better:
        return "trade-off"
    if macro_sign == 1:
        return "degradation (not uniform)"
    if macro_sign == -1:
        return "gain (not uniform)"
    return "equivalent" if macro_equivalent else "not resolved"


def _holm_signs(cells: Sequence[dict[str, Any]], alpha: float) -> list[int | None]:
    """Significance signs of paired cells ({"delta", "se", "n"}) after Holm over the cells."""
    tests = [stats.t_test(c["delta"], c["se"], c["n"]) for c in cells]
    adjusted = stats.holm([t["p"] for t in tests], alpha)["adjusted"]
    return [None if p is None else 0 if p >= alpha else (1 if c["delta"] > 0 else -1)
            for c, p in zip(cells, adjusted, strict=True)]


# ----------------------------------------------------------------------------------------------- the analysis
def macro(domains: dict[str, dict[str, float]], key: str = "loss", among: Iterable[str] | None = None) -> float:
    """Mean of `key` over the evaluation domains (the held-out split excluded), optionally only those in `among`."""
    keep = set(among) if among is not None else None
    vals = [r.get(key) for d, r in domains.items()
            if d != HELDOUT_DOMAIN and (keep is None or d in keep) and _finite(r.get(key))]
    return sum(vals) / len(vals) if vals else math.nan


def timeline_loss(domains: dict[str, dict[str, float]], among: Iterable[str] | None = None) -> float:
    """A timeline point's loss: the macro over its evaluation domains, or the held-out split's loss when the
    point scored that split alone."""
    if set(domains) == {HELDOUT_DOMAIN}:
        value = domains[HELDOUT_DOMAIN].get("loss")
        return float(value) if _finite(value) else math.nan
    return macro(domains, among=among)


def domain_rows(finals: Finals, baseline: str, variants: Sequence[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """{domain: {variant: paired Δ loss and Δ bpb, their s.e., n, the significance sign}}; held-out split last."""
    base = finals.get(baseline, {})
    names = sorted({d for runs in finals.values() for evals in runs.values() for d in evals},
                   key=lambda d: (d == HELDOUT_DOMAIN, d))
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for dom in names:
        out[dom] = {}
        for v in variants:
            runs = finals.get(v, {})
            cell = {}
            for key, suffix in (("loss", ""), ("bpb", "_bpb")):
                p = paired_delta(_values(base, dom, key), _values(runs, dom, key))
                cell[f"delta{suffix}"], cell[f"se{suffix}"] = p["delta"], p["se"]
                if key == "loss":
                    cell["n"] = p["n"]
                    cell["significant"] = stats.significance(p["delta"], p["se"], p["n"])
                    cell["p"] = stats.t_test(p["delta"], p["se"], p["n"])["p"]
                    cell["loss"] = _mean(_values(runs, dom, key).values())
            out[dom][v] = cell
    return out


def variant_summary(finals: Finals, baseline: str, variant: str,
                    domains: dict[str, dict[str, dict[str, Any]]], alpha: float = stats.ALPHA,
                    margin: float | None = None) -> dict[str, Any]:
    """Macro Δ (loss and bpb) ± s.e. with its test, interval and TOST, the domain counts (Holm over domains).

    The verdict is filled in by analyze_study once every variant's macro p is known (Holm over the variants).
    """
    base, runs = finals.get(baseline, {}), finals.get(variant, {})
    evals = [d for d in domains if d != HELDOUT_DOMAIN]
    # Each pair's macro runs over the domains both of its runs have (missing ones are named in the notes).
    loss, bpb = (paired_delta({s: macro(base[s], key, runs[s]) for s in runs if s in base},
                              {s: macro(runs[s], key, base[s]) for s in runs if s in base}) for key in ("loss", "bpb"))
    test = stats.compare(loss["delta"], loss["se"], loss["n"], margin, alpha)
    out: dict[str, Any] = {"macro_delta": loss["delta"], "macro_delta_se": loss["se"], "macro_delta_bpb": bpb["delta"],
                           "macro_delta_bpb_se": bpb["se"], "n_pairs": loss["n"], "seeds": loss["seeds"],
                           "macro_per_seed": loss["per_seed"], "macro_p": test["p"], "macro_ci95": test["ci95"],
                           "macro_tost": test["tost"]}
    cells = [domains[d][variant] for d in evals]
    signs = _holm_signs(cells, alpha)
    positive = sum(1 for c in cells if _finite(c["delta"]) and c["delta"] > 0)
    negative = sum(1 for c in cells if _finite(c["delta"]) and c["delta"] < 0)
    held = domains.get(HELDOUT_DOMAIN, {}).get(variant, {})
    held_test = stats.compare(held.get("delta", math.nan), held.get("se", math.nan), held.get("n", 0), margin, alpha)
    out.update(domains_worse=signs.count(1), domains_better=signs.count(-1), domains_positive=positive,
               domains_negative=negative, domains_total=len(evals), domain_signs=signs,
               heldout_delta=held.get("delta"), heldout_delta_se=held.get("se"), heldout_p=held_test["p"],
               heldout_ci95=held_test["ci95"], heldout_tost=held_test["tost"], heldout_n=held.get("n", 0))
    return out


def _family_verdicts(rows: dict[str, dict[str, Any]], baseline: str, alpha: float) -> None:
    """Holm over the variants' macro (and, apart, held-out) tests; then each variant's verdict and outcomes."""
    names = [v for v in rows if v != baseline]
    for key in ("macro", "heldout"):
        adjusted = stats.holm([rows[v][f"{key}_p"] for v in names], alpha)["adjusted"]
        for v, p in zip(names, adjusted, strict=True):
            r = rows[v]
            r[f"{key}_p_holm"] = p
            mean, se = r[f"{key}_delta"], r[f"{key}_delta_se"]
            n = r["n_pairs"] if key == "macro" else r.get("heldout_n", r["n_pairs"])  # each metric its own pairs
            c = stats.compare(_num(mean), _num(se), n, (r[f"{key}_tost"] or {}).get("margin"), alpha, p=p)
            r[f"{key}_outcome"] = c["outcome"]
    for v in names:
        r = rows[v]
        p = r["macro_p_holm"]
        sign = None if p is None else 0 if p >= alpha else (1 if r["macro_delta"] > 0 else -1)
        r["macro_significant"] = sign
        r["verdict"] = verdict(r["domain_signs"], r["domains_positive"], r["domains_negative"], sign,
                               (r["macro_tost"] or {}).get("equivalent"))


def _num(x: Any) -> float:
    return float(x) if _finite(x) else math.nan


def gap_timeline(timelines: Timelines, baseline: str, variant: str, margin: float | None = None,
                 alpha: float = stats.ALPHA) -> list[dict[str, Any]]:
    """Per token count: paired macro gap vs the baseline (mean, s.e., n, per-seed, 95 % CI, status open / closed /
    not resolved by RULES['illusory_convergence']), and the variant's macro loss; the held-out split's gap and
    loss at every point instead when the timeline scored that split alone."""
    # Points pair by token count (the x axis); a point without one cannot be placed and is skipped.
    base = {s: {p["tokens"]: p for p in pts if p.get("tokens")} for s, pts in timelines.get(baseline, {}).items()}
    mine = {s: {p["tokens"]: p for p in pts if p.get("tokens")} for s, pts in timelines.get(variant, {}).items()}
    tokens = sorted({t for pts in mine.values() for t in pts})
    # A timeline that scored the held-out split alone (eval_timeline_domains = "heldout") is read on that split at
    # every point, the final full evaluation included: one metric along the curve, so a gap that "reopens" is not
    # the switch from the split to the domains' macro. Otherwise each point pairs the macro over the domains both
    # runs evaluated there.
    heldout = any(set(p["domains"]) == {HELDOUT_DOMAIN} for arm in (mine, base) for pts in arm.values()
                  for p in pts.values())
    metric = HELDOUT_DOMAIN if heldout else "macro"

    def loss(domains: dict[str, dict[str, float]], among: Iterable[str] | None = None) -> float:
        return timeline_loss({HELDOUT_DOMAIN: domains.get(HELDOUT_DOMAIN) or {}} if heldout else domains, among)

    out = []
    for t in tokens:
        here = {s: pts[t] for s, pts in mine.items() if t in pts}
        there = {s: base[s][t] for s in here if t in base.get(s, {})}
        v = {s: loss(here[s]["domains"], among=there[s]["domains"]) for s in there}
        b = {s: loss(there[s]["domains"], among=here[s]["domains"]) for s in there}
        gap = paired_delta(b, v)
        losses = [x for p in here.values() if _finite(x := loss(p["domains"]))]
        mean_loss, se_loss = stats.mean_se(losses)
        point = {"tokens": t, "step": next(iter(here.values())).get("step"),
                 "metric": metric, "gap": gap["delta"], "se": gap["se"],
                 "n": gap["n"], "per_seed": gap["per_seed"], "loss": mean_loss, "loss_se": se_loss}
        point.update(gap_status(point, margin, alpha))
        out.append(point)
    return out


def gap_status(p: dict[str, Any], margin: float | None, alpha: float = stats.ALPHA) -> dict[str, Any]:
    """{"status": open / open, within margin / closed / not resolved / n/a, "p", "ci95"} of one timeline point
    (RULES)."""
    c = stats.compare(_num(p["gap"]), _num(p["se"]), p["n"], margin, alpha)
    if c["outcome"] in ("worse", "better"):
        status = "open"
    elif c["outcome"] == "equivalent":
        status = "closed"
    elif c["outcome"] in ("worse, within margin", "better, within margin"):
        status = "open, within margin"  # a gap resolved inside the margin is real: never "closed"
    else:
        status = c["outcome"]  # not resolved / n/a
    return {"status": status, "p": c["p"], "ci95": c["ci95"]}


def illusory_convergence(points: Sequence[dict[str, Any]], margin: float | None = None,
                         alpha: float = stats.ALPHA) -> dict[str, Any] | None:
    """The first (open, closed, reopened) triple of timeline points by RULES['illusory_convergence'], or None."""
    status = [gap_status(p, margin, alpha)["status"] for p in points]
    opened = None
    for i, a in enumerate(points):
        if status[i] == "open" and opened is None:
            opened = a
        if opened is None or status[i] != "closed":
            continue
        for j in range(i + 1, len(points)):
            b = points[j]
            if not (status[j] == "open" and b["gap"] > 0):
                continue
            rise = stats.paired(a["per_seed"], b["per_seed"])
            if stats.significance(rise["mean"], rise["se"], rise["n"], alpha) == 1:
                return {"open_tokens": opened["tokens"], "open_gap": opened["gap"],
                        "closed_tokens": a["tokens"], "closed_gap": a["gap"], "closed_se": a["se"],
                        "reopened_tokens": b["tokens"], "reopened_gap": b["gap"], "reopened_se": b["se"],
                        "rise": rise["mean"], "rise_se": rise["se"]}
    return None


def first_open(points: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first timeline point whose gap is open (either sign), or None: "the gap never opened" is checkable."""
    return next(({"tokens": p["tokens"], "gap": p["gap"], "se": p["se"], "p": p.get("p")} for p in points
                 if p.get("status") == "open"), None)


def analyze_study(finals: Finals, baseline: str, variants: Sequence[str] | None = None,
                  timelines: Timelines | None = None, costs: dict[str, dict[str, Any]] | None = None,
                  decode: dict[str, dict[str, Any]] | None = None, margin: float | None = None,
                  alpha: float = stats.ALPHA) -> dict[str, Any]:
    """The whole study as JSON-ready data: variants, domains, timeline, rules, notes (NaN -> None).

    margin: the equivalence margin in nats stated before the runs (the registered plan's); None = equivalence
    and "closed" cannot be claimed, and the verdicts say "not resolved" instead.
    """
    variants = list(variants or finals)
    if baseline not in variants:
        variants.insert(0, baseline)
    timelines, costs, decode = timelines or {}, costs or {}, decode or {}
    notes = _notes(finals, baseline, variants)
    if margin is None:
        notes.append("no equivalence margin was given (none registered): a difference that is not significant is "
                     "'not resolved', and no timeline gap can be called closed")
    domains = domain_rows(finals, baseline, variants)
    out_variants, timeline = {}, {}
    for v in variants:
        row = {k: (costs.get(v) or {}).get(k)
               for k in ("params", "mask_elements", "active_params_per_token", "inference_bytes")}
        row.update(variant_summary(finals, baseline, v, domains, alpha, margin))
        row["runs"] = len(finals.get(v, {}))
        points = gap_timeline(timelines, baseline, v, margin, alpha) if timelines.get(v) else []
        timeline[v] = points
        if timelines.get(v) and v != baseline:
            found = illusory_convergence(points, margin, alpha)
            row["illusory_convergence"], row["illusory_at"] = found is not None, found
            row["first_open"] = first_open(points)
        measured = decode.get(v) or {}
        for key in ("tokens_per_s", "bytes_per_token"):
            if measured.get(key) is not None:
                row[key] = measured[key]
        if measured.get("error"):
            notes.append(f"variant '{v}': decode not measured ({measured['error']})")
        out_variants[v] = row
    _family_verdicts(out_variants, baseline, alpha)
    out_variants[baseline]["verdict"] = "baseline"
    if timelines and not any(timeline.values()):
        notes.append("no timeline points: the runs evaluated only at the end (set eval_timeline in the sweep)")
    return jsonable({
        "baseline": baseline, "heldout_domain": HELDOUT_DOMAIN, "export_dtype": EXPORT_QUANT, "margin": margin,
        "alpha": alpha, "variants": out_variants, "domains": domains, "timeline": timeline, "rules": RULES,
        "notes": notes,
    })


def _notes(finals: Finals, baseline: str, variants: Sequence[str]) -> list[str]:
    """Plain-language notes on what is missing: variants without runs, seeds without a partner, domains."""
    notes = []
    mixed = sample_note({f"{v}/{s}": evals for v, runs in finals.items() for s, evals in runs.items()})
    if mixed:
        notes.append(mixed)
    base = finals.get(baseline, {})
    if not base:
        notes.append(f"the baseline '{baseline}' has no finished runs: no deltas can be computed yet")
    all_domains = {d for runs in finals.values() for evals in runs.values() for d in evals if d != HELDOUT_DOMAIN}
    for v in variants:
        runs = finals.get(v, {})
        if not runs:
            notes.append(f"variant '{v}' has no finished runs yet")
            continue
        if v != baseline:
            lonely = sorted(s for s in runs if s not in base)
            if lonely:
                notes.append(f"variant '{v}': seed(s) {lonely} have no baseline run of the same seed and are left out")
            paired = [s for s in runs if s in base]
            if len(paired) < 2:
                notes.append(f"variant '{v}': {len(paired)} paired seed(s), fewer than 2: no s.e., verdict n/a")
        for s, evals in sorted(runs.items()):
            missing = sorted(all_domains - set(evals))
            if missing:
                notes.append(f"variant '{v}' seed {s} has no evaluation on {missing}; its macro uses the other domains")
    return notes


# ----------------------------------------------------------------------------------------------- the sweep
def is_variant_sweep(folder: str | Path) -> bool:
    """Does the sweep folder hold a sweep with [variants] (run points carry a 'variant' value) whose grid does not
    vary dP? One that does (e.g. dP x training lengths) is a set of dose groups: the general sweep report's."""
    path = Path(folder) / DB_FILE
    if not path.is_file():
        return False
    with SweepStore(path, readonly=True) as store:
        points = [r["point"] or {} for r in store.runs()]
    return any(VARIANT_KEY in p for p in points) and not any(DIM_KEY in p for p in points)


def variant_costs(config: dict[str, Any], quant: str = EXPORT_QUANT) -> dict[str, int]:
    """Weights, MGLU mask elements, active params per token and inference bytes per token of a stored run config.

    `params` counts weights only: MGLU's masks ship at 1 bit per element (in `inference_bytes`, and apart as
    `mask_elements`), as the published "halves the FFN gate/up parameters" counts them.
    """
    from plelab.edge.budget import active_params_per_token, inference_bytes
    from plelab.model.params import count_params
    from plelab.training.config import load_train_config

    model = load_train_config(config).model
    counts = count_params(model)
    return {"params": int(counts["total"] - counts["ffn_mask"]), "mask_elements": int(counts["ffn_mask"]),
            "active_params_per_token": int(active_params_per_token(model)),
            "inference_bytes": int(inference_bytes(model, quant))}


def published_variant(configs: dict[str, dict[str, Any]], baseline: str) -> str | None:
    """The variant that is the published one (MGLU with one mask), for the side-by-side table; None if absent."""
    for name, cfg in configs.items():
        ffn = ((cfg or {}).get("model") or {}).get("ffn") or {}
        if name != baseline and ffn.get("kind") == "mglu" and ffn.get("mask_count", 1) == 1:
            return name
    return None


RECORDS_KIND = "ffn-study"
"""records.json's `kind` for this study (plelab report RECORDS.json dispatches on it)."""


def study_records(folder: str | Path, decode: dict[str, dict[str, Any]] | None = None,
                  plan: str | Path | None = None) -> dict[str, Any]:
    """Everything the study's analysis rests on, per seed, as plain data: what a report commits as records.json
    so that anyone can recompute it (`plelab report records.json`) without the sweep folder."""
    from plelab.experiments.plan import plan_inputs

    data = load_variant_sweep(folder)
    if decode is None:
        decode = read_json(Path(folder) / DECODE_FILE)
    return {"kind": RECORDS_KIND, "sweep": data["sweep"], "folder": data["folder"], "counts": data["counts"],
            "total_runs": data["total_runs"], "baseline": data["baseline"], "variants": data["variants"],
            "finals": data["finals"], "timelines": data["timelines"],
            "costs": {v: variant_costs(cfg) for v, cfg in data["configs"].items()}, "decode": decode or {},
            "published_variant": published_variant(data["configs"], data["baseline"]),
            "plan_inputs": plan_inputs(folder, plan)}


def analysis_from_records(rec: dict[str, Any]) -> dict[str, Any]:
    """The study's analysis from study_records' data (a sweep folder's, or a committed records.json's).

    The equivalence margin and test level come from the registered analysis plan (or a plan given at report
    time, whose verdicts are then post hoc); without one the margin is None.
    """
    from plelab.experiments.plan import plan_from_inputs, plan_margin

    registered = plan_from_inputs(rec["plan_inputs"])
    margin, alpha = plan_margin(registered)
    finals, timelines = seed_keys(rec["finals"]), seed_keys(rec["timelines"])
    analysis = analyze_study(finals, rec["baseline"], rec["variants"], timelines, rec["costs"], rec["decode"],
                             margin=margin, alpha=alpha)
    head = {k: rec[k] for k in ("sweep", "folder", "counts", "total_runs", "published_variant")}
    return {**head, **analysis, "plan": registered}


def study_analysis(folder: str | Path, decode: dict[str, dict[str, Any]] | None = None,
                   plan: str | Path | None = None) -> dict[str, Any]:
    """analysis_from_records(study_records(...)) for a sweep folder."""
    return analysis_from_records(study_records(folder, decode, plan))


def _values(runs: dict[int, dict[str, dict[str, float]]], domain: str, key: str) -> dict[int, float]:
    return {s: evals[domain][key] for s, evals in runs.items() if _finite((evals.get(domain) or {}).get(key))}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if _finite(v)]
    return sum(vals) / len(vals) if vals else math.nan
