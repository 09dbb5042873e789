"""The PLE table is never whole on a rank, yet starts as the one-process table does: 2 real torchrun ranks' rows
equal the 1-process table bit for bit, and so does every other weight."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from dist_helpers import launch, make_dataset, write_config

from plelab.parallel.checkpoint import TABLE_WEIGHT
from plelab.training.config import load_train_config
from plelab.training.trainer import Trainer

WORKER = Path(__file__).with_name("table_worker.py")


def run_worker(root: Path, name: str, nproc: int) -> list[dict]:
    out = root / name
    out.mkdir()
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"] \
        if nproc > 1 else [sys.executable]
    proc = launch([*launcher, str(WORKER), str(root / "train.toml"), str(out / "run"), str(out)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt") for r in range(nproc)]


# Token table: 259 rows x 2 layers x 6. N-gram table: 3 heads of 263 rows (orders 1-3) x 2 layers x 6 / 3 = 789
# rows of 4. Neither the rank boundary nor the table's end falls on torch's 16-value block in either.
TABLES = {"token": ("dim = 6\nvocab_size = 259\n", 259, 130),
          "ngram": ('dim = 6\nindex = "ngram"\n[model.ple.ngram]\norders = [1, 2, 3]\nheads = 1\nrows = [263]\n',
                    789, 395)}


@pytest.mark.parametrize("kind", list(TABLES))
def test_two_ranks_rows_of_the_table_equal_the_one_process_table_bit_for_bit(tmp_path, kind):
    make_dataset(tmp_path)
    section, rows, half = TABLES[kind]
    write_config(tmp_path, dtype="fp32", device="cpu", eval_data="")
    config = tmp_path / "train.toml"
    config.write_text(config.read_text() + "[model.ple]\n" + section)
    ranks = run_worker(tmp_path, "two", 2)
    one = Trainer(load_train_config(config), tmp_path / "one", quiet=True)
    one.close()
    whole = one.model.state_dict()[TABLE_WEIGHT]
    assert whole.shape[0] == rows and whole.numel() % 16 and half * whole.shape[1] % 16
    assert [r["lo"] for r in ranks] == [0, half]
    assert [r["state"][TABLE_WEIGHT].shape[0] for r in ranks] == [half, rows - half]  # each rank holds its rows
    assert torch.equal(torch.cat([r["state"][TABLE_WEIGHT] for r in ranks]), whole)
    for r in ranks:  # the rest of the model too (the PLE generator ends where the whole table leaves it)
        for name, value in one.model.state_dict().items():
            if name != TABLE_WEIGHT:
                assert torch.equal(r["state"][name], value), name
