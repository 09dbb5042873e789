"""The engine interface behind `plelab run` (plelab/edge/engine.py): numpy, c and mcu give one greedy sequence."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from edge_helpers import lively_model

from plelab.cli.main import main
from plelab.edge import engine, mcu
from plelab.edge.export import ExportOptions, export_model
from plelab.inference.sampling import Sampling

needs_mcu = pytest.mark.skipif(
    bool(mcu.missing_tools()),
    reason=f"needs {', '.join(mcu.missing_tools())} (bash scripts/setup.sh --test installs them)")
needs_cc = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("engine") / "m.ple"
    export_model(lively_model(), path, ExportOptions(quant="int4", group=32))
    return path


def greedy(model: Path, **fields) -> engine.Request:
    return engine.Request(model, [3, 1, 4, 1, 5], 10, Sampling(temperature=0), **fields)


@needs_cc
@needs_mcu
@pytest.mark.parametrize("path", [{}, {"act": "int8", "kv_dtype": "int8"}])
def test_every_engine_gives_the_same_greedy_ids_through_the_interface(model, path):
    ids = {}
    for name, board in (("numpy", None), ("c", None), *(("mcu", b) for b in mcu.BOARDS)):
        e = engine.get_engine(name, board)
        request = greedy(model, **path)
        e.check(request)
        ids[name, board] = list(e.generate(request))
        report = e.report()
        assert report["tokens_counted"] == request.positions and report["resident_bytes"] > 0
        if name == "mcu":  # instructions, not seconds: the figure a board gives
            assert report["tokens_per_s"] is None and report["instructions_per_token"] > 1000
            assert report["board"] == board and report["bytes_per_token"]["flash"] > 0
    assert len(set(map(tuple, ids.values()))) == 1 and len(ids["numpy", None]) == 10, ids


@needs_mcu
def test_plelab_run_engine_mcu_decodes_on_the_board_as_the_numpy_engine(model, capsys):
    common = ["run", str(model), "--ids", "3,1,4", "--max-new-tokens", "6", "--json"]
    assert main([*common, "--temperature", "0"]) == 0
    want = json.loads(capsys.readouterr().out)["generated_ids"]
    for board in mcu.BOARDS:  # greedy without being told: the board decodes only that way
        assert main([*common, "--engine", "mcu", "--board", board]) == 0
        got = json.loads(capsys.readouterr().out)
        assert got["generated_ids"] == want and got["engine"] == "mcu" and got["board"] == board
    assert main(["run", str(model), "--ids", "3,1,4", "--max-new-tokens", "6", "--engine", "mcu"]) == 0
    err = capsys.readouterr().err
    assert "M instructions per token on mps2-an500" in err and "flash" in err


def test_a_missing_board_package_is_one_line_naming_it(model, monkeypatch, capsys):
    """The machine has the packages (or not): which ones are missing is simulated by hiding QEMU from PATH."""
    real = shutil.which
    monkeypatch.setattr(mcu.shutil, "which", lambda name: None if name.startswith("qemu-system") else real(name))
    e = engine.get_engine("mcu", "mps3-an547")
    with pytest.raises(engine.EngineError, match="needs the Debian package qemu-system-arm"):
        e.check(greedy(model))
    assert main(["run", str(model), "--ids", "1", "--engine", "mcu", "--board", "mps3-an547"]) == 2
    err = capsys.readouterr().err
    assert "qemu-system-arm (apt-get install qemu-system-arm, or bash scripts/setup.sh --test)" in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(("argv", "message"), [
    (["--engine", "mcu", "--temperature", "0.7"], "the mcu engine decodes greedily"),
    (["--engine", "mcu", "--board", "pdp-11"], "unknown board 'pdp-11'; known: mps2-an500"),
    (["--engine", "mcu", "--board", "mps2-an500", "--kernel", "helium"], "builds the kernels portable, vector, dsp"),
    (["--engine", "c", "--board", "mps2-an500"], "--board and --kernel choose the emulated board of --engine mcu"),
    (["--engine", "mcu", "--devices", "mine.toml"], "the built-in device profiles only"),
    (["--head-skip", "--act", "int8", "--temperature", "0"], "--head-skip needs --engine c or mcu"),
    (["--engine", "mcu", "--head-skip"], "--head-skip needs --act int8"),
])
def test_requests_an_engine_cannot_serve_are_one_line_before_any_work(model, capsys, argv, message):
    assert main(["run", str(model), "--ids", "1,2", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_prompt_the_board_cannot_take_is_refused_before_building(model, tmp_path):
    too_long = engine.Request(model, [1] * 1000, 100, Sampling(temperature=0))
    with pytest.raises(mcu.McuError, match="1099 positions .* more than the harness runs .1024."):
        engine.get_engine("mcu").check(too_long)
