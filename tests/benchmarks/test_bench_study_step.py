"""The study-step benchmark runs end to end on a tiny shape and reports both paths (so it does not rot)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_study_step  # noqa: E402


def test_quick_run_reports_both_paths_and_the_target(capsys):
    r = bench_study_step.main(["--quick", "--threads", "1"])
    assert set(r["results"]) == {"law_h32_dP8"} and r["models"]["law_h32_dP8"]["hidden_size"] == 32
    row = r["results"]["law_h32_dP8"]["threads_1"]
    for path in ("fp32", "bf16-head"):
        assert row[path]["ms_best"] > 0 and row[path]["n"] == 2 and 0 < row[path]["share_of_peak"] < 1
        assert row[path]["tokens_per_s"] == 2 * 32 / (row[path]["ms_best"] / 1e3)
    assert row["ratio_ref_over_fast_best"] == row["fp32"]["ms_best"] / row["bf16-head"]["ms_best"]
    assert r["paths"]["bf16-head"].startswith("bf16-head") and r["peaks_flops"]["1"]["fp32"] > 0
    assert r["target"]["met"] is False  # no law model at H = 64 / 128 in a quick run: nothing to meet
    assert "bench_study_step.py --quick" in r["command"] and '"ratio_ref_over_fast_best"' in capsys.readouterr().out


def test_the_models_are_the_studies_own():
    models = bench_study_step.study_models(0.25, quick=False)
    assert set(models) == {"law_h32_dP8", "law_h64_dP16", "law_h128_dP32", "ffn_study_swiglu"}
    h64 = models["law_h64_dP16"]
    assert (h64.model.hidden_size, h64.model.num_layers, h64.model.vocab_size, h64.batch_size, h64.context) == \
        (64, 4, 8192, 16, 128)
    assert h64.model.ple.gate == "scalar" and h64.dtype == "fp32" and h64.max_steps == 1500
    ffn = models["ffn_study_swiglu"]
    assert (ffn.model.hidden_size, ffn.model.vocab_size, ffn.model.ffn.kind, ffn.model.ple.dim) == \
        (96, 4096, "swiglu", 0)
