"""Sweep variants: [variants.NAME] crossed with the grid, FFN widths matched to the baseline, old hashes kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweep_helpers import study_file, write_sweep

from plelab.cli.main import main
from plelab.edge.budget import budget_value
from plelab.experiments.sweep import config_hash, load_sweep
from plelab.util.dataclass_config import ConfigError

VARIANTS = """
[variants.swiglu]
[variants.mglu1]
"model.ffn.kind" = "mglu"
[variants.mglu4]
model.ffn.kind = "mglu"
model.ffn.mask_count = 4
match = false
"""


def variant_sweep(root: Path, options: str = "", variants: str = VARIANTS, grid: str = "seed = [1, 2]") -> Path:
    path = write_sweep(root, grid, options, diagnostics_every=0)
    path.write_text(path.read_text() + variants)
    return path


def test_variants_cross_the_grid_with_stable_names_in_file_order(tmp_path):
    sweep = load_sweep(variant_sweep(tmp_path))
    names = [p.name for p in sweep.points]
    assert names == ["variant=swiglu,seed=1", "variant=mglu1,seed=1", "variant=mglu4,seed=1",
                     "variant=swiglu,seed=2", "variant=mglu1,seed=2", "variant=mglu4,seed=2"]
    assert [p.index for p in sweep.points] == list(range(6))
    assert [(p.variant, p.config.seed, p.config.model.ffn.kind, p.config.model.ffn.mask_count)
            for p in sweep.points[:3]] == [("swiglu", 1, "swiglu", 1), ("mglu1", 1, "mglu", 1), ("mglu4", 1, "mglu", 4)]
    assert sweep.baseline == "swiglu" and all(not p.solved for p in sweep.points)  # no match_ffn: widths as given
    # The resolved form (what subprocess runs read) expands to the same runs and configs.
    again = load_sweep(sweep.resolved_dict())
    assert [(p.name, p.config_hash) for p in again.points] == [(p.name, p.config_hash) for p in sweep.points]


def test_match_ffn_solves_each_matched_variants_width_against_the_baseline(tmp_path):
    sweep = load_sweep(variant_sweep(tmp_path, 'baseline = "swiglu"\nmatch_ffn = "ffn_params"'))
    base, mglu1, mglu4 = sweep.points[:3]
    width = mglu1.config.model.ffn.intermediate_size
    # One shared matrix instead of gate + up: the matched MGLU is wider, and the widest within the budget.
    assert mglu1.solved == {"model.ffn.intermediate_size": width} and width > base.config.model.ffn.intermediate_size
    assert budget_value(mglu1.config.model, "ffn_params") <= budget_value(base.config.model, "ffn_params")
    wider = load_sweep(variant_sweep(tmp_path, 'match_ffn = "ffn_params"'),
                       ["variants.mglu1.match=false", f"variants.mglu1.model.ffn.intermediate_size={width + 1}"])
    assert budget_value(wider.points[1].config.model, "ffn_params") > budget_value(base.config.model, "ffn_params")
    # match = false keeps the config's width; the solved value is part of the stored config (and its hash).
    assert not mglu4.solved and mglu4.config.model.ffn.intermediate_size == base.config.model.ffn.intermediate_size
    assert mglu1.config_dict()["model"]["ffn"]["intermediate_size"] == width
    assert mglu1.config_hash != load_sweep(variant_sweep(tmp_path)).points[1].config_hash
    # Subprocess runs expand the resolved form: the same widths are solved there.
    again = load_sweep(sweep.resolved_dict())
    assert [(p.name, p.solved, p.config_hash) for p in again.points] == [
        (p.name, p.solved, p.config_hash) for p in sweep.points]


def test_the_status_shows_the_solved_widths(tmp_path, capsys):
    path = variant_sweep(tmp_path, 'match_ffn = "ffn_params"', grid="seed = [1]")
    assert main(["sweep", str(path), "--status", "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert [(r["variant"], sorted(r["solved"])) for r in runs] == [
        ("swiglu", []), ("mglu1", ["model.ffn.intermediate_size"]), ("mglu4", [])]
    assert main(["sweep", str(path), "--status"]) == 0
    out = capsys.readouterr().out
    assert "solved" in out and f"intermediate_size={runs[1]['solved']['model.ffn.intermediate_size']}" in out


@pytest.mark.parametrize("options, variants, message", [
    ('baseline = "swiglu2"', VARIANTS, "sweep.baseline 'swiglu2' is not a variant; variants: swiglu, mglu1, mglu4"),
    ("", VARIANTS + '"model.ffn.kindd" = "x"\n', r"variant mglu4 \(variant=mglu4,seed=1\): unknown config key"),
    ('match_ffn = "params"', VARIANTS,
     "sweep.match_ffn must be one of .*'ffn_params', 'inference_bytes', 'active_flops', got 'params'"),
    ('match_ffn = "ffn_params"', '[variants.tiny]\n"model.ffn.intermediate_size" = 1\n'
     '[variants.moe]\n"model.ffn.kind" = "moe"\n', r"variant moe \(variant=moe,seed=1\): no moe width"),
    ("", VARIANTS + "seed = 3\n", "variant mglu4 sets seed, which the grid also sweeps"),
    ("", "[variants.a]\nmatch = 1\n", "variants.a.match must be true or false"),
    ("", '[variants."a b"]\n', "variant name 'a b' must be"),
    ('baseline = "x"', "", "sweep.baseline needs \\[variants.NAME\\] tables"),
])
def test_bad_variants_are_one_clear_line(tmp_path, capsys, options, variants, message):
    path = variant_sweep(tmp_path, options, variants)
    with pytest.raises(ConfigError, match=message):
        load_sweep(path)
    assert main(["sweep", str(path), "--status"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err


def test_sweep_files_without_variants_keep_their_run_names_and_config_hashes():
    # Recorded with plelab before variants, timelines and the MoE/pruned FFN fields existed (commit e4a994c).
    recorded = json.loads((Path(__file__).with_name("deadzone_h32_hashes.json")).read_text())
    sweep = load_sweep(study_file("deadzone-law-h32.toml"))
    assert {p.name: p.config_hash for p in sweep.points} == recorded
    assert list(recorded) == [p.name for p in sweep.points]
    # A field added later still counts once it is set off its default.
    timeline = load_sweep(study_file("deadzone-law-h32.toml"), ["base.eval_timeline=8"])
    assert timeline.points[0].config_hash != recorded["seed=1,dim=0"]
    config = sweep.points[0].config_dict()
    config["model"]["ffn"]["num_experts"] += 1
    assert config_hash(config) != recorded["seed=1,dim=0"]


def test_the_ffn_study_file_states_the_widths_match_ffn_solves():
    """studies/ffn/ffn-study.toml writes its matched widths out (so the file says what ran): they must be what
    budget.match_ffn solves against MGLU n_m = 1, or the study's equal-budget claim is false."""
    from plelab.edge.budget import FREE_WIDTH, inference_bytes, match_ffn

    sweep = load_sweep(study_file("ffn-study.toml"), ["grid.seed=[1]"])
    models = {p.variant: p.config.model for p in sweep.points}
    matched = ["swiglu_narrow", "lowrank", "pruned", "moe"]
    for name in matched:
        cfg, field = models[name], FREE_WIDTH[models[name].ffn.kind]
        solved = match_ffn(cfg, models["mglu1"], "inference_bytes")
        assert getattr(solved.ffn, field) == getattr(cfg.ffn, field), name
    budget = inference_bytes(models["mglu1"])
    assert all(inference_bytes(models[n]) <= budget for n in matched)
    assert inference_bytes(models["swiglu"]) > budget  # the reference is the one variant left above the budget
