"""torchrun with 2 gloo ranks against one process: same losses, same PLE table, resumable across world sizes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from dist_helpers import losses, make_dataset, ok, plelab, rel_close, torchrun, write_config

from plelab.data.tokenizer import Tokenizer
from plelab.inference.load import load_model
from plelab.model.ngram import build_id_map, id_map_document
from plelab.parallel.checkpoint import TABLE_WEIGHT
from plelab.runs.checkpoint import SHARDED_MODEL_PREFIX, SHARDED_OPTIM_PREFIX, is_sharded, resolve_checkpoint


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A 1-process run and a 2-rank DDP run of the same config (global batch 4, 6 steps, checkpoints at 3, 6).

    The config leaves `parallel` at its default (auto): the plain `torchrun ... -m plelab train` of the README."""
    root = tmp_path_factory.mktemp("dist")
    make_dataset(root)
    write_config(root, max_steps=6, ckpt_every=3, keep_checkpoints=3, warmup_steps=2, log_every=1,
                 dtype="fp32", device="cpu")
    ok(plelab("train", "train.toml", "--out", "one", "--quiet", cwd=root))
    two = ok(torchrun("train", "train.toml", "--out", "two", cwd=root))
    (root / "two.stdout").write_text(two.stdout)
    return root


def rewind(run: Path, step: int, dest: Path) -> Path:
    """A copy of `run` whose newest checkpoint is the one of `step` (as if it had been stopped there)."""
    shutil.copytree(run, dest)
    for ckpt in (dest / "checkpoints").glob("step_*"):
        if int(ckpt.name.removeprefix("step_")) > step:
            shutil.rmtree(ckpt)
    (dest / "checkpoints" / "LATEST").write_text(f"step_{step:08d}")
    return dest


def test_two_ranks_give_the_one_process_loss_at_every_step(runs):
    assert len(losses(runs / "one")) == 6
    rel_close(losses(runs / "two"), losses(runs / "one"))


def test_rank_0_alone_prints_progress(runs):
    out = (runs / "two.stdout").read_text()
    assert out.count("step 6/6 loss") == 1 and out.count("training 6 steps") == 1
    assert out.count("2 ranks, parallel = ddp") == 1  # parallel = auto chose DDP


def test_sharded_table_ends_equal_to_the_one_process_table_and_no_rank_held_all_of_it(runs):
    ckpt = resolve_checkpoint(runs / "two")
    assert is_sharded(ckpt) and not (ckpt / "model.safetensors").exists()
    one, _ = load_model(runs / "one")  # what eval / generate / diagnose / export load
    two, _ = load_model(runs / "two")
    a, b = one.state_dict(), two.state_dict()
    assert a.keys() == b.keys()
    for k in a:  # fp32 sums in another order, amplified by Adam's g / sqrt(v) where g is tiny: ~1e-6
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=3e-5, msg=k)
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    rows = one.config.ple_vocab_size
    for key in (SHARDED_MODEL_PREFIX + TABLE_WEIGHT, f"{SHARDED_OPTIM_PREFIX}{TABLE_WEIGHT}.exp_avg"):
        chunks = sorted((c.offsets[0], c.sizes[0]) for c in meta[key].chunks)
        assert chunks == [(0, (rows + 1) // 2), ((rows + 1) // 2, rows // 2)], key  # each rank wrote its half


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_resume_across_world_sizes_gives_the_uninterrupted_losses(runs, tmp_path):
    full = losses(runs / "one")
    two_to_one = rewind(runs / "two", 3, tmp_path / "two_to_one")
    ok(plelab("train", "--out", str(two_to_one), "--resume", "--quiet"))
    one_to_two = rewind(runs / "one", 3, tmp_path / "one_to_two")
    ok(torchrun("train", "--out", str(one_to_two), "--resume", "--quiet"))
    for run in (two_to_one, one_to_two):
        got = losses(run)
        assert sorted(got) == [1, 2, 3, 4, 5, 6]
        rel_close({s: got[s] for s in (4, 5, 6)}, {s: full[s] for s in (4, 5, 6)})


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
@pytest.mark.parametrize("which", ["runs", "ngram_runs"], ids=["token", "ngram"])
def test_fsdp_gives_the_one_process_losses_and_table(which, request):
    runs = request.getfixturevalue(which)
    ok(torchrun("train", "train.toml", "--out", "fsdp", "--quiet", "--set", "parallel=fsdp", cwd=runs))
    rel_close(losses(runs / "fsdp"), losses(runs / "one"))
    one, _ = load_model(runs / "one")
    fsdp, _ = load_model(runs / "fsdp")
    for k, v in one.state_dict().items():
        torch.testing.assert_close(fsdp.state_dict()[k], v, rtol=1e-4, atol=3e-5, msg=k)


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_eval_generate_diagnose_export_accept_a_sharded_checkpoint(runs, tmp_path):
    run = str(runs / "two")
    ok(plelab("eval", run, "--data", str(runs / "valid"), "--max-tokens", "64"))
    ok(plelab("generate", run, "--prompt", "The quick", "--max-new-tokens", "4"))
    ok(plelab("diagnose", run, "--data", str(runs / "data"), "--batches", "1", "--batch-size", "2"))
    ok(plelab("export", run, "--out", str(tmp_path / "two.ple")))
    assert (tmp_path / "two.ple").stat().st_size > 0


NGRAM = ('[model.ple]\nindex = "ngram"\ngate = "engram"\nconv_kernel = 2\n'
         '[model.ple.ngram]\norders = [1, 2]\nheads = 2\n')
"""An n-gram table (4 heads of 263 rows, 2 layers x 16 / 4 per row) with Engram's gate and convolution."""


@pytest.fixture(scope="module")
def ngram_runs(tmp_path_factory) -> Path:
    """One process and 2 DDP ranks training the n-gram table: its hashed rows are sharded like token rows."""
    root = tmp_path_factory.mktemp("dist-ngram")
    make_dataset(root)
    config = write_config(root, max_steps=4, ckpt_every=4, warmup_steps=2, log_every=1, dtype="fp32", device="cpu")
    # With the token-id compression map too: a buffer every rank reads from the file, saved with the weights.
    tok = Tokenizer.load(root / "data" / "tokenizer.json")
    (root / "idmap.json").write_text(json.dumps(id_map_document(build_id_map(258, lambda i: tok.decode([i])))))
    config.write_text(config.read_text() + NGRAM + f'id_map = "{root / "idmap.json"}"\n')
    ok(plelab("train", "train.toml", "--out", "one", "--quiet", cwd=root))
    ok(torchrun("train", "train.toml", "--out", "two", "--quiet", cwd=root))
    return root


def test_an_ngram_table_trains_on_two_ranks_as_in_one_process(ngram_runs):
    rel_close(losses(ngram_runs / "two"), losses(ngram_runs / "one"))
    ckpt = resolve_checkpoint(ngram_runs / "two")
    one, _ = load_model(ngram_runs / "one")
    two, _ = load_model(ngram_runs / "two")
    assert one.config.ple_table_rows == 4 * 263  # the smallest prime above the 258 ids
    assert len(set(one.state_dict()["per_layer_inputs.index.id_map"].tolist())) < 258
    for k, v in one.state_dict().items():
        torch.testing.assert_close(two.state_dict()[k], v, rtol=1e-4, atol=3e-5, msg=k)
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(ckpt)).read_metadata().state_dict_metadata
    chunks = sorted((c.offsets[0], c.sizes[0]) for c in meta[SHARDED_MODEL_PREFIX + TABLE_WEIGHT].chunks)
    assert chunks == [(0, 526), (526, 526)]  # each rank wrote (and held) half of the hashed rows
