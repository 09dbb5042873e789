"""Evaluation domains: the prepared held-out split rides along with evaluation folders, outside the macro."""

from __future__ import annotations

import math

import pytest
import torch
from training_helpers import make_dataset, write_config

from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.model.transformer import LanguageModel
from plelab.training.config import load_train_config
from plelab.training.data_access import TrainingData
from plelab.training.evaluate import evaluate_domains


@pytest.fixture
def cfg(tmp_path):
    make_dataset(tmp_path)
    return load_train_config(write_config(tmp_path))


def test_the_held_out_split_is_evaluated_beside_the_folders_and_left_out_of_the_macro(cfg):
    data = TrainingData(cfg, torch.device("cpu"))
    assert set(data.eval_domains) == {"prose", "numbers", HELDOUT_DOMAIN}
    torch.manual_seed(0)
    out = evaluate_domains(LanguageModel(cfg.model), data.eval_domains, seq_len=32, max_tokens=256)
    folders = [out["domains"][name]["loss"] for name in ("prose", "numbers")]
    assert math.isclose(out["macro"]["loss"], sum(folders) / 2, rel_tol=1e-9)
    assert out["domains"][HELDOUT_DOMAIN]["loss"] > 0


def test_without_folders_the_held_out_split_is_the_macro(cfg):
    cfg.eval_data = ""
    data = TrainingData(cfg, torch.device("cpu"))
    assert set(data.eval_domains) == {HELDOUT_DOMAIN}
    torch.manual_seed(0)
    out = evaluate_domains(LanguageModel(cfg.model), data.eval_domains, seq_len=32, max_tokens=256)
    assert out["macro"]["loss"] == out["domains"][HELDOUT_DOMAIN]["loss"]


def test_a_domain_with_ids_beyond_the_vocabulary_is_a_clear_error(cfg):
    """Checked once per domain on the host (the model's forward does not check ids)."""
    import dataclasses

    from plelab.model.transformer import TokenIdError

    data = TrainingData(cfg, torch.device("cpu"))
    prose = data.eval_domains["prose"]
    bad = dataclasses.replace(prose, tokens=prose.tokens.astype("int64") + 1000)
    with pytest.raises(TokenIdError, match=r"\[0, 258\)"):
        evaluate_domains(LanguageModel(cfg.model), {"prose": bad}, seq_len=32)
