"""Every committed sweep file still names the same runs with the same config hashes, so every existing sweep
folder's results and checkpoints stay matched to their runs (committed_sweep_hashes.json was written by plelab
at commit aebcd3e, before the package moves and renames of issue 23; a sweep file added later is recorded when
it is added: fastpath-check.toml, whose fp32 runs hash equal to deadzone-law-h64.toml's, deadzone-tokens.toml,
ffn-pilot-2.toml, visual-ple-ids.toml and ffn-study-2.toml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sweep_helpers import study_file, sweep_files

from plelab.experiments.sweep import load_sweep

RECORDED = json.loads(Path(__file__).with_name("committed_sweep_hashes.json").read_text())


def test_every_committed_sweep_file_is_recorded():
    assert sorted(RECORDED) == sorted(p.name for p in sweep_files())


@pytest.mark.parametrize("name", sorted(RECORDED))
def test_sweep_run_names_and_config_hashes_are_unchanged(name, tmp_path):
    sweep = load_sweep(study_file(name), out=tmp_path / "out")
    assert {p.name: p.config_hash for p in sweep.points} == RECORDED[name]
    assert [p.name for p in sweep.points] == list(RECORDED[name])


def test_a_field_added_to_the_vision_section_is_hashed_only_off_its_default():
    from plelab.experiments.sweep import config_hash

    sweep = load_sweep(study_file("visual-ple-study.toml"), out=Path("/tmp/unused"))
    cfg = sweep.points[0].config_dict()
    assert cfg["vision"]["pixels"] is True
    without = {**cfg, "vision": {k: v for k, v in cfg["vision"].items() if k != "pixels"}}
    assert config_hash(cfg) == config_hash(without)
    assert config_hash({**cfg, "vision": {**cfg["vision"], "pixels": False}}) != config_hash(cfg)
