"""Host decode speed: the NumPy edge runtime on an exported .ple vs the same model in PyTorch eager (KV cache).

Both decode greedily from the same prompt, one token per step, with the same number of threads; the
prompt's prefill is excluded. Prints JSON with the command that produced it.

    python benchmarks/bench_edge_decode.py --model esp32-28m --quant int4 --new-tokens 128
    python benchmarks/bench_edge_decode.py --model runs/esp32 --quant fp32     # a trained checkpoint
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="esp32-28m", help="preset (random weights) or checkpoint/run directory")
    p.add_argument("--quant", default="int4", choices=["fp32", "fp16", "int8", "int4"], help="export encoding")
    p.add_argument("--prompt-tokens", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="best of N runs for each side")
    p.add_argument("--threads", type=int, default=1, help="BLAS / torch threads for both sides")
    p.add_argument("--out", default="/tmp/bench_edge_decode.ple", help="where the exported file goes")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print JSON."""
    args = parse(argv)
    # Thread counts must be fixed before NumPy / torch load their BLAS.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    import json
    import time
    from pathlib import Path

    import numpy as np
    import torch

    from plelab.edge.export import ExportOptions, export_model
    from plelab.edge.runtime import EdgeModel
    from plelab.inference.load import load_model
    from plelab.model import KVCache, LanguageModel, load_model_config

    torch.set_num_threads(args.threads)
    if Path(args.model).is_dir():
        model, _ = load_model(args.model)
    else:
        torch.manual_seed(0)
        model = LanguageModel(load_model_config(args.model)).eval()
    export_model(model, args.out, ExportOptions(args.quant))
    prompt = np.random.default_rng(0).integers(0, model.config.vocab_size, args.prompt_tokens).tolist()
    n = args.new_tokens

    def numpy_run() -> tuple[float, list[int]]:
        rt = EdgeModel(args.out, verify="none")
        out = list(rt.generate(prompt, n + 1, temperature=0.0))  # n decode steps after the prefill
        return rt.timing["decode_s"], out

    @torch.no_grad()
    def torch_run() -> tuple[float, list[int]]:
        cache = KVCache.empty(model.config, 1, len(prompt) + n + 1)
        logits, _ = model(torch.tensor([prompt]), cache=cache)
        nxt = int(logits[0, -1].argmax())
        out = [nxt]
        t0 = time.perf_counter()
        for _ in range(n):
            logits, _ = model(torch.tensor([[nxt]]), cache=cache)
            nxt = int(logits[0, -1].argmax())
            out.append(nxt)
        return time.perf_counter() - t0, out

    np_s, np_out = min((numpy_run() for _ in range(args.repeats)), key=lambda r: r[0])
    pt_s, pt_out = min((torch_run() for _ in range(args.repeats)), key=lambda r: r[0])
    result = {
        "command": "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv if argv else sys.argv[1:])]),
        "model": args.model,
        "quant": args.quant,
        "file_bytes": Path(args.out).stat().st_size,
        "threads": args.threads,
        "prompt_tokens": len(prompt),
        "decode_tokens": n,
        "numpy_runtime_tokens_per_s": n / np_s,
        "torch_eager_tokens_per_s": n / pt_s,
        "numpy_over_torch": (n / np_s) / (n / pt_s),
        "greedy_tokens_agree": sum(a == b for a, b in zip(np_out, pt_out, strict=True)) / len(pt_out),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
