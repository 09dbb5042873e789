"""Training configuration: one typed dataclass, loadable from TOML/YAML/JSON, overridable by dotted keys."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from plelab.model.config import ModelConfig
from plelab.model.presets import load_model_config
from plelab.util.dataclass_config import ConfigError, apply_overrides, from_dict, read_file, to_dict
from plelab.vision.config import VisionConfig, check_vision_run


@dataclass
class TrainConfig:
    """Everything a training run needs besides the model weights."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model; in files, `[model]` may name `preset = "small-ple"` and override fields below it."""
    data: str = ""
    """Prepared token-shard directory (from `plelab data prepare`)."""
    eval_data: str = ""
    """Folder of per-domain validation .txt files (e.g. ../shared/data/valid); empty = none."""
    tokenizer: str = ""
    """tokenizer.json; empty = the one next to the prepared data (DATA/tokenizer.json)."""
    batch_size: int = 16
    """Sequences per micro-batch."""
    seq_len: int = 0
    """Tokens per sequence; 0 = the model's max_seq_len."""
    grad_accum: int = 1
    """Micro-batches accumulated per optimizer step."""
    max_steps: int = 1000
    """Optimizer steps to train."""
    lr: float = 3e-3
    """Peak learning rate (AdamW for the dense part, lazy Adam for a sparse PLE table)."""
    min_lr_ratio: float = 0.1
    """Cosine decay ends at lr * min_lr_ratio."""
    warmup_steps: int = 50
    """Linear warmup steps."""
    weight_decay: float = 0.1
    """AdamW decay on matrices; never on norms, embeddings, PLE tables or gates."""
    beta1: float = 0.9
    """Adam beta1."""
    beta2: float = 0.95
    """Adam beta2."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this (0 = off)."""
    sparse_ple: bool = True
    """Sparse PLE-table gradients with a lazy row-wise Adam: step cost independent of V x L x dP. Sets the
    model's ple.sparse_grad when the run builds it (plelab.training.optim.model_config_for)."""
    seed: int = 1337
    """Seed for initialisation, data order and sampling."""
    device: str = "auto"
    """auto (cuda, then mps, then cpu), or an explicit torch device."""
    dtype: str = "auto"
    """auto = bf16 autocast where the hardware computes bf16 natively (CUDA with bf16; CPUs with AVX512-BF16,
    AMX or aarch64 BF16), else fp32; or bf16 / bf16-head / fp32. The run prints its choice and why
    (plelab.inference.device.choose_precision). Under every value weights, gradients, optimizer state (the PLE
    table's sparse updates included), norms, softmax and the loss stay fp32. fp32: everything fp32. bf16: autocast,
    every matmul in bf16 with bf16 outputs; on a CPU the gain needs width: measured 1.40x at H = 256
    (benchmarks/bench_train_step.py) but 0.9x at H = 128 and 0.55-0.6x for mini-ple on a byte vocabulary
    (benchmarks/bench_distributed.py). bf16-head, the CPU fast path for the studies' small models: only the fused
    output head + cross-entropy changes, its three GEMMs taking bf16-rounded inputs (hidden states, head weight,
    logit gradients) with fp32 accumulation and fp32 outputs, on the CPU's bf16 units where it has them and
    emulated exactly in fp32 where not (plelab.model.bf16_gemm; benchmarks/bench_study_step.py); attention, FFN,
    PLE and the rest run as under fp32, and evaluation is fp32. On CUDA bf16-head is plain bf16 autocast."""
    compile: bool = False
    """torch.compile the model (nn.Module.compile: checkpoints keep their parameter names). Pays on CUDA;
    the first steps are slow while it compiles."""
    pin_memory: bool = True
    """On CUDA, copy each batch through pinned host memory with non_blocking=True (no effect on the CPU)."""
    parallel: str = "none"
    """Under torchrun: "ddp" (weights replicated, gradients all-reduced) or "fsdp" (FSDP2 fully_shard per decoder
    layer + root: weights, gradients and optimizer state sharded). Either way the PLE table is split by
    vocabulary across ranks (plelab.parallel). batch_size is then the global batch (divisible by the world
    size). One process without torchrun ignores it and trains as with "none"."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of storing them (less memory, ~1/3
    more compute)."""
    log_every: int = 10
    """Print and log a metrics line every N steps."""
    eval_every: int = 0
    """Evaluate on eval_data every N steps (0 = only at the end)."""
    eval_tokens: int = 16384
    """Cap on tokens per domain for evaluations during training."""
    eval_timeline: int = 0
    """Also evaluate on eval_data at this many log-spaced steps (so token counts) from the end of warmup
    (step max(1, warmup_steps)) to max_steps, both included: the gap timeline sweeps record (0 = off; else
    >= 2). Steps are rounded to the nearest integer and a point that rounds onto its predecessor moves to the
    next step, so every point is distinct (plelab.training.standard_callbacks.timeline_steps)."""
    ckpt_every: int = 100
    """Write a checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 2
    """Keep the newest K checkpoints."""
    max_bad_steps: int = 5
    """Stop after this many non-finite losses in a row (each one is skipped and counted)."""
    diagnostics_every: int = 0
    """Log PLE diagnostics (injection ratio, gates, gradient ratios) every N steps (0 = off)."""
    early_warning_fraction: float = 0.1
    """Fraction of training at which the PLE early-warning verdict is taken."""
    tensorboard: bool = False
    """Also log to TensorBoard (RUN_DIR/tb) when tensorboard is installed."""
    wandb: bool = False
    """Also log to Weights & Biases when wandb is installed (project 'plelab')."""
    vision: VisionConfig = field(default_factory=VisionConfig)
    """Image + caption training (plelab.vision); off unless vision.corpus is set, and then left out of the
    recorded config (existing runs and sweep hashes are unchanged)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "grad_accum", "max_steps", "log_every", "ckpt_every", "keep_checkpoints",
                     "eval_tokens", "max_bad_steps"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_every", "diagnostics_every", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:  # 0 = off
                raise ConfigError(f"{name} must be >= 0 (0 = off), got {getattr(self, name)}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        first = min(max(1, self.warmup_steps), self.max_steps)
        if self.eval_timeline and not 2 <= self.eval_timeline <= self.max_steps - first + 1:
            raise ConfigError(f"eval_timeline must be 0 (off) or 2..{self.max_steps - first + 1} (distinct steps "
                              f"from {first} to max_steps {self.max_steps}), got {self.eval_timeline}")
        if not 0 < self.early_warning_fraction <= 1:
            raise ConfigError(f"early_warning_fraction must be in (0, 1], got {self.early_warning_fraction}")
        if self.seq_len < 0 or self.seq_len > self.model.max_seq_len:
            raise ConfigError(f"seq_len must be in 0..model.max_seq_len ({self.model.max_seq_len}), got {self.seq_len}")
        if not self.lr > 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.parallel not in ("none", "ddp", "fsdp"):
            raise ConfigError(f"parallel must be none, ddp or fsdp, got {self.parallel!r}")
        if self.dtype not in ("auto", "bf16", "bf16-head", "fp32"):
            raise ConfigError(f"dtype must be auto, bf16, bf16-head or fp32, got {self.dtype!r}")
        if self.dtype == "bf16-head" and self.model.logit_softcap is not None:
            raise ConfigError("dtype = bf16-head changes the fused head + loss, which soft-capped logits "
                              "(model.logit_softcap) do not use: choose fp32 or bf16")
        if self.vision.enabled:
            check_vision_run(self)

    @property
    def context(self) -> int:
        """Tokens per training sequence."""
        return self.seq_len or self.model.max_seq_len

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed per optimizer step."""
        return self.batch_size * self.grad_accum * self.context


def load_train_config(source: str | Path | dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """Build a TrainConfig from a file or dict plus `key=value` overrides (e.g. model.ple.dim=0)."""
    data = dict(source) if isinstance(source, dict) else read_file(source)
    data = apply_overrides(data, overrides or [])
    model = data.pop("model", {})
    if not isinstance(model, dict):
        raise ConfigError("[model] must be a table (e.g. preset = \"small-ple\")")
    data["model"] = load_model_config(model)
    return from_dict(TrainConfig, data)


def train_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """JSON-friendly dict of a TrainConfig (round-trips through load_train_config)."""
    out = to_dict(cfg)
    if not cfg.vision.enabled:  # a text run records (and hashes) exactly what it did before [vision] existed
        del out["vision"]
    return out
