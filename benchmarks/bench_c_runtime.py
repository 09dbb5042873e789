"""Decode speed of plelab's C runtime (`plerun`) against karpathy/llama2.c's `run.c` on the same dense shape.

llama2.c (vendored unmodified in third_party/llama2c/) runs a random model of the preset's dense shape written by
its own export.py (legacy v0 fp32 file, the one run.c reads); plerun runs the preset's int4 and fp32 .ple exports,
PLE included. Both binaries are built here by the same compiler with the same flags (`--openmp` adds -fopenmp to
both), run with the same thread count (OMP_NUM_THREADS, and plerun's --threads), the same prompt token ids, greedy,
for the same number of positions (prompt included), in alternating order after one warm-up run each; medians over
the repeats. Each side's tok/s is its own in-process figure: llama2.c's "achieved tok/s" line (positions after the
first, millisecond clock) and plerun's JSON `tok_per_s`. Prints JSON with the command that produced it.

    python3 benchmarks/bench_c_runtime.py                        # 1 thread, -Ofast -march=native, 250 positions
    python3 benchmarks/bench_c_runtime.py --openmp --threads 2   # -fopenmp on both sides, 2 threads each
    python3 benchmarks/bench_c_runtime.py --quick                # tiny shape, one round: a smoke run in seconds
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import math
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from plelab.cli import options  # noqa: E402
from plelab.errors import PlelabError  # noqa: E402

if TYPE_CHECKING:
    from plelab.model.config import ModelConfig

LLAMA2C = REPO / "third_party" / "llama2c"
TARGET = 1.0  # issue 13: our tokens/s >= 1.0x llama2.c at the same thread count
# --quick: small enough that exporting and running both sides takes seconds (PLE stays on), big enough that a
# llama2.c run outlasts its millisecond clock (it reports inf tok/s otherwise).
QUICK_SET = ["vocab_size=4096", "hidden_size=64", "num_layers=2", "ffn.intermediate_size=64", "ple.dim=16",
             "max_seq_len=64"]
ACHIEVED = re.compile(r"achieved tok/s:\s*(\S+)")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="esp32-28m", help="model preset: its dense shape is what llama2.c runs")
    p.add_argument("--threads", type=options.positive_int, default=1, help="threads on both sides (default 1)")
    p.add_argument("--openmp", action="store_true", help="build both sides with -fopenmp (needed for --threads > 1)")
    p.add_argument("--cflags", default="-Ofast -march=native", help="C flags for both builds")
    p.add_argument("--steps", type=options.positive_int, default=None,
                   help="positions decoded, prompt included (default 250; 64 with --quick)")
    p.add_argument("--repeats", type=options.positive_int, default=None,
                   help="timed runs per side, median reported (default 9; 1 with --quick)")
    p.add_argument("--prompt", default="Once upon a time", help="prompt text (llama2.c) = token ids (plerun)")
    p.add_argument("--cache", type=Path, default=None,
                   help="where llama2.c's binary, model and tokenizer are kept (default ~/.cache/plelab/bench_c)")
    p.add_argument("--quick", action="store_true", help="tiny shape, 64 positions, one round: a smoke run")
    args = p.parse_args(argv)
    args.overrides = list(QUICK_SET) if args.quick else []
    args.steps = args.steps or (64 if args.quick else 250)
    args.repeats = args.repeats or (1 if args.quick else 9)
    if args.threads > 1 and not args.openmp:
        p.error("--threads > 1 needs --openmp: run.c is single-threaded without it")
    if args.cache is None:
        args.cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "plelab" / "bench_c"
    return args


def digest(*parts: str | bytes) -> str:
    """A short content hash naming a cached artefact (it changes whenever any input changes)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def checked(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    """Run a command; a failure is one PlelabError line naming the command and the last line it printed."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1]
        raise PlelabError(f"{shlex.join(cmd)} failed with status {proc.returncode}: {last}")
    return proc


def c_flags(cflags: str, openmp: bool) -> list[str]:
    """Every flag plelab.edge.c_engine.build passes to the compiler for these options: llama2.c gets the same.

    Its fixed part (-std=c99, warnings, -ffp-contract=fast) leaves run.c's generated code unchanged (same assembly
    as `-Ofast -march=native` alone with gcc 12); using it anyway makes the two command lines identical.
    """
    from plelab.edge import c_engine

    return c_engine.compile_flags(cflags, openmp)


def cached(path: Path, make: Callable[[Path], None]) -> Path:
    """`path`, made by `make(tmp)` then renamed into place when absent, so an interrupted build never lingers."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            make(tmp)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    return path


def build_llama2c(cache: Path, cc: str, cc_version: str, flags: list[str]) -> Path:
    """llama2.c's run.c compiled as our runtime is (same compiler, same flags), cached by source and flags."""
    source = LLAMA2C / "run.c"
    key = digest(source.read_bytes(), cc, cc_version, *flags)
    return cached(cache / f"run-{key}",
                  lambda tmp: checked([*shlex.split(cc), *flags, "-o", str(tmp), str(source), "-lm"]))


def llama2c_model(cache: Path, cfg: ModelConfig) -> Path:
    """A random llama2.c model with the dense shape of `cfg`, written by llama2.c's own export.py (v0 fp32)."""
    if cfg.ffn.kind != "swiglu" or cfg.head_size * cfg.num_heads != cfg.hidden_size or not cfg.tie_embeddings:
        raise PlelabError("llama2.c models are SwiGLU, tied, with head size = hidden / heads; this preset is not")
    model_args = dict(dim=cfg.hidden_size, n_layers=cfg.num_layers, n_heads=cfg.num_heads,
                      n_kv_heads=cfg.kv_heads, vocab_size=cfg.vocab_size, hidden_dim=cfg.ffn.intermediate_size,
                      max_seq_len=cfg.max_seq_len, dropout=0.0)
    sources = [(LLAMA2C / name).read_bytes() for name in ("export.py", "model.py")]
    key = digest(*sources, json.dumps(model_args, sort_keys=True))

    def make(tmp: Path) -> None:
        import torch

        with tempfile.TemporaryDirectory() as d:
            # export.py's --checkpoint loader builds Transformer(ModelArgs(**model_args)), i.e. llama2.c's own
            # initialisation from torch's fixed default seed, then loads the state dict non-strictly: an empty
            # one keeps those random weights.
            ckpt = Path(d) / "random.pt"
            torch.save({"model_args": model_args, "model": {}}, ckpt)
            checked([sys.executable, "export.py", str(tmp), "--version", "0", "--checkpoint", str(ckpt)],
                    cwd=LLAMA2C, env={**os.environ, "OMP_NUM_THREADS": "1"})

    return cached(cache / f"llama2c-{key}.bin", make)


def llama2c_tokenizer(cache: Path, vocab_size: int) -> Path:
    """A llama2.c tokenizer file of `vocab_size` tokens (run.c refuses to start without one)."""
    helper = LLAMA2C / "make_tokenizer_bin.py"
    key = digest(helper.read_bytes(), str(vocab_size))
    return cached(cache / f"tok{vocab_size}-{key}.bin", lambda tmp: checked(
        [sys.executable, str(helper), "--vocab-size", str(vocab_size), "--out", str(tmp)]))


def prompt_ids(text: str) -> list[int]:
    """The token ids run.c encodes `text` to with make_tokenizer_bin.py's vocabulary, so plerun gets the same.

    run.c prepends BOS (1) and the dummy prefix " " (259 there); each character is then its own token where the
    vocabulary has it (only " ") or its UTF-8 bytes as byte tokens (3 + byte). No merges apply: no
    concatenation of two such token strings is in that vocabulary.
    """
    ids = [1, 259] if text else [1]
    for ch in text:
        ids += [259] if ch == " " else [3 + b for b in ch.encode()]
    return ids


def export_ple(preset: str, overrides: list[str], quant: str, out: Path) -> Path:
    """Our model: `plelab export PRESET --quant QUANT --out OUT` (random weights, seed 0).

    Run in this process (torch is loaded here already; a subprocess would load it again), its summary muted so
    that stdout stays one JSON object.
    """
    from plelab.cli.main import main as plelab

    argv = ["export", preset, "--quant", quant, "--out", str(out), *(a for o in overrides for a in ("--set", o))]
    with contextlib.redirect_stdout(io.StringIO()):
        status = plelab(argv)
    if status:
        raise PlelabError(f"plelab {shlex.join(argv)} failed with status {status} (its error is above)")
    return out


@dataclass
class Sample:
    """One timed run: the program's own tok/s, the process wall time (load included) and its JSON if any."""

    tok_per_s: float
    wall_s: float
    report: dict = field(default_factory=dict)


def timed(cmd: list[str], env: dict[str, str], stdout: int | None) -> tuple[subprocess.CompletedProcess, float]:
    """Run a contender once; returns the finished process and its wall seconds."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        last = (proc.stderr.strip() or "no output").splitlines()[-1]
        raise PlelabError(f"{shlex.join(cmd)} failed with status {proc.returncode}: {last}")
    return proc, wall


def llama2c_runner(binary: Path, model: Path, tokenizer: Path, prompt: str, steps: int,
                   env: dict[str, str]) -> Callable[[], Sample]:
    """A closure running llama2.c greedily (-t 0) and reading its "achieved tok/s" line."""
    cmd = [str(binary), str(model), "-z", str(tokenizer), "-t", "0", "-n", str(steps), "-i", prompt]

    def run() -> Sample:
        # The generated text goes to /dev/null: the cheapest sink for the per-token printf+fflush run.c times.
        proc, wall = timed(cmd, env, subprocess.DEVNULL)
        found = ACHIEVED.search(proc.stderr)
        if not found:
            raise PlelabError(f"llama2.c printed no 'achieved tok/s' line: {proc.stderr.strip()[-200:]!r}")
        rate = float(found.group(1))
        if not math.isfinite(rate):
            raise PlelabError("llama2.c's run was shorter than its millisecond clock; use more --steps")
        return Sample(rate, wall)

    return run


def plerun_runner(binary: Path, model: Path, ids: list[int], steps: int, threads: int,
                  env: dict[str, str]) -> Callable[[], Sample]:
    """A closure running plerun greedily and reading `tok_per_s` from its JSON."""
    cmd = [str(binary), str(model), "--ids", ",".join(map(str, ids)), "--steps", str(steps),
           "--threads", str(threads), "--no-verify-table", "--json"]

    def run() -> Sample:
        proc, wall = timed(cmd, env, subprocess.PIPE)
        report = json.loads(proc.stdout)
        return Sample(float(report["tok_per_s"]), wall, report)

    return run


def alternate(runners: dict[str, Callable[[], Sample]], repeats: int) -> dict[str, list[Sample]]:
    """One untimed warm-up run each, then `repeats` rounds with the order rotating (reversed every other cycle).

    The machine is shared: rotation spreads slow periods over all contenders, and medians drop outliers.
    """
    names = list(runners)
    for name in names:
        runners[name]()
    samples: dict[str, list[Sample]] = {name: [] for name in names}
    n = len(names)
    for r in range(repeats):
        order = names[r % n :] + names[: r % n]
        if (r // n) % 2:
            order.reverse()
        for name in order:
            samples[name].append(runners[name]())
    return samples


def plerun_report(sample: Sample) -> dict:
    """plerun's own JSON from one run (traffic, peak RAM, arena), with the token list shortened to its length."""
    report = dict(sample.report)
    report["n_tokens"] = len(report.pop("tokens", []))
    return report


def summary(samples: list[Sample]) -> dict:
    """Median / min / max tok/s over the runs, and the median process wall time."""
    rates = [s.tok_per_s for s in samples]
    return {
        "tok_per_s_median": statistics.median(rates), "tok_per_s_min": min(rates), "tok_per_s_max": max(rates),
        "n": len(rates), "process_wall_s_median": statistics.median(s.wall_s for s in samples),
    }


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark and print its JSON."""
    args = parse(argv)
    command = "python3 " + shlex.join(["benchmarks/bench_c_runtime.py", *(sys.argv[1:] if argv is None else argv)])
    from plelab.edge import c_engine
    from plelab.model.presets import load_model_config

    t_start, load_start = time.perf_counter(), os.getloadavg()[0]
    cfg = load_model_config(args.preset, args.overrides)
    ids = prompt_ids(args.prompt)
    if not len(ids) < args.steps <= cfg.max_seq_len:
        raise PlelabError(f"--steps must exceed the prompt's {len(ids)} tokens and be <= {cfg.max_seq_len}")
    cc = c_engine.compiler()
    cc_version = checked([*shlex.split(cc), "--version"]).stdout.splitlines()[0]
    flags = c_flags(args.cflags, args.openmp)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    runners: dict[str, Callable[[], Sample]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_c_runtime.") as work:
        # Ours is exported afresh every time: the exporter evolves and a stale cached file would mislead.
        ples = {q: export_ple(args.preset, args.overrides, q, Path(work) / f"{q}.ple") for q in ("int4", "fp32")}
        llama_bin = build_llama2c(args.cache, cc, cc_version, flags)
        llama_model = llama2c_model(args.cache, cfg)
        runners["llama2c"] = llama2c_runner(llama_bin, llama_model, llama2c_tokenizer(args.cache, cfg.vocab_size),
                                            args.prompt, args.steps, env)
        plerun = c_engine.build(cflags=args.cflags, openmp=args.openmp)
        for q, ple in ples.items():
            runners[f"plerun_{q}"] = plerun_runner(plerun, ple, ids, args.steps, args.threads, env)
        samples = alternate(runners, args.repeats)
        sizes = {"llama2c": llama_model.stat().st_size, **{f"plerun_{q}": p.stat().st_size for q, p in ples.items()}}

    base = statistics.median(s.tok_per_s for s in samples["llama2c"])
    ratios = {q: statistics.median(s.tok_per_s for s in samples[f"plerun_{q}"]) / base for q in ("int4", "fp32")}
    result = {
        "command": command,
        "shape": {
            "preset": args.preset, "overrides": args.overrides, "hidden_size": cfg.hidden_size,
            "num_layers": cfg.num_layers, "num_heads": cfg.num_heads, "num_kv_heads": cfg.kv_heads,
            "ffn_intermediate": cfg.ffn.intermediate_size, "vocab_size": cfg.vocab_size,
            "max_seq_len": cfg.max_seq_len, "tied": cfg.tie_embeddings,
            "ple_dim_ours": cfg.ple.dim, "note": "llama2.c runs the dense shape; ours adds PLE",
        },
        "run": {
            "steps": args.steps, "prompt": args.prompt, "prompt_ids": ids, "greedy": True, "repeats": args.repeats,
            "warmup": 1, "order": "rotating (ABC, BCA, CAB, then reversed)", "threads": args.threads,
            "timing": "each program's own figure, both (positions - 1) / time from the second position on: "
                      "llama2.c 'achieved tok/s' (ms clock, stdout to /dev/null; it would stop early only on "
                      "sampling BOS), plerun JSON tok_per_s (ns clock, --no-verify-table)",
        },
        "build": {
            "cc": cc, "cc_version": cc_version, "cflags": args.cflags, "openmp": args.openmp,
            "flags_both_sides": shlex.join(flags),
            "llama2c_source": "third_party/llama2c/run.c (unmodified, see its README.md)",
            "llama2c_run_c_sha256": hashlib.sha256((LLAMA2C / "run.c").read_bytes()).hexdigest(),
        },
        "env": {
            "machine": platform.machine(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "OMP_NUM_THREADS": env["OMP_NUM_THREADS"], "loadavg_1m_start": load_start,
            "loadavg_1m_end": os.getloadavg()[0],
        },
        "file_bytes": sizes,
        "results": {name: summary(s) for name, s in samples.items()},
        "plerun_report": {q: plerun_report(samples[f"plerun_{q}"][-1]) for q in ("int4", "fp32")},
        "ratio_ours_over_llama2c": ratios,
        "target": TARGET,
        "meets_target": {q: r >= TARGET for q, r in ratios.items()},
        "wall_s": time.perf_counter() - t_start,
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    try:
        main()
    except PlelabError as exc:
        print(f"bench_c_runtime: {exc}", file=sys.stderr)
        sys.exit(2)
