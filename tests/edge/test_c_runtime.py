"""The C runtime (plelab/edge/c): exact against the NumPy runtime, planner-equal traffic and RAM, clear errors."""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import numpy as np
import pytest
from edge_helpers import lively_model

from plelab.cli.main import main
from plelab.edge import c_engine
from plelab.edge import format as fmt
from plelab.edge.format import PleFile
from plelab.edge.placement import get_device, items, place
from plelab.edge.runtime import EdgeModel

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def plerun() -> Path:
    return c_engine.build(cflags="-O2")


def run_c(plerun: Path, model: Path, *args: str, steps: int = 256) -> dict:
    proc = subprocess.run([str(plerun), str(model), "--ids", ",".join(map(str, PROMPT)), "--steps", str(steps),
                           "--json", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def c_error(plerun: Path, model: Path, *args: str) -> str:
    proc = subprocess.run([str(plerun), str(model), *args], capture_output=True, text=True)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and err and "\n" not in err, (proc.returncode, err)
    return err


def numpy_logits(path: Path, tokens: list[int]) -> np.ndarray:
    rt = EdgeModel(path)
    cache = rt.new_cache(len(tokens))
    out = np.concatenate([rt.forward(tokens[:100], cache), rt.forward(tokens[100:], cache)])
    rt.close()
    return out


def check_parity(plerun: Path, path: Path, tmp_path: Path, tol: float | None) -> None:
    """256 greedy steps in C: every token is NumPy's argmax, every logit within `tol` of NumPy's."""
    dump = tmp_path / "logits.bin"
    r = run_c(plerun, path, "--dump-logits", str(dump))
    tokens = r["tokens"]
    assert tokens[: len(PROMPT)] == PROMPT and len(tokens) == 257
    ref = numpy_logits(path, tokens[:256])
    assert list(ref.argmax(-1)[len(PROMPT) - 1 :]) == tokens[len(PROMPT) :]
    if tol is not None:
        got = np.fromfile(dump, np.float32).reshape(ref.shape)
        assert np.abs(got - ref).max() <= tol


@pytest.mark.parametrize(
    "overrides, options",
    [
        ([], {}),  # Gemma form: context projection, input gate, output norm
        (["num_kv_heads=4"], {}),
        (["ple.layers=[1]", "ple.context=false"], {}),  # subset of layers, no context
        (["ple.gate=scalar", "ple.output_norm=false"], {}),  # simple form, scalar gate
        (["ple.gate=vector", "tie_embeddings=false", "embed_scale=true"], {}),  # vector gate, untied head
        (["ffn.kind=mglu", "ffn.mask_count=2"], {}),
        (["ffn.kind=lowrank", "ffn.rank=8"], {}),
        (["ple.vocab_size=100"], {}),
        (["ple.dim=0"], {}),
        ([], {"embed_in_record": True, "align": 16, "page": 512}),
        (["tie_embeddings=false"], {"embed_in_record": True}),
    ],
)
def test_fp32_variants_match_numpy_over_256_steps(plerun, export_tmp, tmp_path, overrides, options):
    check_parity(plerun, export_tmp(lively_model(*overrides), quant="fp32", **options), tmp_path, 1e-4)


@pytest.mark.parametrize("quant, overrides", [("fp16", []), ("int8", []), ("int4", []),
                                              ("int8", ["ffn.kind=mglu", "ffn.mask_count=2"]),
                                              ("int4", ["ple.gate=vector", "tie_embeddings=false"])])
def test_quantised_exports_give_numpys_greedy_tokens(plerun, export_tmp, tmp_path, quant, overrides):
    check_parity(plerun, export_tmp(lively_model(*overrides), quant=quant, group=32), tmp_path, None)


def test_mmap_storage_gives_the_same_tokens_with_a_smaller_arena(plerun, export_tmp):
    path = export_tmp(lively_model(), quant="int4", group=32)
    read, mapped = run_c(plerun, path, steps=40), run_c(plerun, path, "--mmap", steps=40)
    assert read["tokens"] == mapped["tokens"]
    assert mapped["arena_bytes"] < read["arena_bytes"]


def check_traffic_is_the_planners(plerun: Path, path: Path) -> dict:
    """plerun's bytes and reads per token and tier equal `plelab place`'s on the esp32-s3 and desktop profiles; the
    desktop run's traffic."""
    with PleFile(path, verify="none") as f:
        layout = f.layout
    steps = 63  # KV reads average over positions 1..63: the planner's figure at context 32
    for device in ("esp32-s3", "desktop"):
        r = run_c(plerun, path, "--device", device, steps=steps)
        want = place(layout, get_device(device), context=(steps + 1) // 2, kv_dtype="fp32")
        assert set(r["traffic"]) == set(want["bytes_per_token"])
        for tier, t in r["traffic"].items():
            assert t["bytes_per_token"] == pytest.approx(want["bytes_per_token"][tier], rel=1e-9), tier
            assert t["reads_per_token"] == pytest.approx(want["reads_per_token"][tier], rel=1e-9), tier
    return r["traffic"]


def test_traffic_per_tier_equals_the_planner(plerun, export_tmp):
    traffic = check_traffic_is_the_planners(plerun, export_tmp(lively_model(), quant="int4", group=32))
    assert traffic["nvme"]["reads_per_token"] == 1  # one PLE record read per token


def test_peak_ram_is_the_planners_sram_plus_psram_and_scratch(plerun, export_tmp):
    path = export_tmp(lively_model(), quant="int4", group=32)
    with PleFile(path, verify="none") as f:
        want = place(f.layout, get_device("esp32-s3"), kv_dtype="fp32")  # context = max_seq_len, as the arena
    ram = sum(t["used"] for t in want["tiers"].values() if t["kind"] == "ram")
    r = run_c(plerun, path, "--device", "esp32-s3", steps=8)
    assert r["weight_bytes"] + r["kv_cache_bytes"] == ram
    assert ram <= r["arena_bytes"] <= r["peak_ram_bytes"] <= ram + 64 * 1024  # scratch is small
    # per tier: what the runtime placed in SRAM and PSRAM is the plan's figure, byte for byte
    assert {name: t["placed"] for name, t in r["tiers"].items()} == {
        name: t["used"] for name, t in want["tiers"].items() if t["kind"] == "ram"}
    assert sum(t["arena"] for t in r["tiers"].values()) == r["arena_bytes"]
    assert all(t["available"] == want["tiers"][name]["capacity"] for name, t in r["tiers"].items())


def test_no_verify_table_skips_only_the_row_tables(plerun, export_tmp, tmp_path):
    good = export_tmp(lively_model(), quant="int8", group=32)
    with PleFile(good) as f:
        ple, tensors = f.layout.section("ple"), f.layout.section("tensors")
    raw = bytearray(good.read_bytes())
    raw[ple.offset + 5] ^= 0x40
    bad = tmp_path / "bad_row.ple"
    bad.write_bytes(bytes(raw))
    assert "section 'ple' fails its sha256" in c_error(plerun, bad, "--ids", "1")
    run_c(plerun, bad, "--no-verify-table", steps=8)
    raw[ple.offset + 5] ^= 0x40
    raw[tensors.offset + 5] ^= 0x40
    bad.write_bytes(bytes(raw))
    assert "section 'tensors' fails its sha256" in c_error(plerun, bad, "--ids", "1", "--no-verify-table")


def test_bad_input_is_one_line_and_exit_2(plerun, export_tmp, tmp_path):
    path = export_tmp(lively_model(), quant="int4", group=32)
    assert "token ids must lie in [0, 256); got [256, -3]" in c_error(plerun, path, "--ids", "1,256,-3")
    long_prompt = ",".join(["1"] * 257)
    assert "longer than the model's context of 256" in c_error(plerun, path, "--ids", long_prompt)
    assert "exceeds the model's context" in c_error(plerun, path, "--ids", "1", "--steps", "300")
    assert "--ids wants comma-separated integers" in c_error(plerun, path, "--ids", "1,x")
    assert "unknown device" in c_error(plerun, path, "--ids", "1", "--device", "toaster")
    small = tmp_path / "tiny-device.txt"
    small.write_text("device tiny-mcu\ntier sram ram 4096\ntier psram ram 8192\ntier flash storage 16777216\n")
    with PleFile(path, verify="none") as f:
        need = sum(it.stored for it in items(f.layout, 256, "fp32") if it.resident)
    err = c_error(plerun, path, "--ids", "1", "--device", str(small))
    assert f"does not fit tiny-mcu: weights + KV cache need {need} bytes of RAM, 12288 available " \
           "(sram 4096 + psram 8192)" in err


def test_another_format_version_fails_loudly(plerun, export_tmp, tmp_path):
    good = export_tmp(lively_model(), quant="int4", group=32)
    raw = good.read_bytes()
    fields = fmt.HEADER.unpack(raw[: fmt.HEADER.size])
    for version in (1, 4):
        bad = tmp_path / f"v{version}.ple"
        bad.write_bytes(fmt._pack_header(fields[3], fields[4], fields[5], fields[6], version=version) + raw[64:])
        assert f"format version {version} is not supported (the C runtime reads versions 2 and 3)" in c_error(
            plerun, bad, "--ids", "1")
    with pytest.raises(fmt.PleFormatError, match="version 4 is not supported"):
        PleFile(tmp_path / "v4.ple")


def test_numpy_runtime_still_reads_version_1_files(export_tmp, tmp_path):
    """A v1 file (meta JSON only, no model section) opens in the NumPy runtime with the same weights."""
    good = export_tmp(lively_model(), quant="int8", group=32)
    with PleFile(good) as f:
        lay = f.layout
        want = f.read_tensor("norm.weight")
    v1 = fmt.Layout(lay.model, lay.derived, lay.quant, lay.tensors, lay.tables, lay.tokenizer, lay.source, version=1)
    raw = good.read_bytes()
    body = {s.name: raw[s.offset : s.offset + s.nbytes] for s in lay.sections}
    assert v1.meta()["version"] == 1 and "model" not in [s.name for s in v1.sections]
    out = fmt.write_ple(tmp_path / "v1.ple", v1, {n: [b] for n, b in body.items() if n not in ("meta", "model")})
    head = bytearray((tmp_path / "v1.ple").read_bytes())
    struct.pack_into("<I", head, 8, 1)
    struct.pack_into("<I", head, 60, zlib.crc32(bytes(head[:60])))
    (tmp_path / "v1.ple").write_bytes(bytes(head))
    with PleFile(tmp_path / "v1.ple") as f:
        assert f.layout.version == 1 and np.array_equal(f.read_tensor("norm.weight"), want)
    assert out.file_bytes < lay.file_bytes


def test_binary_model_description_must_agree_with_the_meta(export_tmp, tmp_path):
    good = export_tmp(lively_model(), quant="int8", group=32)
    with PleFile(good) as f:
        assert f.layout.version == 2
        desc = f.layout.section("model")
    raw = bytearray(good.read_bytes())
    struct.pack_into("<I", raw, desc.offset + 8, 65)  # hidden size 64 -> 65, checksums made consistent again
    sha = hashlib.sha256(raw[desc.offset : desc.offset + desc.nbytes]).digest()
    idx = next(i for i in range(8) if raw[64 + 64 * i : 64 + 64 * i + 5] == b"model")
    raw[64 + 64 * idx + 32 : 64 + 64 * idx + 64] = sha
    n_sec = struct.unpack_from("<I", raw, 24)[0]
    struct.pack_into("<I", raw, 28, zlib.crc32(bytes(raw[64 : 64 + 64 * n_sec])))
    struct.pack_into("<I", raw, 60, zlib.crc32(bytes(raw[:60])))
    bad = tmp_path / "disagree.ple"
    bad.write_bytes(bytes(raw))
    with pytest.raises(fmt.PleFormatError, match="disagrees with the meta"):
        PleFile(bad, verify="none")


def test_plelab_run_engine_c_gives_the_numpy_engines_greedy_ids(export_tmp, capsys):
    path = str(export_tmp(lively_model(), quant="int4", group=32))
    results = {}
    for engine in ("numpy", "c"):
        assert main(["run", path, "--ids", "1,2,3", "--max-new-tokens", "12", "--temperature", "0", "--json",
                     "--engine", engine]) == 0
        results[engine] = json.loads(capsys.readouterr().out)
    assert results["c"]["generated_ids"] == results["numpy"]["generated_ids"]
    assert len(results["c"]["generated_ids"]) == 12
    errors = {}
    for engine in ("numpy", "c"):  # one message for an id outside the vocabulary, whichever engine
        assert main(["run", path, "--ids", "1,999,1000", "--engine", engine]) == 2
        errors[engine] = capsys.readouterr().err.strip()
    assert errors["c"] == errors["numpy"] and "token ids must lie in [0, 256); got [999, 1000]" in errors["c"]
    assert "\n" not in errors["c"]
    for engine in ("numpy", "c"):  # an id no C long holds: named, not "--ids wants comma-separated integers"
        assert main(["run", path, "--ids", "1,99999999999999999999999", "--engine", engine]) == 2
        err = capsys.readouterr().err
        assert "token ids must lie in [0, 256); got [99999999999999999999999]" in err and err.count("\n") == 1


def test_esp_idf_storage_compiles_against_the_stub_header():
    c_dir = c_engine.C_DIR
    sources = [c_dir / "esp-idf" / "ple_storage_esp.c", *(c_dir / s for s in c_engine.LIBRARY)]
    for src in sources:  # the whole component as ESP-IDF builds it (no POSIX storage under ESP_PLATFORM)
        cmd = [c_engine.compiler(), "-std=c99", "-Wall", "-Wextra", "-Werror", "-DESP_PLATFORM", "-fsyntax-only",
               "-I", str(c_dir), "-I", str(c_dir / "esp-idf" / "host_stub"), str(src)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
    cmake = (c_dir / "esp-idf" / "CMakeLists.txt").read_text()
    for src in (*c_engine.LIBRARY, "ple_storage_esp.c"):
        assert src in cmake


def test_built_in_device_profiles_match_devices_toml():
    assert (c_engine.C_DIR / "devices.inc").read_text() == c_engine.devices_inc()


def test_build_is_cached_and_keyed_by_flags(plerun):
    assert c_engine.build(cflags="-O2") == plerun
    assert c_engine.build(cflags="-O1") != plerun
