"""An n-gram PLE model through the edge stack: the .ple format's n-gram index (version 3), the NumPy runtime's hash
and S reads per position against the torch model, placement and budgets, and what the format refuses."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from edge_helpers import lively_model
from test_parity import runtime_logits, torch_logits

from plelab.edge import format as fmt
from plelab.edge.budget import inference_bytes
from plelab.edge.export import ExportError, ExportOptions, export_model, layout_for_config
from plelab.edge.format import PleFile
from plelab.edge.placement import get_device, items, place
from plelab.edge.runtime import EdgeModel
from plelab.inference.generate import generate
from plelab.model import load_model_config
from plelab.model.ngram import NgramLayout, hash_rows_python, id_map_document

NGRAM = ["ple.index=ngram", "ple.ngram.orders=[2,3]", "ple.ngram.heads=2"]  # S = 4 heads of 257 rows, dP 16
# orders 1-3, two heads each (S = 6), a rows count per order, a seed: dP 24 = 6 slices of 4
NGRAM_3 = ["ple.index=ngram", "ple.dim=24", "ple.ngram.orders=[1,2,3]", "ple.ngram.heads=2",
           "ple.ngram.rows=[257,263,269]", "ple.ngram.seed=77"]


def id_map_file(tmp_path: Path) -> Path:
    """An id-map file that merges pairs of ids (a stand-in for a tokenizer's: the runtimes only look ids up)."""
    path = tmp_path / "idmap.json"
    path.write_text(json.dumps(id_map_document([i // 2 for i in range(256)])))
    return path


VARIANTS = {
    "gemma_form": NGRAM,
    "orders_1_to_3": NGRAM_3,
    "simple_form_untied": [*NGRAM, "ple.gate=scalar", "ple.context=false", "ple.output_norm=false",
                           "tie_embeddings=false"],
    "vector_gate_subset": [*NGRAM, "ple.gate=vector", "ple.layers=[1]"],
}


@pytest.mark.parametrize("name", VARIANTS)
def test_an_ngram_export_runs_as_the_torch_model_does(export_tmp, name):
    """fp32 logits within 1e-4 over a prefill and token-by-token decoding: the NumPy runtime hashes the ids (the
    positions before a decoded token come from its cache) and reads S records per position."""
    model = lively_model(*VARIANTS[name])
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(4))
    ref = torch_logits(model, ids)
    assert np.abs(runtime_logits(export_tmp(model, quant="fp32"), ids, prefill=17) - ref).max() <= 1e-4


def test_an_id_map_travels_in_the_file_and_the_runtime_hashes_compressed_ids(export_tmp, tmp_path):
    model = lively_model(*NGRAM, f"ple.ngram.id_map={id_map_file(tmp_path)}")
    path = export_tmp(model, quant="fp32")
    with PleFile(path) as f:
        assert f.layout.id_map and [f.read_id(t) for t in (0, 1, 2, 255)] == [0, 0, 1, 127]
    ids = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(5))
    assert np.abs(runtime_logits(path, ids, prefill=9) - torch_logits(model, ids)).max() <= 1e-4
    # the map matters: the same weights hashing the raw ids give other logits
    with torch.no_grad():
        model.per_layer_inputs.index.id_map.copy_(torch.arange(256))
    assert np.abs(runtime_logits(path, ids, prefill=9) - torch_logits(model, ids)).max() > 1e-2


def test_greedy_decoding_equals_the_torch_models(export_tmp):
    model = lively_model(*NGRAM)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    with EdgeModel(export_tmp(model, quant="fp32")) as rt:
        assert list(rt.generate(prompt, 20, temperature=0.0)) == list(generate(model, prompt, 20, temperature=0.0))


def test_quantised_ngram_exports_degrade_in_order(export_tmp):
    model = lively_model(*NGRAM)
    ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(6))
    ref = torch_logits(model, ids)
    err = {q: np.abs(runtime_logits(export_tmp(model, quant=q, group=16), ids, prefill=32) - ref).mean()
           for q in ("fp16", "int8", "int4")}
    assert err["fp16"] < err["int8"] < err["int4"]
    assert err["int8"] < 0.05 * np.abs(ref).mean()


def test_the_file_records_the_index_in_version_3_and_a_token_model_stays_version_2(export_tmp):
    path = export_tmp(lively_model(*NGRAM_3), quant="int8", group=16)
    with PleFile(path) as f:
        lay = f.layout
        desc = f._pread(lay.section("model").nbytes, lay.section("model").offset)
    assert lay.version == 3 and lay.meta()["version"] == 3
    assert lay.ngram == NgramLayout((1, 2, 3), 2, (257, 263, 269), 77) and lay.ple_reads == 6
    ple = lay.table("ple")
    assert ple.rows == lay.derived["ple_vocab_size"] == 2 * (257 + 263 + 269)
    assert ple.part("ple").length == 2 * 24 // 6  # each row: every layer's slice of one head
    # the binary description: index kind in the head, then the n-gram block after the PLE layers
    assert struct.unpack_from("<I", desc, 84)[0] == 1
    at = fmt.MODEL_HEAD.size + 8  # two PLE layers, padded to 8 bytes
    assert struct.unpack_from("<10I", desc, at) == (3, 2, 77, 0, 1, 2, 3, 257, 263, 269)
    with PleFile(export_tmp(lively_model(), quant="int8", group=16)) as f:
        assert f.layout.version == 2 and f.layout.ngram is None and f.layout.ple_reads == 1


def test_a_version_2_file_written_before_version_3_is_still_read_and_rewritten_byte_for_byte(tmp_path):
    """tests/edge/data/token-v2.ple was written by plelab before format version 3 existed: this plelab reads it to
    the greedy ids it decoded to then, and writes the same model to the same bytes."""
    fixture = Path(__file__).with_name("data") / "token-v2.ple"
    want = json.loads(fixture.with_suffix(".json").read_text())
    with EdgeModel(fixture) as rt:
        assert rt.file.layout.version == 2
        assert list(rt.generate(want["prompt"], len(want["greedy_ids"]), temperature=0.0)) == want["greedy_ids"]
    again = tmp_path / "again.ple"
    export_model(lively_model("vocab_size=64", "max_seq_len=32", "ple.dim=8"), again, ExportOptions(**want["export"]))
    assert again.read_bytes() == fixture.read_bytes()


@pytest.mark.parametrize("overrides, field", [
    ([*NGRAM, "ple.gate=engram", "ple.context=false", "ple.output_norm=false"], "ple.gate=engram"),
    ([*NGRAM, "ple.conv_kernel=4"], "ple.conv_kernel=4"),
    (["ple.conv_kernel=2"], "ple.conv_kernel=2"),  # a token table's convolution neither
])
def test_a_model_the_runtimes_cannot_run_is_refused_in_one_line_naming_the_field(tmp_path, overrides, field):
    out = tmp_path / "never.ple"
    with pytest.raises(ExportError) as exc:
        export_model(lively_model(*overrides), out, ExportOptions(quant="int4"))
    assert field in str(exc.value) and "\n" not in str(exc.value)
    assert not out.exists()


def test_an_ngram_table_cannot_carry_the_embedding_row(tmp_path):
    with pytest.raises(ExportError, match="hash buckets, not token ids"):
        export_model(lively_model(*NGRAM), tmp_path / "x.ple", ExportOptions(embed_in_record=True))


def test_the_runtime_reads_s_records_per_position_where_the_hash_says(export_tmp):
    model = lively_model(*NGRAM)
    path = export_tmp(model, quant="int4", group=16)
    prompt = [7, 7, 200, 3]
    with EdgeModel(path) as rt:
        read = []
        real = rt.file.read_record
        rt.file.read_record = lambda table, row: read.append(row) or real(table, row)  # a spy, the real read
        rt.forward(prompt, rt.new_cache(4))
        record = rt.ple_table.record_bytes
        assert rt.traffic.reads["file"] == 4 * 4 and rt.traffic.bytes["file"] == 4 * 4 * record
    assert read == [r for rows in hash_rows_python(prompt, model.config.ple_layout) for r in rows]


@pytest.mark.parametrize("quant", ["fp32", "int8", "int4"])
def test_placement_and_the_budget_count_s_reads_and_every_rows_scales(quant, tmp_path):
    cfg = load_model_config("tiny", [*NGRAM_3, f"ple.ngram.id_map={id_map_file(tmp_path)}"])
    layout = layout_for_config(cfg, ExportOptions(quant=quant))
    per_token = items(layout, context=0, kv_dtype="fp16")
    ple = next(it for it in per_token if it.name == "table:ple")
    record = layout.table("ple").record_bytes
    assert (ple.reads_per_token, ple.bytes_per_token) == (6, 6 * record)
    # a row: 2 layers x 24 / 6 values, and (int8 / int4) its own scale
    assert record == {"fp32": 32, "int8": 8 + 2, "int4": 4 + 2}[quant]
    idmap = next(it for it in per_token if it.name == fmt.ID_MAP)
    assert (idmap.bytes_per_token, idmap.reads_per_token, idmap.resident) == (4, 1, False)
    # `plelab params`' weight bytes read per token are the placement's (the KV cache apart)
    assert inference_bytes(cfg, quant) == sum(it.bytes_per_token for it in per_token if it.name != "kv_cache")
    r = place(layout, get_device("esp32-s3"), kv_dtype="fp32")
    assert r["reads_per_token"]["flash"] == 6 + 1  # six PLE records and the id; the tied head is in RAM


def test_an_ngram_file_relabelled_version_2_is_refused(export_tmp, tmp_path):
    """A version-2 reader would misread the n-gram index: a file claiming version 2 may not hold one."""
    raw = bytearray(export_tmp(lively_model(*NGRAM), quant="int8", group=16).read_bytes())
    fields = fmt.HEADER.unpack(bytes(raw[: fmt.HEADER.size]))
    raw[: fmt.HEADER.size] = fmt._pack_header(fields[3], fields[4], fields[5], fields[6], version=2)
    bad = tmp_path / "relabelled.ple"
    bad.write_bytes(bytes(raw))
    with pytest.raises(fmt.PleFormatError, match="an n-gram index needs format version 3, the file is version 2"):
        PleFile(bad, verify="none")


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_plelab_params_and_plelab_place_read_the_same_bytes_per_token(quant, capsys):
    from plelab.cli.main import main

    sets = [a for o in NGRAM_3 for a in ("--set", o)]
    assert main(["params", "tiny", *sets, "--quant", quant, "--json"]) == 0
    params = json.loads(capsys.readouterr().out)
    assert main(["place", "tiny", *sets, "--quant", quant, "--device", "esp32-s3", "--json"]) == 0
    placed = json.loads(capsys.readouterr().out)
    kv = next(it["bytes_per_token"] for it in placed["items"] if it["name"] == "kv_cache")
    assert params["inference_bytes"] == sum(placed["bytes_per_token"].values()) - kv
    assert placed["reads_per_token"]["flash"] == params["ple_table_index"]["rows_read_per_token"] == 6
