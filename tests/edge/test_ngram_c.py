"""An n-gram PLE model in the C runtime: the same logits and greedy ids as the NumPy runtime (host, and bare metal on
every emulated board), the planner's traffic of S records per token, malformed n-gram fields refused in one line,
the fuzzer through version 3's fields, and one command line for every engine."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import zlib
from pathlib import Path

import pytest
from edge_helpers import lively_model
from test_c_runtime import PROMPT, c_error, check_parity, check_traffic_is_the_planners, run_c
from test_ngram_edge import NGRAM, NGRAM_3, VARIANTS, id_map_file

from plelab.cli.main import main
from plelab.edge import c_engine, mcu
from plelab.edge import format as fmt
from plelab.edge.c_fuzz import fuzz, seed_file
from plelab.edge.export import ExportOptions, export_model
from plelab.edge.format import PleFile

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
needs_mcu = pytest.mark.skipif(
    bool(mcu.missing_tools()),
    reason=f"needs {', '.join(mcu.missing_tools())} (bash scripts/setup.sh --test installs them)")


@pytest.fixture(scope="module")
def plerun_o2() -> Path:
    return c_engine.build(cflags="-O2")


@pytest.mark.parametrize("name", VARIANTS)
def test_fp32_ngram_variants_match_numpy_over_256_steps(plerun_o2, export_tmp, tmp_path, name):
    check_parity(plerun_o2, export_tmp(lively_model(*VARIANTS[name]), quant="fp32"), tmp_path, 1e-4)


def test_an_id_map_gives_numpys_logits(plerun_o2, export_tmp, tmp_path):
    model = lively_model(*NGRAM, f"ple.ngram.id_map={id_map_file(tmp_path)}")
    check_parity(plerun_o2, export_tmp(model, quant="fp32"), tmp_path, 1e-4)


@pytest.mark.parametrize("quant, overrides", [("fp16", NGRAM), ("int8", NGRAM_3), ("int4", NGRAM),
                                              ("int4", [*NGRAM_3, "ple.gate=vector", "tie_embeddings=false"])])
def test_quantised_ngram_exports_give_numpys_greedy_tokens(plerun_o2, export_tmp, tmp_path, quant, overrides):
    check_parity(plerun_o2, export_tmp(lively_model(*overrides), quant=quant, group=16), tmp_path, None)


def test_traffic_per_tier_equals_the_planner_with_s_reads_and_the_id(plerun_o2, export_tmp, tmp_path):
    path = export_tmp(lively_model(*NGRAM_3, f"ple.ngram.id_map={id_map_file(tmp_path)}"), quant="int4", group=16)
    traffic = check_traffic_is_the_planners(plerun_o2, path)
    with PleFile(path, verify="none") as f:
        record = f.layout.table("ple").record_bytes
    assert traffic["nvme"] == {"reads_per_token": 6 + 1, "bytes_per_token": 6 * record + 4}


def test_the_version_2_fixture_decodes_to_its_recorded_ids_in_c(plerun_o2):
    fixture = Path(__file__).with_name("data") / "token-v2.ple"
    want = json.loads(fixture.with_suffix(".json").read_text())
    r = c_engine.run(fixture, want["prompt"], len(want["prompt"]) + len(want["greedy_ids"]) - 1, cflags="-O2")
    assert r["tokens"][len(want["prompt"]):] == want["greedy_ids"]


def _patched(src: Path, dst: Path, at: int, value: int) -> Path:
    """`src` with the u32 at offset `at` of its model section set to `value`, every checksum made right again."""
    raw = bytearray(src.read_bytes())
    with PleFile(src, verify="none") as f:
        sec = f.layout.section("model")
        idx = [s.name for s in f.layout.sections].index("model")
    struct.pack_into("<I", raw, sec.offset + at, value)
    raw[64 + 64 * idx + 32 : 64 + 64 * idx + 64] = hashlib.sha256(raw[sec.offset : sec.offset + sec.nbytes]).digest()
    n_sec = struct.unpack_from("<I", raw, 24)[0]
    struct.pack_into("<I", raw, 28, zlib.crc32(bytes(raw[64 : 64 + 64 * n_sec])))
    struct.pack_into("<I", raw, 32, zlib.crc32(bytes(raw[64 + 64 * n_sec :])))
    struct.pack_into("<I", raw, 60, zlib.crc32(bytes(raw[:60])))
    dst.write_bytes(bytes(raw))
    return dst


NG = fmt.MODEL_HEAD.size + 8  # the n-gram block: after the head and two PLE layers (padded to 8 bytes)
# (offset in the model section, value, what the one line says)
MALFORMED = [
    (84, 2, "PLE index 2 is unknown to format version 3"),
    (NG, 0, "the n-gram index has 0 orders of 2 hash heads"),
    (NG, 9, "the n-gram index has 9 orders of 2 hash heads"),
    (NG, 3, "n-gram order 257 ("),  # three orders: the first rows count is read as the third order
    (NG + 4, 0, "has 2 orders of 0 hash heads"),
    (NG + 4, 256, "has 2 orders of 256 hash heads"),
    (NG + 16, 3, "n-gram order 3 (257 rows per head) is invalid"),  # orders 3, 3: not ascending
    (NG + 20, 9, "n-gram order 9 (257 rows per head) is invalid"),
    (NG + 24, 1, "n-gram order 2 (1 rows per head) is invalid"),
    (NG + 28, 263, "heads' 1040 rows and 4 heads do not fit a PLE table of 1028 rows"),
    (NG + 12, 64, "the id map (64 entries, section of 1024 bytes) is not one uint32 per token id of 256"),
    (NG + 12, 0, "the id map (0 entries, section of 1024 bytes)"),
    (60, 1, "row table 'ple' lacks a part of 4 values"),  # one PLE layer: a row would hold one slice
]


def test_malformed_ngram_fields_are_refused_in_one_line(plerun_o2, export_tmp, tmp_path):
    good = export_tmp(lively_model(*NGRAM, f"ple.ngram.id_map={id_map_file(tmp_path)}"), quant="int4", group=16)
    run_c(plerun_o2, good, steps=8)  # the unpatched file runs
    for i, (at, value, says) in enumerate(MALFORMED):
        err = c_error(plerun_o2, _patched(good, tmp_path / f"bad{i}.ple", at, value), "--ids", "1")
        assert says in err, (at, value, err)
        with pytest.raises(fmt.PleFormatError, match="disagrees with the meta JSON"):  # the NumPy reader
            PleFile(tmp_path / f"bad{i}.ple", verify="none")
    token = export_tmp(lively_model(), quant="int4", group=16)  # an n-gram index in a version-2 file
    assert "PLE index 1 is unknown to format version 2" in c_error(
        plerun_o2, _patched(token, tmp_path / "v2.ple", 84, 1), "--ids", "1")


def test_twenty_thousand_mutations_of_an_ngram_file_no_crash_and_one_line_rejections(tmp_path):
    r = fuzz(20_000, seed=5, model=seed_file(tmp_path / "seed.ple", ngram=True), timeout=300)
    assert r["cases"] == 20_000 and r["crashes"] == 0 and r["bad_messages"] == 0
    assert r["rejected"] > 5_000 and r["accepted"] > 1_000
    assert r["by_kind"]["head_fields"] > 2_000  # the head, PLE layers and n-gram block, with checksums made right


def test_plelab_run_gives_the_same_greedy_ids_on_every_engine(export_tmp, tmp_path, capsys):
    path = str(export_tmp(lively_model(*NGRAM, f"ple.ngram.id_map={id_map_file(tmp_path)}"), quant="int4",
                          group=16))
    engines = ["numpy", "c"] + ([] if mcu.missing_tools("mps2-an500") else ["mcu"])
    results = {}
    for engine in engines:
        assert main(["run", path, "--ids", "3,1,4,1,5", "--max-new-tokens", "10", "--temperature", "0", "--json",
                     "--engine", engine]) == 0
        results[engine] = json.loads(capsys.readouterr().out)
    assert len(results["numpy"]["generated_ids"]) == 10
    assert all(r["generated_ids"] == results["numpy"]["generated_ids"] for r in results.values())


STEPS = 14
PATHS = {"fp32": ({}, []), "int8": ({"act": "int8", "kv": "int8", "head_skip": True},
                                    ["--act", "int8", "--kv", "int8", "--head-skip"])}


@needs_mcu
def test_bare_metal_decodes_an_ngram_model_to_the_hosts_ids_without_double_or_64_bit_division(tmp_path):
    model = tmp_path / "ngram.ple"
    export_model(lively_model(*NGRAM, f"ple.ngram.id_map={id_map_file(tmp_path)}"), model,
                 ExportOptions(quant="int4", group=32))
    with PleFile(model, verify="none") as f:
        record = f.layout.table("ple").record_bytes
    for path, (opts, flags) in PATHS.items():
        host = c_engine.run(model, PROMPT, STEPS, device="esp32-s3", cflags="-O2", extra=flags)
        for board in mcu.BOARDS:
            r = mcu.run_model(board, model, PROMPT, STEPS, **opts)
            assert r["tokens"] == host["tokens"], (board, path)
            # each position reads its id from the map and four PLE records from flash, nothing past the file
            st = r["storage"]
            assert st["reads_decode"] == STEPS * (1 + 4) and st["bytes_decode"] == STEPS * (4 + 4 * record)
            assert st["refused"] == 0
            # the hash is in the token path: still no double-precision or 64-bit division helper called
            assert r["helper_calls"] == {"soft_double": 0, "div64": 0, "double_math": 0}, (board, path)
