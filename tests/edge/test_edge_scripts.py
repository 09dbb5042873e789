"""The quality and speed scripts run end to end on tiny inputs (so they do not rot between real runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from edge_helpers import lively_model

from plelab.data.tokenizer import Tokenizer
from plelab.runs.checkpoint import save_checkpoint

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_edge_decode  # noqa: E402
import edge_quality  # noqa: E402


def test_edge_quality_reports_per_domain_deltas(tmp_path, capsys):
    tok = Tokenizer.byte_level()
    tok_file = tok.save(tmp_path / "tokenizer.json")
    ckpt = save_checkpoint(tmp_path / "ckpt", lively_model(f"vocab_size={tok.vocab_size}"), tokenizer=tok_file)
    valid = tmp_path / "valid"
    valid.mkdir()
    (valid / "en.txt").write_text("Once upon a time.\n<|endoftext|>\nThe end of the story.\n")
    (valid / "zh.txt").write_text("从前有座山。\n")
    r = edge_quality.main([str(ckpt), "--valid", str(valid), "--max-tokens", "300", "--out-dir", str(tmp_path)])
    assert set(r["domains"]) == {"en", "zh"}
    for row in r["domains"].values():
        assert abs(row["fp32"] - row["torch"]) < 1e-4  # the fp32 export is the model
        assert {"delta_int8", "delta_int4"} <= set(row)
    assert r["file_bytes"]["int4"] < r["file_bytes"]["int8"] < r["file_bytes"]["fp32"]
    assert "edge_quality" in r["command"]


def test_decode_benchmark_compares_numpy_and_torch(tmp_path, monkeypatch):
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(var, raising=False)  # the script sets these; undone after the test
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)  # keep this process's thread count
    r = bench_edge_decode.main(["--model", "tiny", "--quant", "fp32", "--new-tokens", "8", "--repeats", "1",
                                "--out", str(tmp_path / "b.ple")])
    assert r["numpy_runtime_tokens_per_s"] > 0 and r["torch_eager_tokens_per_s"] > 0
    assert r["greedy_tokens_agree"] == 1.0  # fp32: same tokens as PyTorch
