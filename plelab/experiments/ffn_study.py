"""The FFN-sharing study (SPEC §5): per-domain paired deltas, one verdict per variant, and the gap timeline.

Everything below `load_study` is pure arithmetic on plain dicts, so each rule is tested on constructed numbers
and `plelab report DIR --json` prints exactly what the report shows. The rules (also in the output, RULES):

- Pairing: a variant's run with seed s is compared with the baseline's run with the same seed s (same data
  order; the seed's noise is shared), so each quantity is a per-seed delta d_s = variant_s - baseline_s, and
  its mean over the n paired seeds is reported with s.e. = sd(d_s) / sqrt(n). Seeds without a partner are
  left out and named in the notes.
- Macro: per seed, the mean over the evaluation domains (the 16 of ../shared/data/valid; the prepared data's
  held-out split `val` is shown as a row but is never part of the macro or the domain counts), then paired.
- Significance (one test everywhere): a paired mean m with s.e. e over n seeds is significantly worse when
  m > t·e and significantly better when m < -t·e, with t = t_{0.975, n-1} (Student's t, two-sided 5 %: 4.30
  for n = 3, 3.18 for n = 4, 2.78 for n = 5). With 3 seeds a "2 s.e." rule would be a ~18 % test per
  domain, so the t quantile is the defensible threshold; fewer than 2 paired seeds give no s.e. and no verdict.
- Domains worse / better: the number of domains whose paired Δ is significantly worse / better (per domain, 5 %).
- Sign test: k of the m domains with a non-zero mean Δ have Δ > 0; p = two-sided binomial(m, 1/2). p < 0.01
  needs k >= 14 of 16. Domains share one model, so it measures consistency of direction, and the macro test
  carries the significance.
- Verdict, first that applies: *n/a* (fewer than 2 paired seeds); *uniform degradation*: sign test p < 0.01
  with Δ > 0 on the majority, macro significantly worse and no domain significantly better; *uniform gain*:
  the mirror; *trade-off*: at least one domain significantly worse and at least one significantly better
  (16 per-domain 5 % tests: under no effect this fires now and then, so read it with the per-domain table);
  *degradation (not uniform)* / *gain (not uniform)*: the macro is significantly worse / better but the
  domains do not agree enough for "uniform"; *no difference*: otherwise.
- Gap timeline: at every token count both runs of a seed evaluated, gap_s = macro_variant_s - macro_baseline_s,
  mean ± s.e. over seeds. A gap is *open* at a point when it is significantly non-zero (the test above) and
  |gap| > CLOSED_TOL nats, *closed* when it is not significant or |gap| <= CLOSED_TOL. *Illusory convergence*:
  the gap is open at some point, closed at a later point i, and open again towards worse at a point j after i,
  with the per-seed rise gap_s(j) - gap_s(i) itself significantly > 0: a reader stopping at i would have
  called the variants equal. A gap that was never open before it widens (both models still near their initial
  loss at the first points) is a gap opening, not a convergence, and is not flagged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.diagnostics.diagnose import jsonable
from plelab.errors import PlelabError
from plelab.experiments.analysis import SEED_KEY, mean_std, t_critical
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE, VARIANT_KEY
from plelab.experiments.sweep_store import SweepStore

SIGN_TEST_P = 0.01
"""Two-sided sign-test level for a *uniform* verdict (16 domains: at least 14 of them on one side)."""
CLOSED_TOL = 0.005
"""nats/token: a timeline gap this small counts as closed whatever its s.e. (and a reopening must exceed it)."""
EXPORT_DTYPE = "fp16"
"""Export precision the study's inference bytes are counted at."""
DECODE_FILE = "decode.json"
"""In the sweep folder: {variant: measure_decode(...) result} for the variant's first seed."""

VERDICTS = ("uniform degradation", "uniform gain", "trade-off", "degradation (not uniform)", "gain (not uniform)",
            "no difference", "n/a")

RULES = {
    "pairing": "each variant run is compared with the baseline run of the same seed; Δ = variant − baseline "
               "(positive = worse), mean over paired seeds ± s.e. = sd/√n",
    "macro": f"per seed, the mean over the evaluation domains (the held-out split '{HELDOUT_DOMAIN}' is a row but "
             "not in the macro or the counts), then paired across seeds",
    "significance": "significantly worse: mean > t·s.e., better: mean < −t·s.e., with t = t(0.975, n−1) "
                    "(two-sided 5 % paired t-test; t = 4.30 for 3 seeds); fewer than 2 paired seeds: no test",
    "domains_worse": "number of domains whose paired Δ is significantly worse (per domain, the test above)",
    "sign_test": f"k of m domains with non-zero mean Δ have Δ > 0; two-sided binomial p(m, 1/2); a uniform verdict "
                 f"needs p < {SIGN_TEST_P:g} (14 of 16)",
    "verdict": "first that applies: n/a (< 2 paired seeds); uniform degradation (sign test p < 0.01 towards "
               "worse, macro significantly worse, no domain significantly better); uniform gain (the mirror); "
               "trade-off (>= 1 domain significantly worse and >= 1 significantly better); degradation / gain "
               "(not uniform) (macro significant, domains not uniform); no difference (otherwise)",
    "illusory_convergence": f"open = significantly non-zero and |gap| > {CLOSED_TOL:g} nats; closed = not "
                            f"significant or |gap| <= {CLOSED_TOL:g}; flagged when the gap is open at some point, "
                            "closed at a later one, and open again (worse) after that, with the per-seed rise from "
                            "the closed point itself significantly > 0 (a gap that was never open before it "
                            "widens is not a convergence)",
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

Finals = dict[str, dict[int, dict[str, dict[str, float]]]]
"""{variant: {seed: {domain: {"loss", "bpb"}}}}: final evaluations."""
Timelines = dict[str, dict[int, list[dict[str, Any]]]]
"""{variant: {seed: [{"step", "tokens", "domains": {domain: {"loss", "bpb"}}}]}}: evaluations during training."""


# ----------------------------------------------------------------------------------------------- statistics
def paired_delta(base: dict[Any, float], variant: dict[Any, float]) -> dict[str, Any]:
    """Mean ± s.e. of variant[s] - base[s] over the seeds both have (s.e. NaN with fewer than two)."""
    seeds = sorted(s for s in variant if s in base and _finite(variant[s]) and _finite(base[s]))
    deltas = [variant[s] - base[s] for s in seeds]
    mean, se = mean_se(deltas)
    return {"delta": mean, "se": se, "n": len(deltas), "seeds": seeds,
            "per_seed": dict(zip(seeds, deltas, strict=True))}


def mean_se(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (sd / sqrt(n), ddof = 1; NaN with fewer than two values)."""
    mean, std = mean_std(values)
    return mean, std / math.sqrt(len(values)) if len(values) > 1 else math.nan


def significance(mean: float, se: float, n: int) -> int | None:
    """+1 significantly worse, -1 significantly better, 0 within noise, None without a test (n < 2)."""
    if n < 2 or not (_finite(mean) and _finite(se)):
        return None
    t = t_critical(n)
    return 1 if mean > t * se else -1 if mean < -t * se else 0


def sign_test_p(positive: int, negative: int) -> float:
    """Two-sided exact binomial p of `positive` successes out of positive + negative at probability 1/2."""
    m = positive + negative
    if m == 0:
        return 1.0
    k = max(positive, negative)
    tail = sum(math.comb(m, i) for i in range(k, m + 1)) / 2**m
    return min(1.0, 2 * tail)


def verdict(domain_signs: Sequence[int | None], positive: int, negative: int, macro_sign: int | None) -> str:
    """The variant's verdict from the per-domain significance signs, the sign counts and the macro's sign."""
    if macro_sign is None:
        return "n/a"
    worse, better = domain_signs.count(1), domain_signs.count(-1)
    uniform = sign_test_p(positive, negative) < SIGN_TEST_P
    if uniform and positive > negative and macro_sign == 1 and better == 0:
        return "uniform degradation"
    if uniform and negative > positive and macro_sign == -1 and worse == 0:
        return "uniform gain"
    if worse and better:
        return "trade-off"
    if macro_sign == 1:
        return "degradation (not uniform)"
    if macro_sign == -1:
        return "gain (not uniform)"
    return "no difference"


# ----------------------------------------------------------------------------------------------- the analysis
def macro(domains: dict[str, dict[str, float]], key: str = "loss", among: Iterable[str] | None = None) -> float:
    """Mean of `key` over the evaluation domains (the held-out split excluded), optionally only those in `among`."""
    keep = set(among) if among is not None else None
    vals = [r.get(key) for d, r in domains.items()
            if d != HELDOUT_DOMAIN and (keep is None or d in keep) and _finite(r.get(key))]
    return sum(vals) / len(vals) if vals else math.nan


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
                    cell["significant"] = significance(p["delta"], p["se"], p["n"])
                    cell["loss"] = _mean(_values(runs, dom, key).values())
            out[dom][v] = cell
    return out


def variant_summary(finals: Finals, baseline: str, variant: str,
                    domains: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Macro Δ (loss and bpb) ± s.e., domains worse / better / positive, sign test and the verdict."""
    base, runs = finals.get(baseline, {}), finals.get(variant, {})
    evals = [d for d in domains if d != HELDOUT_DOMAIN]
    # Each pair's macro runs over the domains both of its runs have (missing ones are named in the notes).
    loss, bpb = (paired_delta({s: macro(base[s], key, runs[s]) for s in runs if s in base},
                              {s: macro(runs[s], key, base[s]) for s in runs if s in base}) for key in ("loss", "bpb"))
    macro_sign = significance(loss["delta"], loss["se"], loss["n"])
    out: dict[str, Any] = {"macro_delta": loss["delta"], "macro_delta_se": loss["se"], "macro_delta_bpb": bpb["delta"],
                           "macro_delta_bpb_se": bpb["se"], "n_pairs": loss["n"], "seeds": loss["seeds"]}
    cells = [domains[d][variant] for d in evals]
    signs = [c["significant"] for c in cells]
    positive = sum(1 for c in cells if _finite(c["delta"]) and c["delta"] > 0)
    negative = sum(1 for c in cells if _finite(c["delta"]) and c["delta"] < 0)
    held = domains.get(HELDOUT_DOMAIN, {}).get(variant, {})
    out.update(domains_worse=signs.count(1), domains_better=signs.count(-1), domains_positive=positive,
               domains_negative=negative, domains_total=len(evals), sign_test_p=sign_test_p(positive, negative),
               macro_significant=macro_sign, heldout_delta=held.get("delta"), heldout_delta_se=held.get("se"))
    out["verdict"] = "baseline" if variant == baseline else verdict(signs, positive, negative, macro_sign)
    return out


def gap_timeline(timelines: Timelines, baseline: str, variant: str) -> list[dict[str, Any]]:
    """Per token count: paired macro gap vs the baseline (mean, s.e., n, per-seed), and the variant's macro loss."""
    # Points pair by token count (the x axis); a point without one cannot be placed and is skipped.
    base = {s: {p["tokens"]: p for p in pts if p.get("tokens")} for s, pts in timelines.get(baseline, {}).items()}
    mine = {s: {p["tokens"]: p for p in pts if p.get("tokens")} for s, pts in timelines.get(variant, {}).items()}
    tokens = sorted({t for pts in mine.values() for t in pts})
    out = []
    for t in tokens:
        here = {s: pts[t] for s, pts in mine.items() if t in pts}
        there = {s: base[s][t] for s in here if t in base.get(s, {})}
        # Pair macros over the domains both runs evaluated at this point.
        v = {s: macro(here[s]["domains"], among=there[s]["domains"]) for s in there}
        b = {s: macro(there[s]["domains"], among=here[s]["domains"]) for s in there}
        gap = paired_delta(b, v)
        mean_loss, se_loss = mean_se([x for p in here.values() if _finite(x := macro(p["domains"]))])
        out.append({"tokens": t, "step": next(iter(here.values())).get("step"), "gap": gap["delta"], "se": gap["se"],
                    "n": gap["n"], "per_seed": gap["per_seed"], "loss": mean_loss, "loss_se": se_loss})
    return out


def _open(p: dict[str, Any]) -> bool:
    """Is the gap at this point significantly non-zero and beyond CLOSED_TOL (either sign)?"""
    return significance(p["gap"], p["se"], p["n"]) in (1, -1) and abs(p["gap"]) > CLOSED_TOL


def _closed(p: dict[str, Any]) -> bool:
    """Is the gap at this point within noise (not significant) or within CLOSED_TOL?"""
    return p["n"] >= 2 and _finite(p["gap"]) and (abs(p["gap"]) <= CLOSED_TOL
                                                  or significance(p["gap"], p["se"], p["n"]) == 0)


def illusory_convergence(points: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The first (open, closed, reopened) triple of timeline points by RULES['illusory_convergence'], or None."""
    opened = None
    for i, a in enumerate(points):
        if _open(a) and opened is None:
            opened = a
        if opened is None or not _closed(a):
            continue
        for b in points[i + 1:]:
            if not (_open(b) and b["gap"] > 0):
                continue
            rise = paired_delta(a["per_seed"], b["per_seed"])
            if significance(rise["delta"], rise["se"], rise["n"]) == 1:
                return {"open_tokens": opened["tokens"], "open_gap": opened["gap"],
                        "closed_tokens": a["tokens"], "closed_gap": a["gap"], "closed_se": a["se"],
                        "reopened_tokens": b["tokens"], "reopened_gap": b["gap"], "reopened_se": b["se"],
                        "rise": rise["delta"], "rise_se": rise["se"]}
    return None


def analyze_study(finals: Finals, baseline: str, variants: Sequence[str] | None = None,
                  timelines: Timelines | None = None, costs: dict[str, dict[str, Any]] | None = None,
                  decode: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The whole study as JSON-ready data: variants, domains, timeline, rules, notes (NaN -> None)."""
    variants = list(variants or finals)
    if baseline not in variants:
        variants.insert(0, baseline)
    timelines, costs, decode = timelines or {}, costs or {}, decode or {}
    notes = _notes(finals, baseline, variants)
    domains = domain_rows(finals, baseline, variants)
    out_variants, timeline = {}, {}
    for v in variants:
        row = {k: (costs.get(v) or {}).get(k)
               for k in ("params", "mask_elements", "active_params_per_token", "inference_bytes")}
        row.update(variant_summary(finals, baseline, v, domains))
        row["runs"] = len(finals.get(v, {}))
        points = gap_timeline(timelines, baseline, v) if timelines.get(v) else []
        timeline[v] = points
        if timelines.get(v) and v != baseline:
            found = illusory_convergence(points)
            row["illusory_convergence"], row["illusory_at"] = found is not None, found
        measured = decode.get(v) or {}
        for key in ("tokens_per_s", "bytes_per_token"):
            if measured.get(key) is not None:
                row[key] = measured[key]
        if measured.get("error"):
            notes.append(f"variant '{v}': decode not measured ({measured['error']})")
        out_variants[v] = row
    if timelines and not any(timeline.values()):
        notes.append("no timeline points: the runs evaluated only at the end (set eval_timeline in the sweep)")
    return jsonable({
        "baseline": baseline, "heldout_domain": HELDOUT_DOMAIN, "export_dtype": EXPORT_DTYPE,
        "variants": out_variants, "domains": domains, "timeline": timeline, "rules": RULES, "notes": notes,
    })


def _notes(finals: Finals, baseline: str, variants: Sequence[str]) -> list[str]:
    """Plain-language notes on what is missing: variants without runs, seeds without a partner, domains."""
    notes = []
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
    """Does the sweep folder hold a sweep with [variants] (run points carry a 'variant' value)?"""
    path = Path(folder) / DB_FILE
    if not path.is_file():
        return False
    with SweepStore(path, readonly=True) as store:
        return any(VARIANT_KEY in (r["point"] or {}) for r in store.runs())


def load_study(folder: str | Path) -> dict[str, Any]:
    """Read a variant sweep's folder into plain data: baseline, variants in file order, configs, finals, timelines."""
    folder = Path(folder)
    if not (folder / DB_FILE).is_file():
        raise PlelabError(f"{folder} has no {DB_FILE}; run `plelab sweep SWEEP_FILE` first (or give its folder)")
    with SweepStore(folder / DB_FILE, readonly=True) as store:
        meta, runs, evals = store.meta(), store.runs(), store.evals()
        timeline = store.timeline()
    other = sorted({k for r in runs for k in (r["point"] or {})} - {VARIANT_KEY, SEED_KEY})
    if other:
        raise PlelabError(f"the FFN study report pairs variants by seed, but this sweep's grid also varies "
                          f"{', '.join(other)}; give each value its own sweep (or a variant)")
    resolved = _read_json(folder / RESOLVED_FILE) or {}
    order = list(resolved.get("variants") or {})
    variants = order + [v for v in dict.fromkeys(_variant(r) for r in runs) if v and v not in order]
    baseline = ((resolved.get("sweep") or {}).get("baseline") or meta.get("baseline")
                or (variants[0] if variants else ""))
    finals: Finals = {}
    timelines: Timelines = {}
    configs: dict[str, dict[str, Any]] = {}
    counts: dict[str, int] = {}
    for r in runs:
        v, seed = _variant(r), _seed(r)
        counts[r["status"]] = counts.get(r["status"], 0) + 1
        if v is None:
            continue
        configs.setdefault(v, r["config"])
        if r["status"] == "done" and r["name"] in evals:
            finals.setdefault(v, {})[seed] = evals[r["name"]]
            configs[v] = r["config"]
        if timeline.get(r["name"]):
            timelines.setdefault(v, {})[seed] = timeline[r["name"]]
    return {"sweep": meta.get("name", folder.name), "folder": str(folder), "baseline": baseline,
            "variants": variants, "configs": configs, "finals": finals, "timelines": timelines,
            "counts": counts, "total_runs": len(runs), "run_dirs": {
                (_variant(r), _seed(r)): str(folder / "runs" / r["name"]) for r in runs if r["status"] == "done"}}


def variant_costs(config: dict[str, Any], dtype: str = EXPORT_DTYPE) -> dict[str, int]:
    """Weights, MGLU mask elements, active params per token and inference bytes per token of a stored run config.

    `params` counts weights only: MGLU's masks ship at 1 bit per element (in `inference_bytes`, and apart as
    `mask_elements`), as the published "halves the FFN gate/up parameters" counts them.
    """
    from plelab.model.budget import active_params_per_token, inference_bytes
    from plelab.model.params import count_params
    from plelab.training.config import load_train_config

    model = load_train_config(config).model
    counts = count_params(model)
    return {"params": int(counts["total"] - counts["ffn_mask"]), "mask_elements": int(counts["ffn_mask"]),
            "active_params_per_token": int(active_params_per_token(model)),
            "inference_bytes": int(inference_bytes(model, dtype))}


def published_variant(configs: dict[str, dict[str, Any]], baseline: str) -> str | None:
    """The variant that is the published one (MGLU with one mask), for the side-by-side table; None if absent."""
    for name, cfg in configs.items():
        ffn = ((cfg or {}).get("model") or {}).get("ffn") or {}
        if name != baseline and ffn.get("kind") == "mglu" and ffn.get("mask_count", 1) == 1:
            return name
    return None


def study_analysis(folder: str | Path, decode: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """load_study + variant_costs + analyze_study for a sweep folder, with the sweep's name and run counts."""
    data = load_study(folder)
    if decode is None:
        decode = _read_json(Path(folder) / DECODE_FILE)
    costs = {v: variant_costs(cfg) for v, cfg in data["configs"].items()}
    analysis = analyze_study(data["finals"], data["baseline"], data["variants"], data["timelines"], costs, decode)
    head = {"sweep": data["sweep"], "folder": data["folder"], "counts": data["counts"],
            "total_runs": data["total_runs"], "published_variant": published_variant(data["configs"],
                                                                                   data["baseline"])}
    return {**head, **analysis}


def _variant(run: dict[str, Any]) -> str | None:
    v = (run.get("point") or {}).get(VARIANT_KEY)
    return str(v) if v is not None else None


def _seed(run: dict[str, Any]) -> int:
    seed = run.get("seed")
    return int(seed if seed is not None else (run.get("point") or {}).get(SEED_KEY, 0))


def _read_json(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is not valid JSON ({exc}); delete it to regenerate it") from None


def _values(runs: dict[int, dict[str, dict[str, float]]], domain: str, key: str) -> dict[int, float]:
    return {s: evals[domain][key] for s, evals in runs.items() if _finite((evals.get(domain) or {}).get(key))}


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _mean(values: Iterable[float]) -> float:
    vals = [v for v in values if _finite(v)]
    return sum(vals) / len(vals) if vals else math.nan
