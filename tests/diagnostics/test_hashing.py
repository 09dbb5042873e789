"""Hash-specific diagnostics of an n-gram table: every figure against a count made by brute force, the rows never
trained against the rows training read, and `plelab diagnose` reporting them for a real n-gram run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch

from plelab.diagnostics.batches import token_frequencies
from plelab.diagnostics.hashing import hash_diagnostics, initial_table, table_row_reads
from plelab.model import LanguageModel, load_model_config
from plelab.model.ngram import hash_rows_python
from plelab.runs.checkpoint import read_checkpoint_json, resolve_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "training"))
from training_helpers import make_dataset, write_config  # noqa: E402

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
NGRAM = ["ple.index=ngram", "ple.ngram.orders=[1,2,3]", "ple.ngram.heads=2", "ple.ngram.rows=[31,37,41]",
         "ple.dim=24"]


def novel_bytes(shared_data: Path, n: int) -> np.ndarray:
    text = (shared_data / "valid" / "en_novel.txt").read_text(encoding="utf-8")[:n]
    return np.frombuffer(text.encode(), dtype=np.uint8).astype(np.int64)


def test_collisions_and_load_equal_a_brute_force_count(shared_data):
    torch.manual_seed(0)
    model = LanguageModel(load_model_config("tiny", NGRAM))
    ids = novel_bytes(shared_data, 3000)
    got = hash_diagnostics(model, ids, tokens_per_step=256)
    layout = model.config.ple_layout
    rows = hash_rows_python(ids.tolist(), layout)
    assert got["rows_per_token"] == 6 and got["distinct_rows_read"] == len({r for pos in rows for r in pos})
    for j, head in enumerate(got["heads"]):
        n, offset, size = head["order"], layout.offsets[j], layout.head_rows[j]
        grams_of_row: dict[int, set] = defaultdict(set)
        gram_at = [tuple(ids[t - n + 1 : t + 1]) for t in range(n - 1, len(ids))]
        for t, gram in zip(range(n - 1, len(ids)), gram_at, strict=True):
            grams_of_row[rows[t][j]].add(gram)
        distinct = {g: r for r, gs in grams_of_row.items() for g in gs}
        shared = {g for g, r in distinct.items() if len(grams_of_row[r]) > 1}
        reads = Counter(rows[t][j] for t in range(n - 1, len(ids)))
        assert head["distinct_ngrams"] == len(distinct)
        assert head["collision_rate"] == pytest.approx(len(shared) / len(distinct))
        assert head["token_collision_rate"] == pytest.approx(sum(g in shared for g in gram_at) / len(gram_at))
        assert head["random_collision_rate"] == pytest.approx(1 - (1 - 1 / size) ** (len(distinct) - 1))
        assert head["rows_read"] == len(reads) and head["max_reads"] == max(reads.values())
        assert all(offset <= r < offset + size for r in reads)
    windows = [len({r for pos in rows[s : s + 256] for r in pos})
               for s in np.linspace(0, len(ids) - 256, num=32).astype(int)]
    assert got["distinct_rows_per_step"] == pytest.approx(np.mean(windows))


def test_a_token_table_reads_its_token_frequencies_and_gets_no_hash_report(shared_data):
    torch.manual_seed(0)
    model = LanguageModel(load_model_config("tiny"))
    ids = novel_bytes(shared_data, 2000)
    assert (table_row_reads(model, ids) == token_frequencies(ids, 256)).all()
    assert hash_diagnostics(model, ids) == {}


def test_rows_never_trained_are_the_rows_no_step_read(shared_data, tmp_path):
    torch.manual_seed(0)
    model = LanguageModel(load_model_config("tiny", [*NGRAM, "ple.sparse_grad=true"]))
    initial = model.per_layer_inputs.embed_tokens_per_layer.weight.detach().clone()
    table = model.per_layer_inputs.embed_tokens_per_layer.weight
    ids = novel_bytes(shared_data, 40).reshape(2, 20)
    opt = torch.optim.SparseAdam([table], lr=1e-2)
    _, loss = model(torch.from_numpy(ids), torch.from_numpy(ids))
    loss.backward()
    opt.step()
    read = {r for seq in ids.tolist() for pos in hash_rows_python(seq, model.config.ple_layout) for r in pos}
    got = hash_diagnostics(model, ids.reshape(-1), initial=initial)["never_trained"]
    assert got["rows"] == table.shape[0] - len(read)
    assert got["share"] == pytest.approx(1 - len(read) / table.shape[0])
    # the monitor's snapshot comes back as a read-only memory map: the same count, and no warning or copy into torch
    np.save(tmp_path / "init.npy", initial.numpy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mapped = hash_diagnostics(model, ids.reshape(-1), initial=np.load(tmp_path / "init.npy", mmap_mode="r"))
    assert mapped["never_trained"] == got


@pytest.fixture(scope="module")
def ngram_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ngram")
    make_dataset(root)
    config = write_config(root, max_steps=4, ckpt_every=4, dtype="fp32", device="cpu")
    config.write_text(config.read_text() + "[model.ple]\nindex = \"ngram\"\ngate = \"engram\"\nconv_kernel = 4\n"
                      "context = false\noutput_norm = false\n")
    proc = subprocess.run([sys.executable, "-m", "plelab", "train", str(config), "--out", str(root / "run"),
                           "--quiet"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_diagnose_reports_the_hashing_of_an_ngram_run(ngram_run):
    proc = subprocess.run([sys.executable, "-m", "plelab", "diagnose", str(ngram_run / "run"), "--data",
                           str(ngram_run / "data"), "--batches", "2", "--batch-size", "2", "--seq-len", "16",
                           "--json"], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    h = json.loads(proc.stdout)["hashing"]
    assert h["rows_per_token"] == 8 and len(h["heads"]) == 8 and h["tokens_per_step"] == 4 * 32
    assert 0 < h["never_trained"]["share"] < 1 and "seed 1337" in h["never_trained"]["source"]
    text = subprocess.run([sys.executable, "-m", "plelab", "diagnose", str(ngram_run / "run"), "--data",
                           str(ngram_run / "data"), "--batches", "2", "--batch-size", "2", "--seq-len", "16"],
                          capture_output=True, text=True, env=ENV, timeout=300).stdout
    assert "n-gram table: orders [2, 3] x 4 heads" in text and "rows never trained:" in text


def test_the_rebuilt_initial_table_is_the_one_training_started_from(ngram_run):
    from plelab.training.config import load_train_config
    from plelab.training.trainer import Trainer

    trainer = Trainer(load_train_config(ngram_run / "train.toml"), ngram_run / "fresh", quiet=True)
    trainer.close()
    start = trainer.model.per_layer_inputs.embed_tokens_per_layer.weight.detach()
    rebuilt, note = initial_table(read_checkpoint_json(resolve_checkpoint(ngram_run / "run") / "config.json"))
    assert torch.equal(rebuilt, start), note
