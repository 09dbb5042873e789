"""The MCU instruction-count benchmark runs end to end on a tiny shape (so it does not rot between real runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from plelab.edge import mcu

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_mcu  # noqa: E402


@pytest.mark.skipif(bool(mcu.missing_tools()), reason="needs gcc-arm-none-eabi, libnewlib-arm-none-eabi and "
                    "qemu-system-arm (bash scripts/setup.sh --test installs them)")
def test_quick_run_counts_instructions_per_path_and_kernel(capsys):
    r = bench_mcu.main(["--quick", "--board", "mps3-an547", "--kernel", "portable", "--steps", "4"])
    runs = r["boards"]["mps3-an547"]["runs"]
    assert set(runs) == {"fp32/portable", "fp32/vector", "int8/portable", "int8_head_skip/portable"}
    params = r["model"]["active_parameters"]
    assert params["total"] == params["dense_tensors"] + params["tied_head"] == params["dense_tensors"] + 4096 * 64
    for run in runs.values():
        assert run["instructions_per_token"] > params["total"]  # at least one instruction per multiply-add
        assert len(run["instructions_per_position"]) == 4 and len(run["tokens"]) == 5
        assert run["est_tok_s_one_instruction_per_cycle"] == pytest.approx(
            bench_mcu.CLOCK_MHZ["mps3-an547"] * 1e6 / run["instructions_per_token"])
        assert run["flash_reads_per_token"] == 1 and "-icount shift=0" in run["qemu_command"]
    assert r["boards"]["mps3-an547"]["same_tokens_per_path"] == {"fp32": True, "int8": True, "int8_head_skip": True}
    assert "not cycles" in r["what"] and any("latency" in s for s in r["estimate"]["leaves_out"])
    assert "bench_mcu.py --quick" in r["command"] and '"boards"' in capsys.readouterr().out
