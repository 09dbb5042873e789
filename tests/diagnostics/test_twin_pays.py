"""The pays verdict: a run against its dP = 0 twin (same data, seed, steps), found beside it or named, on the run's
own recorded evaluation data; a run that is not a twin is refused with the reason; without one, benefit is "not
measured" and the report says why dependence is not benefit."""

from __future__ import annotations

import json

import pytest
import torch
from diagnostic_helpers import byte_corpus

from plelab.cli.main import main
from plelab.diagnostics.diagnose_run import diagnose_run
from plelab.diagnostics.twin import TwinError, check_twin, find_twin
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer


def _train(root, name: str, **overrides) -> None:
    cfg = {"data": str(root / "data"), "eval_data": str(root / "valid"), "batch_size": 4, "seq_len": 32,
           "max_steps": 12, "warmup_steps": 2, "log_every": 6, "ckpt_every": 6, "eval_tokens": 128, "lr": 1e-2,
           "device": "cpu", "seed": 7, "model": {"preset": "tiny", "vocab_size": 258, "max_seq_len": 32}}
    for key, value in overrides.items():
        node = cfg
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    Trainer(load_train_config(cfg), root / name, quiet=True).run()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """ple (dP 16) and its twin base (dP 0), plus other_seed (dP 0, another seed: not a twin), on byte text."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("twins")
    byte_corpus(root, valid_repeats=30)
    _train(root, "sweep/ple")
    _train(root, "sweep/base", **{"model.ple.dim": 0})
    _train(root, "elsewhere/other_seed", seed=8, **{"model.ple.dim": 0})
    return root


def test_the_twin_is_found_beside_the_run_and_pays_is_measured_on_the_runs_own_eval_data(runs):
    twin, note = find_twin(runs / "sweep" / "ple")
    assert twin == runs / "sweep" / "base" and "same training" in note
    report = diagnose_run(runs / "sweep" / "ple", batches=4, batch_size=2, seq_len=32)
    # no --data: the evaluation data the run recorded (config eval_data) is used, and the report says so
    assert "recorded eval_data" in report["data"]["source"] and report["used"]["basis"] == "ablation"
    pays = report["pays"]
    assert pays["twin"].startswith(str(runs / "sweep" / "base")) and pays["n_batches"] == 4
    assert pays["verdict"] in ("better", "better, within margin", "equivalent", "worse", "worse, within margin",
                               "not resolved")
    # the verdict is the paired difference of the two models' losses on the same batches
    assert pays["delta"] == pytest.approx(pays["loss"] - pays["twin_loss"])
    assert pays["test"]["n"] == 4 and len(pays["test"]["ci95"]) == 2


def test_a_run_that_is_not_the_twin_is_refused_with_the_reason(runs):
    with pytest.raises(TwinError, match="seed = 8, the run's 7"):
        check_twin(runs / "sweep" / "ple", runs / "elsewhere" / "other_seed")
    with pytest.raises(TwinError, match="it has a PLE table"):
        check_twin(runs / "sweep" / "base", runs / "sweep" / "ple")


def test_without_a_twin_benefit_is_not_measured_and_the_report_says_why(runs, capsys):
    assert main(["diagnose", str(runs / "sweep" / "ple"), "--no-twin", "--batches", "2", "--batch-size", "2",
                 "--seq-len", "32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["pays"]["verdict"] == "not measured"
    assert "no dP = 0 twin given" in report["pays"]["reason"]
    assert "not whether the table bought anything" in report["pays"]["reason"]
    assert main(["diagnose", str(runs / "sweep" / "ple"), "--batches", "2", "--batch-size", "2",
                 "--seq-len", "32"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].startswith("used: ") and out.splitlines()[2].startswith("pays: ")
    assert "Dependence is not benefit" in out
    assert main(["diagnose", str(runs / "sweep" / "ple"), "--twin", str(runs / "elsewhere" / "other_seed")]) == 2
    assert "is not the dP = 0 twin" in capsys.readouterr().err
