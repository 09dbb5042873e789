"""A model with a 1 GiB PLE table runs in a process whose resident memory stays near the dense core.

The file is written directly: the dense part comes from a random model whose PLE table is never
allocated (`random_model`), the 1 GiB of PLE records from a cycle of pre-encoded random records. A fresh subprocess that
imports only the NumPy runtime then verifies every byte, runs a prompt of 200 distinct tokens, and reports
VmHWM (peak resident set) from /proc. The bound is the issue's: dense core + KV cache + 100 MB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from plelab.edge.export import ExportOptions, layout_for_model, model_sections, random_model
from plelab.edge.format import write_ple
from plelab.edge.quant import quantize
from plelab.model import load_model_config

GIB = 1 << 30

PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from plelab.edge.runtime import EdgeModel

    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))

    model = EdgeModel(sys.argv[1], verify="full")
    prompt = np.random.default_rng(0).choice(model.vocab, 200, replace=False).tolist()
    out = list(model.generate(prompt, 40, temperature=0.0))
    kv = 2 * model.n_layers * model.n_kv * model.head_dim * 240 * 4
    print(json.dumps({"hwm": status("VmHWM"), "rss": status("VmRSS"), "resident": model.resident_bytes,
                      "kv": kv, "file_reads": model.traffic.reads["file"], "tokens": model.traffic.tokens,
                      "generated": len(out), "torch": "torch" in sys.modules}))
    """
)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_one_gib_ple_table_stays_out_of_resident_memory(tmp_path):
    cfg = load_model_config(
        "tiny",
        ["vocab_size=65536", "hidden_size=64", "num_layers=8", "num_heads=4", "num_kv_heads=2",
         "max_seq_len=256", "ffn.intermediate_size=128", "ple.dim=1024"],
    )
    opts = ExportOptions(quant="fp16")
    model, _ = random_model(cfg, seed=0)  # the PLE table is never allocated
    layout = layout_for_model(model, opts)
    ple = layout.table("ple")
    assert ple.nbytes >= GIB
    sections = model_sections(model, layout)
    # 1 GiB of random fp16 records: a 509-record random block (prime, so neighbours differ) cycled.
    block = np.random.default_rng(1).standard_normal((509, ple.part("ple").length), dtype=np.float32) * 0.02
    block = ple.assemble({"ple": quantize(block, ple.part("ple").enc)})
    batch = 4096
    cycle = np.concatenate([block] * (-(-batch // 509) + 1))
    batches = (cycle[(a % 509) : (a % 509) + min(batch, ple.rows - a)] for a in range(0, ple.rows, batch))
    sections["ple"] = ple.chunks(batches)
    path = tmp_path / "big.ple"
    write_ple(path, layout, sections)

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}  # tiny matmuls: extra BLAS threads only cost time
    out = subprocess.run([sys.executable, "-c", PROBE, str(path)], capture_output=True, text=True, timeout=300,
                         env=env)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert not r["torch"] and r["generated"] == 40
    assert r["file_reads"] == r["tokens"] == 200 + 39  # one record per token seen, nothing else
    bound = r["resident"] + r["kv"] + 100 * 10**6
    assert r["hwm"] < bound, f"peak RSS {r['hwm']:,} B >= dense core + KV + 100 MB = {bound:,} B"
    print(f"peak RSS {r['hwm'] / 1e6:.1f} MB; dense core {r['resident'] / 1e6:.1f} MB, KV {r['kv'] / 1e6:.2f} MB; "
          f"PLE table {ple.nbytes / 1e9:.2f} GB")
