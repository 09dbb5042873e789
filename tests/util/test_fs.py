"""plelab.util.fs: the atomic writer, its stale-temp cleanup, and the output-path guard."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from plelab.errors import PlelabError
from plelab.util.fs import atomic_writer, check_output_path, remove_stale_temp_files, sampled_sha256


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_atomic_writer_replaces_whole_or_not_at_all(tmp_path):
    out = tmp_path / "f.bin"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_writer(out) as f:
        f.write(b"half")
        raise RuntimeError("killed halfway")
    assert out.read_bytes() == b"old" and os.listdir(tmp_path) == ["f.bin"]
    with atomic_writer(out) as f:
        f.write(b"new")
    assert out.read_bytes() == b"new" and os.listdir(tmp_path) == ["f.bin"]
    assert out.stat().st_mode & 0o777 == 0o666 & ~_umask()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_only_dead_writers_temp_files_are_removed(tmp_path):
    dead = tmp_path / f".a.ple.{dead_pid()}.abcd1234.tmp"
    live = tmp_path / f".b.ple.{os.getpid()}.abcd1234.tmp"
    other = tmp_path / ".c.ple.notapid.tmp"  # not our naming: never touched
    for p in (dead, live, other):
        p.write_bytes(b"x")
    assert remove_stale_temp_files(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


def test_check_output_path_refusals(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("x")
    link = tmp_path / "hard.txt"
    os.link(src, link)
    with pytest.raises(PlelabError, match="also an input"):
        check_output_path(link, overwrite=True, inputs=(src,))  # the same file under another name
    with pytest.raises(PlelabError, match="already exists"):
        check_output_path(src)
    (tmp_path / "gone").symlink_to(tmp_path / "missing")
    with pytest.raises(PlelabError, match="dangling"):
        check_output_path(tmp_path / "gone" / "sub" / "x.ple")
    with pytest.raises(PlelabError, match="is a folder"):
        check_output_path(tmp_path, overwrite=True)
    with pytest.raises(PlelabError, match="not a folder"):
        check_output_path(src, overwrite=True, is_dir=True)
    assert check_output_path(tmp_path / "new" / "deeper" / "x.ple") == tmp_path / "new" / "deeper" / "x.ple"


def test_sampled_sha256_tells_apart_same_size_files_and_reads_little(tmp_path):
    rng = np.random.default_rng(0)
    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(rng.bytes(3 << 20))
    b.write_bytes(rng.bytes(3 << 20))
    assert sampled_sha256(a) != sampled_sha256(b)
    assert sampled_sha256(a) == sampled_sha256(shutil.copyfile(a, tmp_path / "c.bin"))
    big = tmp_path / "big.bin"  # 64 GiB, sparse: hashing it whole would take minutes, sampling it does not
    with open(big, "wb") as f:
        f.truncate(64 << 30)
    before = sampled_sha256(big)
    with open(big, "r+b") as f:
        f.seek((64 << 30) - 1)
        f.write(b"x")
    assert sampled_sha256(big) != before  # the last block is always sampled
