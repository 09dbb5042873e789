"""The main job: train a small PLE model and its dP = 0 twin on the same tokens, compare them per domain, and end
with the pays verdict (plelab.diagnostics: the paired loss difference on the same evaluation batches).

Default corpus: the running Python's own standard library sources (every fresh machine has them):
modules and their tests are split by a stable hash of the file path into training files and held-out
evaluation domains. With `--data DIR`, DIR/train is the corpus and DIR/valid the domains (both required).
"""

from __future__ import annotations

import hashlib
import json
import sysconfig
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from plelab.data.prepare import prepare_dataset, resolve_tokenizer
from plelab.data.sources import SourceOptions
from plelab.diagnostics.diagnose_run import pays_between, pays_line
from plelab.errors import PlelabError
from plelab.model.params import count_params
from plelab.training.config import TrainConfig, load_train_config
from plelab.training.trainer import Trainer
from plelab.util.fs import check_output_path

SEPARATOR = "\n<|endoftext|>\n"


@dataclass
class Corpus:
    """Training inputs and a folder of evaluation domain files."""

    train: list[Path]
    valid_dir: Path
    options: SourceOptions
    description: str


def _held_out(path: Path) -> bool:
    return int(hashlib.sha256(str(path.name).encode()).hexdigest(), 16) % 10 == 0


def stdlib_corpus(work: Path, max_bytes: int) -> Corpus:
    """Split the standard library's .py files into training files and held-out domain files under work/valid."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.stat().st_size > 0)
    if not files:
        raise PlelabError(f"no Python sources found under {root}; pass --data DIR instead")
    train: list[Path] = []
    domains: dict[str, list[Path]] = {"stdlib_modules": [], "stdlib_tests": []}
    total = 0
    for f in files:
        is_test = "test" in f.parts or "tests" in f.parts or f.name.startswith("test_")
        if _held_out(f):
            domains["stdlib_tests" if is_test else "stdlib_modules"].append(f)
        elif total < max_bytes:
            train.append(f)
            total += f.stat().st_size
    valid = work / "valid"
    valid.mkdir(parents=True, exist_ok=True)
    for name, members in domains.items():
        texts, size = [], 0
        for f in members:
            text = f.read_text(encoding="utf-8", errors="replace")
            if size + len(text) > 400_000:
                break
            texts.append(text)
            size += len(text)
        (valid / f"{name}.txt").write_text(SEPARATOR.join(texts) + "\n", encoding="utf-8")
    desc = f"Python {sysconfig.get_python_version()} standard library: {len(train)} files, {total / 1e6:.1f} MB"
    return Corpus(train, valid, SourceOptions(format="text"), desc)


def data_corpus(data: Path) -> Corpus:
    """A user folder laid out as ../shared/data: DIR/train (the corpus) and DIR/valid (domain .txt files).

    Checked before anything is prepared or trained: the comparison needs both, and without DIR/train the
    domain files would leak into the training text.
    """
    if not data.is_dir():
        raise PlelabError(f"--data {data}: not a folder (give a folder holding train/ and valid/)")
    missing = [name for name in ("train", "valid") if not (data / name).is_dir()]
    if missing:
        raise PlelabError(f"--data {data}: no {' or '.join(f'{m}/' for m in missing)} folder; the demo trains on "
                          "DIR/train and compares the twins on the domain .txt files in DIR/valid")
    if not any((data / "valid").glob("*.txt")):
        raise PlelabError(f"--data {data}: valid/ holds no domain .txt files to compare the twins on")
    return Corpus([data / "train"], data / "valid", SourceOptions(), f"{data}/train")


def demo_config(run: Path, base: dict[str, Any], steps: int, valid: Path | None) -> TrainConfig:
    """The shared training config of both twins."""
    cfg = dict(
        data=str(run / "data"), eval_data=str(valid) if valid else "", batch_size=16, max_steps=steps,
        warmup_steps=max(1, steps // 20), lr=3e-3, log_every=max(1, steps // 10), ckpt_every=max(1, steps // 4),
        eval_tokens=60_000, model=base,
        # fp32: at the demo's width (H = 128) bf16 autocast is ~10 % slower per step on a CPU, even one with
        # native bf16 (measured), and the demo's budget is wall time.
        dtype="fp32",
    )
    return load_train_config(cfg)


def run_demo(
    out: Path, data: Path | None = None, minutes: float = 6.0, preset: str = "mini-ple", vocab_size: int = 4096,
    max_corpus_mb: float = 12.0, steps: int | None = None, say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Prepare data, train PLE and its dP = 0 twin for the same steps, evaluate both per domain; return the table.

    `say` receives the progress lines (corpus, timing, each run's start); the trainers print their own."""
    t0 = time.perf_counter()
    corpus = data_corpus(data) if data else None  # a bad --data fails here, before anything is written
    check_output_path(out, overwrite=True, is_dir=True)  # the work folder is resumed, never a file
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus or stdlib_corpus(out, int(max_corpus_mb * 1e6))
    say(f"corpus: {corpus.description}")
    tok_path = out / "tokenizer.json"
    if not (out / "data" / "manifest.json").exists():
        tokenizer = resolve_tokenizer(tok_path, corpus.train, vocab_size=vocab_size, max_bytes=int(4e6),
                                      options=corpus.options)
        prepare_dataset(corpus.train, tokenizer, out / "data", options=corpus.options, val_fraction=0.01,
                        progress=True)
    base = {"preset": preset, "vocab_size": vocab_size}
    ple_dim = load_train_config({"model": base}).model.ple.dim
    if steps is None:
        steps = _steps_for_budget(out, base, corpus.valid_dir, minutes * 60 - (time.perf_counter() - t0), say)
    results = {}
    for name, overrides in (("ple", []), ("base", ["model.ple.dim=0"])):
        cfg = demo_config(out, base, steps, corpus.valid_dir)
        if overrides:
            cfg = load_train_config(json.loads(json.dumps(_plain(cfg))), overrides)
        run_dir = out / name
        resume = (run_dir / "checkpoints").is_dir()
        say(f"\n== {name}: dP={cfg.model.ple.dim}, {count_params(cfg.model)['total']:,} params, {steps} steps ==")
        final = Trainer(cfg, run_dir, resume=resume).run()
        results[name] = {"final": final["final_eval"], "params": count_params(cfg.model),
                         "tokens": final.get("tokens"), "train_loss": final.get("loss")}
    pays = pays_between(out / "ple", out / "base", str(corpus.valid_dir))
    summary = compare(results, ple_dim, steps, time.perf_counter() - t0)
    summary["pays"] = {k: pays[k] for k in ("verdict", "reason", "delta", "se", "n_batches", "twin", "data")}
    summary["pays"].update(ci95=pays["test"]["ci95"], run=str(out / "ple"))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def _plain(cfg: TrainConfig) -> dict[str, Any]:
    from plelab.training.config import train_config_dict

    return train_config_dict(cfg)


def _steps_for_budget(out: Path, base: dict[str, Any], valid: Path | None, seconds: float,
                      say: Callable[[str], None] = print) -> int:
    """Time a few steps of the PLE model and pick the step count that fits both runs in `seconds`."""
    cfg = demo_config(out, base, 8, valid)
    cfg = load_train_config(_plain(cfg), ["eval_data=", "ckpt_every=1000"])
    probe = Trainer(cfg, out / "probe", quiet=True)
    probe.train_step()  # warm-up
    t = time.perf_counter()
    for _ in range(4):
        probe.train_step()
    per_step = (time.perf_counter() - t) / 4
    import shutil

    shutil.rmtree(out / "probe", ignore_errors=True)
    # 2 runs; the dP = 0 twin is a little faster; keep ~25 % for evaluation and checkpoints.
    steps = int(0.75 * seconds / (2 * per_step))
    say(f"timing: {per_step * 1000:.0f} ms/step with PLE on {torch.get_num_threads()} threads -> {steps} steps each")
    if steps < 20:
        raise PlelabError(f"only {steps} steps fit in the time budget; give more --minutes")
    return steps


def compare(results: dict[str, Any], ple_dim: int, steps: int, seconds: float) -> dict[str, Any]:
    """Per-domain loss / bpb of both twins and the PLE - base differences."""
    ple, base = results["ple"]["final"], results["base"]["final"]
    rows = {}
    for name in ple["domains"]:
        a, b = ple["domains"][name], base["domains"][name]
        rows[name] = {"ple_loss": a["loss"], "base_loss": b["loss"], "delta_loss": a["loss"] - b["loss"],
                      "ple_bpb": a["bpb"], "base_bpb": b["bpb"]}
    macro = {"ple_loss": ple["macro"]["loss"], "base_loss": base["macro"]["loss"],
             "delta_loss": ple["macro"]["loss"] - base["macro"]["loss"],
             "ple_bpb": ple["macro"]["bpb"], "base_bpb": base["macro"]["bpb"]}
    return {"ple_dim": ple_dim, "steps": steps, "tokens_each": results["ple"]["tokens"], "seconds": seconds,
            "params": {k: v["params"]["total"] for k, v in results.items()},
            "ple_added": results["ple"]["params"]["ple_added"], "domains": rows, "macro": macro}


def format_comparison(summary: dict[str, Any]) -> str:
    """The per-domain comparison as a text table."""
    lines = [
        f"PLE (dP={summary['ple_dim']}, {summary['params']['ple']:,} params) vs dP=0 twin "
        f"({summary['params']['base']:,} params), {summary['steps']} steps / {summary['tokens_each']:,} tokens each",
        f"{'domain':<22} {'PLE loss':>9} {'base loss':>10} {'delta':>8} {'PLE bpb':>8} {'base bpb':>9}",
    ]
    for name, r in list(summary["domains"].items()) + [("macro", summary["macro"])]:
        lines.append(f"{name:<22} {r['ple_loss']:>9.4f} {r['base_loss']:>10.4f} {r['delta_loss']:>+8.4f} "
                     f"{r['ple_bpb']:>8.4f} {r['base_bpb']:>9.4f}")
    lines.append(f"total time {summary['seconds'] / 60:.1f} min; negative delta = PLE better")
    if summary.get("pays"):
        lines += ["", pays_line({**summary["pays"], "test": True}),
                  f"  `plelab diagnose {summary['pays']['run']}` adds whether the model uses its table (ablation): "
                  "dependence, which is not benefit"]
    return "\n".join(lines)
