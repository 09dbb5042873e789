"""The round's pays check: every finished table run against the same seed's dP = 0 run, as `plelab diagnose` would
say it, resumable from its JSON file."""

from __future__ import annotations

import json

import torch
from diagnostic_helpers import byte_corpus

from plelab.studies.onset.pays_check import check_runs, main, table_runs
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer


def _train(root, name: str, dim: int, seed: int, steps: int = 12) -> None:
    cfg = {"data": str(root / "data"), "eval_data": str(root / "valid"), "batch_size": 4, "seq_len": 32,
           "max_steps": steps, "warmup_steps": 2, "log_every": 6, "ckpt_every": 6, "eval_tokens": 128, "lr": 1e-2,
           "device": "cpu", "seed": seed,
           "model": {"preset": "tiny", "vocab_size": 258, "max_seq_len": 32, "ple": {"dim": dim}}}
    Trainer(load_train_config(cfg), root / "runs" / name, quiet=True).run()


def test_each_finished_table_run_gets_its_twins_pays_verdict_and_a_rerun_resumes(tmp_path, capsys):
    torch.set_num_threads(1)
    byte_corpus(tmp_path, valid_repeats=30)
    _train(tmp_path, "seed=1,dim=0", 0, 1)
    _train(tmp_path, "seed=1,dim=16", 16, 1)
    _train(tmp_path, "seed=2,dim=16", 16, 2)  # no dP = 0 run of seed 2: not measured, and why
    runs = tmp_path / "runs"
    assert [(p.name, s, d) for p, s, d in table_runs(runs)] == [("seed=1,dim=16", 1, 16), ("seed=2,dim=16", 2, 16)]
    out = tmp_path / "pays.json"
    result = check_runs(runs, out, batches=4, say=lambda _: None)
    by = {r["seed"]: r for r in result["rows"]}
    assert by[1]["twin"].endswith("seed=1,dim=0") and by[1]["n_batches"] == 4 and len(by[1]["ci95"]) == 2
    assert by[1]["verdict"] in ("better", "better, within margin", "equivalent", "worse", "worse, within margin",
                                "not resolved")
    assert by[2]["verdict"] == "not measured" and "dP = 0 twin" in by[2]["reason"]
    assert json.loads(out.read_text()) == result
    # a rerun measures nothing again (the rows come back as they were), and the command prints the summary
    assert main([str(runs), "--out", str(out), "--batches", "4"]) == 0
    assert json.loads(capsys.readouterr().out) == result["summary"]
    assert json.loads(out.read_text())["rows"] == result["rows"]
    # the write-up's table: one row per run, by dP then seed, the unmeasured one saying why
    assert main([str(runs), "--out", str(out), "--markdown"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2].startswith(f"| 16 | 1 | {by[1]['delta']:+.4f} [") and table[2].endswith(f"| {by[1]['verdict']} |")
    assert table[3].startswith("| 16 | 2 | ") and "dP = 0 twin" in table[3] and table[3].endswith("| not measured |")


def test_a_foreign_out_file_or_too_few_batches_is_refused_and_left_alone(tmp_path, capsys):
    (tmp_path / "runs").mkdir()
    other = tmp_path / "other.json"
    other.write_text('{"something": 1}')
    assert main([str(tmp_path / "runs"), "--out", str(other)]) == 2
    assert "not a pays check's file" in capsys.readouterr().err and other.read_text() == '{"something": 1}'
    assert main([str(tmp_path / "runs"), "--out", str(tmp_path / "new.json"), "--batches", "0"]) == 2
    assert "at least 2" in capsys.readouterr().err and not (tmp_path / "new.json").exists()
