"""The n-gram hash, pinned in every implementation to the frozen vectors of docs/ngram-ple-vectors.json: the Python
reference, NumPy (the NumPy runtime's), torch (training's), C on this machine (the C runtime's ple_ngram.c) and the
same C built bare metal for every emulated board, where the hash also calls no double-precision or 64-bit division
helper."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from plelab.edge import c_engine, mcu
from plelab.model import ngram
from plelab.model.ple_index import NgramHash
from plelab.model.ple_index import fmix32 as fmix32_torch

VECTORS = json.loads((Path(__file__).resolve().parents[2] / "docs" / "ngram-ple-vectors.json").read_text())
LAYOUTS = [ngram.NgramLayout(tuple(c["orders"]), c["heads"], tuple(c["rows"]), c["seed"]) for c in VECTORS["cases"]]
IDS = [c["ids"] for c in VECTORS["cases"]]
WANT = {"fmix": [out for _, out in VECTORS["fmix32"]], "mult": [m[4] for m in VECTORS["multiplier"]],
        "cases": [c["table_rows"] for c in VECTORS["cases"]]}


def plengram_args() -> list[str]:
    """plengram.c's command line for every input of the vectors file."""
    args = ["fmix", ",".join(str(x) for x, _ in VECTORS["fmix32"]),
            "mult", ",".join(":".join(map(str, m[:4])) for m in VECTORS["multiplier"])]
    for c in VECTORS["cases"]:
        args += ["case", ",".join(map(str, c["orders"])), str(c["heads"]), ",".join(map(str, c["rows"])),
                 str(c["seed"]), ",".join(map(str, c["ids"]))]
    return args


def python_reference() -> dict:
    return {"fmix": [ngram.fmix32(x) for x, _ in VECTORS["fmix32"]],
            "mult": [ngram.multiplier(*m[:4]) for m in VECTORS["multiplier"]],
            "cases": [ngram.hash_rows_python(ids, lay) for ids, lay in zip(IDS, LAYOUTS, strict=True)]}


def numpy_form() -> dict:  # the hash of the NumPy runtime (its multipliers are the reference's)
    return {"cases": [ngram.hash_rows_numpy(np.array(ids, np.uint32), lay).tolist()
                      for ids, lay in zip(IDS, LAYOUTS, strict=True)]}


def torch_form() -> dict:  # the hash of the model that trains
    x = torch.tensor([x for x, _ in VECTORS["fmix32"]], dtype=torch.long)
    return {"fmix": fmix32_torch(x).tolist(),
            "cases": [NgramHash(lay)(torch.tensor([ids], dtype=torch.long))[0].tolist()
                      for ids, lay in zip(IDS, LAYOUTS, strict=True)]}


def c_host() -> dict:
    if not any(shutil.which(c) for c in ("cc", "gcc", "clang")):
        pytest.skip("no C compiler")
    proc = subprocess.run([str(c_engine.build(cflags="-O2", program="plengram")), *plengram_args()],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def c_bare_metal(board: str) -> dict:
    if mcu.missing_tools(board):
        pytest.skip(f"needs {', '.join(mcu.missing_tools(board))} (bash scripts/setup.sh --test installs them)")
    r = mcu.run_image(board, mcu.build_image(board, None, program="plengram"), plengram_args()).result
    assert r.pop("helper_calls") == {"soft_double": 0, "div64": 0, "double_math": 0}, board
    return r


IMPLEMENTATIONS = {"python": python_reference, "numpy": numpy_form, "torch": torch_form, "c": c_host,
                   **{f"mcu-{b}": (lambda b=b: c_bare_metal(b)) for b in mcu.BOARDS}}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_every_implementation_reproduces_the_frozen_vectors(implementation):
    got = IMPLEMENTATIONS[implementation]()
    got.pop("done", None)
    assert got and got == {k: WANT[k] for k in got}
    if implementation in ("python", "c") or implementation.startswith("mcu"):
        assert set(got) == set(WANT)  # the C builds and the reference compute every kind of value
