"""The training loop: micro-batches, AdamW + lazy sparse Adam, warmup-cosine, clipping, checkpoints, resume.

The model knows nothing of this file; everything optional (diagnostics, TensorBoard, W&B) hangs on
callbacks. A run directory holds config.json, metrics.jsonl, checkpoints/ and whatever callbacks write.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import random
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.errors import PlelabError
from plelab.model.transformer import LanguageModel
from plelab.training.callbacks import Callback
from plelab.training.checkpoint import (
    atomic_write_bytes,
    load_training_state,
    prune_checkpoints,
    read_weights,
    resolve_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)
from plelab.training.config import TrainConfig, train_config_dict
from plelab.training.data_access import TrainingData
from plelab.training.mfu import measure_matmul_peak, mfu, train_flops_per_token
from plelab.training.optim import Optimizer, grad_norm_and_clip, lr_at


class TrainingStopped(PlelabError):
    """Training stopped on purpose (too many non-finite losses, disk full, ...); checkpoints are intact."""


def pick_device(name: str = "auto") -> torch.device:
    """cuda if present, then mps, else cpu; or the named device."""
    if name != "auto":
        return torch.device(name)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def autocast_context(device: torch.device, dtype: str):
    """bf16 autocast where the hardware has it (or when asked), otherwise a no-op context."""
    use_bf16 = dtype == "bf16" or (
        dtype == "auto" and device.type == "cuda" and torch.cuda.is_bf16_supported()
    )
    if use_bf16:
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def format_eta(seconds: float) -> str:
    """h:mm:ss for progress lines."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def rng_state() -> dict[str, Any]:
    """Every RNG a run touches (python, numpy, torch, cuda)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what `rng_state` returned."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class Trainer:
    """Runs one training job into `run_dir`; `run()` returns the final metrics."""

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        callbacks: list[Callback] | None = None,
        resume: bool = False,
        quiet: bool = False,
    ):
        self.config = cfg
        self.run_dir = Path(run_dir)
        self.callbacks = list(callbacks or [])
        self.quiet = quiet
        self.device = pick_device(cfg.device)
        self.total_steps = cfg.max_steps
        self.step = 0
        self.bad_steps = 0
        self.skipped_steps = 0
        self.tokens_seen = 0
        self.last_eval: dict[str, Any] | None = None
        self._stop_signal: int | None = None

        self.data = TrainingData(cfg, self.device)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        torch.manual_seed(cfg.seed)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        self.model = LanguageModel(cfg.model).to(self.device)
        self.optimizer = Optimizer(self.model, cfg)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.flops_per_token = train_flops_per_token(cfg.model, cfg.context)
        self.peak_flops = measure_matmul_peak(seconds=0.3) if self.device.type == "cpu" else None
        self.metrics_path = self.run_dir / "metrics.jsonl"
        if resume:
            self._resume()
        else:
            self._start_fresh()

    # ----------------------------------------------------------------- set-up and resume
    def _start_fresh(self) -> None:
        if (self.run_dir / "checkpoints").is_dir() and any((self.run_dir / "checkpoints").glob("step_*")):
            raise PlelabError(f"{self.run_dir} already holds a run; use --resume to continue it or pick a new --out")
        (self.run_dir / "config.json").write_text(json.dumps(train_config_dict(self.config), indent=2))
        self.metrics_path.write_text("")

    def _resume(self) -> None:
        try:
            ckpt = resolve_checkpoint(self.run_dir)
        except PlelabError:
            self.log_line(f"no checkpoint in {self.run_dir}; starting from scratch")
            self._start_fresh()
            return
        verify_checkpoint(ckpt)
        self.model.load_state_dict(read_weights(ckpt, self.model, self.device))
        state = load_training_state(ckpt)
        self.optimizer.load_state_dict(state["optimizer"])
        self.data.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.bad_steps, self.skipped_steps = state["bad_steps"], state["skipped_steps"]
        self.tokens_seen = state["tokens_seen"]
        for cb, cb_state in zip(self.callbacks, state.get("callbacks", []), strict=False):
            cb.load_state_dict(cb_state)
        self._truncate_metrics(self.step)
        self.log_line(f"resumed from {ckpt} at step {self.step}")

    def _truncate_metrics(self, step: int) -> None:
        """Drop metric lines logged after the checkpoint we resume from (they will be logged again)."""
        if not self.metrics_path.exists():
            return
        keep = []
        for line in self.metrics_path.read_text().splitlines():
            try:
                if json.loads(line).get("step", 0) <= step:
                    keep.append(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
        self.metrics_path.write_text("".join(k + "\n" for k in keep))

    # ----------------------------------------------------------------- logging
    def log_line(self, text: str) -> None:
        """Progress line on stdout (unless quiet)."""
        if not self.quiet:
            print(text, flush=True)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """Append one JSON object to metrics.jsonl."""
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")

    # ----------------------------------------------------------------- checkpoints
    def save(self) -> Path:
        """Write a checkpoint of the current step (atomic) and prune old ones."""
        state = {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "data": self.data.state_dict(),
            "rng": rng_state(),
            "bad_steps": self.bad_steps,
            "skipped_steps": self.skipped_steps,
            "tokens_seen": self.tokens_seen,
            "callbacks": [cb.state_dict() for cb in self.callbacks],
        }
        ckpts = self.run_dir / "checkpoints"
        name = f"step_{self.step:08d}"
        try:
            path = save_checkpoint(
                ckpts / name, self.model, train_config_dict(self.config), state, self.data.tokenizer_path
            )
            atomic_write_bytes(ckpts / "LATEST", name.encode())
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise TrainingStopped(
                    f"disk full while writing checkpoint {name}; the previous checkpoint is intact, "
                    "free space and rerun with --resume"
                ) from exc
            raise
        prune_checkpoints(ckpts, self.config.keep_checkpoints)
        for cb in self.callbacks:
            cb.on_checkpoint(self, path)
        return path

    # ----------------------------------------------------------------- evaluation
    def evaluate(self, max_tokens: int | None = None) -> dict[str, Any] | None:
        """Per-domain loss and bits per byte on eval_data (None when there is none)."""
        if not self.data.eval_domains:
            return None
        from plelab.training.evaluate import evaluate_domains

        results = evaluate_domains(
            self.model, self.data.eval_domains, self.config.context, self.config.batch_size,
            max_tokens=max_tokens, autocast=autocast_context(self.device, self.config.dtype),
        )
        self.last_eval = results
        self.log_metrics({"step": self.step, "eval": results})
        for cb in self.callbacks:
            cb.on_eval(self, results)
        self.log_line(
            f"eval step {self.step}: macro loss {results['macro']['loss']:.4f} bpb {results['macro']['bpb']:.4f}"
        )
        return results

    # ----------------------------------------------------------------- the loop
    def _handle_signal(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self._stop_signal = signum

    def train_step(self) -> dict[str, Any] | None:
        """One optimizer step over grad_accum micro-batches; None when the loss was not finite (skipped)."""
        cfg = self.config
        lr = lr_at(self.step, cfg)
        self.optimizer.set_lr(lr)
        self.model.train()
        total = 0.0
        for _ in range(cfg.grad_accum):
            x, y = self.data.next_batch()
            with autocast_context(self.device, cfg.dtype):
                _, loss = self.model(x, y, return_logits=False)
            (loss / cfg.grad_accum).backward()
            total += float(loss.detach()) / cfg.grad_accum
        metrics: dict[str, Any] = {"step": self.step + 1, "loss": total, "lr": lr}
        if not math.isfinite(total):
            self.optimizer.zero_grad()
            return None
        for cb in self.callbacks:
            cb.on_after_backward(self, metrics)
        gnorm = grad_norm_and_clip(self.params, cfg.grad_clip)
        if not math.isfinite(gnorm):
            self.optimizer.zero_grad()
            return None
        self.optimizer.step()
        self.optimizer.zero_grad()
        metrics["grad_norm"] = gnorm
        return metrics

    def run(self) -> dict[str, Any]:
        """Train to max_steps (resumable at any moment); returns the last step's metrics and final eval."""
        cfg = self.config
        old = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        for cb in self.callbacks:
            cb.on_train_start(self)
        self.log_line(
            f"training {cfg.max_steps} steps x {cfg.tokens_per_step:,} tokens on {self.device} "
            f"({sum(p.numel() for p in self.model.parameters()):,} params) -> {self.run_dir}"
        )
        last: dict[str, Any] = {}
        t_start, steps_timed = time.perf_counter(), 0
        try:
            while self.step < cfg.max_steps:
                t0 = time.perf_counter()
                metrics = self.train_step()
                if metrics is None:
                    self.bad_steps += 1
                    self.skipped_steps += 1
                    self.step += 1
                    self.log_metrics({"step": self.step, "loss": None, "skipped": "non-finite loss or gradient"})
                    self.log_line(f"step {self.step}: non-finite loss, step skipped ({self.bad_steps} in a row)")
                    if self.bad_steps >= cfg.max_bad_steps:
                        raise TrainingStopped(
                            f"{self.bad_steps} non-finite losses in a row at step {self.step}; "
                            f"stopping with the last good checkpoint intact in {self.run_dir / 'checkpoints'} "
                            "(lower lr or check the data)"
                        )
                    continue
                self.bad_steps = 0
                self.step += 1
                self.tokens_seen += cfg.tokens_per_step
                dt = time.perf_counter() - t0
                steps_timed += 1
                tok_s = cfg.tokens_per_step / dt
                metrics.update(tokens=self.tokens_seen, tokens_per_s=tok_s, step_time=dt)
                if self.peak_flops:
                    metrics["mfu"] = mfu(tok_s, cfg.model, self.peak_flops, seq_len=cfg.context)
                for cb in self.callbacks:
                    cb.on_step_end(self, metrics)
                self.log_metrics(metrics)
                last = metrics
                if self.step % cfg.log_every == 0 or self.step == cfg.max_steps:
                    if self.peak_flops:
                        # The peak measured at start-up may have been under load: keep the best seen so far,
                        # so MFU converges to the true fraction instead of overshooting 100 %.
                        self.peak_flops = max(self.peak_flops, measure_matmul_peak(size=512, seconds=0.05))
                    elapsed = time.perf_counter() - t_start
                    eta = elapsed / steps_timed * (cfg.max_steps - self.step)
                    mfu_txt = f" mfu {metrics['mfu']:.1%}" if "mfu" in metrics else ""
                    self.log_line(
                        f"step {self.step}/{cfg.max_steps} loss {metrics['loss']:.4f} lr {metrics['lr']:.2e} "
                        f"gnorm {metrics['grad_norm']:.2f} {tok_s:,.0f} tok/s{mfu_txt} eta {format_eta(eta)}"
                    )
                if cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.max_steps:
                    self.evaluate(cfg.eval_tokens)
                if self.step % cfg.ckpt_every == 0 or self.step == cfg.max_steps:
                    self.save()
                if self._stop_signal is not None:
                    self.save()
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            self.log_line(f"interrupted at step {self.step}; checkpoint saved, continue with --resume")
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        last["final_eval"] = self.evaluate(cfg.eval_tokens)
        for cb in self.callbacks:
            cb.on_train_end(self)
        return last
