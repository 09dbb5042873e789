"""One CPU training step (forward + backward + AdamW) of plelab's model against transformers' Llama.

Prints one JSON object. All measurements run in this process, with the contenders' order rotating every
round and medians over repeats after warm-up (the machine is shared, so single timings are noise):

1. ours (dP = 0) vs `LlamaForCausalLM` with identical dimensions, sdpa attention, tied embedding, the
   same batch and the same AdamW settings (foreach, as plelab's trainer uses) on both sides. Before
   timing, our weights are copied into the Llama model and logits and loss compared, which proves the
   two compute the same function. "ours" is the training path with the fused ops (`kernels="on"`,
   plelab/model/fused_ops.py), `model(ids, targets, return_logits=False)` (head + cross-entropy fused in
   row chunks); "ours_returning_logits" is the same model called as `model(ids, targets)`, which also
   materialises the logits; "ours_reference" is the reference model (`kernels="off"`: plain RMSNorm,
   RoPE and cross-entropy), all timed in the same rotation.
2. the step-time cost of PLE at dP = H/2 against dP = 0 on the same core (dense AdamW on the table).
3. CPU MFU of ours: 6 * matmul params * tokens/s / a measured fp32 matmul peak (tables excluded),
   and the same with the attention term (see plelab/training/mfu.py).
4. bf16: ours under CPU bf16 autocast (what `dtype = "auto"` picks on a CPU with AVX512-BF16/AMX) against
   ours in fp32, and Llama under the same autocast against Llama at its default precision (fp32 weights, no
   autocast), all in the same rotation as 1.; plus the bf16 matmul peak. Weights and AdamW stay fp32.

    python3 benchmarks/bench_train_step.py            # default size, about 1-2 minutes on 2 idle cores
    python3 benchmarks/bench_train_step.py --quick    # tiny smoke run, seconds on an idle machine
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from plelab.model.config import ModelConfig  # noqa: E402
from plelab.model.params import count_params, matmul_params, train_matmul_macs_per_token, with_ple_dim  # noqa: E402
from plelab.model.presets import load_model_config  # noqa: E402
from plelab.model.transformer import LanguageModel  # noqa: E402
from plelab.training.mfu import measure_matmul_peak, mfu, train_flops_per_token  # noqa: E402
from plelab.util.device import choose_precision  # noqa: E402

# Identical on both sides; foreach/fused are chosen by torch's defaults for CPU tensors unless set here.
ADAMW = dict(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, foreach=True)


def model_config(args: argparse.Namespace, ple_dim: int = 0, kernels: str = "on") -> ModelConfig:
    """Our config for the benchmark size (the CPU kernels on unless asked otherwise)."""
    return load_model_config(
        dict(
            vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
            num_kv_heads=args.kv_heads, max_seq_len=args.seq, tie_embeddings=True,
            ffn=dict(kind="swiglu", intermediate_size=args.ffn), ple=dict(dim=ple_dim), kernels=kernels,
        )
    )


def llama_model(cfg: ModelConfig) -> torch.nn.Module:
    """transformers' LlamaForCausalLM with exactly the dimensions of `cfg` (dP must be 0)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_size, max_position_embeddings=cfg.max_seq_len, rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta}, tie_word_embeddings=True,
        attention_bias=False, mlp_bias=False, hidden_act="silu", use_cache=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(hf)


def parity(ours: LanguageModel, llama: torch.nn.Module, ids: torch.Tensor, targets: torch.Tensor) -> dict:
    """Copy our weights into Llama and compare logits and loss (proves identical dimensions and math)."""
    missing, unexpected = llama.model.load_state_dict(ours.state_dict(), strict=False)
    if unexpected or missing:
        raise RuntimeError(f"weight mapping failed: missing {missing}, unexpected {unexpected}")
    llama.tie_weights()
    with torch.no_grad():
        lo, loss_o = ours(ids, targets)
        out = llama(input_ids=ids, labels=ids)
    return {
        "max_abs_logit_diff": float((lo - out.logits).abs().max()),
        "loss_ours": float(loss_o),
        "loss_llama": float(out.loss),
    }


def step_fn(
    model: torch.nn.Module, kind: str, ids: torch.Tensor, targets: torch.Tensor, dtype: str = "fp32"
) -> Callable[[], float]:
    """A closure running one training step (zero_grad, forward, backward, AdamW step); returns the loss.

    kind: "llama" (HF's own loss from labels=ids), "ours" (the training path: return_logits=False, head and
    cross-entropy fused in chunks) or "ours_logits" (forward also returns the full logits tensor).
    dtype: "fp32" or "bf16" (the forward under CPU bf16 autocast, exactly as the trainer runs it).
    """
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    model.train()
    precision = choose_precision(torch.device("cpu"), dtype)

    def step() -> float:
        opt.zero_grad(set_to_none=True)
        with precision.autocast(torch.device("cpu")):
            if kind == "llama":
                # The standard HF training call: labels = ids, the model shifts them itself.
                loss = model(input_ids=ids, labels=ids).loss
            else:
                loss = model(ids, targets, return_logits=kind == "ours_logits")[1]
        loss.backward()
        opt.step()
        return loss.item()

    return step


@dataclass
class Timing:
    """Per-step wall seconds and this process's CPU seconds (all threads; includes OpenMP spin-waits)."""

    wall: list[float]
    cpu: list[float]


def rotate(fns: list[Callable[[], float]], warmup: int, repeats: int) -> list[Timing]:
    """Time each fn `repeats` times, rotating which goes first every round, after `warmup` calls each.

    The machine is shared: rotation spreads slow periods over all contenders, and medians drop outliers.
    """
    for _ in range(warmup):
        for fn in fns:
            fn()
    times: list[list[float]] = [[] for _ in fns]
    cpu: list[list[float]] = [[] for _ in fns]
    n = len(fns)
    for r in range(repeats):
        order = list(range(n))[r % n :] + list(range(n))[: r % n]
        if (r // n) % 2:
            order.reverse()
        for i in order:
            t0, c0 = time.perf_counter(), time.process_time()
            fns[i]()
            times[i].append(time.perf_counter() - t0)
            cpu[i].append(time.process_time() - c0)
    return [Timing(t, c) for t, c in zip(times, cpu, strict=True)]



def summary(t: Timing) -> dict:
    """Median, min, max wall seconds, and the median CPU seconds."""
    return {
        "median_s": statistics.median(t.wall), "min_s": min(t.wall), "max_s": max(t.wall), "n": len(t.wall),
        "cpu_median_s": statistics.median(t.cpu),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print its JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny size and few repeats: a smoke run in seconds")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--ffn", type=int, default=688)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--ple-dim", type=int, default=None, help="PLE width for the cost measurement; default H/2")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.quick:
        args.hidden, args.layers, args.heads, args.kv_heads, args.ffn = 64, 2, 4, 2, 172
        args.vocab, args.batch, args.seq, args.warmup, args.repeats = 1024, 2, 64, 1, 3
    if args.threads:
        torch.set_num_threads(args.threads)
    ple_dim = args.ple_dim if args.ple_dim is not None else args.hidden // 2
    command = "python3 " + shlex.join(["benchmarks/bench_train_step.py", *(sys.argv[1:] if argv is None else argv)])

    torch.manual_seed(args.seed)
    cfg = model_config(args)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))
    # Our targets are pre-shifted (-100 = ignored); Llama gets labels=ids and shifts internally: same pairs.
    targets = torch.cat([ids[:, 1:], torch.full((args.batch, 1), -100)], dim=1)
    tokens = args.batch * args.seq

    t_start = time.perf_counter()
    load_start = os.getloadavg()[0]  # other processes on the machine: context for the noise
    # The peak is measured three times across the run and the best kept: other processes on the machine
    # can only make a measurement slower, never faster.
    peak_kw = dict(size=512, seconds=0.3) if args.quick else dict(size=1024, seconds=1.0)
    peaks = [measure_matmul_peak(**peak_kw)]

    ours = LanguageModel(cfg)
    llama = llama_model(cfg)
    check = parity(ours, llama, ids, targets)
    # Fresh Llama weights for timing so the two models own separate tensors (tying is kept).
    llama = llama_model(cfg)
    ours_plain = LanguageModel(cfg)
    ours_ref = LanguageModel(model_config(args, kernels="off"))
    ours_bf16, llama_bf16 = LanguageModel(cfg), llama_model(cfg)
    t_llama, t_ours, t_plain, t_ref, t_ours_bf16, t_llama_bf16 = rotate(
        [step_fn(llama, "llama", ids, targets), step_fn(ours, "ours", ids, targets),
         step_fn(ours_plain, "ours_logits", ids, targets), step_fn(ours_ref, "ours", ids, targets),
         step_fn(ours_bf16, "ours", ids, targets, "bf16"), step_fn(llama_bf16, "llama", ids, targets, "bf16")],
        args.warmup, args.repeats,
    )

    peaks.append(measure_matmul_peak(**peak_kw))
    cfg_ple = with_ple_dim(cfg, ple_dim)
    ple_model = LanguageModel(cfg_ple)
    base_model = LanguageModel(cfg)
    t_base, t_ple = rotate(
        [step_fn(base_model, "ours", ids, targets), step_fn(ple_model, "ours", ids, targets)], args.warmup, args.repeats
    )

    peaks.append(measure_matmul_peak(**peak_kw))
    peak = max(peaks)
    peak_bf16 = measure_matmul_peak(torch.bfloat16, **peak_kw)
    med_ours, med_llama = statistics.median(t_ours.wall), statistics.median(t_llama.wall)
    med_base, med_ple = statistics.median(t_base.wall), statistics.median(t_ple.wall)
    tok_s = tokens / med_ours
    tok_s_ple = tokens / med_ple
    result = {
        "command": command,
        "config": {
            "hidden_size": cfg.hidden_size, "num_layers": cfg.num_layers, "num_heads": cfg.num_heads,
            "num_kv_heads": cfg.kv_heads, "head_dim": cfg.head_size, "ffn_intermediate": cfg.ffn.intermediate_size,
            "vocab_size": cfg.vocab_size, "tie_embeddings": True, "batch": args.batch, "seq_len": args.seq,
            "tokens_per_step": tokens, "params_total": count_params(cfg)["total"], "matmul_params": matmul_params(cfg),
            "optimizer": {"name": "torch.optim.AdamW", **{k: list(v) if isinstance(v, tuple) else v
                                                          for k, v in ADAMW.items()}},
            "llama": "transformers.LlamaForCausalLM, attn_implementation=sdpa, labels=ids (HF's own loss)",
            "warmup": args.warmup, "repeats": args.repeats, "order": "rotating (ABCDEF, BCDEFA, ..., then reversed)",
        },
        "env": {
            "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "loadavg_1m_start": load_start, "loadavg_1m_end": os.getloadavg()[0],
        },
        "parity_same_weights": check,
        "ours_vs_llama": {
            "llama": summary(t_llama), "ours": summary(t_ours), "ours_returning_logits": summary(t_plain),
            "ratio_llama_over_ours": med_llama / med_ours,
            "ratio_llama_over_ours_returning_logits": med_llama / statistics.median(t_plain.wall),
            "ours_reference": summary(t_ref),
            "ratio_reference_over_kernels": statistics.median(t_ref.wall) / med_ours,
            # CPU time is less sensitive to other processes than wall time (exactly so with --threads 1).
            "ratio_cpu_time_llama_over_ours": statistics.median(t_llama.cpu) / statistics.median(t_ours.cpu),
            "target": 1.3, "meets_target": med_llama / med_ours >= 1.3,
            "ours_path": "kernels=on, model(ids, targets, return_logits=False): head + cross-entropy fused in row "
                         "chunks; ours_reference: kernels=off, the same call",
        },
        "ple_cost": {
            "ple_dim": ple_dim, "ple_params_added": count_params(cfg_ple)["ple_added"],
            "optimizer_note": "dense AdamW over the PLE table too (the trainer's lazy sparse-table Adam is not used)",
            "dp0": summary(t_base), "ple": summary(t_ple),
            "ratio_ple_over_dp0": med_ple / med_base,
            "ratio_cpu_time_ple_over_dp0": statistics.median(t_ple.cpu) / statistics.median(t_base.cpu),
        },
        "mfu": {
            "matmul_peak_flops": peak,
            "matmul_peak_samples": peaks,
            "matmul_peak_how": f"best of square fp32 GEMMs, size {peak_kw['size']}, at start / middle / end",
            "ours_tokens_per_s": tok_s,
            "flops_per_token_6n": 6 * train_matmul_macs_per_token(cfg),
            "flops_per_token_with_attention": train_flops_per_token(cfg, args.seq),
            "mfu_6n": mfu(tok_s, cfg, peak, args.seq, attention=False),
            "mfu_with_attention": mfu(tok_s, cfg, peak, args.seq, attention=True),
            "ple_tokens_per_s": tok_s_ple,
            "ple_mfu_6n": mfu(tok_s_ple, cfg_ple, peak, args.seq, attention=False),
        },
        "bf16": {
            "precision_auto_here": str(choose_precision(torch.device("cpu"), "auto")),
            "ours_bf16_autocast": summary(t_ours_bf16), "llama_bf16_autocast": summary(t_llama_bf16),
            "ratio_ours_fp32_over_ours_bf16": med_ours / statistics.median(t_ours_bf16.wall),
            "ratio_llama_fp32_over_llama_bf16": med_llama / statistics.median(t_llama_bf16.wall),
            "ratio_llama_bf16_over_ours_bf16": statistics.median(t_llama_bf16.wall)
            / statistics.median(t_ours_bf16.wall),
            "ratio_llama_default_over_ours_bf16": med_llama / statistics.median(t_ours_bf16.wall),
            "matmul_peak_bf16_flops": peak_bf16,
            "ratio_matmul_peak_bf16_over_fp32": peak_bf16 / peak,
            "how": "torch.autocast('cpu', bfloat16) around forward + loss; fp32 weights, grads and AdamW; "
                   "llama default = fp32, no autocast",
        },
        "wall_s": time.perf_counter() - t_start,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
