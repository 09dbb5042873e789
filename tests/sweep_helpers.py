"""Sweeps for the engine and study tests: the trainer tests' tiny byte-level dataset swept over a grid, and a
variant sweep whose results are constructed (no training)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The tiny dataset and training config live with the trainer tests; share them instead of copying.
sys.path.insert(0, str(Path(__file__).resolve().parent / "training"))
from shared_data_helpers import REPO  # noqa: E402
from training_helpers import make_dataset, write_config  # noqa: E402

from plelab.experiments.sweep import RESOLVED_FILE, load_sweep  # noqa: E402
from plelab.experiments.sweep_store import SweepStore  # noqa: E402
from plelab.studies.ffn.analysis import PUBLISHED_DOMAINS  # noqa: E402

__all__ = ["GAPS", "PLAN", "SEEDS", "STUDIES", "TOKENS", "VARIANTS", "WOBBLE", "fake_study", "make_dataset",
           "study_file", "sweep_files", "write_config", "write_sweep"]

STUDIES = REPO / "studies"
"""Each study's folder: its sweep files (NAME.toml), analysis plans (NAME.plan.toml), snapshots and reports."""


def study_file(name: str) -> Path:
    """A committed sweep or plan file by its file name, in whichever study's folder holds it."""
    found = sorted(STUDIES.glob(f"*/{name}"))
    assert len(found) == 1, f"{name}: expected in one study folder, found {found}"
    return found[0]


def sweep_files() -> list[Path]:
    """Every committed sweep file (studies/*/*.toml but the analysis plans)."""
    return sorted(p for p in STUDIES.glob("*/*.toml") if not p.name.endswith(".plan.toml"))

TRAIN = dict(max_steps=12, ckpt_every=4, log_every=4, diagnostics_every=4)


def write_sweep(root: Path, grid: str, options: str = "", **train) -> Path:
    """A sweep file on root's tiny dataset: `base` refers to a training config written next to it."""
    write_config(root, **{**TRAIN, **train})
    path = root / "sweep.toml"
    path.write_text(f'base = "train.toml"\n[sweep]\nout = "{root / "out"}"\nthreads = 1\n{options}\n[grid]\n{grid}\n')
    return path


SEEDS = (1, 2, 3)
TOKENS = (1000, 2000, 4000, 8000, 16000)
GAPS = (0.08, 0.0, 0.18, 0.10, 0.04)  # the published shape: closes, then reopens
WOBBLE = {1: 0.002, 2: -0.003, 3: 0.001}


PLAN = {"plan": {"name": "ffn-test", "margin": 0.02, "effect_of_interest": 0.041,
                 "comparisons": [{"name": "mglu_val", "variant": "mglu", "reference": "swiglu", "metric": "val",
                                  "predicted": "worse", "decisions": {"worse": "MGLU costs loss here"}},
                                 {"name": "mglu_macro", "variant": "mglu", "reference": "swiglu",
                                  "metric": "macro", "predicted": "equivalent"}]}}
"""A plan registered before the constructed runs: the study's margin (0.02 nats) lets a gap be called closed."""


def fake_study(folder: Path, variants: dict, done: tuple[str, ...] = ("swiglu", "mglu"),
               grid: dict | None = None, plan: dict | None = PLAN) -> Path:
    """A variant sweep on the tiny preset whose `done` variants finished with constructed evaluations, on the FFN
    study's 16 domains (its published losses as the baseline) and the held-out split.

    mglu = swiglu + 0.04 on every domain (+ a small per-seed wobble); its timeline gap follows GAPS. `plan` is
    registered before any run is marked done (None: no plan).
    """
    from plelab.experiments.plan import load_plan, register_plan

    sweep = load_sweep({"sweep": {"out": str(folder), "baseline": "swiglu"},
                        "base": {"model": {"preset": "tiny"}, "max_steps": 10},
                        "grid": grid or {"seed": list(SEEDS)}, "variants": variants})
    folder.mkdir(parents=True, exist_ok=True)
    (folder / RESOLVED_FILE).write_text(json.dumps(sweep.resolved_dict()))
    with SweepStore(sweep.db_path) as store:
        store.set_meta(name="ffn-test", grid=sweep.grid)
        store.sync_points(sweep.points)
        if plan is not None:
            register_plan(store, load_plan(plan), "plan.toml")
        for p in sweep.points:
            if p.variant not in done:
                continue
            seed, worse = p.values.get("seed", 1), p.variant != "swiglu"
            shift = (0.04 + WOBBLE[seed]) if worse else 0.0
            final = {d: {"loss": b + shift, "bpb": (b + shift) / 2, "tokens": 100}
                     for d, (b, _) in PUBLISHED_DOMAINS.items()}
            final["val"] = {"loss": 2.0 + shift / 2, "bpb": 1.0, "tokens": 100}
            timeline = [{"step": i + 1, "tokens": t,
                         "domains": {d: {"loss": 4.0 - 0.2 * i + ((g + WOBBLE[seed]) if worse else 0.0), "bpb": 2.0}
                                     for d in PUBLISHED_DOMAINS}} for i, (t, g) in enumerate(zip(TOKENS, GAPS,
                                                                                                 strict=True))]
            store.mark_done(p.name, {"final_eval": {"domains": final}, "timeline": timeline, "steps": 10})
    return folder


VARIANTS = {"swiglu": {}, "mglu": {"model.ffn.kind": "mglu"}}
