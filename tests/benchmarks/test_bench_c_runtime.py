"""The C-runtime benchmark against llama2.c runs end to end on a tiny shape (so it does not rot between real runs)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_c_runtime  # noqa: E402

from plelab.errors import PlelabError  # noqa: E402


def test_quick_run_reports_both_sides(tmp_path, capsys):
    c_engine = pytest.importorskip("plelab.edge.c_engine", reason="plelab's C runtime (c_engine) is not importable")
    try:
        c_engine.compiler()
    except PlelabError as exc:
        pytest.skip(str(exc))
    r = bench_c_runtime.main(["--quick", "--cache", str(tmp_path / "cache")])
    assert set(r["results"]) == {"llama2c", "plerun_int4", "plerun_fp32"}
    assert all(row["tok_per_s_median"] > 0 and row["n"] == 1 for row in r["results"].values())
    assert set(r["ratio_ours_over_llama2c"]) == set(r["meets_target"]) == {"int4", "fp32"}
    assert r["run"]["prompt_ids"][:2] == [1, 259] and len(r["run"]["prompt_ids"]) == 2 + len(r["run"]["prompt"])
    assert r["build"]["cflags"] == "-Ofast -march=native" and r["build"]["openmp"] is False
    assert "-Ofast -march=native" in r["build"]["flags_both_sides"]
    assert r["plerun_report"]["int4"]["positions"] == r["run"]["steps"] == 64
    assert r["plerun_report"]["int4"]["threads"] == 1
    assert "bench_c_runtime.py --quick" in r["command"]
    assert '"ratio_ours_over_llama2c"' in capsys.readouterr().out
    assert any(p.name.startswith("run-") for p in (tmp_path / "cache").iterdir())  # llama2.c built into the cache


def test_threads_without_openmp_is_refused():
    # run.c is single-threaded without -fopenmp: a multi-thread comparison would not be like for like.
    with pytest.raises(SystemExit) as exc:
        bench_c_runtime.parse(["--threads", "2"])
    assert exc.value.code == 2


ENCODE_C = r"""
#define TESTING
#include "run.c"
int main(int argc, char **argv) {
    Tokenizer t;
    build_tokenizer(&t, argv[1], atoi(argv[2]));
    int *ids = malloc((strlen(argv[3]) + 3) * sizeof(int)), n = 0;
    encode(&t, argv[3], 1, 0, ids, &n);
    for (int i = 0; i < n; i++) printf("%d%s", ids[i], i + 1 < n ? "," : "\n");
    return 0;
}
"""


@pytest.mark.parametrize("prompt", ["Once upon a time", "héllo  wörld 中文", "x"])
def test_prompt_ids_are_what_run_c_encodes(tmp_path, prompt):
    # Both sides must decode from the same token ids: check ours against run.c's own encode().
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        pytest.skip("no C compiler ($CC or cc) on this machine")
    (tmp_path / "encode.c").write_text(ENCODE_C)
    exe = tmp_path / "encode"
    subprocess.run([cc, "-O0", "-I", str(bench_c_runtime.LLAMA2C), "-o", str(exe), str(tmp_path / "encode.c"),
                    "-lm"], check=True)
    tok = bench_c_runtime.llama2c_tokenizer(tmp_path, 512)
    out = subprocess.run([str(exe), str(tok), "512", prompt], check=True, capture_output=True, text=True).stdout
    assert [int(i) for i in out.split(",")] == bench_c_runtime.prompt_ids(prompt)
