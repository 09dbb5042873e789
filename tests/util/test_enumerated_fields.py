"""Every enumerated config field is a Literal: a file or --set value outside it is one clear line, naming the
field and the choices (and the Literals list what the code accepts)."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from plelab.data.sources import KINDS, SourceOptions
from plelab.edge.budget import BUDGETS
from plelab.edge.export import ExportOptions
from plelab.edge.quant import EXPORT_QUANTS
from plelab.experiments.sweep import SweepOptions
from plelab.model.config import FFNConfig, ModelConfig, PLEConfig
from plelab.training.config import TrainConfig, load_train_config
from plelab.util.dataclass_config import ConfigError, from_dict


def literal_fields(cls: type) -> dict[str, tuple]:
    hints = typing.get_type_hints(cls)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(cls)
            if typing.get_origin(hints[f.name]) is typing.Literal}


def test_the_enumerated_fields_are_literals():
    assert literal_fields(TrainConfig) == {"dtype": ("auto", "bf16", "bf16-head", "fp32"),
                                           "parallel": ("auto", "none", "ddp", "fsdp"),
                                           "eval_sample": ("spread", "head", "all"),
                                           "eval_timeline_domains": ("all", "heldout"),
                                           "ple_table": ("memory", "disk")}
    assert literal_fields(ExportOptions) == {"quant": EXPORT_QUANTS}
    assert literal_fields(SweepOptions)["match_ffn"] == ("", *BUDGETS)
    assert literal_fields(SourceOptions)["format"] == ("auto", *KINDS)
    assert set(literal_fields(FFNConfig)) == {"kind", "prune_importance"}
    assert set(literal_fields(PLEConfig)) == {"gate", "index"}
    assert {"arch", "kernels"} <= set(literal_fields(ModelConfig))


@pytest.mark.parametrize(("override", "field"), [
    ("dtype=float16", "dtype"), ("parallel=tp", "parallel"), ("model.ffn.kind=glu", "ffn.kind"),
    ("model.ple.gate=sigmoid", "gate"), ("model.ple.index=hashed", "index"), ("ple_table=ram", "ple_table")])
def test_a_value_outside_the_choices_is_one_line_naming_them(override, field):
    with pytest.raises(ConfigError, match=field) as err:
        load_train_config({}, [override])
    assert "\n" not in str(err.value) and "one of" in str(err.value)


def test_sweep_options_refuse_an_unknown_budget():
    with pytest.raises(ConfigError, match="match_ffn"):
        from_dict(SweepOptions, {"match_ffn": "bytes"})
