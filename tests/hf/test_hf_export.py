"""`plelab export --hf` writes the real PLE table (and main embedding) in the record layout, table-only;
`plelab place` reads such a file, or a Gemma config.json alone (Gemma 3n E2B / E4B shapes on phones)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from plelab.cli.main import main
from plelab.edge.format import PleFile
from plelab.hf.checkpoint import HFCheckpoint
from plelab.util.safetensors import read_rows


def export(folder, out, *flags) -> None:
    assert main(["export", "--hf", str(folder), "--out", str(out), *flags]) == 0


@pytest.mark.parametrize("multimodal", [False, True])
def test_fp32_export_holds_the_exact_table_and_embedding(make_gemma, tmp_path, capsys, multimodal):
    folder = make_gemma("gemma3n", multimodal=multimodal)
    export(folder, tmp_path / "m.ple", "--quant", "fp32")
    assert "table-only export" in capsys.readouterr().out
    ckpt = HFCheckpoint.open(folder)
    table = read_rows(ckpt.table, 0, ckpt.table.shape[0]).float().numpy()
    embed = read_rows(ckpt.tensors["embed_tokens.weight"], 0, ckpt.text_config["vocab_size"]).float().numpy()
    with PleFile(tmp_path / "m.ple") as f:
        lay = f.layout
        assert lay.source["table_only"] and "runtimes must refuse" in lay.source["core"]
        assert lay.tensors == [] and lay.tokenizer is not None and f.tokenizer_json()
        for row in (0, 7, table.shape[0] - 1):
            assert np.array_equal(f.read_record(lay.table("ple"), row)["ple"], table[row])
            assert np.array_equal(f.read_record(lay.table("embed"), row)["embed"], embed[row])


def test_int4_export_is_close_and_streams_in_chunks(make_gemma, tmp_path, monkeypatch):
    import plelab.edge.export as ex
    import plelab.util.safetensors as st

    calls = []
    original = st.read_rows
    monkeypatch.setattr(st, "read_rows", lambda info, a, b: calls.append((info.shape, a, b)) or original(info, a, b))
    monkeypatch.setattr(ex, "_CHUNK_VALUES", 16 * 50)  # 50 rows of the 16-wide table per chunk
    folder = make_gemma("gemma4")
    export(folder, tmp_path / "m.ple", "--quant", "int4", "--group", "8")
    ckpt = HFCheckpoint.open(folder)
    table_reads = [(a, b) for shape, a, b in calls if shape == ckpt.table.shape]
    assert len(table_reads) > 1 and max(b - a for a, b in table_reads) <= 50
    table = original(ckpt.table, 0, ckpt.table.shape[0]).float().numpy()
    with PleFile(tmp_path / "m.ple") as f:
        got = np.stack([f.read_record(f.layout.table("ple"), r)["ple"] for r in range(table.shape[0])])
        assert f.layout.table("ple").record_bytes == 16 // 2 + 2 * 2  # int4 codes + two fp16 group scales
    err = np.abs(got - table).max() / np.abs(table).max()
    assert 0 < err < 0.1


def test_plan_of_an_exported_table_and_runtime_refusal(make_gemma, tmp_path, capsys):
    path = tmp_path / "m.ple"
    export(make_gemma("gemma4"), path, "--quant", "int4", "--group", "8")
    capsys.readouterr()
    assert main(["place", str(path), "--device", "phone-ufs4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["placement"]["table:ple"] == "ufs" and r["bytes_per_token"]["ufs"] == 12
    assert "core's weights are not counted" in r["note"]
    assert main(["run", str(path), "--ids", "1,2,3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "table-only export" in err


def test_the_c_engine_refuses_a_table_only_file_in_the_numpy_engines_words(make_gemma, tmp_path, capsys):
    import subprocess

    from plelab.edge import c_engine

    try:
        plerun = c_engine.build(cflags="-O2")
    except c_engine.CEngineError as exc:
        pytest.skip(str(exc))
    path = tmp_path / "m.ple"
    export(make_gemma("gemma4"), path, "--quant", "int4", "--group", "8")
    capsys.readouterr()
    errors = {}
    for engine in ("numpy", "c"):
        assert main(["run", str(path), "--ids", "1,2,3", "--engine", engine]) == 2
        errors[engine] = capsys.readouterr().err.strip()
    assert errors["c"] == errors["numpy"] and "table-only export" in errors["c"]
    proc = subprocess.run([str(plerun), str(path), "--ids", "1"], capture_output=True, text=True)
    assert proc.returncode == 2 and "table-only export" in proc.stderr and "name table" not in proc.stderr


def _gemma3n_config(**published) -> dict:
    from transformers import Gemma3nTextConfig

    return Gemma3nTextConfig(**published).to_dict()


# Published Gemma 3n text configs; transformers' Gemma3nTextConfig defaults are E4B's (checked below).
E2B = dict(num_hidden_layers=30, intermediate_size=[8192] * 30, num_kv_shared_layers=10,
           activation_sparsity_pattern=[0.95] * 10 + [0.0] * 20, layer_types=None)
E4B = dict()


@pytest.mark.parametrize(("name", "published", "layers"), [("E2B", E2B, 30), ("E4B", E4B, 35)])
@pytest.mark.parametrize("device", ["phone-ufs4", "phone-ufs3"])
def test_plan_gemma3n_shapes_from_config_alone(tmp_path, capsys, name, published, layers, device):
    cfg = _gemma3n_config(**published)
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["hidden_size_per_layer_input"],
            cfg["vocab_size_per_layer_input"]) == (2048, layers, 256, 262144)
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    args = ["place", str(tmp_path), "--device", device, "--quant", "int4", "--group", "128", "--context", "4096"]
    assert main([*args, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    record = layers * 256 // 2 + layers * 256 // 128 * 2  # int4 codes + one fp16 scale per 128 values
    assert r["bytes_per_token"]["ufs"] == record  # E2B: 3,960 B, E4B: 4,620 B per token
    table = next(it for it in r["items"] if it["name"] == "table:ple")
    assert table["tier"] == "ufs" and table["bytes"] == 262144 * record  # E2B 1.04 GB, E4B 1.21 GB of RAM saved
    assert main(args) == 0
    assert f"PLE table left in ufs: {262144 * record:,} bytes of RAM saved" in capsys.readouterr().out
