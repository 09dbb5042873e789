"""The fast-path check: its sweep file, its statistics on constructed numbers, its report, a tiny real run."""

from __future__ import annotations

import json
import math

import pytest
from sweep_helpers import make_dataset, study_file

from plelab.cli.main import main
from plelab.errors import PlelabError
from plelab.experiments.sweep import load_sweep
from plelab.experiments.sweep_runner import run_sweep
from plelab.studies.fastpath import check as F
from plelab.studies.fastpath.report import write_fastpath_report
from plelab.studies.registry import choose_study


def test_the_fp32_runs_are_the_dead_zone_law_h64_runs_and_bf16_head_differs_only_in_dtype():
    check = load_sweep(study_file("fastpath-check.toml"))
    law = load_sweep(study_file("deadzone-law-h64.toml"), ["grid.model.ple.dim=[0, 4]"])
    law_hashes = {(p.values["seed"], p.values["model.ple.dim"]): p.config_hash for p in law.points}
    assert check.baseline == "fp32" and len(check.points) == 12
    for p in check.points:
        key = (p.values["seed"], p.values["model.ple.dim"])
        if p.variant == "fp32":
            assert p.config_hash == law_hashes[key]  # the same config, so the same run as the law study's
        else:
            assert p.variant == "bf16-head" and p.config.dtype == "bf16-head"
            twin = next(q for q in check.points if q.variant == "fp32" and
                        (q.values["seed"], q.values["model.ple.dim"]) == key)
            assert {k: v for k, v in p.config_dict().items() if k != "dtype"} == \
                {k: v for k, v in twin.config_dict().items() if k != "dtype"}


def run(variant: str, dim: int, seed: int, heldout: float, curve: dict[int, float]) -> dict:
    return {"name": f"{variant}-{dim}-{seed}", "variant": variant, "dim": dim, "seed": seed, "dir": "", "config": {},
            "final": {"val": heldout, "a": heldout + 1, "b": heldout + 2}, "curve": curve}


def constructed(shift: float) -> list[dict]:
    """fp32 finals 3.0/3.1/3.2 at dP 0 (seed sd 0.1), dP 4 gains 0.05; bf16-head = fp32 + shift."""
    runs = []
    for seed, base in ((1, 3.0), (2, 3.1), (3, 3.2)):
        for dim, gain in ((0, 0.0), (4, -0.05)):
            ref = base + gain
            curve = {t: ref + 1.0 / t for t in (10, 20, 30)}
            runs.append(run("fp32", dim, seed, ref, curve))
            runs.append(run("bf16-head", dim, seed, ref + shift * seed / 2,
                            {t: v + shift * seed / 2 for t, v in curve.items()}))
    return runs


def test_the_statistics_on_constructed_numbers():
    close, far = constructed(0.01), constructed(0.2)  # per-seed shifts 0.005/0.01/0.015 vs 0.1/0.2/0.3
    rows = F.final_section(close, "heldout")
    assert [r["dim"] for r in rows] == [0, 4]
    r = rows[0]
    assert r["fp32"]["mean"] == pytest.approx(3.1) and r["fp32"]["seed_sd"] == pytest.approx(0.1)
    assert r["delta"]["mean"] == pytest.approx(0.01) and r["delta"]["per_seed"] == pytest.approx(
        {1: 0.005, 2: 0.01, 3: 0.015})
    assert r["delta"]["se"] == pytest.approx(0.005 / math.sqrt(3))
    half = 4.303 * 0.005 / math.sqrt(3)
    assert r["delta"]["ci95"] == pytest.approx([0.01 - half, 0.01 + half], rel=1e-3)  # t_{0.975, 2} = 4.303
    assert r["passes"] and r["equivalent"]
    assert F.final_section(close, "macro")[0]["fp32"]["mean"] == pytest.approx(4.6)  # mean of a and b
    big = F.final_section(far, "heldout")[0]
    assert big["delta"]["mean"] == pytest.approx(0.2) and not big["passes"] and not big["equivalent"]
    # The PLE effect: -0.05 on both paths, so their difference is the shift's seed pattern minus itself: 0.
    effect = F.effect_section(close)[0]
    assert effect["effect"]["fp32"]["mean"] == pytest.approx(-0.05)
    assert effect["delta"]["mean"] == pytest.approx(0.0, abs=1e-12)
    curves = F.curve_section(close)
    assert curves[0]["steps"] == 3 and curves[0]["mean_diff"] == pytest.approx(0.01)
    assert curves[0]["mean_seed_sd"] == pytest.approx(0.1)
    assert curves[0]["mean_diff_over_seed_sd"] == pytest.approx(0.1) and curves[0]["passes"]
    assert not F.curve_section(far)[0]["passes"]
    verdict = {"verdict": "alive", "layers": ["alive"] * 4}
    v = F.verdict_section(close, {r["name"]: verdict for r in close})
    assert v["compared"] == 6 and v["passes"]
    odd = {r["name"]: verdict for r in close} | {"bf16-head-4-2": {"verdict": "dead", "layers": ["dead"] * 4}}
    assert F.verdict_section(close, odd)["agree"] == 5 and not F.verdict_section(close, odd)["passes"]


@pytest.mark.slow  # 8 tiny runs of 50 steps with PLE diagnostics and 8 diagnoses: ~3 min on 2 loaded cores
def test_a_tiny_real_check_runs_end_to_end(tmp_path, capsys):
    # The real sweep file, shrunk: the byte-level test corpus, a 32-wide model, 50 steps, seeds 1-2.
    make_dataset(tmp_path)
    overrides = [f"base.data={tmp_path / 'data'}", f"base.eval_data={tmp_path / 'valid'}", "base.max_steps=50",
                 "base.batch_size=4", "base.seq_len=32", "base.warmup_steps=5", "base.log_every=5",
                 "base.ckpt_every=50", "base.diagnostics_every=5", "base.eval_tokens=256",
                 "base.model.vocab_size=258", "base.model.hidden_size=32", "base.model.num_heads=2",
                 "base.model.max_seq_len=32", "base.model.ffn.intermediate_size=64", "grid.seed=[1, 2]",
                 "sweep.parallel=1"]
    sweep = load_sweep(study_file("fastpath-check.toml"), overrides, out=tmp_path / "check")
    assert run_sweep(sweep, quiet=True, say=lambda _: None) == {"done": 8}
    assert choose_study(sweep.folder).name == "fast-path"
    assert main(["report", str(sweep.folder), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["runs"] == 8 and result["steps"] == [50]
    assert [r["dim"] for r in result["final_heldout"]] == [0, 4]
    for row in result["final_heldout"]:
        assert row["delta"]["n"] == 2 and row["delta"]["mean"] != 0  # the paths differ, by a little
        assert abs(row["delta"]["mean"]) < 0.05
    assert result["curves"][0]["steps"] == 50  # the trainer logs every step to metrics.jsonl
    assert result["verdicts"]["compared"] == 4
    assert all(r["fp32"]["verdict"] for r in result["verdicts"]["rows"])
    text = (sweep.folder / "report.md").read_text()
    assert text.startswith("# Fast-path check") and "## plelab diagnose verdicts: " in text
    assert main(["report", str(sweep.folder), "--no-diagnose", "--out", str(tmp_path / "quick")]) == 0
    assert "Not run (--no-diagnose)." in (tmp_path / "quick" / "report.md").read_text()


def test_the_report_states_every_answer_and_the_overall_mark(tmp_path):
    runs = constructed(0.01)
    verdict = {"verdict": "alive", "layers": ["alive"] * 4}
    result = {"folder": "f", "runs": len(runs), "steps": [30], "final_heldout": F.final_section(runs, "heldout"),
              "final_macro": F.final_section(runs, "macro"), "ple_effect": F.effect_section(runs),
              "curves": F.curve_section(runs), "verdicts": F.verdict_section(runs, {r["name"]: verdict for r in runs}),
              "passes": True}
    write_fastpath_report(result, tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "Overall: **PASS**" in md and "plelab diagnose verdicts: 6 of 6 pairs agree" in md
    for heading in ("Final held-out loss (val split)", "Final macro loss", "PLE effect", "Training-loss curves"):
        assert f"## {heading}" in md
    assert "| 0 | 3.1000 ± 0.1000 | 3.1100 ± 0.1050 | +0.01000 ± 0.00289 | [-0.0024, +0.0224] | True | True |" in md


def test_a_folder_without_both_paths_is_one_clear_error(tmp_path, capsys):
    with pytest.raises(PlelabError, match="sweep.sqlite"):
        F.check(tmp_path)
    assert not F.is_fastpath_sweep(tmp_path)
    assert main(["report", str(tmp_path), "--no-diagnose"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--no-diagnose works only on the fast-path study's sweeps" in err
