"""`plelab export-hf` and `plelab train --init-from-hf`: plelab arch=gemma4 runs <-> Hugging Face Gemma 4 folders.

A tiny arch=gemma4 model is trained a few steps on a byte-level dataset, exported, loaded with
AutoModelForCausalLM and compared logit for logit and on greedy generations. The other way, a random
transformers Gemma 4 is saved, training starts from it, and the run's weights are shown to be its weights
moved by two small steps. Bad inputs each end in one line and exit status 2 before a run folder is touched.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from kill_helpers import hidden_leftovers, killed_before_rename
from parity_helpers import randomise_

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from transformers.models.gemma4.configuration_gemma4 import Gemma4TextConfig  # noqa: E402
from transformers.models.gemma4.modeling_gemma4 import Gemma4ForCausalLM  # noqa: E402

from plelab.cli.main import main  # noqa: E402
from plelab.data.tokenizer import Tokenizer  # noqa: E402
from plelab.hf.interop import gemma4_config_from_hf  # noqa: E402
from plelab.inference.generate import generate  # noqa: E402
from plelab.inference.load import load_model  # noqa: E402
from plelab.training.config import load_train_config  # noqa: E402
from plelab.training.trainer import Trainer  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import make_dataset, write_config  # noqa: E402

TOL = 1e-5
GEMMA4_MODEL = (
    'arch = "gemma4"\n'
    "[model.gemma4]\nsliding_window = 8\nfull_head_dim = 16\nfinal_logit_softcap = 10.0\n"
)


def train(root: Path, name: str, gemma4: bool = True, **fields) -> Path:
    """A few Trainer steps of the tiny preset (arch=gemma4 unless told) into root/name."""
    config = write_config(root, **({"max_steps": 4} | fields))
    if gemma4:
        config.write_text(config.read_text() + GEMMA4_MODEL)
    Trainer(load_train_config(config), root / name, quiet=True).run()
    return root / name


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    make_dataset(root)
    train(root, "run")
    return root


def one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error:" in err
    return err


def test_export_loads_as_gemma4_with_same_logits_and_greedy_text(setup, capsys):
    out = setup / "hf-out"
    assert main(["export-hf", str(setup / "run"), str(out), "--transformers-only"]) == 0  # a byte-level tokenizer
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in out.iterdir()
    }
    ours, _ = load_model(setup / "run")
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    assert isinstance(hf, Gemma4ForCausalLM)
    hf_tok = AutoTokenizer.from_pretrained(out)
    assert hf_tok.eos_token == "<|endoftext|>"
    long_text = "The quick brown fox jumps over the lazy dog. Per-layer"  # 54 tokens: past the window of 8
    x = torch.tensor([hf_tok(long_text)["input_ids"]])
    assert x[0].tolist() == Tokenizer.load(ours.checkpoint_dir / "tokenizer.json").encode(long_text)
    with torch.no_grad():
        assert (ours(x)[0] - hf(x).logits).abs().max().item() <= TOL
    prompt = hf_tok("The quick brown")["input_ids"]  # prompt + new tokens within max_seq_len = 32
    want = list(generate(ours, prompt, 16, temperature=0.0))
    got = hf.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    assert got == want[: len(got)] and (len(got) == 16 or got[-1] == hf.generation_config.eos_token_id)


def test_export_refuses_existing_folder_without_overwrite(setup, capsys):
    out = setup / "hf-again"
    assert main(["export-hf", str(setup / "run"), str(out), "--transformers-only"]) == 0
    (out / "model.safetensors").write_bytes(b"an older export")
    assert "--overwrite" in one_line_error(capsys, ["export-hf", str(setup / "run"), str(out)])
    assert (out / "model.safetensors").read_bytes() == b"an older export"
    assert main(["export-hf", str(setup / "run"), str(out), "--overwrite", "--transformers-only"]) == 0
    assert (out / "model.safetensors").read_bytes() != b"an older export"  # an export replaces an export
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".hf-again")]  # no temp folder left


def test_export_overwrite_never_deletes_the_run_or_the_users_files(setup, tmp_path, capsys):
    runs = tmp_path / "runs"
    run = runs / "a"
    shutil.copytree(setup / "run", run)
    before = sorted(p.relative_to(runs) for p in runs.rglob("*"))
    err = one_line_error(capsys, ["export-hf", str(run), str(runs), "--overwrite"])  # OUT holds the run
    assert "inside the output folder" in err
    err = one_line_error(capsys, ["export-hf", str(run), str(run / "checkpoints"), "--overwrite"])  # OUT in the run
    assert "inside the input folder" in err
    ckpt = next((run / "checkpoints").glob("step_*"))
    err = one_line_error(capsys, ["export-hf", str(ckpt), str(run / "hf"), "--overwrite"])  # in the checkpoint's run
    assert "inside the training run" in err
    err = one_line_error(capsys, ["export-hf", str(ckpt), str(run), "--overwrite"])  # a checkpoint of the run
    assert "is the folder of the training run" in err
    assert sorted(p.relative_to(runs) for p in runs.rglob("*")) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    err = one_line_error(capsys, ["export-hf", str(run), str(mine), "--overwrite"])
    assert "not a Hugging Face model folder" in err and (mine / "notes.txt").read_text() == "mine"


def test_export_on_a_full_disk_is_one_line_and_leaves_nothing_behind(setup, tmp_path, capsys):
    """A real full disk: a 64 KiB tmpfs (root only; skipped elsewhere), far smaller than the export."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a small tmpfs here (needs root)")
    try:
        err = one_line_error(capsys, ["export-hf", str(setup / "run"), str(disk / "out"), "--transformers-only"])
        assert "No space left on device" in err
        assert list(disk.iterdir()) == []  # neither OUT nor its temp folder
    finally:
        subprocess.run(["umount", str(disk)], check=True)


def test_export_refuses_a_llama_run(setup, capsys):
    run = train(setup, "llama-run", gemma4=False, max_steps=1)
    err = one_line_error(capsys, ["export-hf", str(run), str(setup / "llama-hf")])
    assert "arch=gemma4" in err and not (setup / "llama-hf").exists()


@pytest.fixture(scope="module")
def hf_folder(setup) -> tuple[Path, dict[str, torch.Tensor]]:
    cfg = Gemma4TextConfig(
        vocab_size=260, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16, global_head_dim=16, sliding_window=6, max_position_embeddings=64,
        layer_types=["sliding_attention", "full_attention"] * 2, hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=260, num_kv_shared_layers=2,
    )
    torch.manual_seed(0)
    model = Gemma4ForCausalLM(cfg)
    randomise_(model, 0)
    folder = setup / "hf-gemma4"
    model.save_pretrained(folder)
    return folder, {k: v.clone() for k, v in model.state_dict().items()}


def test_init_from_hf_trains_from_the_checkpoint(setup, hf_folder):
    folder, hf_weights = hf_folder
    config = write_config(setup, lr=1e-5, warmup_steps=0)
    run = setup / "from-hf"
    argv = ["train", str(config), "--out", str(run), "--init-from-hf", str(folder), "--set", "max_steps=2", "--quiet"]
    assert main(argv) == 0
    model, meta = load_model(run)
    want = gemma4_config_from_hf(json.loads((folder / "config.json").read_text()))
    assert model.config.arch == "gemma4" and model.config.gemma4 == want.gemma4
    assert meta["model"]["hidden_size"] == 32
    moved = []
    for ours, tensor in model.state_dict().items():
        start = hf_weights["model." + ours.replace("per_layer_inputs.", "").replace(".ple.", ".")]
        assert (tensor - start).abs().max() <= 1e-3, ours  # two Adam steps of 1e-5 from the HF weights
        moved.append(not torch.equal(tensor, start))
    assert any(moved)


def test_init_from_hf_bad_input_is_one_line(setup, hf_folder, capsys):
    folder, _ = hf_folder
    config = str(write_config(setup))
    base = ["train", config, "--set", "max_steps=1"]

    def refused(source: Path, what: str) -> None:
        run = setup / f"refused-{source.name}"
        assert what in one_line_error(capsys, [*base, "--out", str(run), "--init-from-hf", str(source)])
        assert not run.exists()

    refused(setup / "nowhere", "no config.json")
    llama = setup / "llama-folder"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    refused(llama, "not a Gemma 4 config")
    mismatch = setup / "mismatch"
    mismatch.mkdir()
    (mismatch / "model.safetensors").symlink_to(folder / "model.safetensors")
    raw = json.loads((folder / "config.json").read_text())
    (mismatch / "config.json").write_text(json.dumps(raw | {"intermediate_size": 40}))
    refused(mismatch, "shape mismatch")
    sharded = setup / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text(json.dumps(raw))
    (sharded / "model-00001-of-00002.safetensors").symlink_to(folder / "model.safetensors")
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    refused(sharded, "lacks 1 shard")


def test_init_from_hf_on_a_corrupt_or_truncated_safetensors_file_is_one_line(setup, hf_folder, capsys):
    folder, _ = hf_folder
    config = str(write_config(setup))
    data = (folder / "model.safetensors").read_bytes()
    for name, damaged in [("truncated", data[: len(data) // 2]),
                          ("bad-header", data[:8] + b"\xff" * 16 + data[24:])]:
        broken = setup / f"hf-{name}"
        broken.mkdir()
        (broken / "config.json").write_bytes((folder / "config.json").read_bytes())
        (broken / "model.safetensors").write_bytes(damaged)
        run = setup / f"refused-{name}"
        err = one_line_error(capsys, ["train", config, "--out", str(run), "--init-from-hf", str(broken)])
        assert str(broken / "model.safetensors") in err and "safetensors" in err
        assert not run.exists()


def test_resume_of_an_init_from_hf_run_before_its_first_checkpoint_starts_from_the_hf_weights(setup, hf_folder):
    folder, hf_weights = hf_folder
    config = write_config(setup, lr=1e-5, warmup_steps=0)
    run = setup / "from-hf-killed"
    assert main(["train", str(config), "--out", str(run), "--init-from-hf", str(folder), "--set", "max_steps=1",
                 "--quiet"]) == 0
    # As if killed before its first checkpoint: config.json written, no checkpoint yet.
    for ckpt in (run / "checkpoints").iterdir():
        if ckpt.is_dir():
            shutil.rmtree(ckpt)
        else:
            ckpt.unlink()
    assert main(["train", "--out", str(run), "--resume", "--set", "max_steps=2", "--quiet"]) == 0
    model, _ = load_model(run)
    for ours, tensor in model.state_dict().items():
        start = hf_weights["model." + ours.replace("per_layer_inputs.", "").replace(".ple.", ".")]
        assert (tensor - start).abs().max() <= 1e-3, ours  # two Adam steps of 1e-5 from the HF weights, not random
    assert json.loads((run / "config.json").read_text())["init_from_hf"] == str(folder)


def test_init_from_hf_under_torchrun_loads_each_ranks_rows_of_the_table(setup, hf_folder):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parallel"))
    from dist_helpers import ok, torchrun

    folder, hf_weights = hf_folder
    config = write_config(setup, lr=1e-5, warmup_steps=0, max_steps=2, dtype="fp32", device="cpu", eval_data="")
    run = setup / "from-hf-2ranks"
    ok(torchrun("train", str(config), "--out", str(run), "--init-from-hf", str(folder), "--quiet",
                "--set", "parallel=ddp"))
    model, _ = load_model(run)  # the sharded checkpoint read into one process
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    assert table.shape[0] == 260
    for ours, tensor in model.state_dict().items():
        start = hf_weights["model." + ours.replace("per_layer_inputs.", "").replace(".ple.", ".")]
        assert (tensor - start).abs().max() <= 1e-3, ours


def test_a_killed_export_leaves_a_folder_the_next_export_removes(setup, tmp_path):
    out = tmp_path / "hf-killed"
    killed_before_rename(["export-hf", str(setup / "run"), str(out), "--transformers-only"])
    assert not out.exists()
    (left,) = hidden_leftovers(tmp_path, "hf-killed")
    assert (left / "model.safetensors").is_file()  # the model-sized leftover
    assert main(["export-hf", str(setup / "run"), str(tmp_path / "other"), "--transformers-only"]) == 0
    assert not hidden_leftovers(tmp_path, "hf-killed") and not hidden_leftovers(tmp_path, "other")
