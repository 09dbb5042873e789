"""Config loading, overrides and validation errors."""

from __future__ import annotations

import pytest

from plelab.model import ModelConfig, load_model_config
from plelab.util.dataclass_config import ConfigError, describe, field_docs


def test_every_field_has_a_docstring():
    for key, _default, doc in describe(ModelConfig):
        assert doc, f"{key} has no docstring"


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["num_heads=5"], "does not divide hidden_size"),
        (["ple.dim=-1"], "ple.dim"),
        (["num_kv_heads=3"], "num_kv_heads"),
        (["ple.layers=[7]"], "ple.layers"),
        (["ffn.kind=dense"], "ffn.kind"),
        (["kernels=fast"], "kernels"),
        (["ple.gate=sigmoid"], "ple.gate"),
        (["hidden_sise=3"], "unknown config key"),
        (["ffn.kind=lowrank"], "ffn.rank"),
        (["vocab_size=abc"], "expected an integer"),
        (["nodot"], "key=value"),
    ],
)
def test_invalid_configs_get_clear_errors(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_model_config("tiny", overrides)


def test_file_with_preset_and_overrides(tmp_path):
    f = tmp_path / "m.toml"
    f.write_text('preset = "esp32-28m"\nnum_layers = 4\n[ple]\ndim = 64\n')
    cfg = load_model_config(f, ["ple.gate=scalar"])
    assert (cfg.num_layers, cfg.hidden_size, cfg.ple.dim, cfg.ple.gate) == (4, 96, 64, "scalar")
    y = tmp_path / "m.yaml"
    y.write_text("model:\n  preset: tiny\n  hidden_size: 48\n  num_heads: 6\n  num_kv_heads: 3\n")
    assert load_model_config(y).hidden_size == 48


def test_broken_files_are_reported(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_model_config(bad)
    with pytest.raises(ConfigError, match="neither a preset"):
        load_model_config(tmp_path / "missing.toml")


def test_field_docs_read_attribute_docstrings():
    from plelab.model.config import PLEConfig

    assert "dP" in field_docs(PLEConfig)["dim"]


@pytest.mark.parametrize("override", ["rope_theta=0", "rope_theta=1", "init_std=-1", "init_std=0",
                                      "ple.table_init_std=-1"])
def test_out_of_range_init_and_rope_values_are_refused(override):
    from plelab.model.presets import load_model_config

    with pytest.raises(ConfigError, match=override.split("=")[0].split(".")[-1]):
        load_model_config({"preset": "tiny"}, [override])
