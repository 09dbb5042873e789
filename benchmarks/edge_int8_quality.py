"""Quality cost of the microcontroller paths: int8 activations and an int8 KV cache against the fp32 reference.

Runs one .ple file in the C runtime (plerun, the code the microcontroller runs) four ways: fp32 (activations and KV
cache in float32: the reference), int8 activations, int8 KV cache, both. On held-out text, per domain, in windows of
the model's context, teacher-forced: next-token loss (nats/token) of every path, its paired difference from fp32 per
window (mean and 95 % t-interval over windows), and top-1 agreement with fp32 (the share of positions whose argmax
is fp32's). Free-running: greedy continuations of held-out prompts, each path against fp32: identical tokens and
tokens before the first divergence. The greedy head skip runs on the int8 path and must give its ids (checked); the
share of head rows it computed is reported.

    python benchmarks/edge_int8_quality.py model.ple --valid ../shared/data/valid/en_novel.txt --max-tokens 8192
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from plelab.data.tokenizer import Tokenizer  # noqa: E402
from plelab.edge import c_engine  # noqa: E402
from plelab.edge.format import PleFile  # noqa: E402
from plelab.stats import t_critical  # noqa: E402

PATHS = {"fp32": ("fp32", "fp32"), "act8": ("int8", "fp32"), "kv8": ("fp32", "int8"), "act8_kv8": ("int8", "int8")}


def plerun(binary: Path, model: Path, ids: list[int], steps: int, act: str, kv: str, *extra: str) -> dict:
    """One plerun --json run (greedy)."""
    cmd = [str(binary), str(model), "--ids", ",".join(map(str, ids)), "--steps", str(steps), "--json",
           "--act", act, "--kv", kv, "--verify-none", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"plerun failed: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def window_logits(binary: Path, model: Path, ids: list[int], act: str, kv: str, vocab: int) -> np.ndarray:
    """Logits (len(ids), vocab) with every position fed from `ids` (teacher forcing)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as dump:
        plerun(binary, model, ids, len(ids), act, kv, "--dump-logits", dump.name)
        return np.fromfile(dump.name, np.float32).reshape(len(ids), vocab)


def nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per-position next-token NLL in nats (float64)."""
    z = logits.astype(np.float64)
    m = z.max(-1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(z - m).sum(-1))
    return lse - z[np.arange(len(targets)), targets]


def interval(deltas: list[float]) -> dict:
    """Mean and 95 % t-interval of paired per-window differences."""
    n = len(deltas)
    mean = float(np.mean(deltas))
    half = t_critical(n) * float(np.std(deltas, ddof=1)) / math.sqrt(n) if n > 1 else math.nan
    return {"mean": mean, "ci95": [mean - half, mean + half], "windows": n}


def main(argv: list[str] | None = None) -> dict:
    """Measure and print JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help=".ple file (int8 or int4 export of a trained model, with its tokenizer)")
    p.add_argument("--valid", nargs="+", required=True, help="held-out text files (one domain each)")
    p.add_argument("--max-tokens", type=int, default=8192, help="tokens per domain (default 8192)")
    p.add_argument("--prompts", type=int, default=16, help="free-running prompts per domain (default 16)")
    p.add_argument("--prompt-len", type=int, default=16, help="tokens per prompt (default 16)")
    p.add_argument("--generate", type=int, default=64, help="greedy tokens per prompt (default 64)")
    args = p.parse_args(argv)
    model = Path(args.model)
    with PleFile(model) as f:
        layout, tok_json = f.layout, f.tokenizer_json()
    if tok_json is None:
        raise SystemExit(f"{model} has no tokenizer; export it from a run that has one")
    tok = Tokenizer.from_json(tok_json)
    vocab, ctx = layout.model["vocab_size"], layout.model["max_seq_len"]
    binary = c_engine.build()
    result: dict = {"model": str(model), "quant": layout.quant, "domains": {}}
    for path in args.valid:
        name = Path(path).stem
        ids = np.asarray(tok.encode(Path(path).read_text(encoding="utf-8")), np.int64)[: args.max_tokens + 1]
        per_path = {k: [] for k in PATHS}
        agree = {k: [0, 0] for k in PATHS}
        for s in range(0, len(ids) - 1, ctx):
            n = min(ctx, len(ids) - 1 - s)
            x, y = ids[s : s + n].tolist(), ids[s + 1 : s + 1 + n]
            ref = None
            for key, (act, kv) in PATHS.items():
                logits = window_logits(binary, model, x, act, kv, vocab)
                per_path[key].append(float(nll(logits, y).sum()))
                top = logits.argmax(-1)
                ref = top if ref is None else ref
                agree[key][0] += int((top == ref).sum())
                agree[key][1] += n
        tokens = sum(min(ctx, len(ids) - 1 - s) for s in range(0, len(ids) - 1, ctx))
        windows = [min(ctx, len(ids) - 1 - s) for s in range(0, len(ids) - 1, ctx)]
        row: dict = {"tokens": tokens, "loss": {k: sum(v) / tokens for k, v in per_path.items()}}
        row["loss_delta_vs_fp32"] = {k: interval([(a - b) / w for a, b, w in zip(v, per_path["fp32"], windows,
                                                                                   strict=True)])
                                     for k, v in per_path.items() if k != "fp32"}
        row["top1_agreement_vs_fp32"] = {k: a / t for k, (a, t) in agree.items() if k != "fp32"}
        # free-running greedy continuations of held-out prompts
        free = {k: {"identical": 0, "before_divergence": []} for k in PATHS if k != "fp32"}
        skip_rows, skip_total, steps = 0, 0, args.prompt_len + args.generate - 1
        starts = np.linspace(0, max(0, len(ids) - args.prompt_len - 1), args.prompts).astype(int)
        for st in starts:
            prompt = ids[st : st + args.prompt_len].tolist()
            outs = {k: plerun(binary, model, prompt, steps, *PATHS[k])["tokens"][args.prompt_len :] for k in PATHS}
            skipped = plerun(binary, model, prompt, steps, "int8", "fp32", "--head-skip")
            if skipped["tokens"][args.prompt_len :] != outs["act8"]:
                raise SystemExit("the greedy head skip changed the ids: a bug")
            skip_rows += skipped["head_rows_computed"]
            skip_total += skipped["head_rows"]
            for k in free:
                same = [a == b for a, b in zip(outs[k], outs["fp32"], strict=True)]
                free[k]["identical"] += sum(same)
                free[k]["before_divergence"].append(same.index(False) if False in same else len(same))
        row["greedy_vs_fp32"] = {k: {"identical_share": v["identical"] / (len(starts) * len(outs["fp32"])),
                                     "mean_tokens_before_divergence": float(np.mean(v["before_divergence"])),
                                     "prompts": len(starts), "generated": len(outs["fp32"])}
                                 for k, v in free.items()}
        row["head_skip_rows_computed_share"] = skip_rows / skip_total
        result["domains"][name] = row
        print(f"{name}: " + json.dumps(row["loss"]), file=sys.stderr)
    result["command"] = "python " + " ".join(shlex.quote(a) for a in [sys.argv[0], *(argv or sys.argv[1:])])
    result["engine"] = f"plerun ({binary})"
    json.dump(result, sys.stdout, indent=2)
    print()
    return result


if __name__ == "__main__":
    main()
