"""`plelab c` and `plelab mcu` (plelab/cli/c_runtime.py): the C runtime's tools, on this machine and on the boards."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from plelab.cli.main import main
from plelab.edge import c_engine, mcu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from edge_helpers import lively_model  # noqa: E402

needs_cc = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
needs_mcu = pytest.mark.skipif(
    bool(mcu.missing_tools()),
    reason=f"needs {', '.join(mcu.missing_tools())} (bash scripts/setup.sh --test installs them)")


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    status = main([*argv, "--json"])
    return status, json.loads(capsys.readouterr().out)


@needs_cc
def test_c_build_prints_the_cached_binary(capsys):
    assert main(["c", "build", "--program", "plektest", "--cflags=-O1"]) == 0
    path = Path(capsys.readouterr().out.strip())
    assert path.is_file() and path.name == "plektest"
    assert path == c_engine.build(cflags="-O1", program="plektest")


@needs_cc
def test_c_kernels_and_fuzz_report_their_counts(capsys):
    status, r = run_json(capsys, "c", "kernels", "--cases", "300", "--seed", "4")
    assert status == 0 and r["mismatches"] == 0 and r["cases"] >= 300
    status, r = run_json(capsys, "c", "fuzz", "--cases", "2000", "--seed", "5")
    assert status == 0 and r["cases"] == 2000 and r["bad_messages"] == 0 and r["accepted"] + r["rejected"] == 2000
    assert main(["c", "fuzz", "--cases", "300"]) == 0
    assert "300 mutated files:" in capsys.readouterr().out


def test_c_devices_prints_the_shipped_devices_inc(capsys):
    assert main(["c", "devices"]) == 0
    assert capsys.readouterr().out == (c_engine.C_DIR / "devices.inc").read_text()


def test_mcu_boards_lists_every_board_and_what_it_lacks(capsys):
    status, rows = run_json(capsys, "mcu", "boards")
    assert status == 0 and [r["board"] for r in rows] == list(mcu.BOARDS)
    for r in rows:
        assert r["missing"] == mcu.missing_tools(r["board"]) and set(r["missing"]) <= set(r["debian_packages"])


@needs_mcu
def test_mcu_subcommands_run_on_the_board(tmp_path, capsys):
    from plelab.edge.export import ExportOptions, export_model

    model = tmp_path / "m.ple"
    export_model(lively_model(), model, ExportOptions(quant="int4", group=32))
    board = "mps3-an547"
    assert main(["mcu", "build", str(model), "--board", board]) == 0
    assert Path(capsys.readouterr().out.strip()).name == f"plemcu-{board}.elf"
    assert main(["mcu", "run", str(model), "--board", board, "--ids", "3,1,4", "--steps", "5"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["board"] == board and len(r["tokens"]) == 6 and len(r["token_ticks"]) == 5
    status, r = run_json(capsys, "mcu", "fuzz", str(model), "--board", board, "--cases", "40")
    assert status == 0 and r["cases"] == 40 and r["bad_messages"] == 0
    status, r = run_json(capsys, "mcu", "kernels", "--board", board, "--kernel", "helium", "--cases", "200")
    assert status == 0 and r["kernel"] == "helium" and r["mismatches"] == 0
    status, r = run_json(capsys, "mcu", "calibrate", "--board", board, "--loops", "100000")
    assert status == 0 and abs(r["instructions"] - 200_000) <= 100
