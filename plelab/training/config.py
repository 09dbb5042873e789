"""Training configuration: one typed dataclass, loadable from TOML/YAML/JSON, overridable by dotted keys."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from plelab.model.config import ModelConfig
from plelab.model.presets import load_model_config
from plelab.util.dataclass_config import LATER, ConfigError, apply_overrides, from_dict, read_file, to_dict
from plelab.util.device import PRECISIONS, PrecisionChoice

PLETableStorage = Literal["memory", "disk"]
PLE_TABLE_STORAGES: tuple[str, ...] = get_args(PLETableStorage)
ParallelMode = Literal["auto", "none", "ddp", "fsdp"]
PARALLEL_MODES: tuple[str, ...] = get_args(ParallelMode)
EvalSample = Literal["spread", "head", "all"]
EVAL_SAMPLES: tuple[str, ...] = get_args(EvalSample)
TimelineDomains = Literal["all", "heldout"]
TIMELINE_DOMAINS: tuple[str, ...] = get_args(TimelineDomains)

PLUGIN_SECTIONS: dict[str, type[TrainConfig]] = {}
"""Config sections that plug-ins add ({section: TrainConfig subclass}), filled as the subclasses are defined."""


@dataclass
class TrainConfig:
    """Everything a training run needs besides the model weights.

    A plug-in that trains another kind of model adds its own section by subclassing, e.g.
    `class VisionTrainConfig(TrainConfig, section="vision")` with a `vision` field: `load_train_config` picks
    that subclass when the section is present (and on), and its `trainer_class()` names the trainer it needs
    (plelab.training.trainer.trainer_for).
    """

    section: ClassVar[str] = ""
    """The plug-in section this class adds ("" for the text TrainConfig itself)."""

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
    ple_table: PLETableStorage = field(default="memory", metadata=LATER)
    """Where the PLE table and its Adam moments live. memory: tensors in RAM (split by rows across ranks under
    torchrun). disk: three memory-mapped sparse files under RUN_DIR/.ple_table/, of which a step touches only its
    batch's rows, so a table larger than RAM trains (plelab/training/disk_table.py); one process on the CPU, with
    sparse_ple = true and a table that starts at zero (model.ple.table_init_std = 0); checkpoints hold the rows
    training touched."""
    sparse_ple: bool = True
    """Sparse PLE-table gradients with a lazy row-wise Adam: step cost independent of V x L x dP. The one
    switch for it: the model the run builds records it as ple.sparse_grad (plelab.training.optim.model_config_for)."""
    seed: int = 1337
    """Seed for initialisation, data order and sampling."""
    init_from_hf: str = ""
    """A local Hugging Face Gemma 4 folder to start from (`plelab train --init-from-hf PATH` sets it): its
    config.json replaces [model] (arch = gemma4) and its weights the random initialisation when the model is built,
    on every rank its own rows of the PLE table. Recorded with the run, so `--resume` before the first checkpoint
    starts from these weights again; a checkpoint, once written, is what resume reads."""
    device: str = "auto"
    """auto (cuda, then mps, then cpu), or an explicit torch device."""
    dtype: PrecisionChoice = "auto"
    """auto = bf16 autocast where the hardware computes bf16 natively (CUDA with bf16; CPUs with AVX512-BF16,
    AMX or aarch64 BF16), else fp32; or bf16 / bf16-head / fp32. The run prints its choice and why
    (plelab.util.device.choose_precision). Under every value weights, gradients, optimizer state (the PLE
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
    parallel: ParallelMode = "auto"
    """auto = "ddp" when started on several ranks (torchrun), one process otherwise; or explicitly "ddp" (weights
    replicated, gradients all-reduced), "fsdp" (FSDP2 fully_shard per decoder layer + root: weights, gradients
    and optimizer state sharded) or "none" (one process; refused on several ranks). On several ranks the PLE
    table is split by vocabulary (plelab.parallel) and batch_size is the global batch (divisible by the world
    size). One process without torchrun trains alone whatever this says. Hashes and sweep comparisons read
    "auto" as "none", the former default (see LEGACY_DEFAULTS)."""
    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in backward instead of storing them (less memory, ~1/3
    more compute)."""
    log_every: int = 10
    """Print and log a metrics line every N steps."""
    eval_every: int = 0
    """Evaluate on eval_data every N steps (0 = only at the end)."""
    eval_tokens: int = 16384
    """Cap on tokens per domain for evaluations during training (picked as eval_sample says)."""
    eval_sample: EvalSample = "spread"
    """Which tokens a capped evaluation scores, per domain (the held-out split included): "spread" = windows
    evenly spaced through the whole domain (the same for every run), "head" = the first whole documents that
    fit (a run recorded before this field existed used this, whatever its config says now: results record the
    sample used), "all" = every token, eval_tokens ignored. Each domain's result carries its evaluation noise
    (loss_se over the scored windows)."""
    eval_heldout_whole: bool = False
    """Score every token of the prepared held-out split at every evaluation, whatever eval_tokens and eval_sample
    say (the other domains keep the cap): the split a study's gate is judged on, without its sampling noise."""
    eval_timeline: int = 0
    """Also evaluate on eval_data at this many log-spaced steps (so token counts) from the end of warmup
    (step max(1, warmup_steps)) to max_steps, both included: the gap timeline sweeps record (0 = off; else
    >= 2). Steps are rounded to the nearest integer and a point that rounds onto its predecessor moves to the
    next step, so every point is distinct (plelab.training.standard_callbacks.timeline_steps)."""
    eval_timeline_domains: TimelineDomains = "all"
    """What the timeline's points before the last score: "all" = every evaluation domain, "heldout" = only the
    prepared held-out split (a gap timeline on it at a fraction of the cost). The final evaluation, and every
    eval_every evaluation, score every domain either way."""
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

    def __init_subclass__(cls, section: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if section:
            cls.section = section
            PLUGIN_SECTIONS[section] = cls

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
        if self.model.ple.sparse_grad:
            raise ConfigError("model.ple.sparse_grad is not a setting (the trainer sets it from sparse_ple on the "
                              "model it builds); remove it and set sparse_ple = true or false")
        if self.ple_table not in PLE_TABLE_STORAGES:
            raise ConfigError(f"ple_table must be one of {', '.join(PLE_TABLE_STORAGES)}, got {self.ple_table!r}")
        if self.ple_table == "disk":
            self._check_disk_table()
        if self.parallel not in PARALLEL_MODES:
            raise ConfigError(f"parallel must be one of {', '.join(PARALLEL_MODES)}, got {self.parallel!r}")
        if self.eval_timeline_domains not in TIMELINE_DOMAINS:
            raise ConfigError(f"eval_timeline_domains must be one of {', '.join(TIMELINE_DOMAINS)}, "
                              f"got {self.eval_timeline_domains!r}")
        if self.eval_timeline_domains != "all" and not self.eval_timeline:
            raise ConfigError("eval_timeline_domains = \"heldout\" narrows the timeline's evaluations, and "
                              "eval_timeline is 0 (no timeline): set eval_timeline, or leave the field at \"all\"")
        if self.eval_sample not in EVAL_SAMPLES:
            raise ConfigError(f"eval_sample must be one of {', '.join(EVAL_SAMPLES)}, got {self.eval_sample!r}")
        if self.dtype not in PRECISIONS:
            raise ConfigError(f"dtype must be one of {', '.join(PRECISIONS)}, got {self.dtype!r}")
        if self.dtype == "bf16-head" and self.model.logit_softcap is not None:
            raise ConfigError("dtype = bf16-head changes the fused head + loss, which soft-capped logits "
                              f"(model.gemma4.final_logit_softcap = {self.model.logit_softcap:g}) do not use: "
                              "choose fp32 or bf16, or unset the soft cap")

    def _check_disk_table(self) -> None:
        ple = self.model.ple
        if ple.dim == 0:
            raise ConfigError("ple_table = \"disk\" keeps the PLE table on disk, and model.ple.dim = 0 has none")
        if not self.sparse_ple:
            raise ConfigError("ple_table = \"disk\" needs the lazy Adam, which touches only a step's rows: set "
                              "sparse_ple = true")
        if ple.table_init_std != 0:
            raise ConfigError("ple_table = \"disk\" starts the table at zero (a sparse file): set "
                              "model.ple.table_init_std = 0")

    @property
    def context(self) -> int:
        """Tokens per training sequence."""
        return self.seq_len or self.model.max_seq_len

    @property
    def tokens_per_step(self) -> int:
        """Tokens consumed per optimizer step."""
        return self.batch_size * self.grad_accum * self.context

    def input_paths(self) -> tuple[str, ...]:
        """The files and folders this run reads (never its output folder); a plug-in adds its own."""
        return tuple(p for p in (self.data, self.eval_data, self.tokenizer, self.init_from_hf) if p)

    def param_counts(self) -> dict[str, int]:
        """plelab.model.params.count_params of the model this config trains (a plug-in counts its own)."""
        from plelab.model.params import count_params

        return count_params(self.model)


LEGACY_DEFAULTS: dict[str, tuple[Any, Any]] = {"parallel": ("auto", "none")}
"""Fields whose default changed after run hashes were introduced: {field: (new default, former default)}. In one
process, where sweeps train, the new default trains exactly as the former one did; config hashes and sweep config
comparisons read it as the former value (`legacy_view`), so existing sweeps keep their run keys and their work."""


def legacy_view(config: dict[str, Any]) -> dict[str, Any]:
    """A train_config_dict with every new default of LEGACY_DEFAULTS written as the former one (for hashing)."""
    out = dict(config)
    for name, (new, former) in LEGACY_DEFAULTS.items():
        if out.get(name) == new:
            out[name] = former
    return out


def load_train_config(source: str | Path | dict[str, Any], overrides: list[str] | None = None) -> TrainConfig:
    """Build a TrainConfig from a file or dict plus `key=value` overrides (e.g. model.ple.dim=0)."""
    data = dict(source) if isinstance(source, dict) else read_file(source)
    data = apply_overrides(data, overrides or [])
    model = data.pop("model", {})
    if not isinstance(model, dict):
        raise ConfigError("[model] must be a table (e.g. preset = \"small-ple\")")
    data["model"] = load_model_config(model)
    return from_dict(config_class(data), data)


def config_class(data: dict[str, Any]) -> type[TrainConfig]:
    """The TrainConfig subclass of the plug-in section `data` holds, else TrainConfig.

    A section that is present but off (its config's `enabled` is false, e.g. `[vision]` without a corpus) is
    removed from `data`: the run is a text run and records (and hashes) exactly what it did without it.
    """
    present = [name for name in PLUGIN_SECTIONS if name in data]
    if len(present) > 1:
        raise ConfigError(f"sections {', '.join(present)} exclude each other (each trains another kind of model)")
    if not present:
        return TrainConfig
    cls = PLUGIN_SECTIONS[present[0]]
    hint = typing.get_type_hints(cls)[present[0]]
    value = data[present[0]]
    section = value if dataclasses.is_dataclass(value) else from_dict(hint, value or {}, prefix=present[0] + ".")
    if getattr(section, "enabled", True):
        return cls
    del data[present[0]]
    return TrainConfig


def train_config_dict(cfg: TrainConfig) -> dict[str, Any]:
    """JSON-friendly dict of a TrainConfig (round-trips through load_train_config)."""
    return to_dict(cfg)
