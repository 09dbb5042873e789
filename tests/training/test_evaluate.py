"""Evaluation domains: the prepared held-out split rides along with evaluation folders, outside the macro."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from training_helpers import make_dataset, write_config

from plelab.data.prepare import HELDOUT_DOMAIN, EvalDomain
from plelab.inference.evaluate import evaluate_domains
from plelab.model.transformer import LanguageModel
from plelab.training.config import load_train_config
from plelab.training.data_access import TrainingData


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


def _domain(n_docs: int = 40, doc_tokens: int = 300) -> EvalDomain:
    """A domain of n_docs documents, tokens 1.. in order (EOT = 0), 2 bytes per token."""
    parts, ends, byte_ends, n, b = [np.array([0])], [], [], 1, 0
    for _ in range(n_docs):
        doc = np.arange(1, doc_tokens) % 50 + 1
        parts += [doc, np.array([0])]
        n += doc_tokens
        b += 2 * (doc_tokens - 1)
        ends.append(n)
        byte_ends.append(b)
    return EvalDomain("d", np.concatenate(parts), b, np.array(ends), np.array(byte_ends))


def test_head_reads_only_the_start_spread_reads_the_whole_file_all_reads_everything():
    """The old evaluation (eval_tokens = 4096, first documents) read a few percent of a file from its start."""
    from plelab.inference.evaluate import sample_windows

    dom = _domain()                                        # 12,000 targets
    _, head, _ = sample_windows(dom, 128, 1024, "head")
    _, spread, spread_bytes = sample_windows(dom, 128, 1024, "spread")
    _, every, every_bytes = sample_windows(dom, 128, 1024, "all")
    assert max(head) < 1024 and len(spread) == 8           # head: the first 3 documents only
    assert spread[0] == 0 and spread[-1] == dom.n_targets - 128   # spread: from the first to the last window
    gaps = [b - a for a, b in zip(spread, spread[1:], strict=False)]
    assert max(gaps) - min(gaps) <= 1 and min(gaps) >= 128  # evenly spaced, never overlapping
    assert every == list(range(0, dom.n_targets, 128)) and every_bytes == dom.n_bytes
    assert abs(spread_bytes - 8 * 128 * 2) < 2 * 8 * 2      # ~2 bytes a token (EOT targets carry none)
    _, small, _ = sample_windows(_domain(2, 100), 128, 1024, "spread")
    assert small == [0, 128]                                # a domain smaller than the cap is read whole


def test_evaluation_reports_its_noise_and_the_sample_it_used(cfg):
    data = TrainingData(cfg, torch.device("cpu"))
    torch.manual_seed(0)
    model = LanguageModel(cfg.model)
    out = evaluate_domains(model, data.eval_domains, seq_len=32, max_tokens=256)
    for r in out["domains"].values():
        assert r["sample"] == "spread" and r["windows"] >= 2 and 0 < r["loss_se"] < r["loss"]
    assert out["sample"] == "spread"
    whole = evaluate_domains(model, data.eval_domains, seq_len=32)
    assert whole["sample"] == "all" and all(r["sample"] == "all" for r in whole["domains"].values())
    # The held-out split is now the whole split, cut into documents at EOT, not its first eval_tokens + 1 tokens.
    held = data.eval_domains[HELDOUT_DOMAIN]
    assert held.n_docs > 1 and held.tokens[0] == held.tokens[held.doc_token_ends[0] - 1]


def test_the_held_out_split_can_be_scored_whole_beside_capped_domains(cfg, tmp_path):
    data = TrainingData(cfg, torch.device("cpu"))
    torch.manual_seed(0)
    model = LanguageModel(cfg.model)
    capped = evaluate_domains(model, data.eval_domains, seq_len=32, max_tokens=64)
    out = evaluate_domains(model, data.eval_domains, seq_len=32, max_tokens=64, whole=(HELDOUT_DOMAIN,))
    everything = evaluate_domains(model, data.eval_domains, seq_len=32)
    held = out["domains"][HELDOUT_DOMAIN]
    assert held["sample"] == "all" and held["tokens"] == everything["domains"][HELDOUT_DOMAIN]["tokens"]
    assert held["tokens"] > capped["domains"][HELDOUT_DOMAIN]["tokens"]
    assert out["domains"]["prose"] == capped["domains"]["prose"]  # the other domains keep the cap
    # through the config: the trainer's evaluation scores the split whole
    from plelab.training.trainer import Trainer

    cfg.eval_heldout_whole, cfg.eval_tokens, cfg.max_steps = True, 64, 2
    result = Trainer(cfg, tmp_path / "run", quiet=True).run()
    assert result["final_eval"]["domains"][HELDOUT_DOMAIN]["sample"] == "all"
    assert result["final_eval"]["domains"]["prose"]["sample"] == "spread"


def test_a_sample_note_compares_runs_per_domain_not_domains_with_each_other():
    from plelab.experiments.sweep_results import sample_note

    whole_val = {"val": {"sample": "all"}, "prose": {"sample": "spread"}}
    assert sample_note({"a": whole_val, "b": whole_val}) is None  # domains differ; each domain's runs agree
    note = sample_note({"a": whole_val, "b": {"val": {"sample": "spread"}, "prose": {"sample": "spread"}}})
    assert note is not None and "val: all in 1 runs, spread in 1 runs" in note and "prose" not in note


def test_a_new_evaluation_default_leaves_old_sweep_hashes_alone():
    """eval_sample is a field added after run hashes existed: at its default it is not hashed, so the sweeps of
    the published studies keep their run keys (their runs record the sample they used: 'head')."""
    from plelab.experiments.sweep import config_hash
    from plelab.training.config import TrainConfig, train_config_dict

    cfg = train_config_dict(TrainConfig(eval_tokens=4096))
    old = {k: v for k, v in cfg.items() if k != "eval_sample"}
    assert config_hash(cfg) == config_hash(old)
    assert config_hash({**cfg, "eval_sample": "head"}) != config_hash(old)


def test_a_domain_with_ids_beyond_the_vocabulary_is_a_clear_error(cfg):
    """Checked once per domain on the host (the model's forward does not check ids)."""
    import dataclasses

    from plelab.model.transformer import TokenIdError

    data = TrainingData(cfg, torch.device("cpu"))
    prose = data.eval_domains["prose"]
    bad = dataclasses.replace(prose, tokens=prose.tokens.astype("int64") + 1000)
    with pytest.raises(TokenIdError, match=r"\[0, 258\)"):
        evaluate_domains(LanguageModel(cfg.model), {"prose": bad}, seq_len=32)
