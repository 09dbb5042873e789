"""Process-group teardown: repeated 2-rank FSDP runs all exit 0 (gloo used to abort ~13 % of them at exit)."""

from __future__ import annotations

import pytest
from dist_helpers import make_dataset, torchrun, write_config

RUNS = 20


@pytest.mark.slow
def test_twenty_fsdp_runs_exit_cleanly(tmp_path):
    make_dataset(tmp_path)
    write_config(tmp_path, max_steps=2, ckpt_every=2, warmup_steps=1, eval_data="", dtype="fp32", device="cpu",
                 parallel="fsdp")
    codes = []
    for i in range(RUNS):
        proc = torchrun("train", "train.toml", "--out", f"run{i}", "--quiet", cwd=tmp_path)
        codes.append(proc.returncode)
        if proc.returncode:
            print(proc.stderr[-2000:])
    assert codes == [0] * RUNS, codes
