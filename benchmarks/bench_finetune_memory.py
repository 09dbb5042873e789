"""Peak RSS of `plelab finetune` steps when the PLE table stays on disk, against the same run with the table
loaded into memory (as transformers does) and against the model without its table.

Three checkpoints of one tiny transformers-built Gemma 4 text model (H 32, 2 layers, dP 64) that differ only in
the PLE table's rows: `small` has 320 rows (the model without its table, in effect), `wide` enough rows for
`--table-gib` GiB of float32 (1 GiB: 2,097,152 rows). Each run is a fresh subprocess that imports everything
first, then runs `plelab finetune` (LoRA on attention + MLP, a few steps, a checkpoint and the adapter folder
written) through `plelab.cli.main.main`; its peak RSS (VmHWM in /proc/self/status) is compared with the value
right after the imports. Runs:

    small      the 320-row checkpoint                                  (baseline)
    streamed   the wide checkpoint, table read per batch from the shard (finetune.table_in_memory = false)
    loaded     the wide checkpoint, table loaded whole                  (finetune.table_in_memory = true)

The goal: streamed - small < 100 MB (the table adds page cache, not resident memory); loaded - small shows
what the table costs when it is held. RSS does not depend on the machine's load, so the figures are quotable;
the run writes a table file of --table-gib GiB and deletes it at the end (--keep to look at it).

    python3 benchmarks/bench_finetune_memory.py                  # 1 GiB table, ~1-3 minutes
    python3 benchmarks/bench_finetune_memory.py --table-gib 0.25 --steps 2
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

GIB = 1 << 30
VOCAB, HIDDEN, LAYERS, DIM = 320, 32, 2, 64
GOAL_BYTES = 100 * 10**6

PROBE = textwrap.dedent(
    """
    import json, sys
    import peft  # noqa: F401  (imports are not what is measured)
    import transformers.models.gemma4.modeling_gemma4  # noqa: F401
    import plelab.hf.finetune.trainer  # noqa: F401
    from plelab.cli.main import main

    def status(key):
        return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith(key + ":"))

    before = status("VmHWM")
    rc = main(sys.argv[1:])
    print(json.dumps({"rc": rc, "after_imports": before, "peak": status("VmHWM")}))
    """
)

TEXT = ("The quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun. A little bird sings "
        "a song about the river and the mountain, and the wind answers. ")


def write_checkpoint(folder: Path, table_rows: int, tokenizer_json: str) -> int:
    """A Gemma 4 text checkpoint whose table has `table_rows` rows (float32), written without ever holding the
    table: the small tensors from a transformers model, then the table streamed from a repeated random block.
    Returns the table's bytes."""
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    folder.mkdir(parents=True)
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, hidden_size_per_layer_input=DIM, num_hidden_layers=LAYERS,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=16, global_head_dim=16,
                  intermediate_size=64, layer_types=["full_attention"] * LAYERS, max_position_embeddings=128)
    torch.manual_seed(0)
    small = Gemma4ForCausalLM(Gemma4TextConfig(**common, vocab_size_per_layer_input=VOCAB))
    big = "model.embed_tokens_per_layer.weight"
    tensors = {k: v for k, v in small.state_dict().items() if k not in ("lm_head.weight", big)}
    width = LAYERS * DIM
    header, offset = {}, 0
    for name, t in tensors.items():
        n = t.numel() * 4
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + n]}
        offset += n
    table_bytes = table_rows * width * 4
    header[big] = {"dtype": "F32", "shape": [table_rows, width], "data_offsets": [offset, offset + table_bytes]}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    block = (np.random.default_rng(0).standard_normal((1021, width)) * 0.02).astype(np.float32).tobytes()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw)
        for t in tensors.values():
            f.write(t.float().contiguous().numpy().tobytes())
        left = table_bytes
        while left:
            chunk = block[: min(left, len(block))]
            f.write(chunk)
            left -= len(chunk)
    Gemma4TextConfig(**common, vocab_size_per_layer_input=table_rows).to_json_file(str(folder / "config.json"))
    (folder / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
    return table_bytes


def prepare_data(root: Path) -> tuple[Path, str]:
    """(prepared dataset folder, tokenizer.json text): a small BPE tokenizer and real-looking text."""
    from plelab.data.prepare import prepare_dataset
    from plelab.data.tokenizer import EOT, Tokenizer

    tok = Tokenizer.train_bpe([TEXT * 50], VOCAB - 20, min_frequency=1)
    src = root / "train.txt"
    src.write_text(f"\n{EOT}\n".join(TEXT * (1 + i % 5) for i in range(400)), encoding="utf-8")
    prepare_dataset([src], tok, root / "data", val_fraction=0.1, progress=False)
    return root / "data", tok.to_json()


def peak_rss(argv: list[str]) -> dict:
    """Run `plelab ARGV` in a fresh subprocess; its VmHWM after the imports and at the end, in bytes."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=1800, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"plelab {' '.join(argv)} failed: {out.stderr[-2000:]}")
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        raise RuntimeError(f"plelab {' '.join(argv)} exited {r['rc']}: {out.stderr[-2000:]}")
    return {**r, "growth": r["peak"] - r["after_imports"]}


def finetune_argv(folder: Path, data: Path, out: Path, steps: int, in_memory: bool) -> list[str]:
    """The measured command: a few LoRA steps, one checkpoint and the adapter folder."""
    return ["finetune", "--hf", str(folder), "--data", str(data), "--out", str(out), "--quiet",
            "--set", f"max_steps={steps}", "--set", "batch_size=4", "--set", "seq_len=64", "--set", "dtype=fp32",
            "--set", "warmup_steps=1", "--set", f"ckpt_every={steps}", "--set", "eval_tokens=256",
            "--set", f"finetune.table_in_memory={str(in_memory).lower()}"]


def measure(workdir: Path, table_gib: float, steps: int, runs: tuple[str, ...] = ("small", "streamed", "loaded")
            ) -> dict:
    """Write the checkpoints and data under `workdir`, run each of `runs`, return the figures (bytes)."""
    data, tokenizer_json = prepare_data(workdir)
    rows = int(table_gib * GIB) // (LAYERS * DIM * 4)
    table_bytes = write_checkpoint(workdir / "wide", rows, tokenizer_json)
    small_bytes = write_checkpoint(workdir / "small", VOCAB, tokenizer_json)
    plan = {"small": (workdir / "small", False), "streamed": (workdir / "wide", False),
            "loaded": (workdir / "wide", True)}
    results = {name: peak_rss(finetune_argv(*plan[name][:1], data, workdir / f"run-{name}", steps, plan[name][1]))
               for name in runs}
    out: dict = {"table_rows": rows, "table_bytes": table_bytes, "small_table_bytes": small_bytes,
                 "runs": results}
    if "small" in results:
        base = results["small"]["growth"]
        out.update({f"{name}_minus_small_bytes": r["growth"] - base for name, r in results.items() if name != "small"})
    if "streamed_minus_small_bytes" in out:
        out["goal_bytes"] = GOAL_BYTES
        out["meets_goal"] = out["streamed_minus_small_bytes"] < GOAL_BYTES
    return out


def main() -> None:
    """Parse arguments, measure, print JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table-gib", type=float, default=1.0, help="size of the wide table in GiB (default 1)")
    parser.add_argument("--steps", type=int, default=3, help="fine-tuning steps per run (default 3)")
    parser.add_argument("--workdir", help="where to write the checkpoints (default: a temp folder, deleted)")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints and runs")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        raise SystemExit("reads /proc/self/status: Linux only")
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench-finetune-memory-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        result = measure(workdir, args.table_gib, args.steps)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    mb = {k.replace("_bytes", "_mb"): round(v / 1e6, 1) for k, v in result.items() if k.endswith("_bytes")}
    print(json.dumps({
        "benchmark": "finetune_memory",
        "command": "python3 " + " ".join(shlex.quote(a) for a in sys.argv),
        "what": "peak RSS growth (VmHWM after the run minus after the imports) of plelab finetune, per run",
        "model": {"family": "gemma4", "hidden_size": HIDDEN, "layers": LAYERS, "ple_dim": DIM, "vocab": VOCAB},
        **result, **mb,
        "load_independent": "RSS figures do not depend on other processes' load",
        "machine": {"python": platform.python_version(), "torch": torch.__version__, "cpu": platform.machine()},
    }, indent=2))


if __name__ == "__main__":
    main()
