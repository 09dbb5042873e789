"""configs/ngram-small.toml end to end on real text: train, resume, evaluate, diagnose (through the console)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from plelab.data.prepare import prepare_dataset
from plelab.data.tokenizer import Tokenizer

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}


def plelab(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "plelab", *args], capture_output=True, text=True, env=ENV,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_the_ready_ngram_config_trains_resumes_and_evaluates_on_real_text(tmp_path, shared_data):
    train = sorted((shared_data / "train").glob("*"))[0]
    text = train.read_text(encoding="utf-8", errors="replace")[:3_000_000] if train.is_file() else None
    if text is None:
        pytest.skip(f"{train} is not a text file")
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    tok = Tokenizer.train_bpe([text], 4096)
    prepare_dataset([tmp_path / "corpus.txt"], tok, tmp_path / "data", val_fraction=0.02, progress=False)
    valid = tmp_path / "valid"
    valid.mkdir()
    for name in ("en_novel", "code_python"):
        (valid / f"{name}.txt").write_text((shared_data / "valid" / f"{name}.txt").read_text()[:20_000])
    plelab("data", "id-map", str(tmp_path / "data"), "--out", str(tmp_path / "idmap.json"))
    common = ["--set", f"data={tmp_path / 'data'}", "--set", f"eval_data={valid}", "--set", "batch_size=4",
              "--set", "seq_len=64", "--set", "eval_tokens=512", "--set", "ckpt_every=3", "--set", "log_every=1",
              "--set", "diagnostics_every=3", "--set", "model.vocab_size=4096",
              "--set", f"model.ple.ngram.id_map={tmp_path / 'idmap.json'}", "--quiet"]
    run = tmp_path / "run"
    plelab("train", str(REPO / "configs" / "ngram-small.toml"), "--out", str(run), "--set", "max_steps=3", *common)
    plelab("train", "--out", str(run), "--resume", "--set", "max_steps=5", "--quiet")
    losses = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in losses if m.get("loss") is not None and "eval" not in m] == [1, 2, 3, 4, 5]
    result = json.loads(plelab("eval", str(run), "--data", str(valid), "--max-tokens", "256", "--json").stdout)
    assert set(result["domains"]) == {"en_novel", "code_python"}
    report = json.loads(plelab("diagnose", str(run), "--data", str(tmp_path / "data"), "--batches", "2",
                               "--batch-size", "2", "--seq-len", "32", "--json").stdout)
    assert report["hashing"]["rows_per_token"] == 8 and report["model"]["ple_dim"] == 128
