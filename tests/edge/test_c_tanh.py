"""The runtime's integer tanh (plelab/edge/c/ple_tanh.h, used by SiLU and GELU on every target) against the
double-precision tanh: within one ulp over a stride of all floats, odd, and right at zeros, infinities and NaN."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from plelab.edge import c_engine

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")


def test_integer_tanh_is_within_one_ulp_of_the_double_one():
    binary = c_engine.build(cflags="-O2", program="pletanh")
    proc = subprocess.run([str(binary), "--stride", "97"], capture_output=True, text=True, timeout=300)
    result = json.loads(proc.stdout)
    assert result["checked"] == (0x7F800000 + 96) // 97
    assert result["max_ulp"] <= 1, result
    assert result["odd_failures"] == 0 and result["special_failures"] == 0, result
    # the polynomial paths are exercised: most of the walk's floats are tiny or huge, where tanh is x or 1, so a
    # tanh that only got those right would still be "exact" on ~93 % of them; ours is exact on all but ~0.03 %
    assert result["exact"] >= 0.999 * result["checked"], result
    assert proc.returncode == 0


def test_a_bad_stride_is_refused():
    binary = c_engine.build(cflags="-O2", program="pletanh")
    proc = subprocess.run([str(binary), "--stride", "0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "usage" in proc.stderr
