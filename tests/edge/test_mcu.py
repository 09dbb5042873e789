"""The C runtime as microcontroller toolchains build it (arm-none-eabi-gcc standing in for ESP-IDF's)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from edge_helpers import lively_model

from plelab.edge import c_engine, mcu
from plelab.edge.export import ExportOptions, export_model
from plelab.edge.format import PleFile
from plelab.edge.placement import get_device, place

needs_arm_gcc = pytest.mark.skipif(
    shutil.which(mcu.ARM_GCC) is None,
    reason="arm-none-eabi-gcc not installed (bash scripts/setup.sh --test installs gcc-arm-none-eabi)")


def test_the_esp_idf_component_lists_the_runtime_library():
    names = {p.name for p in mcu.esp_idf_sources()}
    assert set(c_engine.LIBRARY) | {"ple_storage_esp.c"} == names
    assert all(p.is_file() for p in mcu.esp_idf_sources())


@pytest.mark.parametrize("board", [None, "virt-rv32imafc", "virt-rv32imac"])  # Xtensa's stand-in, the P4's, C6's
@pytest.mark.parametrize("opt", ["-Og", "-O2"])  # ESP-IDF's debug and performance defaults
def test_every_esp_idf_source_builds_warning_free_under_esp_idf_flags(opt, board):
    """uint32_t is unsigned long on ESP-IDF v5's and arm's compilers: %u for it fails -Werror=all there only. The
    RISC-V chips build the RV32 integer kernel, its assembly included."""
    cc = mcu.get_board(board).toolchain.cc if board else mcu.ARM_GCC
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed (bash scripts/setup.sh --test installs it)")
    for src in mcu.esp_idf_sources():
        proc = mcu.esp_idf_compile(src, opt, board)
        assert proc.returncode == 0, proc.stderr
        warnings = [ln for ln in proc.stderr.splitlines() if "warning:" in ln or "error:" in ln]
        assert not warnings, "\n".join(warnings)


@needs_arm_gcc
def test_the_strict_check_sees_a_uint32_printed_with_percent_u(tmp_path):
    """The check can fail: the bug the issue found (%u with a uint32_t) is an error under these flags."""
    src = tmp_path / "bad.c"
    src.write_text('#include <stdio.h>\n#include <stdint.h>\n'
                   'int f(char *b, uint32_t n) { return snprintf(b, 8, "%u", n); }\n')
    proc = mcu.esp_idf_compile(src)
    assert proc.returncode != 0 and "-Werror=format" in proc.stderr


# ---- bare metal under QEMU (plelab/edge/c/mcu) -------------------------------------------------------------

needs_mcu = pytest.mark.skipif(
    bool(mcu.missing_tools()),
    reason=f"needs {', '.join(mcu.missing_tools())} (bash scripts/setup.sh --test installs them)")
BOARDS = list(mcu.BOARDS)
PROMPT = [3, 1, 4, 1, 5]
STEPS = 14
MODELS = {  # name -> (lively_model overrides, export options)
    "gemma_int4": ([], {"quant": "int4", "group": 32}),
    "gemma_int8": ([], {"quant": "int8", "group": 32}),
    "simple_int4": (["ple.gate=scalar", "ple.context=false", "ple.output_norm=false"], {"quant": "int4", "group": 32}),
    "mglu_int4": (["ffn.kind=mglu", "ffn.mask_count=2"], {"quant": "int4", "group": 32}),
    # an 8,192-position KV cache (2 MiB in float32, 768 KiB in int8) does not fit the SRAM tier: it goes to PSRAM
    "kv_in_psram_int8": (["max_seq_len=8192"], {"quant": "int8", "group": 32}),
}
# the runtime's two paths: float activations (the reference), and the MCU path of int8 activations, an int8 KV
# cache and the greedy head that skips rows
PATHS = {"fp32": {}, "int8": {"act": "int8", "kv": "int8", "head_skip": True}}
HOST_FLAGS = {"fp32": [], "int8": ["--act", "int8", "--kv", "int8", "--head-skip"]}


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("mcu_models")
    paths = {}
    for name, (overrides, opts) in MODELS.items():
        paths[name] = out / f"{name}.ple"
        export_model(lively_model(*overrides), paths[name], ExportOptions(**opts))
    return paths


def mcu_run(board: str, model: Path, *args: str, timeout: float = 60) -> mcu.McuRun:
    return mcu.run_image(board, mcu.build_image(board, model), list(args), timeout=timeout)


def host_plan_ram(model: Path, kv: str) -> dict[str, int]:
    with PleFile(model, verify="none") as f:
        want = place(f.layout, get_device("esp32-s3"), kv_dtype=kv)  # context = max_seq_len, as the arena
    return {name: t["used"] for name, t in want["tiers"].items() if t["kind"] == "ram"}


def record_bytes(model: Path) -> int:
    with PleFile(model, verify="none") as f:
        return f.layout.table("ple").record_bytes


@needs_mcu
@pytest.mark.parametrize("board", BOARDS)
def test_the_board_timer_counts_one_tick_per_instruction_at_its_clock(board, models):
    r = mcu_run(board, models["gemma_int4"], "calibrate", "--loops", "500000").result
    assert r["loop_instructions"] == 1_000_000
    assert abs(mcu.instructions(r["ticks"], r["timer_hz"]) - 1_000_000) <= 100  # a few instructions of overhead


@needs_mcu
@pytest.mark.parametrize("name", list(MODELS))
def test_bare_metal_greedy_ids_equal_the_host_engine_with_the_plans_arena(name, models):
    model = models[name]
    for path, opts in PATHS.items():
        host = c_engine.run(model, PROMPT, STEPS, device="esp32-s3", cflags="-O2", extra=HOST_FLAGS[path])
        want_ram = host_plan_ram(model, opts.get("kv", "fp32"))
        assert {t: u["placed"] for t, u in host["tiers"].items()} == want_ram
        for board in BOARDS:
            r = mcu.run_model(board, model, PROMPT, STEPS, **opts)
            assert r["tokens"] == host["tokens"], (board, path)
            assert r["head_rows_computed"] <= r["head_rows"] == STEPS * 256
            # the arena as the ESP32-S3 plan places it: SRAM and PSRAM parts equal the plan's figures
            assert {t: u["placed"] for t, u in r["tiers"].items()} == want_ram, (board, path)
            assert r["tiers"]["sram"]["placed"] <= 300_032  # the profile's SRAM for weights + KV cache
            assert r["sram_region"]["bytes"] == 512 * 1024  # the SRAM stand-in: stack, data, heap, SRAM arena
            assert r["sram_region"]["stack_data_heap"] + r["tiers"]["sram"]["arena"] <= 512 * 1024
            assert r["sram_region"]["stack_used"] < r["sram_region"]["stack"]
            assert all(u["arena"] <= u["available"] for u in r["tiers"].values())
            # the flash holds the file; a token reads one PLE record from it, and nothing past its end
            st = r["storage"]
            assert st["reads_decode"] == STEPS and st["bytes_decode"] == STEPS * record_bytes(model)
            assert st["refused"] == 0 and st["file_bytes"] == model.stat().st_size
            assert st["partition_bytes"] % 4096 == 0 and st["partition_bytes"] >= st["file_bytes"]
            assert all(t > 0 for t in r["token_ticks"])
            # no double precision and no 64-bit division in the token path, on any core: on the RISC-V boards
            # every double operation is a helper call, so this counts every one
            assert r["helper_calls"] == {"soft_double": 0, "div64": 0, "double_math": 0}, (board, path)
            if name == "kv_in_psram_int8":
                assert want_ram["psram"] > 0 and r["tiers"]["psram"]["arena"] >= want_ram["psram"]


# every encoding and FFN kind, a paged table, an untied head, an n-gram table (its hash): the token path's other
# branches
HELPER_VARIANTS = {
    "fp32": ([], {"quant": "fp32"}),
    "fp16_lowrank": (["ffn.kind=lowrank", "ffn.rank=8"], {"quant": "fp16"}),
    "int8_moe_untied": (["ffn.kind=moe", "ffn.num_experts=4", "ffn.top_k=2", "tie_embeddings=false"],
                        {"quant": "int8", "group": 32}),
    "int4_paged": ([], {"quant": "int4", "group": 32, "page": 512}),
    "int4_ngram": (["ple.index=ngram", "ple.ngram.orders=[2,3]", "ple.ngram.heads=2"], {"quant": "int4", "group": 32}),
}


@needs_mcu
@pytest.mark.parametrize("board", ["mps2-an500", "virt-rv32imac"])  # all boards: the ids test
def test_no_double_precision_or_64_bit_division_helper_is_called_per_token(board, tmp_path):
    """The link wraps the compiler's double-precision and 64-bit division helpers and libm's double functions
    (plelab/edge/mcu.py helper_wrappers); the image counts their calls during decode. On rv32imac, with no float
    unit, every double operation is such a call; on the Cortex-M7 a double libm call or a 64-bit division is."""
    for name, (overrides, opts) in HELPER_VARIANTS.items():
        model = tmp_path / f"{name}.ple"
        export_model(lively_model(*overrides), model, ExportOptions(**opts))
        for path, options in PATHS.items():
            if path == "int8" and opts["quant"] in ("fp32", "fp16"):
                options = {"act": "int8", "kv": "int8"}  # no integer head to skip rows of
            r = mcu.run_model(board, model, PROMPT, 6, **options)
            assert r["helper_calls"] == {"soft_double": 0, "div64": 0, "double_math": 0}, (name, path)


@needs_mcu
def test_every_integer_kernel_builds_with_werror_and_gives_the_host_ids(models):
    model = models["gemma_int4"]
    host = c_engine.run(model, PROMPT, STEPS, device="esp32-s3", cflags="-O2", extra=HOST_FLAGS["int8"])
    for board in BOARDS:
        best = mcu.BOARDS[board].int_kernels[-1]  # a build without the switch: DSP on the M7, Helium on the M55
        for kernel, name in ((None, best), ("portable", "portable")):
            r = mcu.run_model(board, model, PROMPT, STEPS, kernel=kernel, **PATHS["int8"])
            assert r["kernel"] == name and r["tokens"] == host["tokens"], (board, kernel)


@needs_mcu
def test_a_model_too_big_for_the_device_fails_in_ple_open_as_on_the_host(tmp_path):
    """65,536 positions of float32 KV cache (16.8 MB): more than the S3's SRAM + PSRAM, refused in one line."""
    model = tmp_path / "long.ple"
    export_model(lively_model("max_seq_len=65536"), model, ExportOptions(quant="int4", group=32))
    with pytest.raises(c_engine.CEngineError) as host:
        c_engine.run(model, [1], 1, device="esp32-s3", cflags="-O2")
    host_msg = str(host.value).removeprefix(f"{model}: ")
    assert "weights + KV cache need" in host_msg and "8164352 available (sram 300032 + psram 7864320)" in host_msg
    for board in BOARDS:
        run = mcu_run(board, model, "run", "--ids", "1", "--steps", "1")
        assert run.returncode == 2 and run.message.startswith(host_msg)
        assert "\n" not in run.message


@needs_mcu
def test_a_model_that_fits_the_profile_but_not_the_boards_psram_is_refused_naming_both_sizes(tmp_path):
    """16,384 positions (4 MiB of KV cache) fit the S3's 7.5 MiB PSRAM tier, not mps2-an500's 3.5 MiB region."""
    model = tmp_path / "long.ple"
    export_model(lively_model("max_seq_len=16384"), model, ExportOptions(quant="int4", group=32))
    run = mcu_run("mps2-an500", model, "run", "--ids", "1", "--steps", "1")
    kv = 2 * 2 * 16 * 16384 * 4
    assert run.returncode == 2
    assert f"the model needs {kv} bytes of psram (weights + KV cache {kv}, alignment 0), the psram region has " \
           f"{3584 * 1024}" in run.message


@needs_mcu
def test_a_truncated_file_in_flash_is_refused_and_never_read_past_its_end(models, tmp_path):
    good = models["gemma_int4"].read_bytes()
    with PleFile(models["gemma_int4"], verify="none") as f:
        ple = f.layout.section("ple")
    cut = ple.offset + ple.nbytes // 2
    interrupted = tmp_path / "interrupted.ple"  # a flash write cut short: the rest of the partition is erased
    interrupted.write_bytes(good[:cut] + b"\xff" * (len(good) - cut))
    short = tmp_path / "short.ple"  # the partition itself ends early
    short.write_bytes(good[:cut])
    for board in BOARDS:
        run = mcu_run(board, interrupted, "run", "--ids", "1", "--steps", "2")
        assert run.returncode == 2 and "section 'ple' fails its sha256 checksum" in run.message, run.message
        assert "(storage: 0 refused reads past the file's end)" in run.message
        run = mcu_run(board, short, "run", "--ids", "1", "--steps", "2")
        assert run.returncode == 2 and f"bytes, the header says {len(good)}" in run.message, run.message
        assert "(storage: 0 refused reads past the file's end)" in run.message


@needs_mcu
@pytest.mark.parametrize("board", BOARDS)
def test_mutated_files_in_flash_end_in_a_message_never_a_fault(board, models):
    run = mcu_run(board, models["gemma_int4"], "fuzz", "--cases", "300", "--seed", "11", timeout=120)
    r = run.result  # a fault would be exit status 3 with its message, a hang the timeout
    assert r["cases"] == 300 and r["accepted"] + r["rejected"] == 300
    assert r["bad_messages"] == 0
    assert r["rejected"] > 100 and r["accepted"] > 0
    assert r["by_kind"]["header_fields"] > 20 and r["by_kind"]["model_fields"] > 20
    assert r["heap_used_after"] == 0  # every rejection freed what it allocated


@needs_mcu
@pytest.mark.parametrize("board", BOARDS)
def test_a_fault_ends_in_one_message_and_status_3(board, models):
    stack = {"mps2-an500": "MemManage", "mps3-an547": "UsageFault"}.get(board, "store access fault")
    for kind, what in (("bus", "load access fault" if board.startswith("virt") else "BusFault"), ("stack", stack)):
        run = mcu_run(board, models["gemma_int4"], "fault", "--kind", kind, timeout=30)
        assert run.returncode == 3 and run.message.startswith(f"fault: {what}"), (kind, run.message)


def test_setup_installs_the_packages_the_mcu_tests_need():
    setup = (Path(__file__).parents[2] / "scripts" / "setup.sh").read_text()
    assert f'mcu_packages="{" ".join(mcu.DEBIAN_PACKAGES)}"' in setup


# ---- what a user types wrong: refused in one line, before any work (issue 37, items 11, 12, 14, 15) ----------


@needs_mcu
@pytest.mark.parametrize("mode, count", [("fuzz", "--cases"), ("kernels", "--cases"), ("calibrate", "--loops"),
                                         ("run", "--steps")])
def test_the_harness_refuses_a_count_below_one(models, mode, count):
    """`fuzz --cases -5` once ran no case and passed."""
    for value in ("-5", "0"):
        run = mcu_run("mps2-an500", models["gemma_int4"], mode, count, value, timeout=30)
        assert run.returncode == 2 and run.message == f"{count} must be at least 1, got {value}", run.message


def test_plelab_mcu_refuses_negative_counts_and_timeouts_in_one_line(capsys):
    from plelab.cli.main import main

    for argv in (["mcu", "fuzz", "--cases", "-5"], ["mcu", "run", "m.ple", "--timeout", "-1"],
                 ["mcu", "kernels", "--cases", "0"], ["mcu", "calibrate", "--loops", "-2"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        err = capsys.readouterr().err
        assert exc.value.code == 2 and err.count("\n") == 1 and argv[-2] in err, err
    with pytest.raises(mcu.McuError, match="cases must be a positive integer, got -5"):
        mcu.fuzz_args(-5)


def test_a_negative_timeout_is_refused_not_taken_for_a_hang(models):
    with pytest.raises(mcu.McuError, match="the timeout must be a positive number of seconds, got -1"):
        mcu.run_image("mps2-an500", models["gemma_int4"], ["calibrate"], timeout=-1)


def test_an_unwritable_build_cache_is_one_line_naming_plelab_cache(models, tmp_path, monkeypatch, capsys):
    """A path under a regular file cannot be created, even by root (a read-only folder can be, by root)."""
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv("PLELAB_CACHE", str(blocker / "cache"))
    with pytest.raises(mcu.McuError, match=f"cannot write built binaries to {blocker}/cache/mcu.*PLELAB_CACHE="):
        mcu.build_image("mps2-an500", models["gemma_int4"])
    from plelab.cli.main import main

    assert main(["mcu", "build", str(models["gemma_int4"])]) == 2
    err = capsys.readouterr().err
    assert "set PLELAB_CACHE to a writable folder" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_model_bigger_than_the_boards_flash_is_refused_before_it_is_read_or_anything_built(tmp_path, monkeypatch):
    """`mcu build` once read a 3 GB file wholly into memory, then failed to link it."""
    monkeypatch.setenv("PLELAB_CACHE", str(tmp_path / "cache"))
    big = tmp_path / "big.ple"
    with open(big, "wb") as f:  # sparse, four flashes' worth: a regression that reads it costs 64 MiB, not 3 GB
        f.truncate(64 << 20)
    for board in BOARDS:
        with pytest.raises(mcu.McuError, match=f"is 67,108,864 bytes; the {board}'s flash holds 16,777,216"):
            mcu.build_image(board, big)
    assert not (tmp_path / "cache" / "mcu" / "obj").exists()  # nothing compiled
