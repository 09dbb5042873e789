"""The callbacks every run has: speed/MFU, console progress, evaluation and checkpoint cadence.

They register first (`plelab.training.callback_factory.callbacks_for` builds them in the order below), so
that a step's speed figures exist before anything logs them, and its evaluation runs before its checkpoint
is written.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from plelab.runs.checkpoint import CheckpointError, newest_verified_checkpoint
from plelab.training.callbacks import Callback, register_callback
from plelab.training.mfu import machine_peak, mfu


def format_eta(seconds: float) -> str:
    """h:mm:ss for progress lines."""
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class SpeedMonitor(Callback):
    """Adds tokens_per_s and, on CPU, MFU against the best GEMM peak this CPU has measured (mfu.machine_peak),
    which the run's first line states."""

    def __init__(self, peak_seconds: float = 0.3):
        self.peak_seconds = peak_seconds
        self.peak_flops: float | None = None

    def on_train_start(self, trainer: Any) -> None:
        # Only on CPU, against the GEMM peak of the precision the run computes in (a bf16 run measured
        # against the fp32 peak would report an MFU ~2.4x too high); accelerators have tensor cores.
        if trainer.device.type == "cpu" and self.peak_flops is None:
            dtype = torch.bfloat16 if trainer.precision.name == "bf16" else torch.float32
            peak = machine_peak(dtype=dtype, seconds=self.peak_seconds)
            self.peak_flops = peak["peak"]
            trainer.log_line(
                f"mfu is against a {peak['dtype']} GEMM peak of {peak['peak'] / 1e9:,.1f} GFLOP/s, the best of "
                f"{peak['measurements']} measurement(s) on this CPU ({peak['cpu']}, {peak['threads']} threads; "
                f"this start measured {peak['measured'] / 1e9:,.1f})" + (f"; {peak['note']}" if peak["note"] else ""))

    def on_step_end(self, trainer: Any, metrics: dict[str, Any]) -> None:
        cfg = trainer.config
        metrics["tokens_per_s"] = cfg.tokens_per_step / metrics["step_time"]
        if self.peak_flops:
            metrics["mfu"] = mfu(metrics["tokens_per_s"], cfg.model, self.peak_flops, seq_len=cfg.context)


class ProgressPrinter(Callback):
    """Console lines: the run's size at the start, loss/lr/speed/ETA every log_every steps, evaluation results."""

    def on_train_start(self, trainer: Any) -> None:
        cfg = trainer.config
        self.t_start, self.steps_timed = time.perf_counter(), 0
        trainer.log_line(
            f"training {cfg.max_steps} steps x {cfg.tokens_per_step:,} tokens on {trainer.device} "
            f"({sum(p.numel() for p in trainer.model.parameters()):,} params) -> {trainer.run_dir}"
        )

    def on_step_logged(self, trainer: Any, metrics: dict[str, Any]) -> None:
        cfg = trainer.config
        self.steps_timed += 1
        if trainer.step % cfg.log_every and trainer.step != cfg.max_steps:
            return
        elapsed = time.perf_counter() - self.t_start
        eta = elapsed / self.steps_timed * (cfg.max_steps - trainer.step)
        mfu_txt = f" mfu {metrics['mfu']:.1%}" if "mfu" in metrics else ""
        trainer.log_line(
            f"step {trainer.step}/{cfg.max_steps} loss {metrics['loss']:.4f} lr {metrics['lr']:.2e} "
            f"gnorm {metrics['grad_norm']:.2f} {metrics['tokens_per_s']:,.0f} tok/s{mfu_txt} eta {format_eta(eta)}"
        )

    def on_eval(self, trainer: Any, results: dict[str, Any]) -> None:
        macro = results["macro"]
        trainer.log_line(f"eval step {trainer.step}: macro loss {macro['loss']:.4f} bpb {macro['bpb']:.4f}")


def timeline_steps(cfg: Any) -> list[int]:
    """The steps of the evaluation timeline (`eval_timeline` log-spaced points, first and max_steps included).

    Step i of n is round(first * (max_steps / first) ** (i / (n - 1))) with first = max(1, warmup_steps);
    one that would not exceed its predecessor moves to the predecessor + 1, so the n steps are distinct (the
    config refuses an n that does not fit). Token counts follow as step * tokens_per_step.
    """
    n, last = cfg.eval_timeline, cfg.max_steps
    if not n:
        return []
    first = min(max(1, cfg.warmup_steps), last)
    steps: list[int] = []
    for i in range(n):
        step = round(first * (last / first) ** (i / (n - 1)))
        # Leave room for the points still to come below max_steps; the early ones absorb the rounding.
        steps.append(min(max(step, steps[-1] + 1 if steps else first), last - (n - 1 - i)))
    return steps


class Evaluator(Callback):
    """When to evaluate: every eval_every steps, at each timeline step and at the end (the evaluation itself,
    and its line in metrics.jsonl, are the trainer's: `Trainer.evaluate`).

    The last step is evaluated before its checkpoint is written and the result kept in the callback's state,
    so a run resumed after it finished (killed before its result was recorded) reuses it: every evaluation,
    timeline points included, is logged exactly once. A kill after an evaluation but before the next
    checkpoint loses nothing either: the resume drops metrics lines past its checkpoint and evaluates again.
    """

    def __init__(self) -> None:
        # {"step", "max_tokens", "results"} of the newest evaluation; saved with checkpoints for on_train_end.
        self.last: dict[str, Any] | None = None

    def evaluate(self, trainer: Any, max_tokens: int | None, heldout_only: bool = False) -> None:
        """Have the trainer evaluate now (every domain, or the held-out split alone), and remember the result."""
        results = trainer.evaluate(max_tokens, heldout_only=heldout_only)
        if results is not None:
            self.last = {"step": trainer.step, "max_tokens": max_tokens, "results": results,
                         "heldout_only": heldout_only}

    def on_step_logged(self, trainer: Any, metrics: dict[str, Any]) -> None:
        cfg, step = trainer.config, trainer.step
        if step == cfg.max_steps or (cfg.eval_every and step % cfg.eval_every == 0):
            self.evaluate(trainer, cfg.eval_tokens)
        elif step in trainer.timeline:
            self.evaluate(trainer, cfg.eval_tokens, heldout_only=cfg.eval_timeline_domains == "heldout")

    def on_train_end(self, trainer: Any) -> None:
        last, max_tokens = self.last, trainer.config.eval_tokens
        if (last is not None and last["step"] == trainer.step and last["max_tokens"] == max_tokens
                and not last.get("heldout_only")):
            trainer.last_eval = last["results"]
        else:  # resumed from a checkpoint written before its step was evaluated (older plelab)
            self.evaluate(trainer, max_tokens)

    def state_dict(self) -> dict[str, Any]:
        return {"last": self.last}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last = state.get("last")


class Checkpointer(Callback):
    """When to write a checkpoint: every ckpt_every steps and at the last step (`Trainer.save` writes it)."""

    def on_step_logged(self, trainer: Any, metrics: dict[str, Any]) -> None:
        cfg = trainer.config
        if trainer.step % cfg.ckpt_every == 0 or trainer.step == cfg.max_steps:
            trainer.save()


def existing_checkpoints(run_dir: Path) -> str:
    """A truthful clause for stop messages: the newest intact checkpoint of the run, or that there is none."""
    try:
        ckpt, _ = newest_verified_checkpoint(run_dir)
    except CheckpointError:
        return f"no intact checkpoint exists in {Path(run_dir) / 'checkpoints'}"
    return f"the newest intact checkpoint is {ckpt}"


register_callback("speed", lambda cfg, note: SpeedMonitor())
register_callback("progress", lambda cfg, note: ProgressPrinter())
register_callback("evaluator", lambda cfg, note: Evaluator())
register_callback("checkpointer", lambda cfg, note: Checkpointer())
