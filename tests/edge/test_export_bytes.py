"""`plelab export` writes the same bytes as before the package moves and renames of issue 23: every case's
sha256 was recorded by plelab at commit aebcd3e (export_hashes_aebcd3e.json). Random weights from a seed make
the files reproducible; a checkpoint's export also names its path, so presets stand in for it here."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from plelab.cli.main import main

RECORDED = json.loads(Path(__file__).with_name("export_hashes_aebcd3e.json").read_text())


@pytest.mark.parametrize("case", sorted(RECORDED))
def test_export_is_byte_identical(case, tmp_path, capsys):
    out = tmp_path / "model.ple"
    assert main(["export", *case.split(), "--out", str(out)]) == 0
    capsys.readouterr()
    assert hashlib.sha256(out.read_bytes()).hexdigest() == RECORDED[case]
