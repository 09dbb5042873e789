"""Every FFN variant on the edge: MGLU from 1-bit masks, MoE touching only routed experts, pruned as dense.

Parity with the PyTorch model (fp32 logits to 1e-4) in the NumPy and the C runtime; bytes read per token
that follow the variant (MGLU: W once plus mask bits; MoE: k of E experts); bad masks refused in one line.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from edge_helpers import lively_model
from test_parity import runtime_logits, torch_logits

from plelab.cli.main import main
from plelab.data.tokenizer import Tokenizer
from plelab.edge import c_engine
from plelab.edge.c_fuzz import fuzz
from plelab.edge.decode_cost import DecodeCostError, measure_decode
from plelab.edge.export import ExportError, ExportOptions, export_model, layout_for_config
from plelab.edge.format import PleFile, PleFormatError
from plelab.edge.placement import items
from plelab.edge.quant import Encoding
from plelab.edge.runtime import EdgeModel, EdgeRuntimeError
from plelab.model import LanguageModel, load_model_config
from plelab.runs.checkpoint import save_checkpoint

HAVE_CC = any(shutil.which(c) for c in ("cc", "gcc", "clang"))
MOE = ["ffn.kind=moe", "ffn.num_experts=4", "ffn.expert_size=48"]
VARIANTS = {
    "mglu1": ["ffn.kind=mglu", "ffn.mask_count=1"],
    "mglu4": ["ffn.kind=mglu", "ffn.mask_count=4"],
    "moe_k1_shared": [*MOE, "ffn.top_k=1", "ffn.shared_expert=true"],
    "moe_k2": [*MOE, "ffn.top_k=2"],
}
PROMPT = [3, 1, 4, 1, 5]


def c_logits(path, steps: int, tmp_path) -> tuple[list[int], np.ndarray]:
    """(tokens, logits at every position) of a greedy C run."""
    dump = tmp_path / "c_logits.bin"
    r = c_engine.run(path, PROMPT, steps, cflags="-O2", extra=["--dump-logits", str(dump)])
    return r["tokens"], np.fromfile(dump, np.float32).reshape(steps, -1)


def per_token_bytes(path, tokens: list[int]) -> float:
    """Bytes the NumPy runtime reads per token over `tokens`, every tier summed."""
    rt = EdgeModel(path)
    rt.forward(tokens, rt.new_cache(len(tokens)))
    rt.close()
    return sum(rt.traffic.per_token()["bytes_per_token"].values())


def pruned_model(*over: str) -> LanguageModel:
    """A pruned-FFN model whose schedule has finished: exactly prune_to live units per layer."""
    model = lively_model("ffn.kind=pruned", "ffn.intermediate_size=96", "ffn.prune_to=40", *over)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for layer in model.layers:
            layer.mlp.alive.zero_()
            layer.mlp.alive[torch.randperm(96, generator=g)[:40]] = 1
    return model


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_numpy_runtime_matches_pytorch(export_tmp, variant):
    model = lively_model(*VARIANTS[variant])
    ids = torch.randint(0, model.config.vocab_size, (40,), generator=torch.Generator().manual_seed(2))
    got = runtime_logits(export_tmp(model, quant="fp32"), ids, prefill=16)
    assert np.abs(got - torch_logits(model, ids)).max() <= 1e-4


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_c_runtime_matches_pytorch(export_tmp, tmp_path, variant):
    model = lively_model(*VARIANTS[variant])
    tokens, got = c_logits(export_tmp(model, quant="fp32"), 48, tmp_path)
    assert np.abs(got - torch_logits(model, torch.tensor(tokens[:48]))).max() <= 1e-4


def test_mglu_masks_are_one_bit_and_w_is_read_once(export_tmp):
    """MGLU reads W and down once plus n_m bits per element: per layer, SwiGLU's bytes less one matrix plus masks."""
    swiglu = export_tmp(lively_model(), quant="fp32")
    tokens = list(range(1, 9))
    base = per_token_bytes(swiglu, tokens)
    cfg = load_model_config("tiny")
    H, inter, L = cfg.hidden_size, cfg.ffn.intermediate_size, cfg.num_layers
    for n_m in (1, 4):
        mglu = export_tmp(lively_model("ffn.kind=mglu", f"ffn.mask_count={n_m}"), quant="fp32")
        with PleFile(mglu) as f:
            mask = f.layout.tensor("layers.0.mlp.mask_logits")
            assert mask.enc.dtype == "u1" and mask.nbytes == -(-n_m * inter * H // 8)
        saved = L * (4 * inter * H - Encoding("u1").code_bytes(n_m * inter * H))
        assert per_token_bytes(mglu, tokens) == base - saved
        with EdgeModel(mglu) as rt, EdgeModel(swiglu) as dense:  # resident: packed bits, no float masks, no W*m
            assert rt.w["layers.0.mlp.mask_logits"].nbytes == mask.nbytes
            assert rt.resident_bytes < dense.resident_bytes


def test_moe_reads_only_the_routed_experts(export_tmp):
    """k of E experts per token: all-expert routing reads exactly (E - k) experts more per layer and token."""
    tokens = list(range(1, 13))
    got = {k: per_token_bytes(export_tmp(lively_model(*MOE, f"ffn.top_k={k}"), quant="fp32"), tokens)
           for k in (1, 2, 4)}
    cfg = load_model_config("tiny")
    expert = 3 * 48 * cfg.hidden_size * 4  # gate, up, down of one fp32 expert
    for k in (1, 2):
        assert got[4] - got[k] == cfg.num_layers * (4 - k) * expert


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_c_runtime_counts_the_same_routed_bytes(export_tmp):
    path = export_tmp(lively_model(*MOE, "ffn.top_k=2"), quant="fp32")
    r = c_engine.run(path, PROMPT, 24, cflags="-O2")
    c_bytes = sum(v["bytes_per_token"] for v in r["traffic"].values())
    assert c_bytes == pytest.approx(per_token_bytes(path, r["tokens"][:24]))


def test_planner_counts_k_of_e_experts():
    cfg = load_model_config("tiny", [*MOE, "ffn.top_k=1"])
    routed = [it for it in items(layout_for_config(cfg, ExportOptions(quant="int8")), 16, "fp16")
              if ".mlp.experts." in it.name]
    assert len(routed) == 3 * 4 * cfg.num_layers
    assert all(it.bytes_per_token == it.stored / 4 and it.density == 0.25 for it in routed)


def test_a_pruned_config_is_planned_at_its_shipped_width():
    cfg = load_model_config("tiny", ["ffn.kind=pruned", "ffn.intermediate_size=96", "ffn.prune_to=40"])
    lay = layout_for_config(cfg, ExportOptions(quant="int8"))
    assert (lay.model["ffn"]["kind"], lay.tensor("layers.0.mlp.gate_proj.weight").shape) == ("swiglu", (40, 32))
    assert not any(t.name.endswith("alive") for t in lay.tensors)


def test_pruned_model_exports_as_the_dense_swiglu_it_became(tmp_path, capsys):
    tok = Tokenizer.byte_level()
    model = pruned_model(f"vocab_size={tok.vocab_size}")
    save_checkpoint(tmp_path / "run" / "checkpoints" / "step_00000001", model,
                    tokenizer=tok.save(tmp_path / "tokenizer.json"))
    out = tmp_path / "pruned.ple"
    assert main(["export", str(tmp_path / "run"), "--quant", "fp32", "--out", str(out)]) == 0
    with PleFile(out) as f:
        ffn, source = f.layout.model["ffn"], f.layout.source
        names = {t.name for t in f.layout.tensors}
    assert (ffn["kind"], ffn["intermediate_size"]) == ("swiglu", 40)
    assert source["ffn_origin"] == {"kind": "pruned", "intermediate_size": 96, "prune_to": 40,
                                    "prune_importance": "magnitude"}
    assert not any(n.endswith("alive") for n in names)
    ids = torch.randint(0, tok.vocab_size, (32,), generator=torch.Generator().manual_seed(4))
    assert np.abs(runtime_logits(out, ids, prefill=10) - torch_logits(model, ids)).max() <= 1e-4
    cost = measure_decode(tmp_path / "run", tokens=4)
    assert (cost["ffn_kind"], cost["file_ffn_kind"], cost["ffn_origin"]) == ("pruned", "swiglu", "pruned")


def test_unfinished_pruning_is_one_line(tmp_path):
    model = lively_model("ffn.kind=pruned", "ffn.intermediate_size=96", "ffn.prune_to=40")
    with pytest.raises(ExportError, match="live units") as exc:
        export_model(model, tmp_path / "m.ple", ExportOptions(quant="fp32"))
    assert "\n" not in str(exc.value)


def _tensor_offset(path, name: str) -> int:
    with PleFile(path) as f:
        return f.layout.section("tensors").offset + f.layout.tensor(name).codes


def test_corrupt_or_misshapen_masks_are_one_line_errors(export_tmp, tmp_path):
    # 36 x 49 with one mask: 1764 bits, so the last byte holds 4 pad bits that must stay zero
    model = lively_model("ffn.kind=mglu", "hidden_size=36", "num_heads=2", "num_kv_heads=1",
                         "ffn.intermediate_size=49")
    path = export_tmp(model, quant="fp32")
    with PleFile(path) as f:
        mask = f.layout.tensor("layers.1.mlp.mask_logits")
    end = _tensor_offset(path, mask.name) + mask.codes_bytes - 1
    raw = bytearray(path.read_bytes())
    raw[end] |= 0x01  # a pad bit
    bad = tmp_path / "pad.ple"
    bad.write_bytes(bytes(raw))
    with pytest.raises(PleFormatError, match="sha256") as exc:  # every byte is checksummed
        EdgeModel(bad)
    assert "\n" not in str(exc.value)
    with pytest.raises(EdgeRuntimeError, match="past its end") as exc:  # and checked even unverified
        EdgeModel(bad, verify="none")
    assert "\n" not in str(exc.value)
    if HAVE_CC:
        with pytest.raises(c_engine.CEngineError, match="past its end") as exc:
            c_engine.run(bad, PROMPT, 8, cflags="-O2", verify="none")
        assert "\n" not in str(exc.value)
    # a mask of the wrong shape for the model (one column short)
    with torch.no_grad():
        model.layers[0].mlp.mask_logits = torch.nn.Parameter(model.layers[0].mlp.mask_logits[..., :-1].clone())
    short = export_tmp(model, quant="fp32")
    with pytest.raises(EdgeRuntimeError, match="mask_logits is u1 .1, 49, 35., the model's mglu FFN needs") as exc:
        EdgeModel(short)
    assert "\n" not in str(exc.value)
    if HAVE_CC:
        with pytest.raises(c_engine.CEngineError, match="mask_logits has the wrong shape") as exc:
            c_engine.run(short, PROMPT, 8, cflags="-O2")
        assert "\n" not in str(exc.value)


def test_a_router_of_the_wrong_shape_is_one_line(export_tmp):
    model = lively_model(*MOE, "ffn.top_k=2")
    with torch.no_grad():
        model.layers[1].mlp.router.weight = torch.nn.Parameter(model.layers[1].mlp.router.weight[:3].clone())
    with pytest.raises(EdgeRuntimeError, match=r"router.weight is fp32 \[3, 32\], the model's moe FFN needs \[4, 32\]"):
        EdgeModel(export_tmp(model, quant="fp32"))


def test_measure_decode_on_a_file_and_bad_arguments(export_tmp):
    path = export_tmp(lively_model(*MOE, "ffn.top_k=1"), quant="fp32")
    r = measure_decode(path, tokens=3)
    assert r["ffn_kind"] == "moe" and r["runtime"] == "numpy" and r["tokens_per_s"] > 0
    assert r["bytes_per_token"] == round(sum(r["bytes_per_token_by_tier"].values())) > r["kv_bytes_per_token"] > 0
    json.dumps(r)
    for kwargs, what in (({"tokens": 0}, "tokens"), ({"runtime": "gpu"}, "runtime"), ({"threads": 0}, "threads"),
                         ({"tokens": 10_000}, "context"), ({"threads": 2}, "C runtime")):
        with pytest.raises(DecodeCostError, match=what):
            measure_decode(path, **kwargs)


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_measure_decode_in_c_reads_the_same_weight_bytes(export_tmp):
    path = export_tmp(lively_model("ffn.kind=mglu"), quant="fp32")
    py, c = measure_decode(path, tokens=6), measure_decode(path, tokens=6, runtime="c")
    assert py["bytes_per_token"] - py["kv_bytes_per_token"] == c["bytes_per_token"] - c["kv_bytes_per_token"]


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
@pytest.mark.parametrize("variant", ["moe_k1_shared", "mglu4"])
def test_c_parser_survives_mutated_moe_and_mglu_files(tmp_path, variant):
    cfg = load_model_config("tiny", ["max_seq_len=16", "vocab_size=64", *VARIANTS[variant]])
    seed = tmp_path / "seed.ple"
    export_model(LanguageModel(cfg), seed, ExportOptions(quant="int4", group=8))
    r = fuzz(3_000, seed=11, model=seed, timeout=300)
    assert r["crashes"] == 0 and r["bad_messages"] == 0 and r["accepted"] > 0 and r["rejected"] > 0
