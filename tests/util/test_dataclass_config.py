"""Fields added after files were written (`LATER`) leave a config's dict as it was until they are set."""

from __future__ import annotations

from plelab.model import load_model_config
from plelab.model.config import ModelConfig
from plelab.training.config import TrainConfig, load_train_config, train_config_dict
from plelab.util.dataclass_config import from_dict, to_dict


def test_later_fields_at_their_defaults_are_left_out_and_come_back():
    token = to_dict(load_model_config("small-ple"))
    assert set(token["ple"]) == {"dim", "vocab_size", "layers", "context", "gate", "gate_init", "output_norm",
                                 "output_norm_init", "table_init_std", "sparse_grad"}  # the keys before n-gram PLE
    assert "ple_table" not in train_config_dict(TrainConfig())
    back = from_dict(ModelConfig, token)
    assert back.ple.index == "token" and back.ple.ngram is None and back.ple.conv_kernel == 0


def test_an_ngram_config_is_written_in_full_and_round_trips():
    cfg = load_model_config("tiny", ["ple.index=ngram", "ple.ngram.heads=2", "ple.conv_kernel=4"])
    d = to_dict(cfg)
    # Every hash setting is recorded, defaults included (the rows worked out from the vocabulary too).
    assert d["ple"]["ngram"] == {"orders": [2, 3], "heads": 2, "rows": [257], "seed": 0, "id_map": None,
                                 "id_map_sha256": None}
    assert d["ple"]["index"] == "ngram" and d["ple"]["conv_kernel"] == 4
    assert from_dict(ModelConfig, d) == cfg
    disk = load_train_config({"model": {"preset": "tiny", "ple": {"table_init_std": 0}}}, ["ple_table=disk"])
    assert train_config_dict(disk)["ple_table"] == "disk"
