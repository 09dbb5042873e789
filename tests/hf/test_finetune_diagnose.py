"""`plelab diagnose --hf MERGED` compares PLE use with the folder the fine-tune started from. Known answers on a
planted dead checkpoint (PLE gate weights zero): adapters on the gate bring the PLE into use ("more"); adapters
on attention and MLP alone leave the gate at zero, so the PLE stays exactly unused ("unchanged")."""

from __future__ import annotations

import json

import pytest
from finetune_helpers import finetune_argv

from plelab.cli.main import main

pytest.importorskip("peft")

DIAG = ["--batches", "16", "--batch-size", "4", "--seq-len", "32", "--json"]


@pytest.mark.parametrize(("targets", "expected"), [("ple", "more"), ("attention,mlp", "unchanged")])
def test_dead_ple_revived_only_by_gate_adapters(make_gemma, finetune_data, tmp_path, capsys, targets, expected):
    data, valid = finetune_data
    folder = make_gemma("gemma4", plant="dead")
    assert main(finetune_argv(folder, data, valid, tmp_path / "run", "--set", f"finetune.targets={targets}",
                              "--merge", str(tmp_path / "merged"))) == 0
    capsys.readouterr()
    prose = tmp_path / "prose"  # the domain it trained on
    prose.mkdir()
    (prose / "prose.txt").write_text((valid / "prose.txt").read_text())
    assert main(["diagnose", "--hf", str(tmp_path / "merged"), "--data", str(prose), *DIAG]) == 0
    report = json.loads(capsys.readouterr().out)
    c = report["finetune"]
    assert c["base"] == str(folder) and c["verdict"] == expected, c
    assert set(c["domains"]) == {"prose"} and len(c["layers"]) == 2
    primary = c["modes"][c["primary_mode"]]
    assert abs(primary["base_delta"]) < 1e-6  # the planted base: PLE contributes nothing
    if expected == "more":
        assert report["used"]["verdict"] != "unused" and primary["tuned_delta"] > 0.01
        assert all(x["injection_ratio_base"] == 0 < x["injection_ratio_tuned"] for x in c["layers"].values())
    else:
        assert report["used"]["verdict"] == "unused" and abs(primary["tuned_delta"]) < 1e-6


def test_text_report_and_explicit_base(make_gemma, finetune_data, tmp_path, capsys):
    data, valid = finetune_data
    base = make_gemma("gemma4")
    argv = ["diagnose", "--hf", str(base), "--data", str(valid), "--base", str(base), *DIAG[:-1]]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fine-tuning vs base" in out and "UNCHANGED" in out  # a folder against itself
    assert main(["diagnose", "--hf", str(base), "--data", str(valid), *DIAG]) == 0
    assert "finetune" not in json.loads(capsys.readouterr().out)  # no record, no --base: no comparison
