"""The C runtime's float SIMD paths (ple_float_simd.h) against NumPy, in the build plelab uses and in plain C."""

from __future__ import annotations

import shutil

import pytest
from edge_helpers import lively_model
from test_c_runtime import check_parity

from plelab.edge import c_engine

pytestmark = pytest.mark.skipif(not any(shutil.which(c) for c in ("cc", "gcc", "clang")), reason="no C compiler")
# c_engine's default flags (SIMD helpers, four-row head passes) and plain C99 loops (other compilers, PLE_SCALAR)
BUILDS = {"native": "-O3 -march=native", "scalar": "-O2 -DPLE_SCALAR"}
# hidden 36: rows no multiple of the vector width, so every kernel runs its tail; vocab 258: a head whose row
# count is no multiple of four
SHAPE = ("hidden_size=36", "num_heads=3", "num_kv_heads=3", "vocab_size=258")


@pytest.fixture(scope="module", params=list(BUILDS))
def plerun_build(request):
    return c_engine.build(cflags=BUILDS[request.param])


@pytest.mark.parametrize(
    "quant, group, tol",
    [
        ("fp32", 128, 1e-4),  # four-row fp32 passes over every matrix and the head
        ("int4", 64, None),  # head rows of one group each (four-row int4 pass); groups straddling layer rows
        ("int4", 32, None),  # head rows of two groups: the per-row grouped kernel on table records
    ],
)
def test_kernels_give_numpys_tokens_and_logits(plerun_build, export_tmp, tmp_path, quant, group, tol):
    check_parity(plerun_build, export_tmp(lively_model(*SHAPE), quant=quant, group=group), tmp_path, tol)
