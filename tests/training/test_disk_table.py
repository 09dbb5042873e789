"""A PLE table trained on disk (`ple_table = "disk"`): bit for bit the run a table in memory gives, checkpoints of
only the touched rows, resume, evaluation, clear refusals, and a resident set that does not grow with the table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from training_helpers import make_dataset, write_config

from plelab.inference.load import load_model
from plelab.model.ngram import hash_rows_python
from plelab.runs.checkpoint import resolve_checkpoint
from plelab.runs.table_rows import TABLE_ROWS_FILE, TABLE_WEIGHT, held_rows
from plelab.training.config import load_train_config
from plelab.training.disk_table import TABLE_DIR, DiskTable, DiskTableError, place_on_disk
from plelab.training.trainer import Trainer
from plelab.util.dataclass_config import ConfigError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
NGRAM = '[model.ple]\nindex = "ngram"\ntable_init_std = 0.0\n[model.ple.ngram]\norders = [1, 2]\nheads = 2\n'


def losses(run: Path) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if m.get("loss") is not None and "eval" not in m}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The same n-gram run with its table in memory and on disk (8 steps, checkpoints at 4 and 8)."""
    root = tmp_path_factory.mktemp("disk")
    make_dataset(root)
    config = write_config(root, max_steps=8, ckpt_every=4, keep_checkpoints=2, dtype="fp32", device="cpu")
    config.write_text(config.read_text() + NGRAM)
    torch.set_num_threads(1)
    for name, storage in (("memory", "memory"), ("disk", "disk")):
        Trainer(load_train_config(config, [f"ple_table={storage}"]), root / name, quiet=True).run()
    return root


def test_a_table_on_disk_trains_bit_for_bit_as_in_memory(runs):
    assert losses(runs / "disk") == losses(runs / "memory") and len(losses(runs / "disk")) == 8
    assert (runs / "disk" / TABLE_DIR / "weight.f32").is_file()
    mem, _ = load_model(runs / "memory")
    disk, _ = load_model(runs / "disk")  # the checkpoint's rows, into a table in memory
    for k, v in mem.state_dict().items():
        assert torch.equal(disk.state_dict()[k], v), k


def test_a_checkpoint_holds_the_rows_training_read_and_no_whole_table(runs):
    ckpt = resolve_checkpoint(runs / "disk")
    from safetensors import safe_open

    with safe_open(ckpt / "model.safetensors", "pt") as f:
        assert TABLE_WEIGHT not in f.keys()
    rows = held_rows(ckpt / TABLE_ROWS_FILE)
    # Every row a training batch read (replaying the loader's batches), and none other.
    cfg = load_train_config(runs / "train.toml", ["ple_table=disk"])
    trainer = Trainer(cfg, runs / "replay", quiet=True)
    trainer.close()
    layout = trainer.model.config.ple_layout
    read = set()
    for _ in range(8):
        x, _ = trainer.data.next_batch()
        read |= {r for seq in x.tolist() for pos in hash_rows_python(seq, layout) for r in pos}
    assert sorted(read) == rows.tolist() and len(rows) < layout.total_rows
    state = torch.load(ckpt / "state.pt", weights_only=False)
    assert state["optimizer"]["sparse"]["state"][0] == {"step": 8}  # the moments are in the rows file only


def test_resume_of_a_disk_table_from_an_earlier_checkpoint_gives_the_same_losses(runs, tmp_path):
    import shutil

    again = tmp_path / "again"
    shutil.copytree(runs / "disk", again)
    shutil.rmtree(again / "checkpoints" / "step_00000008")
    (again / "checkpoints" / "LATEST").write_text("step_00000004")
    proc = subprocess.run([sys.executable, "-m", "plelab", "train", "--out", str(again), "--resume", "--quiet"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert losses(again) == losses(runs / "disk")


def test_eval_reads_a_disk_tables_checkpoint(runs):
    out = [subprocess.run([sys.executable, "-m", "plelab", "eval", str(runs / name), "--data", str(runs / "valid"),
                           "--max-tokens", "64", "--json"], capture_output=True, text=True, env=ENV, timeout=300)
           for name in ("memory", "disk")]
    assert all(p.returncode == 0 for p in out), out[1].stderr[-2000:]
    assert json.loads(out[0].stdout)["macro"] == json.loads(out[1].stdout)["macro"]


@pytest.mark.parametrize("override, message", [
    ("model.ple.table_init_std=0.02", "table_init_std = 0"),
    ("sparse_ple=false", "sparse_ple = true"),
    ("model.ple.dim=0", "has none"),
])
def test_settings_a_disk_table_cannot_take_are_refused(tmp_path, override, message):
    make_dataset(tmp_path)
    config = write_config(tmp_path)
    config.write_text(config.read_text() + NGRAM)
    with pytest.raises(ConfigError, match=message):
        load_train_config(config, ["ple_table=disk", override])


def test_a_disk_table_refuses_another_device_and_a_wrong_checkpoint(tmp_path):
    from plelab.model import LanguageModel, load_model_config

    cfg = load_model_config("tiny", ["ple.table_init_std=0", "ple.sparse_grad=true"])
    with torch.device("meta"):
        skeleton = LanguageModel(cfg)
    with pytest.raises(DiskTableError, match="trains on the CPU"):
        place_on_disk(skeleton, tmp_path / "t", torch.device("cuda"))
    table = DiskTable(tmp_path / "t", 10, 4)
    with pytest.raises(DiskTableError, match="no ple_table_rows"):
        table.restore(tmp_path)


@pytest.mark.slow  # multi-process / GiB-scale: `python3 -m pytest -m slow` (README)
def test_the_resident_set_does_not_grow_with_the_table(tmp_path):
    # The benchmark's two runs: a 16 MiB and a 2 GiB table, the same model and data. The bigger table's peak RSS
    # exceeds the smaller's by what one step touches (a page per row read), not by the table.
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_disk_table.py"), "--table-gib", "2",
                           "--small-mib", "16", "--steps", "4", "--folder", str(tmp_path)],
                          capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert result["runs"]["large"]["table_gib"] >= 2
    assert result["peak_rss_growth_over_large_table"] < 0.1, result
    assert result["runs"]["large"]["files_allocated_mib"] < 0.1 * 3 * 2 * 1024  # sparse: only written rows
    assert result["step_time_ratio_large_over_small"] == pytest.approx(
        result["runs"]["large"]["step_time_s_median"] / result["runs"]["small"]["step_time_s_median"], abs=1e-3)


def test_disk_tables_rows_files_round_trip(tmp_path):
    from plelab.runs.table_rows import dense_table, scatter_table_rows, table_rows_shape, write_table_rows

    g = torch.Generator().manual_seed(0)
    tables = {f: torch.randn(50, 3, generator=g) for f in ("weight", "exp_avg", "exp_avg_sq")}
    rows = np.array([0, 7, 8, 49])
    write_table_rows(tmp_path / "r.safetensors", rows, tables)
    assert table_rows_shape(tmp_path / "r.safetensors") == (50, 3)
    dense = dense_table(tmp_path / "r.safetensors")
    assert torch.equal(dense[rows], tables["weight"][rows]) and not dense[1:7].any()
    back = {f: torch.zeros(50, 3) for f in tables}
    scatter_table_rows(tmp_path / "r.safetensors", back)
    for f in tables:
        assert torch.equal(back[f][rows], tables[f][rows])
