"""The visual PLE study (SPEC §4): caption loss per config, paired Δ vs no visual PLE, the visual table's
diagnostics beside random baselines, the loop-closing fix's effect, and the published figures.

Reads a sweep folder whose runs train with `[vision]` (studies/visual/visual-ple-study.toml): one variant per
config, the baseline variant without visual PLE. Diagnostics run at report time on each finished run's last
checkpoint (plelab.vision.diagnostics.diagnose_run) and are cached in DIR/vision_diagnostics.json, keyed by
the checkpoint's path, so a second report is instant and a resumed or extended run is diagnosed again.
`analyze_vision_study` is pure arithmetic on plain dicts, so each rule is tested on constructed numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from plelab import stats
from plelab.errors import PlelabError
from plelab.experiments.sweep import DB_FILE
from plelab.experiments.sweep_results import load_variant_sweep, seed_keys
from plelab.experiments.sweep_store import SweepStore
from plelab.util.fs import atomic_write_bytes
from plelab.util.json_values import jsonable
from plelab.util.pages import fmt
from plelab.vision.diagnostics import RULES as DIAGNOSTIC_RULES
from plelab.vision.diagnostics import headline, vision_verdict

DIAG_FILE = "vision_diagnostics.json"
"""In the sweep folder: {run name: diagnose_run(...)} of the checkpoints last diagnosed."""
DIAG_VERSION = 1
"""Bumped when the diagnostics' rules change, so cached entries made under older rules are recomputed."""
DOMAIN = "captions"
"""The evaluation domain a vision run records (plelab.vision.train.EVAL_DOMAIN)."""
STATS = ("mean_abs_cosine", "mean_cosine", "effective_rank", "pc1_explained_variance")

RULES = {
    "loss": f"final caption loss on the held-out split ('{DOMAIN}'), nats per caption token; mean ± s.e. over seeds",
    "pairing": "Δ = config − no visual PLE, run by run with the same seed (same trunk init and image order); "
               "mean ± s.e. = sd/√n over the paired seeds",
    "helps": "a config helps when its paired Δ is significantly below 0 and hurts when significantly above: "
             "two-sided 5 % paired t test over the seeds (t = 4.30 s.e. for 3 seeds), Holm-corrected over every "
             "config with visual PLE compared with no visual PLE (one family; a no-table config against another is "
             "description, not tested); fewer than 2 paired seeds: no test. Not significant "
             "is 'not resolved' (95 % CI printed), never 'no difference'",
    "structured": "a config's table is structured when every diagnosed seed's table is structured by the "
                  "diagnostics' rule (below), random-like when every seed's is random-like, mixed otherwise",
    "best_tokenizer": "the tokenizer with the highest bias-corrected MI(patch id; digit label) on the held-out "
                      "split (corpus manifest codebook_report.mi_bits), among the five (not the random control)",
    "id_structure": "the Gaussian baseline is the null of an isotropic table; optimisation noise that is the same "
                    "for every id but anisotropic (gradients living in a few directions) also fails it, random ids "
                    "included. So the study's null for learned id structure is the random-id control: a config has "
                    "id structure beyond the control when the effective rank (as a fraction of its maximum) of its "
                    "table's centred change since initialisation is below the control's, paired by seed (same "
                    "initial table), significantly by the paired t-test above",
    "fix": "the fix (best tokenizer + aux loss λ) turns the table structured when the effective rank of its centred "
           "change is significantly below that of the same corpus without the aux loss (paired by seed, the test "
           "above: the direction set before the runs); it beats no visual PLE when it helps (rule above). A "
           "significantly *higher* rank (ids spread apart) is reported too, labelled post hoc: that direction was "
           "chosen after the runs",
    **{f"diagnostics_{k}": v for k, v in DIAGNOSTIC_RULES.items()},
}

# SPEC §4: five tokenizers, patch ids through PLE, 6,000 steps.
PUBLISHED = {
    "loss_delta": "0.001-0.002 nats for all five tokenizers, indistinguishable from random ids",
    "mean_cosine": 0.000, "effective_rank": 255.1, "max_rank": 256, "pc1_explained_variance": 0.011,
    "random_pc1_explained_variance": 0.004, "steps": 6000,
}


# ----------------------------------------------------------------------------------------------- analysis
def config_facts(config: dict[str, Any], corpora: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """What a run config trains: the visual tokenizer (from its corpus's manifest), dP, λ and the corpus's MI."""
    vision = (config or {}).get("vision") or {}
    corpus = str(vision.get("corpus", ""))
    manifest = corpora.get(corpus) or {}
    report = manifest.get("codebook_report") or {}
    ple_dim = int(vision.get("ple_dim") or 0)
    return {"corpus": corpus, "setting": _setting(config), "max_steps": (config or {}).get("max_steps"),
            "tokenizer": manifest.get("tokenizer_kind") if ple_dim else None,
            "ple_dim": ple_dim, "aux_weight": float(vision.get("aux_weight") or 0.0),
            "mi_bits": report.get("mi_bits"), "mi_floor": report.get("mi_bits_random"),
            "usage_perplexity": report.get("usage_perplexity")}


def _setting(config: dict[str, Any]) -> str:
    """Everything a run config sets except the seed and the visual PLE itself (corpus, dP, lambda): configs with
    the same setting differ only in their table (e.g. the same length and the same pixel path), so only they
    are paired as fix and reference, or as config and random-id control."""
    rest = {k: v for k, v in (config or {}).items() if k != "seed"}
    rest["vision"] = {k: v for k, v in (rest.get("vision") or {}).items()
                      if k not in ("corpus", "ple_dim", "aux_weight")}
    return json.dumps(rest, sort_keys=True, default=str)


def _verdict_now(diag: dict[str, Any]) -> str:
    """A run's verdict under the current rule (plelab.vision.diagnostics.vision_verdict), recomputed from its
    recorded table flag and ablation, so runs recorded under the old alive / dead rule are scored as new ones are."""
    abl = diag.get("ablation")
    if diag.get("visual_ple") is False or (abl is None and "table" not in diag):
        return diag["verdict"]["verdict"]
    if abl is not None:
        abl = {**abl, "n": abl.get("n") or abl.get("n_batches", 0)}
    return vision_verdict((diag.get("table") or {}).get("random_like"), abl)["verdict"]


def _table_summary(diags: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean over seeds of the whole-table statistics per view, seed counts of random-like and verdicts."""
    views = {}
    for view in ("table", "delta"):
        heads = [headline(d["table"], view) for d in diags]
        views[view] = {k: _mean([h.get(k) for h in heads]) for k in (*STATS, *(f"random_{s}" for s in STATS),
                                                                     "max_rank")}
    flags = [d["table"].get("random_like") for d in diags]
    known = [f for f in flags if f is not None]
    structured = (None if not known else "random-like" if all(known) else
                  "structured" if not any(known) else "mixed")
    verdicts: dict[str, int] = {}
    for d in diags:
        v = _verdict_now(d)
        verdicts[v] = verdicts.get(v, 0) + 1
    abl = [d["ablation"]["delta"] for d in diags if d.get("ablation")]
    ratios = [_mean(list(d.get("injection_ratio", {}).values())) for d in diags]
    abl_mean, abl_se = stats.mean_se(abl) if abl else (None, None)
    return {"views": views, "random_like_seeds": sum(bool(f) for f in known), "diagnosed": len(diags),
            "structured": structured, "verdicts": verdicts, "ablation_delta": abl_mean, "ablation_se": abl_se,
            "injection_ratio": _mean(ratios)}


def analyze_vision_study(finals: dict[str, dict[int, dict[str, dict[str, float]]]], baseline: str,
                         variants: Sequence[str], facts: dict[str, dict[str, Any]],
                         diagnostics: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """Per-config rows, the best tokenizer, the fix's effect and conclusions (see RULES).

    finals: {variant: {seed: {domain: {"loss"}}}}; facts: {variant: config_facts(...)};
    diagnostics: {variant: {seed: diagnose_run(...)}}.
    """
    losses = {v: {s: e[DOMAIN]["loss"] for s, e in finals.get(v, {}).items() if DOMAIN in e} for v in variants}
    # Each config's "no visual PLE" reference is the no-table config of its own setting (its length, its pixel
    # path) when the sweep has one, else one of its length, else the sweep's baseline.
    bare = [v for v in variants if not facts.get(v, {}).get("ple_dim")]
    same_length = {facts.get(v, {}).get("max_steps"): v for v in reversed(bare)}
    no_table = {facts.get(v, {}).get("setting"): v for v in bare}
    rows = {}
    for v in variants:
        mean, se = stats.mean_se(list(losses[v].values())) if losses[v] else (None, None)
        row: dict[str, Any] = {"variant": v, **facts.get(v, {}), "n": len(losses[v]), "loss": mean, "loss_se": se,
                               "per_seed": losses[v]}
        mine = facts.get(v, {})
        ref = no_table.get(mine.get("setting")) or (same_length.get(mine.get("max_steps"))
                                                     if mine.get("max_steps") is not None else None) or baseline
        if ref == v:
            ref = baseline
        if v != baseline:
            row["reference"] = ref
            # a fallback reference of another setting (e.g. a pixel path this config lacks): its Δ includes that
            row["reference_same_setting"] = facts.get(ref, {}).get("setting") == mine.get("setting")
            d = stats.paired(losses.get(ref, {}), losses[v])
            test = stats.t_test(d["mean"], d["se"], d["n"])
            row.update(delta=d["mean"] if d["n"] else None, delta_se=d["se"], delta_n=d["n"], delta_p=test["p"],
                       delta_ci95=stats.t_interval(d["mean"], d["se"], d["n"]))
        seeds = {s: x for s, x in (diagnostics.get(v) or {}).items() if x.get("visual_ple")}
        row["table"] = _table_summary(list(seeds.values())) if seeds else None
        row["change_rank"] = {s: _rank_fraction(x) for s, x in seeds.items() if _finite(_rank_fraction(x))}
        rows[v] = row
    _holm_helps(rows, baseline)
    controls = {r.get("setting"): v for v, r in rows.items() if r.get("tokenizer") == "random" and r.get("ple_dim")
                and not r.get("aux_weight")}
    control = next(iter(controls.values()), None)
    for v, row in rows.items():
        mine = controls.get(row.get("setting"))
        if mine and v != mine and row["change_rank"]:
            row["control"] = mine
            row["vs_control"] = _structure_test(rows[mine]["change_rank"], row["change_rank"])
    best = _best_tokenizer(rows, baseline)
    fixes = [_fix_effect(rows, v, baseline) for v in variants if rows[v].get("aux_weight")]
    analysis = {"baseline": baseline, "variants": list(variants), "rows": rows, "control": control,
                "best_tokenizer": best,
                "fix": fixes, "rules": RULES, "published": PUBLISHED}
    analysis["conclusions"] = _conclusions(analysis)
    return analysis


def _holm_helps(rows: dict[str, dict[str, Any]], baseline: str, alpha: float = stats.ALPHA) -> None:
    """helps / hurts per config from its paired Δ vs no visual PLE, Holm-corrected over every config (RULES)."""
    # only configs with visual PLE are tested: a no-table config against another no-table one (another length)
    # says nothing about visual PLE, and in the family it would only make the correction stricter
    names = [v for v in rows if v != baseline and rows[v].get("ple_dim")]
    for v in rows:
        if v != baseline and v not in names:
            rows[v].update(delta_p_holm=None, delta_sig=None, helps=None,
                           outcome="not tested (no visual PLE: description)")
    adjusted = stats.holm([rows[v].get("delta_p") for v in names], alpha)["adjusted"]
    for v, p in zip(names, adjusted, strict=True):
        row = rows[v]
        sig = None if p is None else 0 if p >= alpha else (1 if row["delta"] > 0 else -1)
        # helps: True / False (hurts) / None (not resolved, or no test): "no" only where the test says so
        row.update(delta_p_holm=p, delta_sig=sig, helps={-1: True, 0: None, 1: False, None: None}[sig],
                   outcome={1: "hurts", -1: "helps", 0: "not resolved", None: "n/a"}[sig])


def _rank_fraction(diag: dict[str, Any]) -> float | None:
    """Effective rank of the table's centred change since initialisation, as a fraction of its maximum."""
    h = headline(diag["table"], "delta")
    return h["effective_rank"] / h["max_rank"] if _finite(h["effective_rank"]) and h["max_rank"] else None


def _structure_test(reference: dict[int, float], config: dict[int, float]) -> dict[str, Any]:
    """Paired (by seed) change in effective-rank fraction vs a reference; structured = significantly lower."""
    d = stats.paired(reference, config)
    sig = stats.significance(d["mean"], d["se"], d["n"])
    return {"delta": d["mean"] if d["n"] else None, "se": d["se"], "n": d["n"],
            "structured": None if sig is None else sig == -1, "spread_apart": None if sig is None else sig == 1}


def _is_tokenizer_config(row: dict[str, Any]) -> bool:
    return bool(row.get("ple_dim")) and not row.get("aux_weight") and row.get("tokenizer") not in (None, "random")


def _best_tokenizer(rows: dict[str, dict[str, Any]], baseline: str) -> dict[str, Any] | None:
    """The tokenizer config with the highest MI(patch id; label) (RULES['best_tokenizer']), or None."""
    cands = [r for v, r in rows.items() if v != baseline and _is_tokenizer_config(r) and _finite(r.get("mi_bits"))]
    if not cands:
        return None
    top = max(cands, key=lambda r: r["mi_bits"])
    return {"variant": top["variant"], "tokenizer": top["tokenizer"], "mi_bits": top["mi_bits"],
            "corpus": top["corpus"]}


def _fix_effect(rows: dict[str, dict[str, Any]], variant: str, baseline: str) -> dict[str, Any]:
    """The aux-loss config against the same corpus without the aux loss, and against no visual PLE."""
    row = rows[variant]
    ref = next((r for v, r in rows.items() if v != baseline and r.get("corpus") == row.get("corpus")
                and r.get("setting") == row.get("setting") and r.get("ple_dim") and not r.get("aux_weight")), None)
    mine = (row.get("table") or {}).get("structured")
    theirs = (ref.get("table") or {}).get("structured") if ref else None
    vs_ref = stats.paired(ref["per_seed"], row["per_seed"]) if ref else None
    rank = _structure_test(ref["change_rank"], row["change_rank"]) if ref else None
    return {"variant": variant, "aux_weight": row.get("aux_weight"), "tokenizer": row.get("tokenizer"),
            "reference": ref["variant"] if ref else None, "structured": mine, "reference_structured": theirs,
            "change_rank_vs_reference": rank,
            "turned_structured": None if rank is None else rank["structured"],
            "spread_apart_post_hoc": None if rank is None else rank["spread_apart"],
            "helps": row.get("helps"), "outcome": row.get("outcome"), "delta": row.get("delta"),
            "delta_se": row.get("delta_se"),
            "delta_vs_reference": vs_ref["mean"] if vs_ref and vs_ref["n"] else None,
            "delta_vs_reference_se": vs_ref["se"] if vs_ref else None}


def _conclusions(a: dict[str, Any]) -> list[str]:
    rows, out = a["rows"], []
    toks = [r for v, r in rows.items() if v != a["baseline"] and r.get("ple_dim") and not r.get("aux_weight")]
    if toks:
        helped = [r["variant"] for r in toks if r.get("helps")]
        random_like = [r["variant"] for r in toks if (r.get("table") or {}).get("structured") == "random-like"]
        beyond = [r["variant"] for r in toks if (r.get("vs_control") or {}).get("structured")]
        tested = [r for r in toks if (r.get("vs_control") or {}).get("structured") is not None]
        hurt = [r["variant"] for r in toks if r.get("delta_sig") == 1]
        other = [v for v in hurt if rows[v].get("reference_same_setting") is False]
        caveat = (f"; {', '.join(other)} against a no-table model of another setting (e.g. with the pixel path it "
                  "lacks), so that rise includes the difference of setting") if other else ""
        out.append(f"Visual PLE without the aux loss: {len(helped)}/{len(toks)} configs lower the caption loss "
                   f"significantly vs no visual PLE ({', '.join(helped) or 'none'}), {len(hurt)}/{len(toks)} raise it "
                   f"({', '.join(hurt) or 'none'}; Holm over every config with visual PLE{caveat}); tables "
                   "random-like vs a "
                   f"Gaussian table in {len(random_like)}/{len(toks)} ({', '.join(random_like) or 'none'}); id "
                   f"structure beyond the random-id control ({a.get('control') or 'absent'}) in "
                   f"{len(beyond)}/{len(tested)} tested ({', '.join(beyond) or 'none'}).")
    best = a.get("best_tokenizer")
    fixes = a.get("fix") or []
    if best:
        off = [f["variant"] for f in fixes if f.get("tokenizer") != best["tokenizer"]]
        out.append(f"Best tokenizer by MI(patch id; label): {best['tokenizer']} ({best['mi_bits']:.3f} bits)."
                   + (f" The fix configs {', '.join(off)} use another corpus: rerun them on {best['corpus']}."
                      if off else ""))
    for f in fixes:
        table = {True: "turned the table structured", False: "did not turn the table structured",
                 None: "table effect unknown (not diagnosed)"}[f["turned_structured"]]
        if f.get("spread_apart_post_hoc"):
            table += " (post hoc, not the pre-set rule: the rank went significantly up, the ids spread apart)"
        loss = {-1: "beats", 1: "does not beat", 0: "is not resolved from"}.get(
            rows[f["variant"]].get("delta_sig"), "cannot yet be compared with")
        rank = f.get("change_rank_vs_reference") or {}
        out.append(f"Fix {f['variant']} (λ = {f['aux_weight']:g}): {table} (effective-rank fraction of the change "
                   f"vs {f['reference']}: {fmt(rank.get('delta'), '+.3f')} ± {fmt(rank.get('se'), '.3f')}; vs a "
                   f"Gaussian table: {f['structured']}, without aux: {f['reference_structured']}); caption loss "
                   f"{loss} no visual PLE "
                   f"(Δ {fmt(f['delta'], '+.4f')} ± {fmt(f['delta_se'])}).")
    return out


# ----------------------------------------------------------------------------------------------- the sweep
def is_vision_sweep(folder: str | Path) -> bool:
    """Does the sweep folder hold runs that train with [vision] on?"""
    path = Path(folder) / DB_FILE
    if not path.is_file():
        return False
    with SweepStore(path, readonly=True) as store:
        return any(((r["config"] or {}).get("vision") or {}).get("corpus") for r in store.runs())


def read_corpora(configs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{corpus path: its manifest.json} for the corpora the configs name (absent or unreadable ones left out)."""
    out = {}
    for cfg in configs.values():
        corpus = str(((cfg or {}).get("vision") or {}).get("corpus", ""))
        try:
            out[corpus] = json.loads((Path(corpus) / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
    return out


def run_diagnostics(folder: str | Path, run_dirs: dict[tuple[str, int], str],
                    progress=lambda msg: None) -> dict[str, dict[int, dict[str, Any]]]:
    """{variant: {seed: diagnose_run(...)}} for every finished run, from the cache where its checkpoint matches."""
    from plelab.runs.checkpoint import CheckpointError, resolve_checkpoint
    from plelab.vision.diagnostics import diagnose_run

    path = Path(folder) / DIAG_FILE
    try:
        cache = json.loads(path.read_text()) if path.is_file() else {}
    except ValueError:
        cache = {}
    out: dict[str, dict[int, dict[str, Any]]] = {}
    changed = False
    for (variant, seed), run_dir in sorted(run_dirs.items()):
        name = Path(run_dir).name
        try:
            ckpt = str(resolve_checkpoint(run_dir))
        except CheckpointError as exc:
            progress(f"{name}: no checkpoint to diagnose ({exc})")
            continue
        entry = cache.get(name) or {}
        if entry.get("checkpoint") != ckpt or entry.get("version") != DIAG_VERSION:
            progress(f"diagnosing {name} ({ckpt})")
            try:
                cache[name] = {**jsonable(diagnose_run(run_dir)), "version": DIAG_VERSION}
            except PlelabError as exc:
                progress(f"{name}: {exc}")
                continue
            changed = True
        out.setdefault(variant, {})[seed] = cache[name]
    if changed:
        atomic_write_bytes(path, json.dumps(cache, indent=1).encode())
    return out


RECORDS_KIND = "visual-ple-study"
"""records.json's `kind` for this study (plelab report RECORDS.json dispatches on it)."""


def study_records(folder: str | Path, progress=lambda msg: None, plan: str | Path | None = None) -> dict[str, Any]:
    """Everything the analysis rests on, per seed (losses, config facts, table diagnostics, the plan's inputs), as
    plain data: what a report commits as records.json so that anyone can recompute it without the sweep folder."""
    from plelab.experiments.plan import plan_inputs

    data = load_variant_sweep(folder)
    corpora = read_corpora(data["configs"])
    return {"kind": RECORDS_KIND, "sweep": data["sweep"], "folder": data["folder"], "counts": data["counts"],
            "total_runs": data["total_runs"], "baseline": data["baseline"], "variants": data["variants"],
            "finals": data["finals"], "facts": {v: config_facts(cfg, corpora) for v, cfg in data["configs"].items()},
            "diagnostics": run_diagnostics(folder, data["run_dirs"], progress),
            "plan_inputs": plan_inputs(folder, plan)}


def analysis_from_records(rec: dict[str, Any]) -> dict[str, Any]:
    """The analysis from study_records' data (a sweep folder's or a committed records.json's)."""
    from plelab.experiments.plan import plan_from_inputs

    analysis = analyze_vision_study(seed_keys(rec["finals"]), rec["baseline"], rec["variants"], rec["facts"],
                                    seed_keys(rec["diagnostics"]))
    return {**{k: rec[k] for k in ("sweep", "folder", "counts", "total_runs")}, **analysis,
            "plan": plan_from_inputs(rec["plan_inputs"])}


def study_analysis(folder: str | Path, progress=lambda msg: None, plan: str | Path | None = None) -> dict[str, Any]:
    """analysis_from_records(study_records(...)) for a sweep folder: diagnoses (or reads the cache), analyses."""
    return analysis_from_records(study_records(folder, progress, plan))


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _mean(values: Sequence[Any]) -> float | None:
    vals = [float(v) for v in values if _finite(v)]
    return sum(vals) / len(vals) if vals else None
