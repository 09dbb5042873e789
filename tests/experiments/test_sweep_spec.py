"""Sweep files: grid expansion, stable run names, base references and overrides (no training)."""

from __future__ import annotations

import pytest
from sweep_helpers import write_sweep

from plelab.experiments.sweep import format_value, load_sweep, short_keys
from plelab.util.dataclass_config import ConfigError


def test_grid_expands_in_file_order_with_stable_names(tmp_path):
    sweep = load_sweep(write_sweep(tmp_path, 'seed = [1, 2]\n"model.ple.dim" = [0, 16, 64]'))
    names = [p.name for p in sweep.points]
    assert names == ["seed=1,dim=0", "seed=1,dim=16", "seed=1,dim=64", "seed=2,dim=0", "seed=2,dim=16", "seed=2,dim=64"]
    assert [(p.config.seed, p.config.model.ple.dim) for p in sweep.points] == [
        (1, 0), (1, 16), (1, 64), (2, 0), (2, 16), (2, 64)]
    # base = "train.toml" is read relative to the sweep file; the preset and its overrides survive the grid.
    assert all(p.config.model.hidden_size == 32 and p.config.max_steps == 12 for p in sweep.points)
    assert sweep.run_dir(sweep.points[1]) == tmp_path / "out" / "runs" / "seed=1,dim=16"
    again = load_sweep(tmp_path / "sweep.toml")
    assert [p.name for p in again.points] == names


def test_names_use_the_shortest_unambiguous_key_suffix_and_filesystem_safe_values():
    assert short_keys(["model.ple.dim", "seed", "model.ffn.intermediate_size"]) == {
        "model.ple.dim": "dim", "seed": "seed", "model.ffn.intermediate_size": "intermediate_size"}
    assert short_keys(["model.ple.gate", "other.gate"]) == {"model.ple.gate": "ple.gate", "other.gate": "other.gate"}
    assert [format_value(v) for v in (3, 0.003, 1e-5, True, None, "a b/c", [0, 1])] == [
        "3", "0.003", "1e-05", "true", "none", "a-b-c", "0-1"]


def test_overrides_reach_the_base_the_grid_and_the_options(tmp_path):
    path = write_sweep(tmp_path, 'seed = [1, 2]\n"model.ple.dim" = [0, 16]')
    sweep = load_sweep(path, ["base.max_steps=5", "grid.model.ple.dim=[8]", "sweep.parallel=2"], out=tmp_path / "o")
    assert [p.name for p in sweep.points] == ["seed=1,dim=8", "seed=2,dim=8"]
    assert all(p.config.max_steps == 5 for p in sweep.points)
    assert sweep.options.parallel == 2 and sweep.folder == tmp_path / "o"
    # The resolved form (what subprocess runs read) expands to the same points.
    resolved = load_sweep(sweep.resolved_dict())
    assert [p.config_dict() for p in resolved.points] == [p.config_dict() for p in sweep.points]


@pytest.mark.parametrize("grid, message", [
    ("lr = [0.001, 1e-3]", "both get the run name"),
    ('"model.ple.dimm" = [1]', "grid point dimm=1"),
    ("seed = []", "empty list"),
])
def test_bad_grids_are_refused_with_a_clear_message(tmp_path, grid, message):
    with pytest.raises(ConfigError, match=message):
        load_sweep(write_sweep(tmp_path, grid))


def test_unknown_sections_and_options_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown sweep section"):
        load_sweep({"bsae": {}, "grid": {}})
    with pytest.raises(ConfigError, match="sweep.paralel"):
        load_sweep({"sweep": {"paralel": 2}, "base": {"data": "x"}})
