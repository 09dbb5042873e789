"""The training loop: micro-batches, AdamW + lazy sparse Adam, warmup-cosine, clipping, exact resume.

The loop computes steps and owns the state a checkpoint must hold; everything else (speed/MFU, console
progress, evaluation, checkpoint cadence, TensorBoard, W&B, PLE diagnostics) is a callback, built from the
config by `plelab.training.callback_factory.callbacks_for`. The run directory is locked, checked and
cleaned by `plelab.runs.run_dir`. Where the run's processes come in, the trainer calls a
`plelab.training.distribution.Distribution`: one process by default; under torchrun every rank runs this loop
with `plelab.parallel.engine.Parallel` (handed in by the caller), which shards the PLE table, wraps the model
in DDP / FSDP2 and writes sharded checkpoints, and rank 0 alone writes the run directory's files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import random
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from plelab.data.loader import BatchLoader
from plelab.data.prepare import HELDOUT_DOMAIN
from plelab.errors import PlelabError
from plelab.model.bf16_gemm import bf16_gemms
from plelab.model.softmax_xent import backend as softmax_backend
from plelab.model.transformer import LanguageModel
from plelab.runs import run_dir as rd
from plelab.runs.checkpoint import (
    CheckpointError,
    atomic_write_bytes,
    newest_verified_checkpoint,
    prune_checkpoints,
    read_checkpoint_json,
    remove_leftovers,
)
from plelab.training.callback_factory import callbacks_for
from plelab.training.callbacks import Callback, TrainingStopped, unique_names
from plelab.training.config import TrainConfig, train_config_dict
from plelab.training.data_access import TrainingData
from plelab.training.disk_table import TABLE_DIR, place_on_disk
from plelab.training.distribution import Distribution, PeerLost, SingleProcess
from plelab.training.initial_weights import weight_source
from plelab.training.optim import Optimizer, grad_norm_and_clip, lr_at, model_config_for
from plelab.training.standard_callbacks import existing_checkpoints, timeline_steps
from plelab.util.device import Precision, autocast_context, choose_precision, fused_adamw, pick_device
from plelab.util.fs import check_output_path

__all__ = ["Trainer", "TrainingStopped", "trainer_for"]


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


def aux_loss_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules that declare `aux_losses` (found once, so a step does not walk the module tree)."""
    return [m for m in model.modules() if hasattr(m, "aux_losses")]


def auxiliary_losses(modules: Iterable[torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Weighted auxiliary losses the last training forward left on `modules` (`aux_loss_modules`), by name.

    A module that has a training objective of its own (a mixture-of-experts router's balance loss, a visual
    model's patch-id prediction) sets `self.aux_losses = {name: weighted scalar}` in its forward; the trainer
    adds their sum to the loss it differentiates and logs each one, so `loss` itself stays comparable.
    """
    out: dict[str, torch.Tensor] = {}
    for module in modules:
        for name, value in (getattr(module, "aux_losses", None) or {}).items():
            out[name] = out[name] + value if name in out else value
    return out


def trainer_for(cfg: TrainConfig) -> type[Trainer]:
    """The Trainer class that trains `cfg`: Trainer, or the one a plug-in's config subclass names."""
    named = getattr(cfg, "trainer_class", None)
    return named() if named is not None else Trainer


def compute_context(precision: Precision, device: torch.device) -> contextlib.AbstractContextManager:
    """What a training forward runs under: bf16 autocast, the bf16 head GEMMs of bf16-head on a CPU
    (plelab.model.bf16_gemm), or nothing (fp32)."""
    if precision.name == "bf16-head":
        return bf16_gemms(native=precision.native_bf16)
    return precision.autocast(device)


def adamw_fused(device: torch.device, precision: Precision, distributed: bool = False) -> bool:
    """Whether AdamW runs its fused kernel: on CUDA (`fused_adamw`), and for bf16-head on one CPU process, where it
    ran 1.5-1.7x faster than foreach (H = 64-128 law models; ~1 % of a step) without touching fp32 runs' numerics."""
    return fused_adamw(device) or (precision.name == "bf16-head" and device.type == "cpu" and not distributed)


class Trainer:
    """Runs one training job into `run_dir`; `run()` returns the final metrics.

    callbacks: added after those the config asks for (see `callbacks_for`). resume: continue from the newest
    intact checkpoint, or start at step 0 when there is none yet (a folder prepared by a sweep). overwrite:
    replace a different run or foreign files in `run_dir` instead of refusing. distribution: the processes the
    run spreads over (default: this one; under torchrun `plelab.parallel.engine.from_environment(cfg)`).
    """

    def __init__(
        self,
        cfg: TrainConfig,
        run_dir: str | Path,
        callbacks: list[Callback] | None = None,
        resume: bool = False,
        quiet: bool = False,
        overwrite: bool = False,
        distribution: Distribution | None = None,
    ):
        cfg = self.with_init_model(cfg, resume)
        self.config = cfg
        self.run_dir = check_output_path(run_dir, is_dir=True, overwrite=True, run=True, inputs=cfg.input_paths())
        self.distribution = distribution if distribution is not None else SingleProcess(cfg, pick_device(cfg.device))
        self.world = self.distribution.world
        self.quiet = quiet or not self.world.is_main  # rank 0 alone prints, logs and writes run-dir files
        self.device = self.distribution.device
        self.precision = choose_precision(self.device, cfg.dtype)
        # TensorBoard / W&B write from rank 0 only (metrics and progress are gated in log_metrics / log_line).
        logged = cfg if self.world.is_main else dataclasses.replace(cfg, tensorboard=False, wandb=False)
        self.callbacks = [*callbacks_for(logged, note=self.log_line), *(callbacks or [])]
        self.timeline = set(timeline_steps(cfg))  # steps whose evaluation is a point of the gap timeline
        self._saved_step: int | None = None  # the step of the checkpoint this process wrote last
        self.total_steps = cfg.max_steps
        self.step = 0
        self.bad_steps = 0
        self.skipped_steps = 0
        self.tokens_seen = 0
        self.last_eval: dict[str, Any] | None = None
        self._stop_signal: int | None = None
        self.metrics_path = self.run_dir / rd.METRICS_FILE

        traces = rd.OpeningTraces(self.run_dir)  # what opening the folder adds, taken back if the run never starts
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._lock: rd.RunLock | None = self.distribution.on_main(lambda: rd.RunLock(self.run_dir))
        try:
            # safe: we hold the lock
            removed = self.distribution.on_main(lambda: remove_leftovers(self.run_dir / "checkpoints")) or []
            if removed:
                self.log_line(f"removed {len(removed)} leftover(s) of an interrupted run: "
                              + ", ".join(p.name for p in removed))
            self.data = self.build_data(cfg)
            # (checkpoint, config changes) to continue from; None: training starts from the initial weights.
            found = self._find_resume_point() if resume else None
            torch.manual_seed(cfg.seed)
            random.seed(cfg.seed)
            np.random.seed(cfg.seed)
            self.model = self.build_model(cfg)
            if found is None and cfg.init_from_hf:
                self.load_initial_weights(cfg.init_from_hf)
            # The module a step calls: the model itself, or DDP / FSDP2 over it with the PLE table sharded.
            self.train_model = self.distribution.wrap(self.model, bf16=self.precision.name == "bf16")
            self.optimizer = Optimizer(self.model, cfg,
                                       fused=adamw_fused(self.device, self.precision, self.world.distributed))
            if cfg.compile:
                self.model.compile()  # in place: parameter names (checkpoints) unchanged
            self.params = [p for p in self.model.parameters() if p.requires_grad]
            self.aux_modules = aux_loss_modules(self.model)
            if found is not None:
                self._resume(*found)
            elif not resume:
                self.distribution.on_main(lambda: self._start_fresh(overwrite))
        except BaseException:
            self.close()
            self.distribution.on_main(traces.remove_unless_run)
            raise

    def build_data(self, cfg: TrainConfig) -> TrainingData:
        """The batch source (`next_batch() -> (inputs, targets)`, state_dict/load_state_dict); a subclass
        training another kind of model (e.g. plelab.vision) returns its own."""
        data = TrainingData(cfg, self.device)
        if self.world.distributed:  # this rank's share of every global batch
            data.loader = BatchLoader(data.dataset, cfg.batch_size // self.world.size, cfg.context,
                                      seed=cfg.seed, rank=self.world.rank, world_size=self.world.size)
        return data

    def build_model(self, cfg: TrainConfig) -> torch.nn.Module:
        """The model, initialised from the global RNG just seeded; `forward(inputs, targets, return_logits=False)`
        must return (_, loss). A subclass returns its own.

        Built on the meta device and then given real weights by the distribution's `materialize`: on several
        ranks each holds only its rows of the PLE table, drawn as one process draws them (never the whole table)."""
        with torch.device("meta"):
            skeleton = LanguageModel(model_config_for(cfg), device=self.device)
        if cfg.ple_table == "disk":
            if self.world.distributed:
                raise PlelabError("ple_table = \"disk\" trains in one process (on several ranks each holds its "
                                  "rows of the table in memory already)")
            place_on_disk(skeleton, self.run_dir / TABLE_DIR, self.device)
        return self.distribution.materialize(skeleton)

    @staticmethod
    def with_init_model(cfg: TrainConfig, resume: bool = False) -> TrainConfig:
        """cfg with [model] read from the init_from_hf folder (its weights' names and shapes checked), when set.

        On resume a folder that is gone is left alone: the checkpoint has the weights and config.json the model
        (should there be no checkpoint yet, `load_initial_weights` says so)."""
        if not cfg.init_from_hf or (resume and not Path(cfg.init_from_hf).exists()):
            return cfg
        return dataclasses.replace(cfg, model=weight_source("hf").model_config(cfg.init_from_hf, cfg.model))

    def load_initial_weights(self, folder: str) -> None:
        """The init_from_hf folder's weights into the model just built (this rank's rows of a sharded table)."""
        if not Path(folder).is_dir():
            raise PlelabError(f"init_from_hf = {folder}: no such folder, and the run has no checkpoint yet to "
                              "continue from")
        weight_source("hf").load_weights(self.model, folder)

    def close(self) -> None:
        """Release the run directory (done by `run()`; call it when a Trainer is built but not run)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _leave_group(self) -> None:
        """After a run that ended the same way on every rank: drop model and optimizer, tear the group down."""
        if self.world.distributed:
            self.model = self.train_model = self.optimizer = self.params = None
            self.distribution.close()

    # ----------------------------------------------------------------- set-up and resume
    def _start_fresh(self, overwrite: bool = False) -> None:
        config = train_config_dict(self.config)
        rd.claim_fresh_run_dir(self.run_dir, config, overwrite)
        rd.record_config(self.run_dir, config, 0, {})
        self.metrics_path.write_text("")

    def _find_resume_point(self) -> tuple[Path, dict[str, Any]] | None:
        """Rank 0's `_resume_point`, on every rank."""
        config = train_config_dict(self.config)
        return self.distribution.broadcast(self.distribution.on_main(lambda: self._resume_point(config)))

    def _resume(self, ckpt: Path, changes: dict[str, Any]) -> None:
        config = train_config_dict(self.config)
        self.load_state_dict(self.distribution.load(ckpt, self.model, self.optimizer))
        self.distribution.on_main(lambda: self._record_resume(ckpt, config, changes))

    def _resume_point(self, config: dict[str, Any]) -> tuple[Path, dict[str, Any]] | None:
        """(newest intact checkpoint, recorded config changes), or None for a run that has none yet."""
        try:
            ckpt, skipped = newest_verified_checkpoint(self.run_dir)
        except CheckpointError:
            if any((self.run_dir / "checkpoints").glob("step_*")):
                raise  # checkpoints exist but none is intact: never silently start over
            config_file = self.run_dir / rd.CONFIG_FILE
            rd.resume_changes(read_checkpoint_json(config_file) if config_file.is_file() else config, config)
            self.log_line(f"no checkpoint in {self.run_dir} yet; starting at step 0")
            rd.record_config(self.run_dir, config, 0, {})
            self.metrics_path.write_text("")
            return None
        for note in skipped:
            self.log_line(note)
        saved = read_checkpoint_json(ckpt / "config.json").get("train") or {}
        return ckpt, rd.resume_changes(saved, config)

    def _record_resume(self, ckpt: Path, config: dict[str, Any], changes: dict[str, Any]) -> None:
        rd.record_config(self.run_dir, config, self.step, changes)
        self._truncate_metrics(self.step)
        changed = "".join(f"; {k} {v['old']!r} -> {v['new']!r}" for k, v in changes.items())
        self.log_line(f"resumed from {ckpt} at step {self.step}{changed}")

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

    # ----------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        """Everything besides the weights that an exact resume needs; callback states keyed by name."""
        return {
            "step": self.step,
            "optimizer": self.optimizer.state_dict(),
            "data": self.data.state_dict(),
            "rng": rng_state(),
            "bad_steps": self.bad_steps,
            "skipped_steps": self.skipped_steps,
            "tokens_seen": self.tokens_seen,
            "callbacks": {
                n: cb.state_dict() for n, cb in zip(unique_names(self.callbacks), self.callbacks, strict=True)
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned; callbacks absent from the checkpoint keep their fresh state."""
        if state.get("optimizer") is not None:  # None: a sharded checkpoint, loaded by the distribution
            self.optimizer.load_state_dict(state["optimizer"])
        self.data.load_state_dict(state["data"])
        set_rng_state(state["rng"])
        self.step = state["step"]
        self.bad_steps, self.skipped_steps = state["bad_steps"], state["skipped_steps"]
        self.tokens_seen = state["tokens_seen"]
        saved = state.get("callbacks", {})
        if isinstance(saved, list):  # checkpoints written before callback states were keyed by name
            saved = dict(zip(unique_names(self.callbacks), saved, strict=False))
        for name, cb in zip(unique_names(self.callbacks), self.callbacks, strict=True):
            if name in saved:
                cb.load_state_dict(saved[name])

    # ----------------------------------------------------------------- logging and callbacks
    def log_line(self, text: str) -> None:
        """Progress line on stdout (unless quiet)."""
        if not self.quiet:
            print(text, flush=True)

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        """Append one JSON object to metrics.jsonl (rank 0 only)."""
        if not self.world.is_main:
            return
        with open(self.metrics_path, "a") as f:
            f.write(json.dumps(metrics) + "\n")

    def dispatch(self, hook: str, *args: Any) -> None:
        """Call `hook(self, *args)` on every callback, in order."""
        for cb in self.callbacks:
            getattr(cb, hook)(self, *args)

    def save(self) -> Path:
        """Write a checkpoint of this step (atomic), point LATEST at it, prune old ones, tell the callbacks.

        The Checkpointer callback calls it on its cadence, the loop on an interrupt; a step is written once."""
        ckpts = self.run_dir / "checkpoints"
        name = f"step_{self.step:08d}"
        if self._saved_step == self.step and (ckpts / name).is_dir():
            return ckpts / name
        try:
            path = self.write_checkpoint(ckpts / name)  # and LATEST; sharded on several ranks
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                what = f"disk full while writing checkpoint {name}"
            else:
                what = f"could not write checkpoint {name} ({exc.strerror or exc}; disk full?)"
            raise TrainingStopped(
                f"{what}; {existing_checkpoints(self.run_dir)}; free space and rerun with --resume"
            ) from exc
        self._saved_step = self.step
        if self.world.is_main:
            prune_checkpoints(ckpts, self.config.keep_checkpoints)
        self.dispatch("on_checkpoint", path)
        return path

    def write_checkpoint(self, path: Path) -> Path:
        """Write a complete checkpoint of this step at `path` and point LATEST at it (every rank calls it)."""
        self.distribution.save(path, self.model, self.optimizer, train_config_dict(self.config), self.state_dict(),
                           self.data.tokenizer_path)
        self.distribution.on_main(lambda: atomic_write_bytes(path.parent / "LATEST", path.name.encode()))
        return path

    def evaluate(self, max_tokens: int | None = None, heldout_only: bool = False) -> dict[str, Any] | None:
        """Evaluate now, log the result (a timeline step's line is marked `"timeline": true`) and tell the
        callbacks; None when the run has no evaluation data. The Evaluator callback calls it on its cadence.
        heldout_only: score only the prepared held-out split (a timeline point under eval_timeline_domains)."""
        results = self.measure_eval(max_tokens, heldout_only=heldout_only)
        if results is None:
            return None
        self.last_eval = results
        line: dict[str, Any] = {"step": self.step, "eval": results}
        if self.step in self.timeline:
            line.update(timeline=True, tokens=self.tokens_seen)
        self.log_metrics(line)
        self.dispatch("on_eval", results)
        return results

    def measure_eval(self, max_tokens: int | None, heldout_only: bool = False) -> dict[str, Any] | None:
        """The evaluation itself ({"domains": {name: {loss, bpb, tokens}}, "macro": ...}), max_tokens per domain
        (only the held-out split with heldout_only); None without evaluation data. A subclass evaluating another
        kind of model returns its own."""
        domains = self.data.eval_domains
        if heldout_only:
            domains = {k: v for k, v in domains.items() if k == HELDOUT_DOMAIN}
        if not domains:
            return None
        from plelab.inference.evaluate import evaluate_domains

        cfg = self.config
        return evaluate_domains(self.model, domains, cfg.context, cfg.batch_size,
                                max_tokens=max_tokens, autocast=autocast_context(self.device, cfg.dtype),
                                sample=cfg.eval_sample, whole=(HELDOUT_DOMAIN,) if cfg.eval_heldout_whole else ())

    # ----------------------------------------------------------------- the loop
    def _handle_signal(self, signum, frame) -> None:  # noqa: ARG002 - signal handler signature
        self._stop_signal = signum

    def train_step(self) -> dict[str, Any] | None:
        """One optimizer step over grad_accum micro-batches; None when the loss was not finite (skipped)."""
        cfg = self.config
        lr = lr_at(self.step, cfg)
        self.optimizer.set_lr(lr)
        self.model.train()
        parts: dict[str, list[torch.Tensor]] = {"loss": []}  # per micro-batch, on the device until the step ends
        for i in range(cfg.grad_accum):
            x, y = self.data.next_batch()
            with self.distribution.grad_sync(last=i == cfg.grad_accum - 1):
                with compute_context(self.precision, self.device):
                    _, loss = self.train_model(x, y, return_logits=False)
                    aux = auxiliary_losses(self.aux_modules)
                objective = loss + sum(aux.values()) if aux else loss
                (objective / cfg.grad_accum).backward()
            for name, value in {"loss": loss, **aux}.items():
                parts.setdefault(name, []).append(value.detach())
        # One device-to-host copy per step, not one per micro-batch; summed in the same order and precision as ever.
        sums = {name: sum(v / cfg.grad_accum for v in torch.stack(values).float().tolist())
                for name, values in parts.items()}
        total = self.distribution.mean(sums.pop("loss"))
        aux_totals = sums
        # "loss" stays the language-model loss (comparable across variants); auxiliary terms are logged apart.
        metrics: dict[str, Any] = {"step": self.step + 1, "loss": total, "lr": lr, "dtype": self.precision.name}
        metrics.update({name: self.distribution.mean(v) for name, v in aux_totals.items()})
        if not math.isfinite(total):
            self.optimizer.zero_grad()
            return None
        self.dispatch("on_after_backward", metrics)
        sharded = self.distribution.sharded if self.world.distributed else None
        gnorm = grad_norm_and_clip(self.params, cfg.grad_clip, sharded)
        if not math.isfinite(gnorm):
            self.optimizer.zero_grad()
            return None
        self.optimizer.step()
        self.optimizer.zero_grad()
        metrics["grad_norm"] = gnorm
        return metrics

    def _skip_step(self) -> None:
        self.bad_steps += 1
        self.skipped_steps += 1
        self.step += 1
        self.log_metrics({"step": self.step, "loss": None, "skipped": "non-finite loss or gradient"})
        self.log_line(f"step {self.step}: non-finite loss, step skipped ({self.bad_steps} in a row)")
        if self.bad_steps >= self.config.max_bad_steps:
            raise TrainingStopped(
                f"{self.bad_steps} non-finite losses in a row at step {self.step}; "
                f"{existing_checkpoints(self.run_dir)} (lower lr or check the data)"
            )

    def run(self) -> dict[str, Any]:
        """Train to max_steps (resumable at any moment); returns the last step's metrics and final eval."""
        cfg = self.config
        old = {s: signal.signal(s, self._handle_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        last: dict[str, Any] = {}
        try:
            self.log_line(f"precision: {self.precision}")
            if self.precision.name == "bf16-head":
                with bf16_gemms(native=self.precision.native_bf16) as mode:
                    self.log_line(f"bf16-head: head GEMMs {mode}, softmax step in {softmax_backend()} "
                                  "(plelab.model.bf16_gemm, plelab.model.softmax_xent)")
            if self.world.distributed:
                self.log_line(f"{self.world.size} ranks, parallel = {self.distribution.mode}: PLE table split by "
                              f"vocabulary, {cfg.batch_size // self.world.size} of each step's {cfg.batch_size} "
                              "sequences per rank")
            elif cfg.parallel not in ("none", "auto"):
                self.log_line(f"parallel = {cfg.parallel} but not started by torchrun: training in one process")
            self.dispatch("on_train_start")
            while self.step < cfg.max_steps:
                t0 = time.perf_counter()
                metrics = self.train_step()
                if metrics is None:
                    self._skip_step()
                else:
                    self.bad_steps = 0
                    self.step += 1
                    self.tokens_seen += cfg.tokens_per_step
                    metrics.update(tokens=self.tokens_seen, step_time=time.perf_counter() - t0)
                    self.dispatch("on_step_end", metrics)
                    self.log_metrics(metrics)
                    self.dispatch("on_step_logged", metrics)
                    last = metrics
                if self.distribution.any_rank(self._stop_signal is not None):  # every rank saves, or none
                    self.save()
                    raise KeyboardInterrupt
            if self.bad_steps:
                # Skipped steps leave no checkpoint behind: the run did not reach max_steps in a usable state.
                raise TrainingStopped(
                    f"the last {self.bad_steps} step(s) up to step {self.step} had non-finite losses, so the run "
                    f"has no final checkpoint; {existing_checkpoints(self.run_dir)} (lower lr or check the data)"
                )
            self.dispatch("on_train_end")
        except KeyboardInterrupt:
            self.log_line(f"interrupted at step {self.step}; checkpoint saved, continue with --resume")
            raise
        except Exception as exc:
            lost = self.distribution.peer_failure(exc)
            if lost is not None:
                raise PeerLost(f"rank {self.world.rank}: another rank died or stopped responding at step "
                               f"{self.step} ({lost}); {existing_checkpoints(self.run_dir)}; "
                               "continue with --resume") from exc
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
            self.close()
        self._leave_group()
        last["final_eval"] = self.last_eval
        return last
