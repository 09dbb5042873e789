"""`plelab quant-recipe`: the exact budgeted choice, byte counts, the per-group table on real runs and HF folders,
the .ple recipe in both runtimes, the GGUF recipe's types, resuming, and bad input."""

from __future__ import annotations

import itertools
import json
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_helpers import gemma_tokenizer, held_out, train_run

pytest.importorskip("transformers")
pytest.importorskip("gguf")

from plelab.cli.main import main  # noqa: E402
from plelab.hf.quant_formats import parse_format  # noqa: E402
from plelab.hf.quant_recipe import RecipeError, choose  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import make_dataset, write_config  # noqa: E402

PLE_FORMATS = "fp16,int8/32,int4/32,int4/16"


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error:" in err, err
    return err


def test_choose_is_the_exact_minimum():
    rng = random.Random(0)
    for _ in range(30):
        groups = [f"g{i}" for i in range(4)]
        names = ["a", "b", "c"]
        table = {g: {f: {"bytes": rng.randint(1, 50), "kl": rng.random()} for f in names} for g in groups}
        budget = rng.randint(40, 160)
        best = None
        for combo in itertools.product(names, repeat=len(groups)):
            b = sum(table[g][f]["bytes"] for g, f in zip(groups, combo, strict=True))
            k = sum(table[g][f]["kl"] for g, f in zip(groups, combo, strict=True))
            if b <= budget and (best is None or k < best[1] - 1e-12):
                best = (b, k)
        fmts = [parse_format("fp16")]  # names are matched by string; build stand-ins
        fmts = [type(fmts[0])(n, "ple") for n in names]
        if best is None:
            with pytest.raises(RecipeError, match="below the smallest recipe"):
                choose(table, fmts, budget)
            continue
        pick, nbytes, kl = choose(table, fmts, budget)
        assert nbytes <= budget and kl == pytest.approx(best[1])
        assert nbytes == sum(table[g][f]["bytes"] for g, f in pick.items())


def test_format_bytes_and_round_trips():
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    int4 = parse_format("int4/32")
    assert int4.nbytes((4, 64), table=True) == 4 * (32 + 2 * 2)  # per row: 64 nibbles + two fp16 scales
    assert int4.nbytes((4, 64), table=False) == 128 + 8 * 2  # one vector of 256 values
    assert parse_format("q8_0").nbytes((4, 64), True) == 4 * 68
    assert parse_format("q4_k").nbytes((4, 64), True) is None  # 64 is not a multiple of 256
    assert parse_format("fp16").bits == 16 and parse_format("int8/32").bits == 8.5
    back = int4.round_trip(x, table=True)
    assert np.abs(back - x).max() <= np.abs(x).max() / 7 + 1e-6 and not np.array_equal(back, x)
    with pytest.raises(Exception, match="unknown format"):
        parse_format("int3/32")


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    from plelab.training.config import load_train_config
    from plelab.training.trainer import Trainer

    root = tmp_path_factory.mktemp("recipe-llama")
    make_dataset(root)
    config = write_config(root, max_steps=12)
    Trainer(load_train_config(config), root / "run", quiet=True).run()
    return root / "run"


def test_recipe_on_a_llama_run_exports_a_ple_both_runtimes_run(llama_run, tmp_path, capsys):
    from plelab.edge.format import PleFile

    out = tmp_path / "recipe"
    valid = llama_run.parent / "valid"
    assert main(["quant-recipe", str(llama_run), "--eval", str(valid), "--out", str(out), "--tokens", "200",
                 "--seq-len", "32", "--formats", PLE_FORMATS, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["table"]) == {"ple_table", "ple_context", "ple_projection", "ple_gate", "attention", "ffn",
                                    "embedding"}
    assert set(result["reference"]["domains"]) == {"prose", "numbers"}
    recipe = result["recipes"]["ple"]
    assert recipe["bytes"] <= recipe["budget"] == recipe["baselines"]["int4/32"]["bytes"]
    assert "gguf" not in result["files"] and "gguf" not in result["recipes"]
    for row in result["table"].values():
        assert row["fp16"]["kl"] < 1e-5 < row["int4/16"]["kl"] or row["int4/16"]["kl"] < 1e-5
    # the file: every tensor in its group's encoding, and the NumPy runtime computes what was measured
    with PleFile(out / "recipe.ple") as f:
        encs = {t.name: t.enc.to_json() for t in f.layout.tensors}
        assert f.layout.quant["encodings"]
        assert encs["layers.0.self_attn.q_proj.weight"]["dtype"] == recipe["formats"]["attention"].split("/")[0]
    file_kl = result["files"]["ple"]["measured"]["kl"]
    assert file_kl == pytest.approx(recipe["measured"]["kl"], rel=0.05, abs=1e-5)
    # the C runtime runs the mixed-encoding file and agrees with the NumPy one
    runs = {}
    for engine in ("numpy", "c"):
        assert main(["run", str(out / "recipe.ple"), "--ids", "1,2,3", "--max-new-tokens", "8", "--temperature",
                     "0", "--json", "--engine", engine]) == 0
        runs[engine] = json.loads(capsys.readouterr().out)["generated_ids"]
    assert runs["c"] == runs["numpy"]
    assert (out / "report.html").is_file() and (out / "plots" / "recipe_kl.png").is_file()


def test_rerun_resumes_and_refuses_to_overwrite(llama_run, tmp_path, capsys):
    out = tmp_path / "resume"
    valid = llama_run.parent / "valid"
    argv = ["quant-recipe", str(llama_run), "--eval", str(valid), "--out", str(out), "--tokens", "100",
            "--seq-len", "32", "--formats", "fp16,int4/32", "--budget", "int4/32", "--no-export"]
    assert main(argv) == 0
    saved = json.loads((out / "measurements.json").read_text())
    assert "--overwrite" in one_line_error(capsys, argv)
    (out / "recipe.json").unlink()
    (out / "report.html").unlink()
    (out / "report.md").unlink()
    import shutil

    shutil.rmtree(out / "plots")
    from plelab.hf import quant_recipe

    calls = []
    original = quant_recipe.Measurer.measure
    quant_recipe.Measurer.measure = lambda self, a, windows=False: calls.append(a) or original(self, a, windows)
    try:
        assert main(argv) == 0  # only measurements.json was there: resumed, no cell measured again
    finally:
        quant_recipe.Measurer.measure = original
    assert all(len(a) == len(saved["table"]) for a in calls)  # only whole-recipe measurements


def test_budget_below_the_smallest_recipe_writes_nothing(llama_run, tmp_path, capsys):
    out = tmp_path / "tiny-budget"
    base = ["quant-recipe", str(llama_run), "--eval", str(llama_run.parent / "valid"), "--out", str(out),
            "--formats", "fp16,int4/32"]
    err = one_line_error(capsys, [*base, "--budget", "2k"])
    # Said in the option's own terms: the whole model's bytes the smallest recipe takes, and what the budget allows.
    smallest = re.search(r"it takes ([\d,]+) bytes of weights \(([\d,]+) in the quantized groups \+ ([\d,]+) kept "
                         r"unquantized\), the budget allows 2,000; give at least \1 or a smaller format", err)
    assert err.count("--budget 2k is below the smallest recipe of fp16, int4/32") == 1 and smallest, err
    whole, groups, fixed = (int(x.replace(",", "")) for x in smallest.groups())
    assert whole == groups + fixed
    err = one_line_error(capsys, [*base, "--budget", f"{fixed // 2}"])
    assert f"is below what the norms and other weights kept unquantized take alone ({fixed:,} bytes)" in err
    assert "q4_0 is not among the formats measured (fp16, int4/32)" in one_line_error(capsys, [*base, "--budget",
                                                                                                 "q4_0"])
    assert not out.exists()
    assert "no such file" in one_line_error(capsys, ["quant-recipe", str(llama_run), "--eval", str(tmp_path / "no"),
                                                     "--out", str(out)])
    assert not out.exists()


def test_recipe_on_a_gemma4_run_writes_the_gguf_it_chose(tmp_path_factory, capsys):
    import gguf

    from plelab.hf.gguf_types import ggml_library_path

    root = tmp_path_factory.mktemp("recipe-g4")
    run = train_run(root, "run", gemma_tokenizer(root), steps=8)
    out = root / "recipe"
    formats = "fp16,int8/32,int4/32,f16,q8_0,q4_0" + (",q4_k,q2_k" if ggml_library_path() else "")
    assert main(["quant-recipe", str(run), "--eval", str(held_out(root)), "--out", str(out), "--tokens", "128",
                 "--seq-len", "32", "--formats", formats, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    chosen = result["recipes"]["gguf"]["formats"]
    types = {t.name: t.tensor_type.name.lower() for t in gguf.GGUFReader(str(out / "recipe.gguf")).tensors}
    assert types["per_layer_token_embd.weight"] == chosen["ple_table"]
    assert types["blk.1.inp_gate.weight"] == chosen["ple_gate"]
    assert types["blk.0.proj.weight"] == chosen["ple_projection"]
    assert types["blk.0.ffn_up.weight"] == chosen["ffn"] and types["token_embd.weight"] == chosen["embedding"]
    ple = result["files"]["ple"]
    assert ple["table_only"] and ple["measured"]["max_abs_diff_to_measured"] == 0.0
    if result["files"]["gguf"]["measured_in_llama_cpp"] is not None:
        measured = result["files"]["gguf"]["measured_in_llama_cpp"]["kl"]
        assert measured == pytest.approx(result["recipes"]["gguf"]["measured"]["kl"], rel=0.5, abs=1e-4)


def test_recipe_on_an_hf_gemma3n_folder_streams_the_table(make_gemma, valid_dir, tmp_path, capsys):
    folder = make_gemma("gemma3n")
    out = tmp_path / "g3n"
    assert main(["quant-recipe", "--hf", str(folder), "--eval", str(valid_dir), "--out", str(out), "--tokens", "96",
                 "--seq-len", "32", "--formats", "fp16,int8/32,int4/32,int4/8", "--budget", "int4/32",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["family"] == "gemma3n" and "ple_table" in result["table"]
    assert result["table"]["ple_table"]["int4/8"]["kl"] > result["table"]["ple_table"]["int8/32"]["kl"]
    ple = result["files"]["ple"]
    assert ple["table_only"] and ple["measured"]["max_abs_diff_to_measured"] == 0.0
    assert "gguf" not in result["files"]


def test_recipe_on_an_hf_gemma4_folder_writes_a_gguf_llama_cpp_runs(tokenizer_json, valid_dir, tmp_path, capsys):
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    folder = tmp_path / "hf-g4"  # dP = 8: only 16-bit GGUF types hold the per-layer projections
    torch.manual_seed(0)
    Gemma4ForCausalLM(Gemma4TextConfig(
        vocab_size=320, vocab_size_per_layer_input=320, hidden_size=32, hidden_size_per_layer_input=8,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
        layer_types=["sliding_attention", "full_attention"], sliding_window=8, intermediate_size=64,
        max_position_embeddings=128)).save_pretrained(folder)
    (folder / "tokenizer.json").write_text(tokenizer_json)
    out = tmp_path / "g4"
    assert main(["quant-recipe", "--hf", str(folder), "--eval", str(valid_dir), "--out", str(out), "--tokens", "96",
                 "--seq-len", "32", "--formats", "fp16,int8/32,int4/32,f16,bf16", "--budget", "int4/32",
                 "--gguf-budget", "f16", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["family"] == "gemma4" and set(result["recipes"]["gguf"]["formats"].values()) <= {"f16", "bf16"}
    gg = result["files"]["gguf"]
    assert Path(gg["path"]).is_file()
    if gg["measured_in_llama_cpp"] is not None:  # 16-bit weights: llama.cpp computes nearly the fp32 model
        assert gg["measured_in_llama_cpp"]["kl"] < 1e-3
    # without tokenizer.json: measured on token ids, no GGUF (it would carry no tokenizer), said in the notes
    (folder / "tokenizer.json").unlink()
    ids = tmp_path / "ids.npy"
    np.save(ids, np.random.default_rng(0).integers(0, 320, 200))
    out2 = tmp_path / "g4-ids"
    assert main(["quant-recipe", "--hf", str(folder), "--eval", str(ids), "--out", str(out2), "--tokens", "96",
                 "--seq-len", "32", "--formats", "fp16,int4/32,f16", "--budget", "int4/32", "--gguf-budget", "f16",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert "gguf" not in result["files"] and any("no tokenizer.json" in n for n in result["notes"])


def test_per_tensor_encodings_leave_other_files_unchanged(llama_run, tmp_path):
    """A recipe that restates the defaults writes the same weight bytes; without one the metadata has no
    'encodings' key, so files exported as before are byte-identical to before."""
    from plelab.edge.export import ExportOptions, export_model
    from plelab.edge.format import PleFile
    from plelab.edge.quant import Encoding
    from plelab.inference.load import load_model

    model, _ = load_model(llama_run)
    plain = export_model(model, tmp_path / "plain.ple", ExportOptions(quant="int4", group=32))
    same = {t.name: Encoding("int4", 32) for t in plain.tensors if len(t.shape) > 1 and t.enc.dtype == "int4"}
    restated = export_model(model, tmp_path / "restated.ple",
                            ExportOptions(quant="int4", group=32, encodings={**same, "ple": Encoding("int4", 32)}))
    assert "encodings" not in plain.quant and "encodings" in restated.quant
    for a, b in zip(plain.sections, restated.sections, strict=True):
        assert a.name == b.name
        if a.name not in ("meta", "model"):
            assert a.sha256 == b.sha256, a.name
    with PleFile(tmp_path / "restated.ple") as f:
        assert f.layout.quant["encodings"]["ple"] == {"dtype": "int4", "group": 32}


def test_a_window_past_the_context_or_bad_ids_are_refused_before_out_is_made(llama_run, tmp_path, capsys):
    out = tmp_path / "r"
    base = ["quant-recipe", str(llama_run), "--out", str(out), "--formats", "fp16,int4/32", "--no-export"]
    err = one_line_error(capsys, [*base, "--eval", str(llama_run.parent / "valid"), "--seq-len", "64"])
    assert "--seq-len 64 is longer than the model's context (32 tokens)" in err
    for name, ids, message in (("minus.npy", np.array([5, 7, -1, 9] * 50), "holds token id -1"),
                               ("nan.npy", np.array([5.0, np.nan] * 100), "holds float64 values")):
        np.save(tmp_path / name, ids)
        err = one_line_error(capsys, [*base, "--eval", str(tmp_path / name), "--seq-len", "16"])
        assert message in err, err
    assert not out.exists()
    assert main([*base, "--eval", str(llama_run.parent / "valid"), "--tokens", "100", "--json"]) == 0
    assert "in windows of 32" in json.loads(capsys.readouterr().out)["held_out"]  # the default, fitted to the model


def test_overwrite_without_export_removes_the_earlier_recipes_files(llama_run, tmp_path, capsys):
    out = tmp_path / "again"
    argv = ["quant-recipe", str(llama_run), "--eval", str(llama_run.parent / "valid"), "--out", str(out),
            "--tokens", "100", "--seq-len", "32", "--formats", "fp16,int4/32", "--budget", "int4/32"]
    assert main(argv) == 0 and (out / "recipe.ple").is_file()
    assert main([*argv, "--overwrite", "--no-export"]) == 0
    assert not (out / "recipe.ple").exists()
    assert json.loads((out / "recipe.json").read_text())["files"] == {}
