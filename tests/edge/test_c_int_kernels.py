"""The integer kernels (plelab/edge/c/ple_int_kernels.h) on the host: int8 activations, int8 KV, greedy head skip.

Kernel level: plektest runs the built integer kernel against a scalar reference in the same binary (bit for bit)
on odd sizes, and every case is recomputed here in NumPy. Model level: the C engine's int8 paths against the NumPy
engine's mirror of them (runtime.quantize_i8) and against the fp32 reference.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from edge_helpers import lively_model

from plelab.edge import c_engine, mcu
from plelab.edge.format import PleFile
from plelab.edge.placement import get_device, place
from plelab.edge.runtime import EdgeModel, quantize_i8

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diagnostic_helpers import tiny_config, train  # noqa: E402

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
PROMPT = [3, 1, 4, 1, 5]
# the default build (vector float kernels, F16C) and plain C99 (PLE_KERNEL_PORTABLE): integer kernels are portable C
# on x86 either way; the flags change the float conversions and fused multiply-adds around them
BUILDS = {"native": "-O3 -march=native", "portable": "-O2 -DPLE_KERNEL=PLE_KERNEL_PORTABLE"}


@pytest.fixture(scope="module", params=list(BUILDS))
def build_flags(request) -> str:
    return BUILDS[request.param]


def run_plerun(binary: Path, model: Path, *args: str, ids: list[int] = PROMPT, steps: int = 200) -> dict:
    proc = subprocess.run([str(binary), str(model), "--ids", ",".join(map(str, ids)), "--steps", str(steps), "--json",
                           *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


# ---- kernels ------------------------------------------------------------------------------------------------


def test_integer_kernel_equals_its_scalar_reference_on_odd_sizes(build_flags):
    binary = c_engine.build(cflags=build_flags, program="plektest")
    proc = subprocess.run([str(binary), "--cases", "4000", "--seed", "7"], capture_output=True, text=True)
    r = json.loads(proc.stdout)
    assert proc.returncode == 0 and r["mismatches"] == 0 and r["cases"] > 4000, r  # dot products + row walkers


def _hex(s: str, dtype) -> np.ndarray:
    return np.frombuffer(bytes.fromhex(s), dtype)


def test_kernel_cases_recomputed_in_numpy(tmp_path):
    """Codes are exactly runtime.quantize_i8's, each dot product is the exact sum to float rounding."""
    binary = c_engine.build(cflags=BUILDS["native"], program="plektest")
    emit = tmp_path / "cases.jsonl"
    proc = subprocess.run([str(binary), "--cases", "600", "--seed", "3", "--emit", str(emit)], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kinds = set()
    for line in emit.read_text().splitlines():
        c = json.loads(line)
        x, q = _hex(c["x"], np.float32), _hex(c["q"], np.int8)
        codes, scales = quantize_i8(x)
        scale = scales[0]
        assert np.array_equal(codes, q) and scale == _hex(c["scale"], np.float32)[0], c["case"]
        group, e0, n = c["group"], c["e0"], c["n"]
        raw = _hex(c["codes"], np.uint8)
        if c["dtype"] == "int8":
            w = raw.view(np.int8).astype(np.int64)
        else:
            w = np.stack([raw & 15, raw >> 4], 1).reshape(-1).astype(np.int64)
            w = (w ^ 8) - 8
        w = w[e0 : e0 + n]
        g = (np.arange(e0, e0 + n) // group) - e0 // group
        scales = _hex(c["scales"], np.float16).astype(np.float64)[e0 // group :]  # the groups the run meets
        prods = w * q.astype(np.int64)
        isums = np.bincount(g, weights=prods.astype(np.float64))  # exact: integers below 2^53
        exact = float(scale) * float((isums * scales[: len(isums)]).sum())
        size = float(scale) * float((np.bincount(g, weights=np.abs(prods).astype(np.float64)) *
                                     np.abs(scales[: len(isums)])).sum())
        got = float(_hex(c["got"], np.float32)[0])
        assert abs(got - exact) <= 1e-5 * size + 1e-30, c["case"]
        kinds.add((c["dtype"], e0 % 2, n > 4096, group < n))
    # both dtypes, odd and even starts, a group longer than one int32 run, groups cut by the run
    assert {("int4", 1), ("int8", 1), ("int4", 0), ("int8", 0)} <= {k[:2] for k in kinds}
    assert any(k[2] for k in kinds) and any(k[3] for k in kinds)


# ---- model: int8 activations and int8 KV against the NumPy mirror and the fp32 reference ----------------------


def numpy_logits(path: Path, tokens: list[int], **opts) -> np.ndarray:
    rt = EdgeModel(path, **opts)
    cache = rt.new_cache(len(tokens))
    out = np.concatenate([rt.forward(tokens[:100], cache), rt.forward(tokens[100:], cache)])
    rt.close()
    return out


@pytest.mark.parametrize(
    "quant, group, overrides",
    [
        ("int4", 32, []),  # Gemma form: context projection, input gate, output norm; tied int4 head
        ("int8", 16, ["ple.gate=vector", "tie_embeddings=false"]),  # untied int8 head
        ("int4", 64, ["ffn.kind=mglu", "ffn.mask_count=2", "hidden_size=36", "num_heads=3", "num_kv_heads=3"]),
        ("int4", 32, ["ffn.kind=lowrank", "ffn.rank=8", "ple.gate=scalar", "ple.output_norm=false"]),
    ],
)
@pytest.mark.parametrize("act, kv", [("int8", "fp32"), ("fp32", "int8"), ("int8", "int8")])
def test_int8_paths_match_the_numpy_mirror(build_flags, export_tmp, tmp_path, quant, group, overrides, act, kv):
    """200 greedy steps: NumPy's argmax on C's tokens at every step, logits equal to float rounding.

    The engines sum in different orders (~1e-6). Where an activation lies within that noise of a rounding boundary
    its int8 code differs by one between them (a few positions in hundreds); a step of one code moves a logit by
    about scale * |w| <~ 0.05 here. So: the median position within 1e-5, every position within 0.1.
    """
    binary = c_engine.build(cflags=build_flags)
    path = export_tmp(lively_model(*overrides), quant=quant, group=group)
    dump = tmp_path / "logits.bin"
    r = run_plerun(binary, path, "--act", act, "--kv", kv, "--dump-logits", str(dump))
    assert (r["act"], r["kv"]) == (act, kv)
    ref = numpy_logits(path, r["tokens"][:200], act=act, kv_dtype=kv)
    got = np.fromfile(dump, np.float32).reshape(ref.shape)
    assert list(ref.argmax(-1)[len(PROMPT) - 1 :]) == r["tokens"][len(PROMPT) :]
    err = np.abs(got - ref).max(-1)
    assert np.median(err) <= 1e-5 and err.max() <= 0.1, (np.median(err), err.max())


def test_int8_paths_stay_close_to_the_fp32_reference(export_tmp, tmp_path):
    """The cost of rounding activations and the cache to int8 on a random model: small, not zero."""
    binary = c_engine.build(cflags=BUILDS["native"])
    path = export_tmp(lively_model(), quant="int4", group=32)
    tokens = run_plerun(binary, path, steps=200)["tokens"][:200]
    ref = numpy_logits(path, tokens)
    for act, kv in (("int8", "fp32"), ("fp32", "int8"), ("int8", "int8")):
        got = numpy_logits(path, tokens, act=act, kv_dtype=kv)
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        assert 0 < rel < 0.1, (act, kv, rel)


def test_int8_kv_traffic_and_memory_equal_the_planner(export_tmp):
    """plerun --kv int8 --device D counts the KV cache as plan --kv-dtype int8 does (codes + a scale per vector)."""
    binary = c_engine.build(cflags="-O2")
    path = export_tmp(lively_model(), quant="int4", group=32)
    with PleFile(path, verify="none") as f:
        layout = f.layout
    steps = 63
    r = run_plerun(binary, path, "--kv", "int8", "--act", "int8", "--device", "esp32-s3", steps=steps)
    want = place(layout, get_device("esp32-s3"), context=(steps + 1) // 2, kv_dtype="int8")
    for tier, t in r["traffic"].items():
        assert t["bytes_per_token"] == pytest.approx(want["bytes_per_token"][tier], rel=1e-9), tier
    full = place(layout, get_device("esp32-s3"), kv_dtype="int8")
    ram = sum(t["used"] for t in full["tiers"].values() if t["kind"] == "ram")
    assert r["weight_bytes"] + r["kv_cache_bytes"] == ram
    fp32 = run_plerun(binary, path, "--device", "esp32-s3", steps=8)
    m, d = layout.model, layout.derived
    assert fp32["kv_cache_bytes"] == 2 * m["num_layers"] * d["kv_heads"] * m["max_seq_len"] * d["head_dim"] * 4
    assert r["kv_cache_bytes"] == 2 * m["num_layers"] * d["kv_heads"] * m["max_seq_len"] * (d["head_dim"] + 4)


def test_placement_equals_the_planner_when_sram_overflows(export_tmp):
    """Weights larger than the esp32-s3 profile's SRAM: some tensors must go to PSRAM, in the planner's order.

    (The C placement once left every tensor in the first tier without counting it: equal to the planner only
    while everything fit.)"""
    binary = c_engine.build(cflags="-O2")
    path = export_tmp(lively_model("hidden_size=128", "num_heads=4", "num_kv_heads=4", "vocab_size=4096"),
                      quant="int4", group=32)
    with PleFile(path, verify="none") as f:
        layout = f.layout
    for kv in ("fp32", "int8"):
        want = place(layout, get_device("esp32-s3"), context=4, kv_dtype=kv)
        in_psram = [n for n, tier in want["placement"].items() if tier == "psram" and n != "kv_cache"]
        assert want["fits"] and len(in_psram) > 10, in_psram
        r = run_plerun(binary, path, "--kv", kv, "--device", "esp32-s3", ids=[1], steps=7)
        for tier, t in r["traffic"].items():
            assert t["bytes_per_token"] == pytest.approx(want["bytes_per_token"][tier], rel=1e-9), (kv, tier)


def test_the_numpy_engine_counts_int8_kv_traffic_as_the_planner(export_tmp):
    path = export_tmp(lively_model(), quant="int8", group=32)
    with PleFile(path, verify="none") as f:
        want = place(f.layout, get_device("esp32-s3"), context=16, kv_dtype="int8")
    rt = EdgeModel(path, placement=want["placement"], kv_dtype="int8", act="int8")
    rt.forward(list(range(31)), rt.new_cache(31))  # positions 0..30: the KV reads average to context 16
    assert rt.traffic.per_token()["bytes_per_token"]["sram"] == pytest.approx(want["bytes_per_token"]["sram"])
    rt.close()


# ---- the greedy head skip -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_model():
    """The diagnostics' tiny PLE model after 200 AdamW steps on a Markov chain (confident next-token guesses)."""
    return train(tiny_config(), steps=200)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_head_skip_gives_the_full_heads_ids(build_flags, export_tmp, trained_model, quant):
    binary = c_engine.build(cflags=build_flags)
    shares = {}
    for name, model in (("random", lively_model()), ("trained", trained_model)):
        path = export_tmp(model, quant=quant, group=32)
        steps = min(200, model.config.max_seq_len)
        full = run_plerun(binary, path, "--act", "int8", steps=steps)
        skip = run_plerun(binary, path, "--act", "int8", "--head-skip", steps=steps)
        assert skip["tokens"] == full["tokens"], name
        assert full["head_rows_computed"] == full["head_rows"] == steps * model.config.vocab_size
        assert skip["head_rows"] == full["head_rows"]
        shares[name] = skip["head_rows_computed"] / skip["head_rows"]
    # trained (16 wide: the bound is loose in so few dimensions) some blocks are skipped; a random head leaves
    # its best row no margin over the bound of most others (docs/c-runtime.md has the figures of a larger model)
    assert shares["trained"] < 1 and 0 < shares["random"] <= 1, shares


def test_head_skip_skips_what_cannot_win(export_tmp, tmp_path):
    """A constructed head: rows 0..127 are tiny copies of the mean row, so after any large-norm row no block of
    them is computed; the ids still equal the full head's."""
    import torch

    model = lively_model()
    with torch.no_grad():
        w = model.embed_tokens.weight
        w[:128] = w.mean(0) + 1e-4 * torch.randn_like(w[:128])
    path = export_tmp(model, quant="int8", group=32)
    binary = c_engine.build(cflags="-O2")
    full = run_plerun(binary, path, "--act", "int8", steps=64)
    skip = run_plerun(binary, path, "--act", "int8", "--head-skip", steps=64)
    assert skip["tokens"] == full["tokens"]
    assert skip["head_rows_computed"] <= 64 * (256 - 128 + 16)  # the near-mean rows sort last, one block at most


def test_head_skip_without_int8_activations_is_one_line_and_exit_2(export_tmp):
    binary = c_engine.build(cflags="-O2")
    path = export_tmp(lively_model(), quant="int4", group=32)
    for args in (["--head-skip"], ["--head-skip", "--act", "int8", "--temperature", "0.8"],
                 ["--head-skip", "--act", "int8", "--dump-logits", "/dev/null"], ["--act", "int16"]):
        proc = subprocess.run([str(binary), str(path), "--ids", "1,2", "--steps", "4", *args], capture_output=True,
                              text=True)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err and "\n" not in err, (args, err)
    fp32 = export_tmp(lively_model(), quant="fp32")
    proc = subprocess.run([str(binary), str(fp32), "--ids", "1", "--act", "int8", "--head-skip"], capture_output=True,
                          text=True)
    assert proc.returncode == 2 and "int8 or int4 head" in proc.stderr


# ---- under QEMU: the DSP kernel on a Cortex-M7, Helium on a Cortex-M55 ----------------------------------------


@pytest.mark.skipif(bool(mcu.missing_tools()), reason=f"needs {', '.join(mcu.missing_tools())} (bash "
                    "scripts/setup.sh --test installs them)")
@pytest.mark.parametrize("board", list(mcu.BOARDS))
def test_each_boards_kernels_equal_the_scalar_reference_under_qemu(board, export_tmp):
    """plemcu kernels: every integer kernel the core runs (SMLAD / SXTB16 on mps2-an500, VMLADAVA on mps3-an547,
    and portable C on both) against the scalar reference compiled into the same image, bit for bit; and the same
    results on both boards (the digest covers every dot product's bits and every activation code)."""
    model = export_tmp(lively_model(), quant="int4", group=32)  # the image needs a partition; not read here
    digests = set()
    for kernel in mcu.BOARDS[board].int_kernels:
        image = mcu.build_image(board, model, kernel)
        r = mcu.run_image(board, image, ["kernels", "--cases", "1500", "--seed", "5"], timeout=300).result
        assert r["kernel"] == kernel and r["cases"] > 1500 and r["mismatches"] == 0, r
        digests.add(r["digest"])
    assert len(digests) == 1, digests


def test_plelab_run_int8_paths_give_the_same_ids_in_both_engines(export_tmp, capsys):
    from plelab.cli.main import main

    path = str(export_tmp(lively_model(), quant="int4", group=32))
    common = ["run", path, "--ids", "1,2,3", "--max-new-tokens", "12", "--temperature", "0", "--json",
              "--act", "int8", "--kv-dtype", "int8"]
    results = {}
    for name, extra in (("numpy", []), ("c", ["--engine", "c"]), ("c_skip", ["--engine", "c", "--head-skip"])):
        assert main(common + extra) == 0
        results[name] = json.loads(capsys.readouterr().out)["generated_ids"]
    assert results["numpy"] == results["c"] == results["c_skip"] and len(results["c"]) == 12
    assert main(common + ["--head-skip"]) == 2  # the NumPy engine has no head skip: one line, exit 2
    err = capsys.readouterr().err.strip()
    assert "--head-skip needs --engine c" in err and "\n" not in err
