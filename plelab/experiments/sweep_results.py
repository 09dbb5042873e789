"""A finished sweep's results as plain data for a study's analysis: variants by seed, and which samples were scored.

A study pairs runs by seed; these readers turn the sweep database (SWEEP_DIR/sweep.sqlite) into the dicts its
arithmetic takes, so the arithmetic itself is tested on constructed numbers.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from plelab.errors import PlelabError
from plelab.experiments.sweep import DB_FILE, RESOLVED_FILE, SEED_KEY, VARIANT_KEY
from plelab.experiments.sweep_store import SweepStore

Finals = dict[str, dict[int, dict[str, dict[str, float]]]]
"""{variant: {seed: {domain: {"loss", "bpb"}}}}: final evaluations."""
Timelines = dict[str, dict[int, list[dict[str, Any]]]]
"""{variant: {seed: [{"step", "tokens", "domains": {domain: {"loss", "bpb"}}}]}}: evaluations during training."""


def load_variant_sweep(folder: str | Path) -> dict[str, Any]:
    """Read a variant sweep's folder into plain data: baseline, variants in file order, configs, finals, timelines."""
    folder = Path(folder)
    if not (folder / DB_FILE).is_file():
        raise PlelabError(f"{folder} has no {DB_FILE}; run `plelab sweep SWEEP_FILE` first (or give its folder)")
    with SweepStore(folder / DB_FILE, readonly=True) as store:
        meta, runs, evals = store.meta(), store.runs(), store.evals()
        timeline = store.timeline()
    other = sorted({k for r in runs for k in (r["point"] or {})} - {VARIANT_KEY, SEED_KEY})
    if other:
        raise PlelabError(f"a variant study's report pairs variants by seed, but this sweep's grid also varies "
                          f"{', '.join(other)}; give each value its own sweep (or a variant)")
    resolved = read_json(folder / RESOLVED_FILE) or {}
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


def seed_keys(by_variant: dict[str, dict[Any, Any]]) -> dict[str, dict[int, Any]]:
    """{variant: {seed: ...}} with integer seeds (JSON turned them into strings)."""
    return {v: {int(s): x for s, x in seeds.items()} for v, seeds in by_variant.items()}


def sample_note(evals: dict[str, dict[str, dict[str, Any]]]) -> str | None:
    """A note when runs compared on one domain were evaluated on different samples of its tokens (None when every
    domain's runs agree; domains may differ from each other, e.g. a held-out split scored whole beside capped ones).

    evals: {run: {domain: {..., "sample"}}}. A missing sample is a run recorded before samples were (a text
    domain then read its first eval_tokens tokens); paired deltas between samples compare different text.
    """
    by_domain: dict[str, Counter] = {}
    for run in evals.values():
        for name, d in run.items():
            by_domain.setdefault(name, Counter())[d.get("sample") or "unrecorded (head)"] += 1
    mixed = {name: seen for name, seen in sorted(by_domain.items()) if len(seen) > 1}
    if not mixed:
        return None
    return ("the runs were evaluated on different samples of tokens (" + "; ".join(
        f"{name}: " + ", ".join(f"{k} in {n} runs" for k, n in sorted(seen.items())) for name, seen in mixed.items())
        + "): their losses read different text and are not comparable; extend a study only from the commit it was "
        "run from")


def read_json(path: Path) -> Any:
    """A JSON file a sweep folder keeps beside its database (None when absent; one line when it is not JSON)."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise PlelabError(f"{path} is not valid JSON ({exc}); delete it to regenerate it") from None


def _variant(run: dict[str, Any]) -> str | None:
    v = (run.get("point") or {}).get(VARIANT_KEY)
    return str(v) if v is not None else None


def _seed(run: dict[str, Any]) -> int:
    seed = run.get("seed")
    return int(seed if seed is not None else (run.get("point") or {}).get(SEED_KEY, 0))
