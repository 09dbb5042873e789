"""The demo ends with the pays verdict: the PLE model against its dP = 0 twin on the same evaluation batches, with
its interval, and `plelab diagnose` on the demo's PLE run finds the same twin and the run's own eval data."""

from __future__ import annotations

import json

import torch

from plelab.cli.main import main
from plelab.experiments.demo import format_comparison, run_demo

TEXT = ("Per-layer embeddings give every layer its own small vector per token. The table sits in flash while a "
        "tiny core computes. ")


def test_the_demo_ends_with_the_pays_verdict_and_diagnose_agrees(tmp_path, capsys):
    torch.set_num_threads(1)
    data = tmp_path / "data"
    (data / "train").mkdir(parents=True)
    (data / "valid").mkdir()
    (data / "train" / "a.txt").write_text("\n".join(f"Doc {i}. " + TEXT * (1 + i % 4) for i in range(300)))
    (data / "valid" / "prose.txt").write_text(TEXT * 60)
    summary = run_demo(tmp_path / "demo", data, preset="tiny", vocab_size=300, steps=8, say=lambda _: None)
    pays = summary["pays"]
    assert pays["verdict"] in ("better", "better, within margin", "equivalent", "worse", "worse, within margin",
                               "not resolved")
    assert pays["n_batches"] == 16 and len(pays["ci95"]) == 2 and pays["ci95"][0] <= pays["delta"] <= pays["ci95"][1]
    assert pays["twin"].startswith(str(tmp_path / "demo" / "base"))
    text = format_comparison(summary)
    assert "pays: " in text and "not seed-to-seed spread" in text and "dependence, which is not benefit" in text
    assert json.loads((tmp_path / "demo" / "summary.json").read_text())["pays"]["verdict"] == pays["verdict"]
    capsys.readouterr()
    # diagnose with no flag: the run's recorded eval data and the twin beside it
    assert main(["diagnose", str(tmp_path / "demo" / "ple"), "--json", "--batches", "16", "--seq-len", "64"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert "recorded eval_data" in report["data"]["source"]
    assert report["pays"]["twin"].startswith(str(tmp_path / "demo" / "base"))
    assert report["used"]["basis"] == "ablation"
