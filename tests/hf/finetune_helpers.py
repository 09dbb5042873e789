"""Shared by the fine-tuning tests: the small run settings, running `plelab finetune`, reading its results."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

SMALL = ["--set", "seq_len=32", "--set", "batch_size=4", "--set", "max_steps=24", "--set", "lr=5e-3",
         "--set", "warmup_steps=3", "--set", "log_every=8", "--set", "ckpt_every=12", "--set", "eval_tokens=768",
         "--set", "dtype=fp32", "--quiet"]


def finetune_argv(folder: Path, data: Path, valid: Path, out: Path, *extra: str) -> list[str]:
    """argv of `plelab finetune` with the small settings."""
    return ["finetune", "--hf", str(folder), "--data", str(data), "--out", str(out),
            "--set", f"eval_data={valid}", *SMALL, *extra]


def metrics(run: Path) -> list[dict]:
    """metrics.jsonl of a run."""
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_losses(run: Path) -> dict[int, float]:
    """{step: training loss}."""
    return {m["step"]: m["loss"] for m in metrics(run) if "loss" in m and "eval" not in m}


def evals(run: Path) -> dict[int, dict]:
    """{step: evaluation result}."""
    return {m["step"]: m["eval"] for m in metrics(run) if "eval" in m}


def training_tokens(data: Path, n: int = 24) -> torch.Tensor:
    """Two sequences of the training split's first tokens (ids the fine-tune has seen: trained table rows)."""
    from plelab.data.loader import TokenDataset

    return torch.from_numpy(np.asarray(TokenDataset(data, "train").get(0, 2 * n)).astype(np.int64)).view(2, n)


def peft_logits(base: Path, adapter: Path, x: torch.Tensor, delta: bool = False) -> torch.Tensor:
    """Logits of PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter) (fp32), with the
    table delta added when `delta`."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from plelab.hf.finetune.table_delta import DELTA_FILE, apply_table_delta

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    if delta:
        apply_table_delta(model, adapter / DELTA_FILE)
    model = PeftModel.from_pretrained(model, adapter).eval()
    with torch.no_grad():
        return model(input_ids=x).logits


def hf_logits(folder: Path, x: torch.Tensor) -> torch.Tensor:
    """Logits of AutoModelForCausalLM.from_pretrained(folder) (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=x).logits


def plelab_logits(run: Path, x: torch.Tensor) -> torch.Tensor:
    """Logits of plelab's fine-tuned model, loaded from the run's newest checkpoint."""
    from plelab.hf.finetune.trainer import load_finetuned

    model, _ = load_finetuned(run)
    with torch.no_grad():
        return model(x)[0]
