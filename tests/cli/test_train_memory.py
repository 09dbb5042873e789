"""`plelab train-memory`: JSON and text output, exit status for runs that do not fit, one-line input errors."""

from __future__ import annotations

import argparse
import json

import pytest

from plelab.cli.main import main
from plelab.cli.train_memory import memory_size

SWEEP = ["seed-3b", "--set", "model.ple.dim=512", "--global-batch", "4096", "--gpus", "8", "--gpu-memory", "80GB"]


def run(capsys, *argv: str, command: str = "train-memory") -> tuple[int, str, str]:
    code = main([command, *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_estimate_of_the_published_3b_run(capsys):
    code, out, _ = run(capsys, *SWEEP, "--tokens", "400e9", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["fits"]
    assert plan["model"]["ple_table"] == 100096 * 32 * 512 and plan["model"]["seq_len"] == 4096
    assert plan["sequences_per_rank_per_step"] == 512
    assert plan["micro_batch"] * plan["grad_accum"] == 512
    assert plan["per_rank_bytes"]["total"] <= 80e9
    assert plan["ple_table_sharding_saves_bytes"] > 10 * 2**30  # net of the lookup exchange buffers
    assert plan["gpu_hours"] > 0 and plan["overrides"] == ["model.ple.dim=512"]


def test_text_plan_names_every_part_and_the_verdict(capsys):
    code, out, _ = run(capsys, *SWEEP, "--strategy", "fsdp", "--activation-checkpointing", "--tokens", "1e9")
    assert code == 0
    for word in ("weights", "optimizer", "ple table", "activations",
                 "total per rank", "fits", "fsdp", "activation checkpointing", "GPU-hours", "tokens/s per GPU"):
        assert word in out, word


def test_a_plan_that_does_not_fit_exits_1_with_a_hint(capsys):
    code, out, err = run(capsys, *SWEEP[:-1], "8GB", "--strategy", "ddp")
    assert code == 1 and "DOES NOT FIT" in out
    assert err.count("\n") == 1 and "--strategy fsdp" in err


def test_a_training_config_file_works(tmp_path, capsys):
    cfg = tmp_path / "t.toml"
    cfg.write_text('batch_size = 8\nseq_len = 128\n[model]\npreset = "small-ple"\n')
    code, out, _ = run(capsys, str(cfg), "--gpus", "2", "--gpu-memory", "24GiB", "--json")
    plan = json.loads(out)
    assert code == 0 and plan["model"]["seq_len"] == 128 and plan["sequences_per_rank_per_step"] == 4
    assert plan["cluster"]["gpu_memory_bytes"] == 24 * 2**30 and plan["strategy"] == "ddp"


@pytest.mark.parametrize(("argv", "needle"), [
    (["--gpus", "3"], "divide evenly over 3 GPUs"),
    (["--micro-batch", "3"], "--micro-batch 3 must divide"),
    (["--gpu-memory", "80XB"], "not a memory size"),
    (["--gpu-memory", "0GB"], "at least 1 MiB"),
    (["--gpu-memory", "-80GB"], "must be a positive memory size"),  # not argparse's "expected one argument"
    (["--overhead-gb", "-2"], "--overhead-gb"),
    (["--mfu", "1.5"], "--mfu"),
    (["--tokens", "-1"], "--tokens"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    base = ["seed-3b", "--global-batch", "4096"]
    try:
        code = main(["train-memory", *base, *argv])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and needle in err and "Traceback" not in err, err


@pytest.mark.parametrize(("text", "value"), [
    ("80GB", 80e9), ("80 GB", 80e9), ("80gib", 80 * 2**30), ("80G", 80 * 2**30), ("141", 141e9),
    ("512MB", 512e6), ("1.5TB", 1.5e12),
])
def test_memory_sizes(text, value):
    assert memory_size(text) == value


@pytest.mark.parametrize("text", ["", "abc", "-1GB", "nan", "inf", "1e999", "80XB", "0"])
def test_bad_memory_sizes(text):
    with pytest.raises(argparse.ArgumentTypeError):
        memory_size(text)


def test_help_has_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["train-memory", "--help"])
    out = capsys.readouterr().out
    assert "Example:" in out and "plelab train-memory seed-3b" in out and "--activation-checkpointing" in out


def test_docs_scaling_is_what_the_planner_says():
    """docs/scaling.md is generated from `train-memory --json`; a change to the estimate must regenerate it."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "scaling_doc.py"
    spec = importlib.util.spec_from_file_location("scaling_doc", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.DOC.read_text() == mod.render(), "docs/scaling.md is stale: run python3 scripts/scaling_doc.py"


def test_strategy_and_checkpointing_default_to_the_config(tmp_path, capsys):
    cfg = tmp_path / "t.toml"
    cfg.write_text('batch_size = 8\nparallel = "fsdp"\nactivation_checkpointing = true\n[model]\npreset = "tiny"\n')
    plan = json.loads(run(capsys, str(cfg), "--gpus", "2", "--json")[1])
    assert plan["strategy"] == "fsdp" and plan["strategy_choice"] == "given" and plan["activation_checkpointing"]
    plan = json.loads(run(capsys, str(cfg), "--gpus", "2", "--strategy", "ddp", "--json")[1])
    assert plan["strategy"] == "ddp"


def test_the_former_name_plan_train_still_runs_it(capsys):
    assert run(capsys, "seed-3b", "--gpus", "8", "--json")[1] == run(capsys, "seed-3b", "--gpus", "8", "--json",
                                                                      command="plan-train")[1]
