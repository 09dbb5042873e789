"""Bad fine-tuning input: one line on stderr, exit 2, and nothing written (no run folder, no merge folder)."""

from __future__ import annotations

import json
import shutil

import pytest
from finetune_helpers import finetune_argv
from kill_helpers import hidden_leftovers, killed_before_rename
from safetensors.torch import load_file, save_file

from plelab.cli.main import main

pytest.importorskip("peft")


def refused(argv, capsys, out) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert not out.exists(), f"{out} was written"
    return err


@pytest.fixture()
def args(make_gemma, finetune_data, tmp_path):
    data, valid = finetune_data
    return lambda *extra, folder=None: finetune_argv(folder or make_gemma("gemma4"), data, valid, tmp_path / "run",
                                                     *extra)


def test_folder_without_tokenizer(make_gemma, args, tmp_path, capsys):
    folder = tmp_path / "ckpt"
    shutil.copytree(make_gemma("gemma4"), folder)
    (folder / "tokenizer.json").unlink()
    assert "has no tokenizer.json" in refused(args(folder=folder), capsys, tmp_path / "run")


def test_unknown_target_module(args, tmp_path, capsys):
    err = refused(args("--set", "finetune.targets=attention,qproj"), capsys, tmp_path / "run")
    assert "no linear layer named 'qproj'" in err and "q_proj" in err and "per_layer_input_gate" in err


def test_rank_zero(args, tmp_path, capsys):
    assert "finetune.rank must be > 0" in refused(args("--set", "finetune.rank=0"), capsys, tmp_path / "run")


def test_data_tokenized_with_another_tokenizer(make_gemma, finetune_data, tmp_path, capsys):
    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import Tokenizer

    (tmp_path / "t.txt").write_text("some text in bytes\n" * 200)
    prepare_dataset([tmp_path / "t.txt"], Tokenizer.byte_level(), tmp_path / "bytes", progress=False)
    argv = finetune_argv(make_gemma("gemma4"), tmp_path / "bytes", finetune_data[1], tmp_path / "run")
    err = refused(argv, capsys, tmp_path / "run")
    assert "tokenized with another tokenizer" in err and "plelab data prepare" in err
    assert "their model differs (" in err  # what differs is named


@pytest.mark.parametrize(("setting", "message"), [
    ("parallel=fsdp", "use parallel = ddp"),
    ("diagnostics_every=5", "plelab diagnose --hf"),
    ("finetune.table=dense", "finetune.table must be one of frozen, sparse"),
    ("seq_len=4096", "seq_len must be in 0..model.max_seq_len (128)"),
    ("model.hidden_size=64", "model and tokenizer come from the checkpoint"),
    ("dtype=bf16-head", "bf16-head speeds up plelab's own fused output head + loss, which a Hugging Face model"),
])
def test_settings_fine_tuning_cannot_take(args, tmp_path, capsys, setting, message):
    assert message in refused(args("--set", setting), capsys, tmp_path / "run")


def test_not_gemma_and_no_checkpoint(args, finetune_data, tmp_path, capsys):
    assert "no config.json" in refused(args(folder=tmp_path), capsys, tmp_path / "run")
    argv = ["finetune", "--data", str(finetune_data[0]), "--out", str(tmp_path / "run")]
    assert "give --hf PATH" in refused(argv, capsys, tmp_path / "run")


def test_merge_refusals(args, tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "x").write_text("mine")
    err = refused(args("--merge", str(taken), "--overwrite"), capsys, tmp_path / "run")
    assert "already exists and is not empty; merge into a new folder" in err and "pass --overwrite" not in err
    assert (taken / "x").read_text() == "mine"
    err = refused(["finetune", "--out", str(tmp_path / "nothing"), "--merge", str(tmp_path / "m")], capsys,
                  tmp_path / "m")
    assert "does not exist" in err


def test_the_checkpoint_fine_tuned_is_never_the_run_folder(make_gemma, finetune_data, tmp_path, capsys,
                                                            monkeypatch):
    hf = tmp_path / "hf"
    shutil.copytree(make_gemma("gemma4"), hf)
    (tmp_path / "hf-link").symlink_to(hf)
    before = {p.name: p.read_bytes() for p in hf.iterdir()}
    monkeypatch.chdir(tmp_path)
    data, valid = finetune_data
    for out in ("hf", "hf/", str(hf), "hf-link", "./hf-link/"):
        for extra in ((), ("--overwrite",)):
            capsys.readouterr()
            argv = finetune_argv(hf, data, valid, tmp_path / "unused", *extra)
            argv[argv.index("--out") + 1] = out
            assert main(argv) == 2
            err = capsys.readouterr().err.strip()
            assert len(err.splitlines()) == 1 and "is also an input of this command" in err, err
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == before


def test_train_never_replaces_a_model_folder(make_gemma, finetune_data, tmp_path, capsys, monkeypatch):
    hf = tmp_path / "hf"
    shutil.copytree(make_gemma("gemma4"), hf)
    (tmp_path / "hf-link").symlink_to(hf)
    before = {p.name: p.read_bytes() for p in hf.iterdir()}
    cfg = tmp_path / "t.toml"
    cfg.write_text(f'data = "{finetune_data[0]}"\nbatch_size = 2\nseq_len = 16\nmax_steps = 1\nwarmup_steps = 0\n'
                   '[model]\npreset = "tiny"\nvocab_size = 320\nmax_seq_len = 32\n')
    monkeypatch.chdir(tmp_path)
    for out in ("hf", "hf/", str(hf), "hf-link/"):  # not an input: a folder whose config.json is not a run's
        capsys.readouterr()
        assert main(["train", str(cfg), "--out", out, "--overwrite", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "holds config.json, which is not a plelab run's" in err, err
        assert main(["train", str(cfg), "--init-from-hf", "hf-link", "--out", out, "--overwrite", "--quiet"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is also an input of this command" in err, err
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == before


def test_a_base_replaced_by_other_weights_is_refused_on_resume_and_merge(make_gemma, finetune_data, tmp_path,
                                                                          capsys):
    data, valid = finetune_data
    base, run = tmp_path / "base", tmp_path / "run"
    shutil.copytree(make_gemma("gemma4"), base)
    assert main(finetune_argv(base, data, valid, run, "--set", "max_steps=12")) == 0
    # Other weights of exactly the same shapes (the gates zeroed), under the same file name and size.
    shutil.copyfile(make_gemma("gemma4", plant="dead") / "model.safetensors", base / "model.safetensors")
    capsys.readouterr()
    assert main(["finetune", "--out", str(run), "--resume", "--set", "max_steps=24", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no longer holds the weights this fine-tune was trained on" in err, err
    assert (run / "checkpoints" / "LATEST").read_text() == "step_00000012"  # nothing trained on the new weights
    err = refused(["finetune", "--out", str(run), "--merge", str(tmp_path / "merged")], capsys, tmp_path / "merged")
    assert "no longer holds the weights" in err


@pytest.fixture(scope="module")
def sparse_run(make_gemma, finetune_data, tmp_path_factory):
    """A finished fine-tune that trained the table too (its adapter holds a table delta)."""
    data, valid = finetune_data
    run = tmp_path_factory.mktemp("sparse") / "run"
    assert main(finetune_argv(make_gemma("gemma4"), data, valid, run, "--set", "max_steps=12",
                              "--set", "finetune.targets=attention,ple", "--set", "finetune.table=sparse")) == 0
    return run


def _tamper_delta(adapter, change):
    from safetensors import safe_open

    from plelab.hf.finetune.table_delta import DELTA_FILE

    with safe_open(str(adapter / DELTA_FILE), "pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    change(tensors)
    save_file(tensors, str(adapter / DELTA_FILE), metadata=meta)


def _tamper_adapter(adapter, change):
    from plelab.hf.finetune.adapter import ADAPTER_WEIGHTS

    tensors = load_file(str(adapter / ADAPTER_WEIGHTS))
    change(tensors)
    save_file(tensors, str(adapter / ADAPTER_WEIGHTS), metadata={"format": "pt"})


def _edit_config(adapter, change):
    cfg = json.loads((adapter / "adapter_config.json").read_text())
    change(cfg)
    (adapter / "adapter_config.json").write_text(json.dumps(cfg))


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


TAMPERED = {
    "delta NaN": (lambda a: _tamper_delta(a, lambda t: t["delta"].__setitem__((0, 0), float("nan"))),
                  "table_delta.safetensors: delta holds NaN or infinite values"),
    "delta 1e30": (lambda a: _tamper_delta(a, lambda t: t["delta"].__setitem__((0, 0), 1e30)),
                   "holds a value of magnitude 1e+30, past what training produces"),
    "duplicate rows": (lambda a: _tamper_delta(a, lambda t: t["rows"].__setitem__(1, t["rows"][0])),
                       "a row appears more than once"),
    "lora_B NaN": (lambda a: _tamper_adapter(a, lambda t: next(v for k, v in t.items() if "lora_B" in k).fill_(
        float("inf"))), "lora_B holds NaN or infinite values"),
    "corrupt config": (lambda a: (a / "adapter_config.json").write_text('{"r": 8, "lora_alpha'),
                       "adapter_config.json: not valid JSON"),
    "r = 0": (lambda a: _edit_config(a, lambda c: c.update(r=0)), "r must be a positive integer"),
    "no lora_alpha": (lambda a: _edit_config(a, lambda c: c.pop("lora_alpha")),
                      "lora_alpha must be a positive number (the LoRA scale is lora_alpha / r), got missing"),
    "truncated weights": (lambda a: _truncate(a / "adapter_model.safetensors"),
                          "adapter_model.safetensors: not readable safetensors"),
    "truncated delta": (lambda a: _truncate(a / "table_delta.safetensors"), "not a readable table delta"),
}


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_merge_refuses_a_damaged_adapter_in_one_line(sparse_run, tmp_path, capsys, case):
    tamper, message = TAMPERED[case]
    run = tmp_path / "run"
    shutil.copytree(sparse_run, run)
    tamper(run / "adapter")
    err = refused(["finetune", "--out", str(run), "--merge", str(tmp_path / "merged")], capsys, tmp_path / "merged")
    assert message in err and "Traceback" not in err, err
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".merged")]


def test_a_killed_merge_leaves_a_folder_the_next_merge_removes(sparse_run, tmp_path, capsys):
    killed_before_rename(["finetune", "--out", str(sparse_run), "--merge", str(tmp_path / "merged")])
    (left,) = hidden_leftovers(tmp_path, "merged")
    assert (left / "model.safetensors").is_file() and not (tmp_path / "merged").exists()
    assert main(["finetune", "--out", str(sparse_run), "--merge", str(tmp_path / "merged"), "--quiet"]) == 0
    assert not hidden_leftovers(tmp_path, "merged") and (tmp_path / "merged" / "model.safetensors").is_file()


def test_a_fine_tune_run_given_where_a_model_goes_says_merge_it_first(sparse_run, finetune_data, tmp_path, capsys):
    valid = str(finetune_data[1])
    for argv in (["eval", str(sparse_run), "--data", valid], ["generate", str(sparse_run), "--prompt", "The"],
                 ["diagnose", str(sparse_run), "--data", valid], ["export", str(sparse_run), "--out",
                                                                   str(tmp_path / "x.ple")],
                 ["export-gguf", str(sparse_run), str(tmp_path / "x.gguf")],
                 ["quant-recipe", str(sparse_run), "--eval", valid, "--out", str(tmp_path / "r")]):
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "is a LoRA fine-tune of" in err, (argv, err)
        assert f"plelab finetune --out {sparse_run} --merge MERGED" in err, err
    assert not list(tmp_path.iterdir())


def test_a_sparse_table_fine_tune_gives_torch_no_cause_to_warn(tmp_path, monkeypatch):
    """A batch is a slice (x[:, :-1]), not contiguous, and torch.searchsorted warns (once per process, so on every
    sparse-table fine-tune, --quiet or not) when given one: the table delta's lookup must hand it contiguous ids."""
    import numpy as np
    import torch

    from plelab.hf.finetune.table_delta import TableWithDelta
    from plelab.hf.model import StreamedEmbedding
    from plelab.util.safetensors import read_header

    save_file({"table": torch.randn(50, 4)}, str(tmp_path / "t.safetensors"))
    table = StreamedEmbedding(read_header(tmp_path / "t.safetensors")["table"], 1.0, torch.float32)
    given, search = [], torch.searchsorted
    monkeypatch.setattr(torch, "searchsorted", lambda rows, ids, **kw: given.append(ids.is_contiguous()) or search(
        rows, ids, **kw))
    batch = torch.arange(40).view(4, 10)[:, :-1]
    assert not batch.is_contiguous()
    TableWithDelta(table, np.arange(0, 50, 3))(batch)
    assert given == [True]


def test_data_of_the_same_tokenizer_re_saved_by_transformers_is_accepted(make_gemma, finetune_data, tmp_path):
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path / "hf"
    shutil.copytree(make_gemma("gemma4"), folder)
    PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json")).save_pretrained(folder)
    assert (folder / "tokenizer.json").read_bytes() != (make_gemma("gemma4") / "tokenizer.json").read_bytes()
    data, valid = finetune_data  # prepared with the file as it was before transformers saved it
    assert main(finetune_argv(folder, data, valid, tmp_path / "run", "--set", "max_steps=2")) == 0


def test_the_default_seq_len_fits_a_short_context_and_says_so(make_gemma, finetune_data, tmp_path, capsys):
    data, valid = finetune_data
    argv = ["finetune", "--hf", str(make_gemma("gemma4")), "--data", str(data), "--out", str(tmp_path / "run"),
            "--set", "max_steps=1", "--set", "batch_size=2", "--set", "eval_tokens=256", "--set", "dtype=fp32",
            "--set", f"eval_data={valid}", "--json"]  # no seq_len: the default, 512, is past this context (128)
    assert main(argv) == 0
    assert "seq_len = 128, the checkpoint's context (shorter than the default 512)" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "config.json").read_text())["seq_len"] == 128
