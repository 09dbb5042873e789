"""Quantisation cost of the edge export: validation loss (nats/token) of fp32 / int8 / int4 .ple files.

Exports the checkpoint once per encoding, evaluates every file with the NumPy edge runtime (the code
that would ship) on the same token windows of each validation domain, and reports per-domain and mean
loss and the delta against fp32. The PyTorch loss of the checkpoint on the same windows is reported too,
as a check that the fp32 export is the model.

    python benchmarks/edge_quality.py runs/esp32 --valid ../shared/data/valid --max-tokens 8192 > quality.json
"""

from __future__ import annotations

import os

# The runtime's matrices are tiny: one BLAS thread is fastest (and several thrash a shared machine).
# Set before NumPy loads OpenBLAS; an explicit OPENBLAS_NUM_THREADS in the environment wins.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import shlex  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from plelab.data.prepare import load_eval_domains  # noqa: E402
from plelab.data.tokenizer import Tokenizer  # noqa: E402
from plelab.edge.export import ExportOptions, export_source  # noqa: E402
from plelab.edge.runtime import EdgeModel  # noqa: E402
from plelab.inference.load import load_model  # noqa: E402
from plelab.model import LanguageModel  # noqa: E402
from plelab.runs.checkpoint import resolve_checkpoint  # noqa: E402


def windows(tokens: np.ndarray, seq_len: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Non-overlapping (inputs, targets) windows covering every target once (as plelab eval does)."""
    for s in range(0, len(tokens) - 1, seq_len):
        n = min(seq_len, len(tokens) - 1 - s)
        yield tokens[s : s + n].astype(np.int64), tokens[s + 1 : s + 1 + n].astype(np.int64)


def runtime_nll(path: Path, tokens: np.ndarray, seq_len: int) -> float:
    """Summed next-token NLL (nats) of a .ple file over all windows, computed by the edge runtime."""
    rt = EdgeModel(path, verify="core")
    total = 0.0
    for x, y in windows(tokens, seq_len):
        logits = rt.forward(x.tolist(), rt.new_cache(len(x))).astype(np.float64)
        m = logits.max(-1, keepdims=True)
        lse = (m[:, 0] + np.log(np.exp(logits - m).sum(-1)))
        total += float((lse - logits[np.arange(len(y)), y]).sum())
    rt.close()
    return total


@torch.no_grad()
def torch_nll(model: LanguageModel, tokens: np.ndarray, seq_len: int) -> float:
    """The same sum from the PyTorch checkpoint."""
    total = 0.0
    for x, y in windows(tokens, seq_len):
        logits, _ = model(torch.from_numpy(x)[None])
        total += float(torch.nn.functional.cross_entropy(logits[0].float(), torch.from_numpy(y), reduction="sum"))
    return total


def main(argv: list[str] | None = None) -> dict:
    """Run the comparison and print JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint", help="run or checkpoint directory (with tokenizer.json)")
    p.add_argument("--valid", required=True, help="folder of <domain>.txt validation files")
    p.add_argument("--quants", default="fp32,int8,int4", help="encodings to compare (fp32 first)")
    p.add_argument("--group", type=int, default=128, help="values per scale (default 128)")
    p.add_argument("--no-scale-search", action="store_true", help="plain absmax scales")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per domain (whole documents, default 8192)")
    p.add_argument("--seq-len", type=int, help="window length (default: the model's max_seq_len)")
    p.add_argument("--out-dir", help="where the .ple files go (default: a temp dir)")
    args = p.parse_args(argv)
    quants = args.quants.split(",")
    ckpt = resolve_checkpoint(args.checkpoint)
    model, _ = load_model(ckpt)
    seq_len = args.seq_len or model.config.max_seq_len
    domains = load_eval_domains(args.valid, Tokenizer.load(ckpt))
    domains = {k: d.head(args.max_tokens) for k, d in domains.items()}
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="edge-quality-"))
    files, seconds = {}, {}
    for q in quants:
        files[q] = out_dir / f"model-{q}.ple"
        export_source(str(ckpt), files[q], ExportOptions(q, args.group, scale_search=not args.no_scale_search))
    result: dict = {"domains": {}}
    for name, dom in domains.items():
        n = dom.n_targets
        row = {"tokens": n, "torch": torch_nll(model, dom.tokens, seq_len) / n}
        for q in quants:
            t0 = time.perf_counter()
            row[q] = runtime_nll(files[q], dom.tokens, seq_len) / n
            seconds[q] = seconds.get(q, 0.0) + time.perf_counter() - t0
        for q in quants[1:]:
            row[f"delta_{q}"] = row[q] - row[quants[0]]
        result["domains"][name] = row
        print(f"{name:<20} " + " ".join(f"{k} {v:.4f}" for k, v in row.items() if k != "tokens"), file=sys.stderr)
    rows = result["domains"].values()
    result["mean"] = {k: float(np.mean([r[k] for r in rows])) for k in next(iter(rows)) if k != "tokens"}
    result.update({
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])]),
        "checkpoint": str(ckpt),
        "group": args.group,
        "scale_search": not args.no_scale_search,
        "seq_len": seq_len,
        "max_tokens_per_domain": args.max_tokens,
        "file_bytes": {q: files[q].stat().st_size for q in quants},
        "runtime_eval_seconds": seconds,
    })
    json.dump(result, sys.stdout, indent=2)
    print()
    return result


if __name__ == "__main__":
    main()
