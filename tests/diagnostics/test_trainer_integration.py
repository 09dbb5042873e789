"""PLEMonitor inside the real Trainer (sparse PLE table, byte tokenizer), then `plelab diagnose` on its run."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from diagnostic_helpers import byte_corpus

from plelab.cli import diagnose as cli

trainer_mod = pytest.importorskip("plelab.training.trainer")
from plelab.training.config import load_train_config  # noqa: E402
from plelab.training.ple_monitor import PLEMonitor  # noqa: E402


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A 24-step tiny-preset run with PLEMonitor(every=4), sparse table gradients and held-out domains."""
    root = tmp_path_factory.mktemp("monitored")
    byte_corpus(root)
    cfg = load_train_config({
        "data": str(root / "data"), "eval_data": str(root / "valid"), "batch_size": 4, "seq_len": 32,
        "max_steps": 24, "warmup_steps": 2, "log_every": 8, "ckpt_every": 8, "eval_tokens": 128, "lr": 1e-2,
        "sparse_ple": True, "device": "cpu",
        "model": {"preset": "tiny", "vocab_size": 258, "max_seq_len": 32},
    })
    torch.set_num_threads(1)
    trainer = trainer_mod.Trainer(cfg, root / "run", callbacks=[PLEMonitor(every=4, max_eval_batches=2)], quiet=True)
    trainer.run()
    return root


def test_metrics_and_verdict_files(run_dir):
    lines = [json.loads(x) for x in (run_dir / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = {m["step"] for m in lines if "ple/injection_ratio/layer0" in m}
    assert logged == {4, 8, 12, 16, 20, 24}
    assert all(m.get("ple/grad_ratio_table/layer1") is not None for m in lines if m.get("step") in logged
               and "ple/injection_ratio/layer0" in m)
    diag = run_dir / "run" / "diagnostics"
    assert (diag / "table_init.npy").is_file()
    early = json.loads((diag / "early.json").read_text())
    final = json.loads((diag / "final.json").read_text())
    assert early["step"] == 2
    assert final["summary"]["verdict"] in ("used", "unused", "not resolved", "harmful")
    assert final["early_matches_final"] is not None
    assert any("evaluation domains (prose, val)" in n for n in final["notes"])  # val: the held-out split
    assert "tokens of the training split" in final["report"]["table_health"]["views"]["frequent"]["rows"]


@pytest.mark.parametrize("data", ["data", "valid"])
def test_diagnose_the_run_with_prepared_or_text_data(run_dir, data, capsys):
    parser = argparse.ArgumentParser(prog="plelab")
    cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["diagnose", str(run_dir / "run"), "--data", str(run_dir / data), "--json",
                              "--batches", "2", "--seq-len", "32"])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["used"]["verdict"] in ("used", "unused", "not resolved", "harmful")
    assert report["used"]["basis"] == "ablation"
    assert report["table_health"]["views"]["delta"]["available"]  # the monitor's init snapshot was found
    assert report["monitor"]["final"]["verdict"] == json.loads(
        (run_dir / "run" / "diagnostics" / "final.json").read_text())["summary"]["verdict"]
    freq = report["table_health"]["views"]["frequent"]["rows"]
    assert ("split 'train'" in freq) if data == "data" else ("domain file" in freq)
