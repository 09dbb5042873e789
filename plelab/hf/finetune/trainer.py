"""FinetuneTrainer: plelab's Trainer (loop, checkpoints, exact resume, DDP, evaluation) on a LoRA fine-tune.

What changes from a training run: the model (`build_model`: the checkpoint's transformers model with
adapters, see model.py) and a few callbacks, swapped when the data is built (before any state is restored):
the Evaluator also scores the untouched model at step 0, so a run reports before and after; speed lines
carry tokens/s and ETA but no MFU (plelab's FLOP count is for its own models); the start line counts trained
and frozen parameters; and `AdapterWriter` keeps RUN/adapter (peft's format) in step with every checkpoint.
Checkpoints hold the trained tensors only (`FinetuneModel.state_dict()`), a few MB instead of the model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from plelab.errors import PlelabError
from plelab.hf.checkpoint import HFCheckpoint
from plelab.hf.finetune.adapter import RECORD, check_base_unchanged, read_record, write_adapter
from plelab.hf.finetune.config import FinetuneConfig
from plelab.hf.finetune.model import FinetuneModel, build_finetune_model, resolve_base_dtype
from plelab.training.callbacks import Callback
from plelab.training.data_access import TrainingData
from plelab.training.standard_callbacks import Evaluator, ProgressPrinter, SpeedMonitor
from plelab.training.trainer import Trainer

ADAPTER_DIR = "adapter"
"""RUN/adapter: the newest checkpoint's adapter in peft's format."""


class FinetuneEvaluator(Evaluator):
    """Evaluator that also evaluates the untouched model before the first step (logged as step 0)."""

    def on_train_start(self, trainer: Any) -> None:
        super().on_train_start(trainer)
        if trainer.step == 0 and self.last is None:
            self.evaluate(trainer, trainer.config.eval_tokens)


class FinetuneSpeed(SpeedMonitor):
    """tokens_per_s without MFU (plelab's FLOP formula describes plelab's models, not a Gemma checkpoint)."""

    def on_train_start(self, trainer: Any) -> None:
        self.peak_flops = None


class FinetuneProgress(ProgressPrinter):
    """ProgressPrinter whose start line names the checkpoint and counts trained and frozen parameters."""

    def on_train_start(self, trainer: Any) -> None:
        import time

        cfg, model = trainer.config, trainer.model
        self.t_start, self.steps_timed = time.perf_counter(), 0
        trained = sum(p.numel() for p in model.parameters())
        frozen = sum(p.numel() for p in model.hf.lm.parameters() if not p.requires_grad)
        table = "frozen, on disk" if cfg.finetune.table == "frozen" else "on disk + a trained sparse delta"
        trainer.log_line(
            f"fine-tuning {cfg.finetune.hf}: {trained:,} trained parameters (LoRA r={cfg.finetune.rank} on "
            f"{', '.join(model.paths)}), {frozen:,} frozen in memory, PLE table {table} "
            f"({trainer.hf_ckpt.table.shape[0] * trainer.hf_ckpt.table.row_bytes / 1e9:.2f} GB)")
        trainer.log_line(f"training {cfg.max_steps} steps x {cfg.tokens_per_step:,} tokens on {trainer.device} "
                         f"-> {trainer.run_dir}")


class AdapterWriter(Callback):
    """Writes RUN/adapter (peft's format + table delta) after every checkpoint and at the end, on rank 0."""

    def on_checkpoint(self, trainer: Any, ckpt_dir: Any) -> None:
        if trainer.world.is_main:
            self.write(trainer, Path(ckpt_dir))

    def on_train_end(self, trainer: Any) -> None:
        record = read_record(trainer.run_dir / ADAPTER_DIR) if trainer.world.is_main else None
        if trainer.world.is_main and (record or {}).get("step") != trainer.step:
            self.write(trainer, None)

    def write(self, trainer: Any, ckpt_dir: Path | None) -> Path:
        """RUN/adapter from the model as it is now (the checkpoint just written holds the same tensors)."""
        cfg = trainer.config
        record = {"base": str(trainer.hf_ckpt.path), "family": trainer.hf_ckpt.family, "run": str(trainer.run_dir),
                  "step": trainer.step, "checkpoint": str(ckpt_dir) if ckpt_dir else None,
                  "base_fingerprint": trainer.base_fingerprint, "targets": trainer.model.paths,
                  "rank": cfg.finetune.rank, "alpha": cfg.finetune.alpha, "table": cfg.finetune.table}
        return write_adapter(trainer.model, trainer.hf_ckpt, trainer.run_dir / ADAPTER_DIR, record)


def finetune_callbacks(callbacks: list[Callback]) -> list[Callback]:
    """The run's callbacks with the fine-tuning forms swapped in and AdapterWriter added."""
    swap = {Evaluator: FinetuneEvaluator, SpeedMonitor: FinetuneSpeed, ProgressPrinter: FinetuneProgress}
    return [swap[type(cb)]() if type(cb) in swap else cb for cb in callbacks] + [AdapterWriter()]


class FinetuneTrainer(Trainer):
    """Trains LoRA adapters (and optionally the PLE table's touched rows) of `cfg.finetune.hf`."""

    def build_data(self, cfg: FinetuneConfig) -> TrainingData:
        """The prepared data, checked against the checkpoint's tokenizer (cfg.tokenizer), and the callbacks."""
        if not isinstance(cfg, FinetuneConfig):
            raise PlelabError("FinetuneTrainer needs a FinetuneConfig (plelab.hf.finetune.config)")
        if self.world.distributed and cfg.finetune.table == "sparse":
            raise PlelabError("finetune.table = sparse trains in one process: several ranks would each hold a "
                              "different copy of the table's rows; with torchrun train the adapters only "
                              "(finetune.table = frozen)")
        self.hf_ckpt = HFCheckpoint.open(cfg.finetune.hf)
        self.base_fingerprint = self.hf_ckpt.fingerprint()
        self.callbacks = finetune_callbacks(self.callbacks)  # the Checkpointer is kept (the same object)
        return super().build_data(cfg)

    def _resume_point(self, config: dict[str, Any]) -> tuple[Path, dict[str, Any]] | None:
        """The Trainer's resume point, refused when the base folder holds other weights than those the run's
        adapters were trained on (checked before the model is loaded)."""
        found = super()._resume_point(config)
        if found is not None:
            check_base_unchanged(read_record(self.run_dir / ADAPTER_DIR), self.hf_ckpt, self.base_fingerprint)
        return found

    def build_model(self, cfg: FinetuneConfig) -> FinetuneModel:
        """The checkpoint's model with adapters; the table delta's rows are those the training split uses."""
        dtype = resolve_base_dtype(cfg.finetune, self.precision.name == "bf16")
        return build_finetune_model(self.hf_ckpt, cfg.model, cfg.finetune, self.device, dtype,
                                    train_tokens=self.data.dataset)


def read_run_record(run_dir: Path) -> dict[str, Any]:
    """RUN/adapter/plelab_finetune.json (what the newest adapter was trained from)."""
    record = read_record(Path(run_dir) / ADAPTER_DIR)
    if record is None:
        raise PlelabError(f"{run_dir}: no {ADAPTER_DIR}/{RECORD} (not a finished fine-tune run, or none yet)")
    return record


def load_finetuned(run_dir: str | Path, device: str | torch.device = "cpu",
                   dtype: torch.dtype = torch.float32) -> tuple[FinetuneModel, FinetuneConfig]:
    """plelab's fine-tuned model from a run's newest intact checkpoint (eval mode), and the run's config."""
    from plelab.hf.finetune.config import load_finetune_config
    from plelab.runs.checkpoint import newest_verified_checkpoint, read_checkpoint_json, read_weights

    ckpt_dir, _ = newest_verified_checkpoint(run_dir)
    saved = read_checkpoint_json(ckpt_dir / "config.json").get("train") or {}
    cfg, hf_ckpt = load_finetune_config(json.loads(json.dumps(saved)))
    tokens = None
    if cfg.finetune.table == "sparse":  # rows are in the checkpoint; the data only sizes the delta
        from safetensors import safe_open

        with safe_open(str(ckpt_dir / "model.safetensors"), "pt") as f:
            tokens = f.get_tensor("table.rows").numpy()
    model = build_finetune_model(hf_ckpt, cfg.model, cfg.finetune, torch.device(device), dtype, train_tokens=tokens)
    model.load_state_dict(read_weights(ckpt_dir, model, device))
    return model.eval(), cfg
