"""`plelab params` prints the published figures, as text and as JSON, through the real console entry."""

from __future__ import annotations

import json
import subprocess
import sys


def plelab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "plelab", *args], capture_output=True, text=True, timeout=120)


def test_seed_sweep_table_text():
    out = plelab("params", "seed-3b", "--sweep-ple", "0,64,128,256,512")
    assert out.returncode == 0, out.stderr
    for figure in ("2,458,421,760", "220,807,232", "441,532,544", "882,983,168", "1,765,884,416", "35.92%", "71.83%"):
        assert figure in out.stdout


def test_esp32_json_fields():
    out = plelab("params", "esp32-28m", "--json")
    data = json.loads(out.stdout)
    assert data["total"] == 28_869_920
    for key in ("total", "base_total", "ple_table", "ple_model_projection", "ple_per_layer", "ple_added"):
        assert isinstance(data[key], int)


def test_bad_override_is_one_clear_line():
    out = plelab("params", "seed-3b", "--set", "num_heads=7", "--set", "head_dim=null")
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0 and "does not divide" in out.stderr
    assert "Traceback" not in out.stderr
