"""The C parser survives mutated and truncated .ple files (ASan + UBSan); every rejection is one line, exit 2."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from plelab.edge import c_engine
from plelab.edge.c_fuzz import fuzz, seed_file

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")


def test_twenty_thousand_mutations_no_crash_and_one_line_rejections(tmp_path):
    seed = seed_file(tmp_path / "seed.ple")
    r = fuzz(20_000, seed=7, model=seed, timeout=300)
    assert r["cases"] == 20_000 and r["accepted"] + r["rejected"] == 20_000
    assert r["crashes"] == 0 and r["bad_messages"] == 0
    assert r["rejected"] > 10_000 and r["accepted"] > 0  # both paths exercised: parser and forward pass
    assert all(n > 2_000 for n in r["by_kind"].values())


def test_cli_rejects_mutated_files_with_one_line_and_exit_2(tmp_path):
    plerun = c_engine.build(cflags="-O1", sanitize=True)
    raw = bytearray(seed_file(tmp_path / "seed.ple").read_bytes())
    rng = random.Random(3)
    bad = tmp_path / "bad.ple"
    for case in range(40):
        data = bytearray(raw)
        if case % 2:
            data = data[: rng.randrange(len(data))]
        else:
            for _ in range(rng.randint(1, 4)):
                data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        bad.write_bytes(bytes(data))
        proc = subprocess.run([str(plerun), str(bad), "--ids", "1", "--steps", "2"], capture_output=True, text=True)
        if proc.returncode == 0:  # a flip the checksums cannot see does not exist: every byte is covered
            pytest.fail(f"case {case}: a corrupt file was accepted")
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.startswith("plerun: ") and "\n" not in err, (case, err)
