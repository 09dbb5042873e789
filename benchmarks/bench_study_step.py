"""Training-step speed of the studies' models: the fp32 reference against the bf16-head fast path (issue 25).

Prints one JSON object. The models are read from the studies' own sweep files: the dead-zone-law models
(studies/law/deadzone-law-h{32,64,128}.toml: 4 layers, vocab 8,192, simple-form PLE at dP = H/4 by default)
and the FFN study's baseline (studies/ffn/ffn-study.toml, variant swiglu: H = 96, vocab 4,096), each at its
sweep's batch (16 x 128). A step is the trainer's: forward with `return_logits=False` under the run's compute
context (plelab.training.trainer.compute_context), backward, global-norm clipping, AdamW (fused where the
trainer fuses it: bf16-head on a CPU) + the lazy sparse Adam of the PLE table (plelab.training.optim.Optimizer),
zero_grad.

Both paths train the same weights on the same batch in the same process; at each thread count (1, then 2)
their steps alternate (order swapped every round) after a warm-up, so a slow period on a shared machine
hits both. Reported per model and thread count: best and median wall ms per step, tokens/s (from the best),
the ratio reference / fast (best and median), process CPU ms, and each path's share of its GEMM peak:
training FLOPs per step (plelab.training.mfu.train_flops_per_token) / step time / a best-of square GEMM
peak measured in this run at that thread count, fp32 for the reference, bf16 for the fast path where the CPU
has bf16 units (elsewhere its GEMMs are fp32 on bf16-rounded inputs, so its peak is the fp32 one).

Target (issue 25, taken on an idle machine): fast >= 2x the reference at H = 64 and H = 128 on one thread,
and no slower anywhere. Timings on a shared machine only show a direction.

    python3 benchmarks/bench_study_step.py            # every model, 1 and 2 threads: a few minutes
    python3 benchmarks/bench_study_step.py --quick    # one tiny model, seconds (a smoke run)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from plelab.experiments.sweep import load_sweep  # noqa: E402
from plelab.model import bf16_gemm, softmax_xent  # noqa: E402
from plelab.model.transformer import LanguageModel  # noqa: E402
from plelab.training.config import TrainConfig  # noqa: E402
from plelab.training.mfu import measure_matmul_peak, train_flops_per_token  # noqa: E402
from plelab.training.optim import Optimizer, grad_norm_and_clip, model_config_for  # noqa: E402
from plelab.training.trainer import adamw_fused, compute_context  # noqa: E402
from plelab.util.device import choose_precision, cpu_bf16_features  # noqa: E402

STUDIES = ROOT / "studies"
REFERENCE, FAST = "fp32", "bf16-head"


def study_models(ple_ratio: float, quick: bool) -> dict[str, TrainConfig]:
    """{name: training config} of the studies' models, straight from their sweep files."""
    out = {}
    widths = [32] if quick else [32, 64, 128]
    for H in widths:
        dim = int(H * ple_ratio)
        sweep = load_sweep(STUDIES / "law" / f"deadzone-law-h{H}.toml",
                           [f"grid.model.ple.dim=[{dim}]", "grid.seed=[1]"])
        out[f"law_h{H}_dP{dim}"] = sweep.points[0].config
    if not quick:
        sweep = load_sweep(STUDIES / "ffn" / "ffn-study.toml", ["grid.seed=[1]"])
        out["ffn_study_swiglu"] = next(p.config for p in sweep.points if p.variant == sweep.baseline)
    if quick:  # seconds, not minutes: the same model kinds, shrunk
        out = {name: dataclasses.replace(cfg, batch_size=2, seq_len=32,
                                         model=dataclasses.replace(cfg.model, vocab_size=1024))
               for name, cfg in out.items()}
    return out


def make_step(cfg: TrainConfig, dtype: str, seed: int = 0) -> Callable[[], float]:
    """One training step of `cfg` at `dtype`, exactly as the trainer runs it, on a fixed random batch."""
    cfg = dataclasses.replace(cfg, dtype=dtype)
    device = torch.device("cpu")
    precision = choose_precision(device, dtype)
    torch.manual_seed(seed)
    model = LanguageModel(model_config_for(cfg), device=device)
    model.train()
    optimizer = Optimizer(model, cfg, fused=adamw_fused(device, precision))
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.model.vocab_size, (cfg.batch_size, cfg.context + 1), generator=gen)
    x, y = ids[:, :-1], ids[:, 1:]

    def step() -> float:
        with compute_context(precision, device):
            _, loss = model(x, y, return_logits=False)
        loss.backward()
        grad_norm_and_clip(params, cfg.grad_clip)
        optimizer.step()
        optimizer.zero_grad()
        return float(loss.detach())

    return step


def alternate(ref: Callable[[], float], fast: Callable[[], float], warmup: int, rounds: int) -> dict[str, dict]:
    """Wall and process-CPU seconds of each step, the two alternating (order swapped every round)."""
    for _ in range(warmup):
        ref(), fast()
    times: dict[str, dict[str, list[float]]] = {k: {"wall": [], "cpu": []} for k in (REFERENCE, FAST)}
    for r in range(rounds):
        order = [(REFERENCE, ref), (FAST, fast)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            t0, c0 = time.perf_counter(), time.process_time()
            loss = fn()
            times[name]["wall"].append(time.perf_counter() - t0)
            times[name]["cpu"].append(time.process_time() - c0)
            if loss != loss:
                raise RuntimeError(f"{name} step returned a NaN loss")
    return times


def peaks(quick: bool, native: bool) -> dict[str, float | int | str]:
    """Best-of square GEMM FLOP/s at the current thread count: fp32, and bf16 (small where bf16 is emulated)."""
    size = 256 if quick else 1024
    secs = 0.2 if quick else 1.0
    # torch's own bf16 GEMM where the CPU lacks bf16 units runs ~100x below fp32: a 1024 GEMM would take seconds.
    bf16_size = size if native else 128
    return {"fp32": measure_matmul_peak(torch.float32, size, secs), "fp32_size": size,
            "bf16": measure_matmul_peak(torch.bfloat16, bf16_size, secs), "bf16_size": bf16_size}


def summarise(cfg: TrainConfig, times: dict[str, dict], peak: dict, native: bool) -> dict:
    """Per-path ms, tokens/s, peak shares, and the reference / fast ratios."""
    tokens = cfg.batch_size * cfg.context
    flops = train_flops_per_token(cfg.model, cfg.context) * tokens
    out: dict = {}
    for name in (REFERENCE, FAST):
        wall, cpu = times[name]["wall"], times[name]["cpu"]
        best = min(wall)
        peak_kind = "bf16" if name == FAST and native else "fp32"
        out[name] = {
            "ms_best": 1e3 * best, "ms_median": 1e3 * statistics.median(wall), "n": len(wall),
            "cpu_ms_best": 1e3 * min(cpu), "tokens_per_s": tokens / best,
            "peak_used": peak_kind, "share_of_peak": flops / best / peak[peak_kind],
        }
    ref, fast = out[REFERENCE], out[FAST]
    out["ratio_ref_over_fast_best"] = ref["ms_best"] / fast["ms_best"]
    out["ratio_ref_over_fast_median"] = ref["ms_median"] / fast["ms_median"]
    out["ratio_ref_over_fast_cpu_best"] = ref["cpu_ms_best"] / fast["cpu_ms_best"]
    out["train_gflop_per_step"] = flops / 1e9
    return out


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print its JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="one tiny model, few repeats: a smoke run in seconds")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to measure (default 1 2)")
    p.add_argument("--ple-ratio", type=float, default=0.25, help="dP / H of the law models (default 1/4)")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=6, help="timed steps per path and thread count (default 6)")
    p.add_argument("--models", nargs="+", default=None, help="only these model names (see the JSON's keys)")
    args = p.parse_args(argv)
    if args.quick:
        args.warmup, args.rounds = 1, 2
    command = "python3 " + shlex.join(["benchmarks/bench_study_step.py", *(sys.argv[1:] if argv is None else argv)])
    native = bool(cpu_bf16_features())
    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    models = study_models(args.ple_ratio, args.quick)
    if args.models:
        unknown = sorted(set(args.models) - set(models))
        if unknown:
            p.error(f"unknown model(s) {unknown}; choose from {sorted(models)}")
        models = {k: v for k, v in models.items() if k in args.models}
    results: dict = {}
    peak_by_threads: dict = {}
    for threads in args.threads:
        torch.set_num_threads(threads)
        peak_by_threads[str(threads)] = peaks(args.quick, native)
        for name, cfg in models.items():
            times = alternate(make_step(cfg, REFERENCE), make_step(cfg, FAST), args.warmup, args.rounds)
            results.setdefault(name, {})[f"threads_{threads}"] = summarise(cfg, times, peak_by_threads[str(threads)],
                                                                           native)
        # The peak again after the models: other processes can only slow a measurement, so keep the best.
        again = peaks(args.quick, native)
        for kind in ("fp32", "bf16"):
            peak_by_threads[str(threads)][kind] = max(peak_by_threads[str(threads)][kind], again[kind])
    one = [r["threads_1"]["ratio_ref_over_fast_best"] for n, r in results.items()
           if "threads_1" in r and ("h64" in n or "h128" in n)]
    every = [r[t]["ratio_ref_over_fast_best"] for r in results.values() for t in r]
    result = {
        "command": command,
        "models": {name: {"hidden_size": c.model.hidden_size, "num_layers": c.model.num_layers,
                          "vocab_size": c.model.vocab_size, "ple_dim": c.model.ple.dim, "ffn": c.model.ffn.kind,
                          "ffn_intermediate": c.model.ffn.intermediate_size, "batch": c.batch_size,
                          "seq_len": c.context} for name, c in models.items()},
        "paths": {REFERENCE: str(choose_precision(torch.device("cpu"), REFERENCE)),
                  FAST: str(choose_precision(torch.device("cpu"), FAST))},
        "bf16_hardware": {"cpu_features": cpu_bf16_features(), "onednn_rounds_inputs": bf16_gemm.onednn_rounds_inputs(),
                          "softmax_kernel": softmax_xent.backend()},
        "peaks_flops": peak_by_threads,
        "results": results,
        "target": {
            "what": "fast >= 2x the reference (best-of ms) at H = 64 and H = 128 on 1 thread; no slower anywhere",
            "ratios_h64_h128_1_thread": one, "min_ratio_anywhere": min(every) if every else None,
            "met": bool(one) and min(one) >= 2.0 and min(every) >= 1.0,
            "note": "quotable only on an idle machine; under load the ratios show a direction",
        },
        "env": {"torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
                "cpus": os.cpu_count(), "loadavg_1m_start": load_start, "loadavg_1m_end": os.getloadavg()[0]},
        "wall_s": time.perf_counter() - t_start,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
