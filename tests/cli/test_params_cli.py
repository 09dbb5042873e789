"""`plelab params` prints the published figures, as text and as JSON, through the real console entry."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from plelab.cli.main import main
from plelab.edge.budget import active_flops, active_params_per_token, inference_bytes
from plelab.model import load_model_config


def plelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plelab", *args], capture_output=True, text=True, timeout=120)


def params_json(capsys, *args: str) -> dict:
    """`plelab params ... --json` in this process (the console entry itself is tested by the text-table test)."""
    capsys.readouterr()
    assert main(["params", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_seed_sweep_table_text():
    out = plelab("params", "seed-3b", "--sweep-ple", "0,64,128,256,512")
    assert out.returncode == 0, out.stderr
    for figure in ("2,458,421,760", "220,807,232", "441,532,544", "882,983,168", "1,765,884,416", "35.92%", "71.83%"):
        assert figure in out.stdout


def test_esp32_json_fields(capsys):
    data = params_json(capsys, "esp32-28m", "--export-dtype", "int4")
    assert data["total"] == 28_869_920
    for key in ("total", "base_total", "ple_table", "ple_model_projection", "ple_per_layer", "ple_added",
                "active_params_per_token", "inference_bytes", "active_flops"):
        assert isinstance(data[key], int)
    cfg = load_model_config("esp32-28m")
    assert data["active_params_per_token"] == active_params_per_token(cfg)
    assert data["inference_bytes"] == inference_bytes(cfg, "int4")
    assert data["active_flops"] == active_flops(cfg)
    assert data["export_dtype"] == "int4"


def test_bad_override_is_one_clear_line():
    out = plelab("params", "seed-3b", "--set", "num_heads=7", "--set", "head_dim=null")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "does not divide" in out.stderr
    assert "Traceback" not in out.stderr


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """`plelab ARGS` in this process (a usage error's SystemExit becomes its status): (rc, stdout, stderr)."""
    try:
        rc = main(list(args))
    except SystemExit as exc:
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_text_shows_per_token_costs(capsys):
    rc, out, err = run_cli(capsys, "params", "tiny", "--set", "ffn.kind=mglu")
    assert rc == 0, err
    assert "active parameters" in out and "weight bytes read (fp16 export)" in out


def test_match_ffn_json_and_text(capsys):
    rc, out, err = run_cli(capsys, "params", "tiny", "--set", "ffn.kind=mglu", "--match-ffn", "params", "--json")
    assert rc == 0, err
    data = json.loads(out)
    # MGLU's shared gate/up matrix: 1.5x tiny's 64-wide SwiGLU for the same FFN parameters.
    assert (data["field"], data["width"], data["set"]) == ("ffn.intermediate_size", 96, "ffn.intermediate_size=96")
    assert data["value"] <= data["reference_value"] < data["next_value"]
    assert all(isinstance(data[k], int) for k in ("width", "value", "reference_value", "next_value"))
    rc, out, err = run_cli(capsys, "params", "tiny", "--set", "ffn.kind=lowrank", "--set", "ffn.rank=4",
                           "--match-ffn", "active-flops", "--reference-set", "ffn.intermediate_size=48")
    assert rc == 0, err
    assert "solved width" in out and "ffn.rank = " in out and "reference value" in out


@pytest.mark.parametrize(("kind", "field"), [("lowrank", "rank"), ("pruned", "prune_to")])
def test_match_ffn_solves_the_width_it_is_not_given(capsys, kind, field):
    """The free width (rank, prune_to) is what --match-ffn solves: it must not be asked for first."""
    extra = ["--set", "ffn.intermediate_size=256"] if kind == "pruned" else []
    rc, out, err = run_cli(capsys, "params", "tiny", "--set", f"ffn.kind={kind}", *extra, "--match-ffn", "params",
                           "--json")
    assert rc == 0, err
    data = json.loads(out)
    assert data["field"] == f"ffn.{field}" and data["width"] >= 1
    assert data["value"] <= data["reference_value"]
    given = run_cli(capsys, "params", "tiny", "--set", f"ffn.kind={kind}", *extra, "--set", f"ffn.{field}=3",
                    "--match-ffn", "params", "--json")[1]
    assert json.loads(given)["width"] == data["width"]  # a width given is only the search's start


def test_budget_no_width_meets_is_one_line_exit_2(capsys):
    rc, _, err = run_cli(capsys, "params", "tiny", "--set", "ffn.kind=moe", "--match-ffn", "params",
                         "--reference-set", "ffn.intermediate_size=1")
    assert rc == 2
    assert err.strip().count("\n") == 0 and "no moe width" in err and "192" in err


@pytest.mark.parametrize("args", [["--quant", "bf16"], ["--export-dtype", "bf16"], ["--match-ffn", "flops"],
                                  ["--reference-set", "ffn.rank=2"], ["--match-ffn", "params", "--sweep-ple", "0,64"]])
def test_bad_budget_options_are_one_line(capsys, args):
    rc, _, err = run_cli(capsys, "params", "tiny", *args)
    assert rc == 2
    assert err.strip().count("\n") == 0 and "error" in err


def test_help_has_a_match_example(capsys):
    rc, out, _ = run_cli(capsys, "params", "--help")
    assert rc == 0 and "--match-ffn inference-bytes" in out and "--quant" in out


def test_the_export_encoding_has_one_name_and_the_old_one_still_works(capsys):
    new = params_json(capsys, "esp32-28m", "--quant", "int8")
    old = params_json(capsys, "esp32-28m", "--export-dtype", "int8")
    assert new == old and new["export_dtype"] == "int8"  # the JSON key is a file format: unchanged
    assert new["inference_bytes"] < params_json(capsys, "esp32-28m")["inference_bytes"]


def test_ngram_table_counts_are_what_the_built_model_reads(capsys):
    # Rows and values per token from the real model's table lookups, against what `plelab params` prints.
    import torch

    from plelab.model import LanguageModel

    overrides = ["ple.index=ngram", "ple.ngram.orders=[2,3]", "ple.ngram.heads=2", "ple.ngram.rows=[257,263]"]
    data = params_json(capsys, "tiny", *[a for o in overrides for a in ("--set", o)])
    t = data["ple_table_index"]
    torch.manual_seed(0)
    model = LanguageModel(load_model_config("tiny", overrides))
    table = model.per_layer_inputs.embed_tokens_per_layer
    seen = []
    table.register_forward_hook(lambda mod, args, out: seen.append((args[0].shape, out.shape)))
    model(torch.randint(0, 256, (2, 5)))
    (ids_shape, out_shape), = seen
    assert ids_shape == (2, 5, t["rows_read_per_token"]) and out_shape[-1] == t["row_values"]
    assert t["table_rows"] == table.num_embeddings == 2 * 257 + 2 * 263
    assert t["rows_per_head"] == [257, 263] and t["heads"] == 4
    assert t["table_params_per_token"] == 4 * out_shape[-1] == 2 * 16  # every layer's dP, over the heads
    assert data["ple_table"] == table.weight.numel()
    assert t["table_bytes_per_token_fp32"] == 4 * t["table_params_per_token"]


def test_ngram_params_text_names_the_index():
    out = plelab("params", "small-ple", "--set", "ple.index=ngram")
    assert out.returncode == 0, out.stderr
    assert "n-gram index: orders [2, 3] x 4 hash heads = 8 heads; rows per head 8,209 (order 2)" in out.stdout
    assert "rows read per token" in out.stdout and "65,672" in out.stdout
